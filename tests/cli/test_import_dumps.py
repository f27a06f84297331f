"""rollout-golden import: framework dumps in each layout round-trip into goldens that replay."""

from __future__ import annotations

import dataclasses
import math
import pickle
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from pytest_rollout_golden import Golden, Mode
from pytest_rollout_golden.cli import main


class DataProtoLike:
    """verl/ROLL's DataProto by shape: batch, non_tensor_batch, meta_info."""

    def __init__(self, batch=None, non_tensor_batch=None, meta_info=None):
        self.batch, self.non_tensor_batch, self.meta_info = batch, non_tensor_batch, meta_info


class TensorDict(dict):
    """Just enough of tensordict.TensorDict (see test_codec_tensordict.py)."""

    __module__ = "tensordict"

    def __init__(self, source, batch_size):
        super().__init__(source)
        self.batch_size = torch.Size(batch_size)

    def __reduce__(self):
        return (TensorDict, (dict(self), list(self.batch_size)))


@dataclasses.dataclass
class SampleLike:
    """slime's Sample by shape: a dataclass per sample."""

    index: int
    tokens: list
    reward: float
    rollout_log_probs: torch.Tensor


@pytest.fixture
def fake_tensordict(monkeypatch):
    module = types.ModuleType("tensordict")
    module.TensorDict = TensorDict
    monkeypatch.setitem(sys.modules, "tensordict", module)


def dataproto(step: int) -> DataProtoLike:
    g = torch.Generator().manual_seed(step)
    return DataProtoLike(
        batch=TensorDict(
            {
                "input_ids": torch.randint(0, 50, (2, 6), generator=g),
                "rollout_log_probs": -torch.rand(2, 4, generator=g),
                "attention_mask": torch.ones(2, 6, dtype=torch.bool),
            },
            batch_size=[2],
        ),
        non_tensor_batch={
            "uid": np.array([f"u{step}", f"u{step}"], dtype=object),
            "tools": np.array([{"name": "calc", "n": step}, None], dtype=object),
        },
        meta_info={"global_steps": step, "temperature": 1.0},
    )


def same(a, b) -> None:
    """Deep equality of dumps and what the golden replays."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.shape == b.shape and a.dtype == b.dtype
        for x, y in zip(a.ravel(), b.ravel(), strict=True):
            same(x, y)
    elif isinstance(a, dict):
        assert set(a) == set(b), (set(a), set(b))
        for key in a:
            same(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            same(x, y)
    elif hasattr(a, "non_tensor_batch"):
        same(dict(a.batch), dict(b.batch))
        same(a.non_tensor_batch, b.non_tensor_batch)
        same(a.meta_info, b.meta_info)
    elif dataclasses.is_dataclass(a):
        same(dataclasses.asdict(a), b)
    else:
        assert a == b


def replay(golden: Path, step: int, name: str = "rollout"):
    """The rollout the plugin's Golden replays (it must never generate)."""
    with Golden(golden, mode=Mode.STRICT) as g:
        return g.rollout(lambda: pytest.fail("generated instead of replayed"), step=step, name=name)


def import_(source, target, *extra) -> int:
    return main(["import", str(source), "-o", str(target), *extra])


def test_verl_skip_manager_dumps(tmp_path, fake_tensordict, capsys):
    root = tmp_path / "dump" / "exp_proj" / "GBS2_N1_in2_out4"
    for step in (3, 5):
        (root / str(step)).mkdir(parents=True)
        with open(root / str(step) / "gen_batch.dp", "wb") as f:
            pickle.dump(dataproto(step), f)
    (root / "7" / "0").mkdir(parents=True)  # RolloutTqSkip: {step}/{inner_idx}/tq_batch.pt
    tq = {"tensordict": dict(dataproto(7).batch), "tags": ["a"], "keys": ["input_ids"],
          "global_steps": 7}  # fmt: skip
    torch.save(tq, root / "7" / "0" / "tq_batch.pt")
    out = tmp_path / "golden"
    # Without the flag nothing is written, and the error says which file and why.
    assert import_(tmp_path / "dump", out) == 2
    err = capsys.readouterr().err
    assert "gen_batch.dp: cannot be loaded without full unpickling" in err
    assert "unpickling runs code" in err and "--trust-pickle" in err
    assert not out.exists()

    assert import_(tmp_path / "dump", out, "--trust-pickle") == 0
    assert "-> rollout-rollout-step000005.safetensors" in capsys.readouterr().out
    for step in (3, 5):
        same(dataproto(step), replay(out, step))
    same(tq, replay(out, 7))  # a plain torch.save: loaded with weights_only=True
    assert main(["verify", str(out)]) == 0


def test_roll_train_and_val_pickles(tmp_path, fake_tensordict):
    for split, step in (("train", 0), ("train", 1), ("val", 0)):
        (tmp_path / "dump" / split).mkdir(parents=True, exist_ok=True)
        with open(tmp_path / "dump" / split / f"step_{step:06d}.pkl", "wb") as f:
            pickle.dump(dataproto(step + (10 if split == "val" else 0)), f)
    out = tmp_path / "golden"
    assert import_(tmp_path / "dump", out, "--trust-pickle") == 0
    same(dataproto(1), replay(out, 1))
    same(dataproto(10), replay(out, 0, name="val"))
    assert main(["verify", str(out)]) == 0


def test_nexrl_trajectory_and_per_rank_micro_forward_dumps(tmp_path, capsys):
    dump = tmp_path / "debug_dump"
    for kind in ("trajectory", "forward_data", "loss"):
        (dump / kind).mkdir(parents=True)
    trajectory = {"input_ids": torch.arange(12).view(2, 6), "loss_mask": torch.ones(2, 6)}
    torch.save(trajectory, dump / "trajectory" / "step_000002.pt")
    forward = {}
    for rank in (0, 1):
        for micro in (0, 1):
            forward[rank, micro] = {"log_probs": -torch.rand(2, 6), "entropy": torch.rand(2, 6)}
            torch.save(
                forward[rank, micro],
                dump / "forward_data" / f"step_000002_rank{rank}_micro{micro}.pt",
            )
    loss = {"loss": torch.tensor(0.5), "pg_loss": torch.tensor(0.25)}
    torch.save(loss, dump / "loss" / "step_000002.pt")
    out = tmp_path / "golden"
    # Plain torch.save files load with weights_only=True: no --trust-pickle needed.
    assert import_(dump, out) == 0

    def check(drift: float) -> list[str]:
        with Golden(out, mode=Mode.STRICT) as g:
            same(trajectory, g.rollout(lambda: pytest.fail("generated"), step=2))
            verdicts = []
            for (rank, micro), value in forward.items():
                value = {k: v + drift if (rank, micro, k) == (1, 0, "entropy") else v
                         for k, v in value.items()}  # fmt: skip
                results = g.check_tensors("forward_data", value, step=2, rank=rank, micro=micro)
                verdicts += [r.verdict for r in results]
            verdicts += [r.verdict for r in g.check_tensors("loss", loss, step=2)]
            return verdicts

    assert check(0.0) == ["pass"] * 10
    with pytest.raises(AssertionError, match="forward_data/entropy"):
        check(1e-3)  # a drifted forward value fails against the imported golden
    assert main(["verify", str(out)]) == 0


def test_areal_lists_of_dicts_per_dp_rank(tmp_path):
    dump = tmp_path / "dump"
    dump.mkdir()
    whole = [
        {"input_ids": torch.arange(4) + i, "rewards": torch.tensor(float(i))} for i in range(3)
    ]
    torch.save(whole, dump / "step_000004.pt")
    torch.save(whole[:1], dump / "step_000004_dp_1.pt")
    out = tmp_path / "golden"
    assert import_(dump, out) == 0
    same(whole, replay(out, 4))
    same(whole[:1], replay(out, 4, name="rollout_dp1"))
    assert main(["verify", str(out)]) == 0


def test_slime_samples_take_the_step_from_rollout_id(tmp_path, capsys):
    dump = tmp_path / "dump"
    dump.mkdir()
    samples = [SampleLike(i, [1, 2, i], 0.5 * i, -torch.rand(3)) for i in range(2)]
    torch.save({"rollout_id": 9, "samples": samples}, dump / "rollout_data.pt")
    out = tmp_path / "golden"
    assert import_(dump, out, "--layout", "slime") == 2
    assert "weights_only=True" in capsys.readouterr().err  # a dataclass needs unpickling
    assert import_(dump, out, "--layout", "slime", "--trust-pickle") == 0
    replayed = replay(out, 9)
    assert replayed["rollout_id"] == 9
    same(samples, replayed["samples"])
    assert main(["verify", str(out)]) == 0


def test_imported_golden_replays_in_the_plugin(project, tmp_path):
    dump = tmp_path / "dump" / "trajectory"
    dump.mkdir(parents=True)
    torch.save({"input_ids": torch.arange(6).view(2, 3)}, dump / "step_000000.pt")
    target = project.golden / "test_it" / "test_replay"
    assert import_(tmp_path / "dump", target) == 0
    project.write(
        "import pytest\n"
        "def test_replay(golden):\n"
        "    batch = golden.rollout(lambda: pytest.fail('generated'), step=0)\n"
        "    golden.check({'total': float(batch['input_ids'].sum())})\n"
    )
    result = project.run("--golden-strict")
    result.assert_outcomes(failed=1)  # strict: the metric was never recorded...
    assert "metric 'total'" in result.stdout.str() and "generated" not in result.stdout.str()
    project.run().assert_outcomes(passed=1)  # ...auto records it next to the imported rollout
    project.run("--golden-strict").assert_outcomes(passed=1)


def test_existing_golden_is_never_overwritten(tmp_path, capsys):
    dump = tmp_path / "dump" / "trajectory"
    dump.mkdir(parents=True)
    torch.save({"x": torch.ones(2)}, dump / "step_000000.pt")
    out = tmp_path / "golden"
    assert import_(tmp_path / "dump", out) == 0
    before = (out / "manifest.json").read_bytes()
    assert import_(tmp_path / "dump", out) == 2
    assert "a golden exists already" in capsys.readouterr().err
    assert (out / "manifest.json").read_bytes() == before


def test_a_pickle_naming_a_missing_class_is_a_clear_error(tmp_path, capsys):
    dump = tmp_path / "dump" / "train"
    dump.mkdir(parents=True)
    # A pickle of a class from a module this environment does not have (as a ROLL dump
    # read without ROLL installed): protocol 2, GLOBAL "no_such_framework.protocol DataProto".
    payload = b"\x80\x02cno_such_framework.protocol\nDataProto\nq\x00)\x81q\x01."
    (dump / "step_000000.pkl").write_bytes(payload)
    assert import_(tmp_path / "dump", tmp_path / "golden", "--trust-pickle") == 2
    err = capsys.readouterr().err
    assert "step_000000.pkl: cannot be loaded (ModuleNotFoundError" in err
    assert "needs the classes it names to be importable" in err
    assert not (tmp_path / "golden").exists()


def test_verl_tq_batch_with_the_real_tensordict(tmp_path, capsys):
    """tensordict 0.10.0 where installed (.ci/run: pip install --no-deps tensordict==0.10.0 ...)."""
    tensordict = pytest.importorskip("tensordict")
    step_dir = tmp_path / "dump" / "GBS2_N1_in2_out4" / "6" / "0"
    step_dir.mkdir(parents=True)
    td = tensordict.TensorDict(
        {"input_ids": torch.arange(8).view(2, 4), "old_log_probs": -torch.rand(2, 4)},
        batch_size=[2],
    )
    payload = {"tensordict": td, "tags": [{"status": "ok"}] * 2, "keys": ["input_ids"],
               "global_steps": 6}  # fmt: skip
    torch.save(payload, step_dir / "tq_batch.pt")
    out = tmp_path / "golden"
    assert import_(tmp_path / "dump", out) == 2
    err = capsys.readouterr().err
    assert "it names tensordict." in err and "which is not an allowed type" in err
    assert import_(tmp_path / "dump", out, "--trust-pickle") == 0
    replayed = replay(out, 6)
    assert isinstance(replayed["tensordict"], tensordict.TensorDict)
    assert replayed["tensordict"].batch_size == torch.Size([2])
    for key in ("input_ids", "old_log_probs"):
        assert torch.equal(replayed["tensordict"][key], td[key])
    assert replayed["tags"] == payload["tags"] and replayed["global_steps"] == 6


class _Payload:
    """A pickle that creates a file when it is loaded: what a malicious dump would do."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.mark.parametrize("layout", ["roll-pickle", "areal-torch-save"])
def test_a_code_running_dump_never_runs_without_trust_pickle(tmp_path, capsys, layout):
    marker = tmp_path / "code-ran"
    if layout == "roll-pickle":
        dump = tmp_path / "dump" / "train"
        dump.mkdir(parents=True)
        with open(dump / "step_000000.pkl", "wb") as f:
            pickle.dump({"x": torch.zeros(2), "evil": _Payload(marker)}, f)
    else:
        dump = tmp_path / "dump"
        dump.mkdir()
        torch.save([{"x": torch.zeros(2), "evil": _Payload(marker)}], dump / "step_000000.pt")
    assert not marker.exists()  # writing the dump ran nothing
    assert import_(tmp_path / "dump", tmp_path / "golden") == 2
    assert "--trust-pickle" in capsys.readouterr().err
    assert not marker.exists(), "loading the dump ran its code without --trust-pickle"
    assert not (tmp_path / "golden").exists()
    import_(tmp_path / "dump", tmp_path / "golden", "--trust-pickle")  # the control: it is real
    assert marker.exists()


def test_nan_payloads_in_meta_info_and_non_tensor_fields_import_bit_for_bit(
    tmp_path, fake_tensordict
):
    import struct

    payload = struct.unpack("<d", struct.pack("<Q", 0x7FF8000000000123))[0]
    marker = np.array(0x7FC00042, dtype=np.uint32).view(np.float32)[()]
    batch = dataproto(2)
    batch.meta_info.update({"skipped": payload, "score": marker, "neg": -math.nan})
    batch.non_tensor_batch["score"] = np.array([marker, np.float32(0.5)], dtype=object)
    (tmp_path / "dump" / "2").mkdir(parents=True)
    with open(tmp_path / "dump" / "2" / "gen_batch.dp", "wb") as f:
        pickle.dump(batch, f)
    assert import_(tmp_path / "dump", tmp_path / "golden", "--trust-pickle") == 0
    back = replay(tmp_path / "golden", 2)
    bits = [struct.pack("<d", back.meta_info[k]) for k in ("skipped", "neg")]
    assert bits == [struct.pack("<d", payload), struct.pack("<d", -math.nan)]
    for got in (back.meta_info["score"], back.non_tensor_batch["score"][0]):
        assert type(got) is np.float32 and np.array(got).view(np.uint32) == 0x7FC00042
