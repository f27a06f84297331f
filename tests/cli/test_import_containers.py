"""Import keeps the batch's container (issue 17 items 1, 3, 6 and 8's ``show``).

* verl 0.9.1's real ``DataProto`` (a dataclass), dumped by its own ``save_to_disk``
  (RolloutSkip's ``gen_batch.dp``), replays through the ``golden`` fixture as a
  ``DataProto``, every tensor and non-tensor bit-identical.
* ROLL HEAD's ``DataProto``, whose ``.batch`` and ``.non_tensor_batch`` are
  ``BatchProxy`` objects (copied in ``roll_head.py``), is imported and recorded by
  its underlying TensorDict and dict, and replays as ROLL's classes where they are
  imported, else as ``RolloutBatch``.
* Legacy (non-zip) ``torch.save`` files load with ``weights_only=True``.

verl imports ``ray`` and ``transformers`` only to exist; where they are missing they
are replaced by placeholder modules, as in ``test_real_batches.py``.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
import pickle
import sys
import types
from pathlib import Path

import pytest
import torch

from pytest_rollout_golden import Golden, Mode
from pytest_rollout_golden.cli import main
from pytest_rollout_golden.store import codec, save_batch

INSTALL = "pip install --no-deps tensordict==0.10.0 verl==0.9.1 (see .ci/run)"
HERE = Path(__file__).parent

# Shared by the outer tests (which dump it) and the inner ones (which replay it).
PARTS = '''
import numpy as np
import torch


def objects(*items):
    out = np.empty(len(items), dtype=object)
    for i, item in enumerate(items):
        out[i] = item
    return out


def make_parts(step):
    """(tensors, non_tensors, meta_info) of a rollout batch of 2 sequences."""
    g = torch.Generator().manual_seed(step)
    # bf16 bit patterns: a NaN with a payload, -0.0, the smallest subnormal, +inf, then noise
    special = torch.tensor([0x7FC1, -0x8000, 0x0001, 0x7F80], dtype=torch.int16)
    noise = torch.randn(4, generator=g).to(torch.bfloat16).view(torch.int16)
    tensors = {
        "input_ids": torch.randint(0, 32000, (2, 6), generator=g),
        "old_log_probs": torch.cat([special, noise]).view(torch.bfloat16).reshape(2, 4),
        "attention_mask": torch.tensor([[1] * 6, [0, 0, 1, 1, 1, 1]], dtype=torch.bool),
        "token_level_scores": torch.randn(2, 4, generator=g, dtype=torch.float16),
    }
    non_tensors = {
        "uid": objects(f"u{step}", f"u{step}"),
        "raw_prompt": objects([{"role": "user", "content": "2+2?"}], []),
        "tools": objects({"name": "calc", "n": step}, None),
    }
    meta_info = {"global_steps": step, "temperature": 0.7, "eos_token_id": [2, 32000]}
    return tensors, non_tensors, meta_info


def same_bits(a, b):
    if (a.dtype, a.shape) != (b.dtype, b.shape):
        return False
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def assert_same(batch, step):
    """``batch`` (any DataProto-shaped object) holds exactly ``make_parts(step)``."""
    tensors, non_tensors, meta_info = make_parts(step)
    assert sorted(batch.batch.keys()) == sorted(tensors)
    for key, want in tensors.items():
        assert same_bits(batch.batch[key], want), key
    assert sorted(batch.non_tensor_batch.keys()) == sorted(non_tensors)
    for key, want in non_tensors.items():
        got = batch.non_tensor_batch[key]
        assert isinstance(got, np.ndarray) and (got.dtype, got.shape) == (want.dtype, want.shape)
        assert got.tolist() == want.tolist(), key
    assert batch.meta_info == meta_info
'''
parts = types.ModuleType("import_containers_parts")
exec(PARTS, parts.__dict__)


@pytest.fixture(scope="module")
def verl(placeholder):
    """The real ``verl.protocol`` (and tensordict)."""
    try:
        importlib.import_module("tensordict")
    except ImportError:
        pytest.skip(f"tensordict is not installed; {INSTALL}")
    if importlib.util.find_spec("verl") is None:
        pytest.skip(f"verl is not installed; {INSTALL}")
    for name in ("ray", "transformers"):
        if name not in sys.modules and importlib.util.find_spec(name) is None:
            sys.modules[name] = placeholder(name)
    try:
        return importlib.import_module("verl.protocol")
    except ImportError as error:
        pytest.skip(f"verl.protocol needs {error.name!r}; {INSTALL}")


@pytest.fixture
def roll(monkeypatch):
    """ROLL HEAD's protocol module (see roll_head.py), registered under its real name."""
    pytest.importorskip("tensordict")
    sys.path.insert(0, str(HERE))
    try:
        roll_head = importlib.import_module("roll_head")
    finally:
        sys.path.remove(str(HERE))
    return roll_head.install(monkeypatch.setitem)


def import_(source, target, *extra) -> int:
    return main(["import", str(source), "-o", str(target), *extra])


def replay(golden: Path, step: int, name: str = "rollout"):
    with Golden(golden, mode=Mode.STRICT) as g:
        return g.rollout(lambda: pytest.fail("generated instead of replayed"), step=step, name=name)


# ------------------------------------------------------------------ verl's DataProto (item 1)


def verl_dump(verl, root: Path, step: int) -> Path:
    """RolloutSkip's dump of step ``step``: ``genstep_<step>/gen_batch.dp``, by verl itself."""
    tensors, non_tensors, meta_info = parts.make_parts(step)
    batch = verl.DataProto.from_dict(tensors, non_tensors=non_tensors, meta_info=meta_info)
    (root / f"genstep_{step}").mkdir(parents=True)
    batch.save_to_disk(root / f"genstep_{step}" / "gen_batch.dp")
    return root


REPLAY_VERL = (
    PARTS
    + """
import pytest
from tensordict import TensorDict
from verl.protocol import DataProto


def test_replay(golden):
    batch = golden.rollout(lambda: pytest.fail("generated"), step=3)
    assert type(batch) is DataProto, type(batch)
    assert type(batch.batch) is TensorDict
    assert_same(batch, 3)
    # the user's gate: verl's own operations on the replayed batch
    halves = batch.chunk(2)
    assert [h.non_tensor_batch["uid"].tolist() for h in halves] == [["u3"], ["u3"]]
    assert batch.select(batch_keys=["input_ids"]).batch["input_ids"].shape == (2, 6)
"""
)


def test_verl_dataproto_dump_replays_as_dataproto_in_the_plugin(project, tmp_path, verl):
    dump = verl_dump(verl, tmp_path / "dump", 3)
    target = project.golden_dir("test_replay")
    assert import_(dump, target, "--trust-pickle") == 0
    project.write(REPLAY_VERL)
    project.run("--golden-strict").assert_outcomes(passed=1)


@dataclasses.dataclass
class GenerationConfig:
    """A dataclass inside meta_info: import turns it into a dict, not the DataProto around it."""

    temperature: float
    stop: list


def test_verl_dataproto_keeps_its_class_when_its_contents_are_converted(tmp_path, verl):
    tensors, non_tensors, meta_info = parts.make_parts(4)
    meta_info["config"] = GenerationConfig(0.7, ["</s>"])
    batch = verl.DataProto.from_dict(tensors, non_tensors=non_tensors, meta_info=meta_info)
    (tmp_path / "dump" / "genstep_4").mkdir(parents=True)
    batch.save_to_disk(tmp_path / "dump" / "genstep_4" / "gen_batch.dp")
    assert import_(tmp_path / "dump", tmp_path / "golden", "--trust-pickle") == 0
    back = replay(tmp_path / "golden", 4)
    assert type(back) is verl.DataProto
    assert back.meta_info.pop("config") == {"temperature": 0.7, "stop": ["</s>"]}
    parts.assert_same(back, 4)


# ------------------------------------------------------------------ ROLL's BatchProxy (item 3)


def roll_batch(roll, step: int, remote=None):
    from tensordict import TensorDict

    tensors, non_tensors, meta_info = parts.make_parts(step)
    td = TensorDict(tensors, batch_size=[2])
    return roll.DataProto(
        batch=td, non_tensor_batch=non_tensors, remote_batch=remote, meta_info=meta_info
    )


def roll_dump(roll, root: Path, step: int, remote=None) -> Path:
    (root / "train").mkdir(parents=True, exist_ok=True)
    with open(root / "train" / f"step_{step:06d}.pkl", "wb") as f:
        pickle.dump(roll_batch(roll, step, remote), f)
    return root


REPLAY_ROLL = (
    PARTS
    + """
import pytest
from tensordict import TensorDict
from roll.distributed.scheduler.protocol import DataProto
from roll.distributed.scheduler.remote_protocol import BatchProxy


def test_replay(golden):
    batch = golden.rollout(lambda: pytest.fail("generated"), step=1)
    assert type(batch) is DataProto, type(batch)
    assert type(batch.batch) is BatchProxy and type(batch._batch) is TensorDict
    assert type(batch.non_tensor_batch) is BatchProxy and type(batch._non_tensor_batch) is dict
    assert batch.batch.batch_size == (2,) and len(batch) == 2
    assert_same(batch, 1)
"""
)


def test_roll_head_dump_with_batch_proxies_replays_as_roll_dataproto(project, tmp_path, roll):
    assert type(roll_batch(roll, 1).batch).__name__ == "BatchProxy"
    dump = roll_dump(roll, tmp_path / "dump", 1)
    target = project.golden_dir("test_replay")
    assert import_(dump, target, "--trust-pickle") == 0
    project.write(REPLAY_ROLL)
    project.run("--golden-strict").assert_outcomes(passed=1)


def test_roll_golden_without_roll_imported_replays_as_rollout_batch(tmp_path, roll, monkeypatch):
    assert (
        import_(roll_dump(roll, tmp_path / "dump", 2), tmp_path / "golden", "--trust-pickle") == 0
    )
    for name in [m for m in sys.modules if m == "roll" or m.startswith("roll.")]:
        monkeypatch.delitem(sys.modules, name)
    back = replay(tmp_path / "golden", 2)
    assert type(back) is codec.RolloutBatch
    assert type(back.batch).__name__ == "TensorDict" and type(back.non_tensor_batch) is dict
    parts.assert_same(back, 2)


RECORD_ROLL = (
    PARTS
    + """
import pytest
from tensordict import TensorDict
from roll.distributed.scheduler.protocol import DataProto
from roll.distributed.scheduler.remote_protocol import BatchProxy


def make():
    tensors, non_tensors, meta_info = make_parts(5)
    return DataProto(batch=TensorDict(tensors, batch_size=[2]), non_tensor_batch=non_tensors,
                     meta_info=meta_info)


def test_record(golden, generated):
    batch = golden.rollout(lambda: generated("dataproto", make()))
    assert type(batch) is DataProto and type(batch.batch) is BatchProxy
    assert_same(batch, 5)
    proxy = golden.rollout(lambda: generated("proxy", make().batch), name="proxy")
    assert type(proxy) is BatchProxy and type(proxy._batch) is TensorDict
    assert proxy._batch_size == 2 and proxy._remote_batch is None
    tensors, _, _ = make_parts(5)
    assert all(same_bits(proxy[k], v) for k, v in tensors.items())
"""
)


def test_golden_rollout_records_and_replays_roll_dataproto_and_batch_proxy(project, roll):
    project.write(RECORD_ROLL)
    project.run().assert_outcomes(passed=1)
    assert project.calls() == ["dataproto", "proxy"]
    project.run("--golden-strict").assert_outcomes(passed=1)
    assert project.calls() == []


def test_roll_batch_with_a_remote_part_is_refused_naming_the_file(tmp_path, roll, capsys):
    remote = sys.modules["roll.distributed.scheduler.remote_protocol"].RemoteBatch(["values"], 2)
    dump = roll_dump(roll, tmp_path / "dump", 3, remote=remote)
    assert import_(dump, tmp_path / "golden", "--trust-pickle") == 2
    err = capsys.readouterr().err
    assert f"step 3, {dump / 'train' / 'step_000003.pkl'}: " in err
    assert "remote_batch" in err and "'values'" in err
    assert "before recording" not in err
    assert not (tmp_path / "golden").exists()


def test_roll_batch_whose_remote_part_was_materialized_is_recorded(tmp_path, roll):
    from tensordict import TensorDict

    remote = sys.modules["roll.distributed.scheduler.remote_protocol"].RemoteBatch(["values"], 2)
    batch = roll_batch(roll, 3, remote=remote)
    local = {**parts.make_parts(3)[0], "values": torch.ones(2)}  # "values" fetched
    batch.batch = TensorDict(local, batch_size=[2])  # ROLL's setter drops it from the remote
    assert batch._remote_batch is not None and not batch._remote_batch.keys()
    golden = tmp_path / "golden"
    with Golden(golden, mode=Mode.AUTO) as g:
        g.rollout(lambda: batch, step=0)
    back = replay(golden, 0)
    assert torch.equal(back.batch["values"], torch.ones(2))


# ------------------------------------------------------------------ legacy torch.save (item 6)


@dataclasses.dataclass
class Sample:
    """slime's Sample by shape."""

    index: int
    tokens: list


def test_legacy_torch_save_dumps_load_with_weights_only(tmp_path):
    dump = tmp_path / "dump"
    dump.mkdir()
    whole = [
        {"input_ids": torch.arange(4) + i, "logp": -torch.rand(4).bfloat16()} for i in range(2)
    ]
    torch.save(whole, dump / "step_000004.pt", _use_new_zipfile_serialization=False)
    torch.save(7, dump / "step_000005.pt", _use_new_zipfile_serialization=False)
    assert (dump / "step_000004.pt").read_bytes()[:2] == b"\x80\x02"  # not a zip archive
    assert import_(dump, tmp_path / "golden") == 0  # no --trust-pickle needed
    back = replay(tmp_path / "golden", 4)
    for got, want in zip(back, whole, strict=True):
        for key in want:
            assert parts.same_bits(got[key], want[key])
    assert replay(tmp_path / "golden", 5) == 7


def test_legacy_torch_save_of_classes_needs_trust_pickle(tmp_path, capsys):
    dump = tmp_path / "dump"
    dump.mkdir()
    torch.save({"rollout_id": 3, "samples": [Sample(0, [1, 2])]}, dump / "rollout.pt",
               _use_new_zipfile_serialization=False)  # fmt: skip
    assert import_(dump, tmp_path / "golden", "--layout", "slime") == 2
    err = capsys.readouterr().err
    assert "rollout.pt: cannot be loaded without full unpickling" in err
    assert "torch.load(weights_only=True)" in err and "raw pickle" not in err
    assert import_(dump, tmp_path / "golden", "--layout", "slime", "--trust-pickle") == 0
    assert replay(tmp_path / "golden", 3)["samples"] == [{"index": 0, "tokens": [1, 2]}]


def test_legacy_torch_save_where_a_golden_file_should_be_is_named_so(tmp_path):
    from pytest_rollout_golden import GoldenFormatError, load_batch

    path = tmp_path / "b.safetensors"
    torch.save({"x": torch.ones(2)}, path, _use_new_zipfile_serialization=False)
    with pytest.raises(GoldenFormatError, match=r"is a legacy torch\.save file"):
        load_batch(path)


# ------------------------------------------------------------------ show (item 8)


def test_show_of_an_imported_golden(tmp_path, verl, capsys):
    dump = verl_dump(verl, tmp_path / "dump", 3)
    out = tmp_path / "golden"
    assert import_(dump, out, "--trust-pickle") == 0
    capsys.readouterr()
    assert main(["show", str(out)]) == 0
    text = capsys.readouterr().out
    assert "(test )" not in text and "fingerprint: null" not in text
    assert f"imported from {dump} (verl layout)" in text
    for row in ("non_tensor_batch/uid", "non_tensor_batch/tools", "meta_info/global_steps",
                "meta_info/eos_token_id"):  # fmt: skip
        assert row in text, row
    assert "'u3'" in text and "[2, 32000]" in text
    assert main(["show", str(out), "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["imported"] == {"layout": "verl", "source": str(dump)}
    values = document["files"]["rollout-rollout-step000003.safetensors"]["values"]
    assert values["meta_info/global_steps"] == {"type": "int", "value": "3"}
    assert values["non_tensor_batch/uid"]["type"] == "object[2]"


def test_show_of_a_batch_of_plain_values_prints_no_empty_tensor_table(tmp_path, capsys):
    save_batch(tmp_path / "b.safetensors", {"step": 1, "texts": ["a", "b"]})
    assert main(["show", str(tmp_path / "b.safetensors")]) == 0
    out = capsys.readouterr().out
    assert "dtype[shape]" not in out
    assert "texts" in out and "'a'" in out
