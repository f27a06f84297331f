"""rollout-golden import: what an error says of a file that is not what its layout reads, and the
names ``dumps.checked_tensors`` gives a strict ``check_tensors`` of an imported NexRL dump."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch

from pytest_rollout_golden import Golden, GoldenError, Mode, dumps
from pytest_rollout_golden.cli import main

SAFETENSORS_HEAD = struct.pack("<Q", 2) + b"{}"
NOT_PICKLES = {
    "json": (b'{"rollout_id": 4, "samples": []}\n', 'it is JSON text (it starts \'{"rollout_id"'),
    "text": (b"rollout 4 was not dumped: out of disk\n", "it is text (it starts 'rollout 4 was"),
    "empty": (b"", "it is empty"),
    "binary": (bytes([0, 1, 0xFF, 0xFE, 0x10, 0x99]), "it is binary data of an unknown format"),
    "safetensors": (SAFETENSORS_HEAD, "it is a safetensors file"),
}
FOREIGN = ("UnpicklingError", "EOFError", "raw pickle", "invalid load key", "Memo value")


def import_(source: Path, target: Path, *extra: str) -> int:
    return main(["import", str(source), "-o", str(target), *extra])


@pytest.mark.parametrize("trust", [False, True], ids=["untrusted", "trusted"])
@pytest.mark.parametrize("kind", sorted(NOT_PICKLES))
def test_a_file_that_is_no_pickle_is_described_by_what_it_is(tmp_path, capsys, kind, trust):
    """slime's step is in the file name: the error starts with it before the file is read."""
    content, said = NOT_PICKLES[kind]
    path = tmp_path / "dump" / "rollout_data" / "4.pt"
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    extra = ["--trust-pickle"] if trust else []
    assert import_(tmp_path / "dump", tmp_path / "golden", "--layout", "slime", *extra) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: step 4, {path}: "), err
    assert said in err, err
    assert "move it out of the dump folder" in err
    for foreign in FOREIGN:
        assert foreign not in err, err
    assert not (tmp_path / "golden").exists()


def test_a_roll_pickle_that_is_json_says_so(tmp_path, capsys):
    path = tmp_path / "dump" / "step_3.pkl"
    path.parent.mkdir()
    path.write_text('[{"prompt": "1+1"}]')
    assert import_(tmp_path / "dump", tmp_path / "golden", "--trust-pickle") == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: step 3, {path}: not a pickle: it is JSON text"), err


@pytest.mark.parametrize(
    ("rel", "layout"),
    [("loss/step_000001_rank0_micro0.jsonl", "nexrl"), ("rollout/1/0.jsonl", "areal"),
     ("train_data_step1.jsonl", "nemo-rl"), ("rollout_data/1.jsonl", "verl")],
)  # fmt: skip
def test_a_jsonl_file_that_is_a_torch_archive_says_so(tmp_path, capsys, rel, layout):
    path = tmp_path / "dump" / rel
    path.parent.mkdir(parents=True)
    torch.save({"loss": torch.zeros(2)}, path)
    assert import_(tmp_path / "dump", tmp_path / "golden", "--layout", layout) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: step 1, {path}: not JSON lines: it is a zip archive"), err
    assert "UnicodeDecodeError" not in err and "move it out of the dump folder" in err


def test_a_jsonl_file_that_turns_binary_names_the_line(tmp_path, capsys):
    path = tmp_path / "logs" / "train_data_step2.jsonl"
    path.parent.mkdir()
    path.write_bytes(b'{"idx": 0}\n{"idx": 1, "content": "\xff\xfe"}\n')
    assert import_(tmp_path / "logs", tmp_path / "golden") == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: step 2, {path}: line 2 is not UTF-8 text"), err


# --- NexRL: the names a strict check_tensors expects -----------------------------------


def nexrl_dumps(root: Path) -> dict[str, dict]:
    """The dicts NexRL's DataDumper saves (nexrl/utils/data_dumper.py@6860191994413876a9d7f1431
    d79c29d114a12e6), bookkeeping included: step, rank, micro_idx, *_shape, statistics."""
    lp, ent = -torch.rand(2, 5, generator=torch.Generator().manual_seed(0)), torch.rand(2, 5)
    w = torch.randn(4, 3, generator=torch.Generator().manual_seed(1)).bfloat16()
    saved = {
        "forward_data/step_000003_rank0_micro1": {
            "step": 3, "rank": 0, "micro_idx": 1, "log_probs": lp, "entropy": ent,
            "response_mask": torch.ones(2, 5, dtype=torch.int64),
            "log_probs_shape": list(lp.shape), "entropy_shape": list(ent.shape)},
        "loss/step_000003_rank0_micro1": {
            "step": 3, "rank": 0, "micro_idx": 1, "loss": 0.25, "pg_loss": 0.125,
            "metrics": {"actor/pg_clipfrac": 0.0625},
            "extra_info": {"epoch": 0, "batch_idx": 1, "first_1000_entropy_loss": 1 / 3}},
        "param/step_000003_rank0": {
            "step": 3, "rank": 0, "param_name": "w", "param": w, "shape": [4, 3],
            "dtype": "torch.bfloat16", "norm": float(w.float().norm()), "mean": 0.5, "std": 1.0},
        "old_log_probs/step_000003": {
            "step": 3, "old_log_probs": lp, "shape": [2, 5],
            "batch_info": {"batch_size": 2, "input_ids_shape": [2, 9]}},
    }  # fmt: skip
    for name, data in saved.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        torch.save(data, root / f"{name}.pt")
    return saved


def test_checked_tensors_gives_exactly_the_names_a_strict_check_expects(tmp_path):
    """``flatten`` of the loaded dump names its bookkeeping too (``step``, ``rank``,
    ``micro_idx``, ``*_shape``), which import keeps as metadata: a strict check of those
    fails as never recorded. ``checked_tensors`` drops what import dropped."""
    saved = nexrl_dumps(tmp_path / "dump")
    assert import_(tmp_path / "dump", tmp_path / "golden") == 0
    where = {"forward_data": {"rank": 0, "micro": 1}, "loss": {"rank": 0, "micro": 1},
             "param": {"rank": 0}, "old_log_probs": {}}  # fmt: skip
    with Golden(tmp_path / "golden", mode=Mode.STRICT) as g:
        for name in saved:
            kind = name.split("/")[0]
            loaded = torch.load(tmp_path / "dump" / f"{name}.pt", weights_only=True)
            checked = dumps.checked_tensors(kind, loaded)
            assert "step" not in checked and not any(k.endswith("_shape") for k in checked)
            verdicts = g.check_tensors(kind, checked, step=3, **where[kind])
            assert {r.verdict for r in verdicts} == {"pass"}, kind
    assert sorted(dumps.checked_tensors("loss", saved["loss/step_000003_rank0_micro1"])) == [
        "extra_info/first_1000_entropy_loss", "loss", "metrics/actor/pg_clipfrac", "pg_loss",
    ]  # fmt: skip
    everything = dumps.flatten(saved["forward_data/step_000003_rank0_micro1"])
    assert {"step", "rank", "micro_idx", "log_probs_shape"} <= set(everything)
    failed = pytest.raises(AssertionError, match="never recorded")
    with failed, Golden(tmp_path / "golden", mode=Mode.STRICT) as g:
        g.check_tensors("forward_data", everything, step=3, rank=0, micro=1)


@pytest.mark.parametrize(("kind", "said"), [("trajectory", "golden.rollout"),
                                            ("logits", "forward_data")])  # fmt: skip
def test_checked_tensors_refuses_a_kind_import_does_not_check(kind, said):
    with pytest.raises(GoldenError, match=said):
        dumps.checked_tensors(kind, {"step": 1})


def test_checked_tensors_of_a_jsonl_dump_matches_import(tmp_path):
    record = {"step": 1, "rank": 0, "micro_idx": 0, "loss": 0.5, "pg_loss": 0.25}
    path = tmp_path / "dump" / "loss" / "step_000001_rank0_micro0.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(record) + "\n")
    assert import_(tmp_path / "dump", tmp_path / "golden") == 0
    with Golden(tmp_path / "golden", mode=Mode.STRICT) as g:
        checked = dumps.checked_tensors("loss", json.loads(path.read_text()))
        assert [r.verdict for r in g.check_tensors("loss", checked, step=1, rank=0, micro=0)] == [
            "pass", "pass"]  # fmt: skip
