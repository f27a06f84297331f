"""Real framework batches through save_batch/load_batch and golden.rollout.

Uses the real ``tensordict`` 0.10.0 and verl 0.9.1 that ``.ci/run`` installs with
``--no-deps``; each test skips, with the install command, where they are missing.
``verl.protocol`` imports two heavy packages only to exist: ``ray`` (for an annotation,
``ray.ObjectRef``) and ``transformers`` (``PreTrainedTokenizer``, a type hint in
``verl.utils.torch_functional``). Where they are not installed they are replaced by
empty modules that hand out a placeholder class for any name; nothing else is stubbed,
so ``DataProto``, ``verl.utils.tensordict_utils`` and ``verl.workers.utils.padding``
are verl's own code.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types

import numpy as np
import pytest
import torch

from pytest_rollout_golden import UnsupportedValueError, load_batch, save_batch
from pytest_rollout_golden.store import read_safetensors

INSTALL = "pip install --no-deps tensordict==0.10.0 verl==0.9.1 (see .ci/run)"


@pytest.fixture(scope="module")
def td():
    try:
        return importlib.import_module("tensordict")
    except ImportError:
        pytest.skip(f"tensordict is not installed; {INSTALL}")


@pytest.fixture(scope="module")
def verl(td, placeholder):
    """``(verl.protocol, verl.utils.tensordict_utils, verl.workers.utils.padding)``."""
    if importlib.util.find_spec("verl") is None:
        pytest.skip(f"verl is not installed; {INSTALL}")
    for name in ("ray", "transformers"):
        if name not in sys.modules and importlib.util.find_spec(name) is None:
            sys.modules[name] = placeholder(name)
    try:
        return types.SimpleNamespace(
            protocol=importlib.import_module("verl.protocol"),
            tu=importlib.import_module("verl.utils.tensordict_utils"),
            padding=importlib.import_module("verl.workers.utils.padding"),
        )
    except ImportError as error:
        pytest.skip(f"verl.protocol needs {error.name!r}; {INSTALL}")


def same(a, b) -> bool:
    """Same dtype, shape and bits (NaN payloads included)."""
    if a.dtype != b.dtype or a.is_nested != b.is_nested:
        return False
    if a.is_nested:  # the ragged size is a fresh symbol per tensor: compare row by row
        ra, rb = a.unbind(), b.unbind()
        return a.layout == b.layout and len(ra) == len(rb) and all(map(same, ra, rb))
    if a.shape != b.shape:
        return False
    if a.is_floating_point():
        return torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    return torch.equal(a, b)


def round_trip(tmp_path, value):
    save_batch(tmp_path / "batch.safetensors", value)
    return load_batch(tmp_path / "batch.safetensors")


def objects(*items):
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out


# A verl rollout batch of 3 sequences: left-padded prompts, right-padded responses.
PROMPTS = [[5, 6], [7, 8, 9], [1, 2, 3, 4]]
RESPONSES = [[11, 12], [13, 14, 15, 16], [17]]
TOOL_CALLS = [
    [{"role": "user", "content": "2+2?"}, {"role": "tool", "name": "calc", "content": "4"}],
    [],
    [{"role": "assistant", "tool_calls": [{"name": "search", "arguments": {"q": "x"}}]}],
]


def verl_tensors(device=None):
    P, R = 4, 4
    prompts = torch.tensor([[0] * (P - len(p)) + p for p in PROMPTS])
    responses = torch.tensor([r + [0] * (R - len(r)) for r in RESPONSES])
    prompt_mask, response_mask = (prompts != 0).long(), (responses != 0).long()
    attention_mask = torch.cat([prompt_mask, response_mask], 1)
    g = torch.Generator().manual_seed(0)
    return {
        "prompts": prompts,
        "responses": responses,
        "input_ids": torch.cat([prompts, responses], 1),
        "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
        "response_mask": response_mask,
        "rollout_log_probs": -torch.rand(3, R, generator=g).bfloat16() * response_mask,
    }


# ------------------------------------------------------------------ tensordict


@pytest.mark.parametrize("device", ["cpu", None])
def test_tensordict_keeps_its_device_and_nested_tensordicts(tmp_path, td, device):
    inner = td.TensorDict({"values": torch.randn(3, 2)}, batch_size=[3], device=device)
    batch = td.TensorDict({**verl_tensors(), "critic": inner}, batch_size=[3], device=device)
    loaded = round_trip(tmp_path, batch)
    assert type(loaded) is td.TensorDict and loaded.batch_size == torch.Size([3])
    assert loaded.device == batch.device and loaded["critic"].device == batch.device
    assert type(loaded["critic"]) is td.TensorDict
    assert set(loaded.keys(True, True)) == set(batch.keys(True, True))
    for key in batch.keys(True, True):
        assert same(loaded[key], batch[key]), key


def test_non_tensor_data_as_verl_assigns_it_round_trips(tmp_path, td, verl):
    batch = td.TensorDict(verl_tensors(), batch_size=[3], device="cpu")
    verl.tu.assign_non_tensor(
        batch,
        dp_size=2,
        batch_num_tokens=17,
        pad_mode="no_padding",
        temperature=0.7,
        turn_scores=[[], [0.5, 0.8], [0.9]],
        messages=TOOL_CALLS,
    )
    loaded = round_trip(tmp_path, batch)
    for key in ("dp_size", "batch_num_tokens", "pad_mode", "temperature"):
        got, want = loaded.get(key), batch.get(key)
        assert type(got) is td.NonTensorData, (key, type(got))  # was an empty TensorDict
        assert got.data == want.data and type(got.data) is type(want.data), key
        assert got.batch_size == want.batch_size
    for key in ("turn_scores", "messages"):
        got = loaded.get(key)
        assert type(got) is td.NonTensorStack, (key, type(got))
        assert got.tolist() == batch.get(key).tolist(), key
    assert verl.tu.get(loaded, "messages") == TOOL_CALLS


def test_stacked_non_tensor_data_of_two_batch_dims(tmp_path, td):
    grid = td.NonTensorStack.from_list(
        [
            td.NonTensorStack.from_list([td.NonTensorData("a"), td.NonTensorData("b")]),
            td.NonTensorStack.from_list([td.NonTensorData("c"), td.NonTensorData({"d": 1})]),
        ]
    )
    loaded = round_trip(tmp_path, {"grid": grid})["grid"]
    assert type(loaded) is td.NonTensorStack and loaded.batch_size == torch.Size([2, 2])
    assert loaded.tolist() == [["a", "b"], ["c", {"d": 1}]]


def test_without_tensordict_imported_non_tensor_data_comes_back_as_plain_values(
    tmp_path, td, verl, monkeypatch
):
    batch = td.TensorDict(verl_tensors(), batch_size=[3])
    verl.tu.assign_non_tensor(batch, dp_size=2, messages=TOOL_CALLS)
    save_batch(tmp_path / "b.safetensors", batch)
    monkeypatch.delitem(sys.modules, "tensordict")
    loaded = load_batch(tmp_path / "b.safetensors")
    assert type(loaded) is dict
    assert loaded["dp_size"] == 2 and loaded["messages"] == TOOL_CALLS


# ------------------------------------------------------------------ nested tensors


def test_jagged_tensor_is_stored_as_values_and_offsets(tmp_path):
    g = torch.Generator().manual_seed(1)
    rows = [torch.randn(n, 3, generator=g).bfloat16() for n in (2, 5, 1)]
    jagged = torch.nested.nested_tensor(rows, layout=torch.jagged)
    save_batch(tmp_path / "b.safetensors", {"log_probs": jagged})
    arrays, _ = read_safetensors(tmp_path / "b.safetensors")
    assert sorted(arrays) == ["log_probs/offsets", "log_probs/values"]
    assert arrays["log_probs/values"].shape == (8, 3)
    assert arrays["log_probs/offsets"].tolist() == [0, 2, 7, 8]

    loaded = load_batch(tmp_path / "b.safetensors")["log_probs"]
    assert loaded.is_nested and loaded.layout == torch.jagged
    assert same(loaded, jagged) and same(loaded.values(), jagged.values())


def test_jagged_tensor_with_holes_keeps_its_lengths(tmp_path):
    dense = torch.arange(12.0).reshape(3, 4)
    starts, lengths = torch.tensor([0, 1, 0]), torch.tensor([2, 3, 1])
    holes = torch.nested.narrow(dense, 1, starts, lengths, layout=torch.jagged)
    loaded = round_trip(tmp_path, {"x": holes})["x"]
    assert [r.tolist() for r in loaded.unbind()] == [[0.0, 1.0], [5.0, 6.0, 7.0], [8.0]]
    assert torch.equal(loaded.lengths(), lengths)


def test_strided_nested_tensor_round_trips(tmp_path):
    rows = [torch.ones(2, 3), torch.full((1, 3), -0.0), torch.arange(12.0).reshape(4, 3)]
    strided = torch.nested.as_nested_tensor(rows, layout=torch.strided)
    loaded = round_trip(tmp_path, {"x": strided})["x"]
    assert loaded.is_nested and loaded.layout == torch.strided
    assert same(loaded, strided)


def test_verl_no_padding_batch_round_trips(tmp_path, td, verl):
    """verl's own ``left_right_2_no_padding``: jagged input_ids/position_ids, NonTensorData."""
    batch = verl.protocol.DataProto(
        batch=td.TensorDict(verl_tensors(), batch_size=[3]),
        non_tensor_batch={"uid": objects("g0", "g0", "g1")},
        meta_info={"global_steps": 1},
    )
    no_padding = verl.padding.left_right_2_no_padding(batch.to_tensordict())
    assert no_padding["input_ids"].layout == torch.jagged  # the real path, not a stand-in

    loaded = round_trip(tmp_path, no_padding)
    assert set(loaded.keys()) == set(no_padding.keys())
    for key in ("input_ids", "position_ids", "loss_mask", "prompts"):
        assert same(loaded[key], no_padding[key]), key
    assert same(verl.tu.get(loaded, "indices"), verl.tu.get(no_padding, "indices"))
    assert verl.tu.get(loaded, "max_seq_len") == 8
    # verl's inverse conversion works on the loaded batch exactly as on the original
    back = verl.padding.no_padding_2_padding(loaded["input_ids"], loaded)
    assert torch.equal(back, verl.padding.no_padding_2_padding(no_padding["input_ids"], no_padding))


# ------------------------------------------------------------------ DataProto


def test_dataproto_round_trips_with_device_tool_calls_and_meta_info(tmp_path, td, verl):
    DataProto = verl.protocol.DataProto
    batch = DataProto.from_dict(
        verl_tensors(),
        non_tensors={"uid": objects("g0", "g0", "g1"), "messages": objects(*TOOL_CALLS)},
        meta_info={"eos_token_id": [2, 32000], "temperature": 0.7, "validate": False},
    ).to("cpu")
    assert batch.batch.device == torch.device("cpu")

    loaded = round_trip(tmp_path, batch)
    assert type(loaded) is DataProto and len(loaded) == 3
    assert type(loaded.batch) is td.TensorDict and loaded.batch.device == torch.device("cpu")
    for key, value in batch.batch.items():
        assert same(loaded.batch[key], value), key
    assert loaded.non_tensor_batch["uid"].dtype == object
    assert loaded.non_tensor_batch["messages"].tolist() == TOOL_CALLS
    assert loaded.meta_info == batch.meta_info
    # still a working DataProto: verl's own operations run on it
    halves = loaded.chunk(3)
    assert [h.non_tensor_batch["uid"].tolist() for h in halves] == [["g0"], ["g0"], ["g1"]]


GENERATE_SEQUENCES = """
import numpy as np
import torch
from tensordict import TensorDict
from verl.protocol import DataProto
from verl.utils import tensordict_utils as tu


def generate_sequences(prompts: DataProto) -> DataProto:
    '''Shaped like verl's rollout worker: prompts in, prompts + responses out.'''
    g = torch.Generator().manual_seed(len(prompts))
    idx = prompts.batch["input_ids"]
    responses = torch.randint(3, 50, (len(prompts), 4), generator=g)
    responses[0, 2:] = 0
    response_mask = (responses != 0).long()
    attention_mask = torch.cat([prompts.batch["attention_mask"], response_mask], 1)
    out = TensorDict(
        {
            "prompts": idx,
            "responses": responses,
            "input_ids": torch.cat([idx, responses], 1),
            "attention_mask": attention_mask,
            "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
            "response_mask": response_mask,
            "rollout_log_probs": -torch.rand(len(prompts), 4, generator=g) * response_mask,
            "rollout": TensorDict({"entropy": torch.rand(len(prompts), 4, generator=g)},
                                  batch_size=[len(prompts)]),
            "lengths": torch.nested.nested_tensor(
                [torch.arange(n) for n in response_mask.sum(1).tolist()], layout=torch.jagged
            ),
        },
        batch_size=[len(prompts)],
        device="cpu",
    )
    tu.assign_non_tensor(out, dp_size=1, pad_mode="left_right")
    messages = np.empty(len(prompts), dtype=object)
    messages[:] = [[{"role": "tool", "content": str(i)}] for i in range(len(prompts))]
    return DataProto(
        batch=out,
        non_tensor_batch={**prompts.non_tensor_batch, "messages": messages},
        meta_info={**prompts.meta_info, "timing": {"gen": 0.5}},
    )


def pg_loss(batch):
    ratio = torch.exp(batch.batch["rollout_log_probs"] * 0.5)
    mask = batch.batch["response_mask"]
    return float((ratio * mask).sum() / mask.sum()) + float(batch.batch["rollout"]["entropy"].sum())


def test_rollout(golden, generated):
    prompts = DataProto.from_dict(
        {"input_ids": torch.tensor([[0, 5, 6], [7, 8, 9]]),
         "attention_mask": torch.tensor([[0, 1, 1], [1, 1, 1]])},
        non_tensors={"uid": np.array(["a", "b"], dtype=object)},
        meta_info={"eos_token_id": 2},
    )
    batch = golden.rollout(lambda: generated("rollout", generate_sequences(prompts)))
    assert type(batch) is DataProto and batch.batch.device == torch.device("cpu")
    assert type(batch.batch["rollout"]) is TensorDict
    assert batch.batch["lengths"].layout == torch.jagged
    assert tu.get(batch.batch, "dp_size") == 1 and tu.get(batch.batch, "pad_mode") == "left_right"
    assert batch.non_tensor_batch["messages"][1] == [{"role": "tool", "content": "1"}]
    assert batch.meta_info == {"eos_token_id": 2, "timing": {"gen": 0.5}}
    golden.check({"pg_loss": pg_loss(batch)})
"""


def test_verl_generate_sequences_records_and_replays(project, verl):
    project.write(GENERATE_SEQUENCES)
    project.run().assert_outcomes(passed=1)
    assert project.calls() == ["rollout"]
    result = project.run()
    result.assert_outcomes(passed=1)
    assert project.calls() == [], "replay must not run generate_sequences"
    assert project.counts(result)["replayed"] == 1


# ------------------------------------------------------------------ metrics as verl logs them


def test_verl_metric_objects_are_recorded_as_verl_aggregates_them(verl):
    """The recorded number is the one ``verl.utils.metric.reduce_metrics`` reports."""
    from pytest_rollout_golden._internal.golden import metric_codec

    Metric = importlib.import_module("verl.utils.metric.utils").Metric

    def metric(aggregation, values):
        m = Metric(aggregation)
        m.extend(values)
        return m

    logged = {
        "actor/pg_loss": metric("mean", [0.25, -0.5, 1.0]),
        "actor/grad_norm_max": metric("max", [torch.tensor(3.5), torch.tensor(1.25)]),
        "perf/tokens": metric("sum", [128, 64, 32]),
        "actor/kl_min": metric("min", [0.1, 0.01]),
    }
    nodes = {k: metric_codec.encode(v, where=f"metric {k!r}") for k, v in logged.items()}
    by_verl = importlib.import_module("verl.utils.metric").reduce_metrics(dict(logged))
    assert nodes == {k: float(v) if isinstance(v, float) else v.item() for k, v in by_verl.items()}
    assert nodes["perf/tokens"] == 224 and type(nodes["perf/tokens"]) is int

    with pytest.raises(UnsupportedValueError, match="metric 'x': the verl Metric holds no values"):
        metric_codec.encode(Metric("mean"), where="metric 'x'")


def test_per_micro_batch_lists_are_refused_with_the_reduction_to_write(project):
    project.write(
        """
        def test_metrics(golden):
            metrics = {"actor/pg_loss": [0.25, -0.5, 1.0]}  # verl's append_to_dict
            golden.check(metrics, step=1)
        """
    )
    result = project.run()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "E  *UnsupportedValueError: metric 'actor/pg_loss' at step 1: got list of 3 values "
            "(verl's append_to_dict logs one per micro-batch); record the number verl reports, "
            "as `verl.utils.metric.reduce_metrics(metrics)` computes it: "
            "`float(np.mean(values))`, *"
        ]
    )
    assert project.golden_files() == {}


def test_empty_strided_nested_tensor_is_refused_at_record_time(tmp_path):
    with pytest.raises(UnsupportedValueError, match=r"nested tensor at \['x'\] has no rows"):
        save_batch(tmp_path / "b.safetensors", {"x": torch.nested.nested_tensor([])})
    assert not (tmp_path / "b.safetensors").exists()
