"""rollout-golden diff and show on keyed samples (golden.rollout_samples): samples compared
and named by their keys, so two recordings that differ only in completion order are equal
and a changed sample is named by its key, not its position in key order."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from pytest_rollout_golden import Golden, Mode
from pytest_rollout_golden.cli import main

KEYS = [("p0", 0), ("p0", 1), ("p1", 0), ("p1", 1)]
FILE = "rollout-rollout-step000000.safetensors"


def sample(key: tuple[str, int], changed: tuple[str, int] | None) -> dict:
    uid, index = key
    ids = torch.tensor([int(uid[1:]), index, 7])
    logprob = -0.25 * (index + 1)
    if key == changed:
        ids[2] += 1
        logprob -= 0.5
    return {"uid": uid, "index": index, "token_ids": ids, "logprob": logprob}


def record(directory: Path, order: list, *, changed=None, extra=()) -> Path:
    """A golden of one keyed rollout whose samples completed in ``order``."""
    with Golden(directory, mode=Mode.AUTO) as golden:
        golden.rollout_samples(
            lambda: [sample(k, changed) for k in [*order, *extra]],
            key=lambda s: (s["uid"], s["index"]),
        )
    return directory


def diff_json(capsys, a: Path, b: Path) -> tuple[int, dict]:
    code = main(["diff", str(a), str(b), "--no-config", "--json"])
    return code, json.loads(capsys.readouterr().out)["goldens"][0]


def test_samples_that_differ_only_in_completion_order_are_equal(tmp_path, capsys):
    a = record(tmp_path / "a", KEYS)
    b = record(tmp_path / "b", KEYS[::-1])
    code, golden = diff_json(capsys, a, b)
    assert (code, golden["problems"], golden["differences"]) == (0, [], 0)
    assert main(["diff", str(a / FILE), str(b / FILE), "--no-config"]) == 0
    assert "within tolerance" in capsys.readouterr().out


def test_a_changed_sample_is_named_by_its_key_and_field(tmp_path, capsys):
    a = record(tmp_path / "a", KEYS)
    b = record(tmp_path / "b", KEYS[::-1], changed=("p1", 0))
    code, golden = diff_json(capsys, a, b)
    assert code == 1
    beyond = [t["name"] for t in golden["tensors"] if not t["ok"]]
    assert beyond == ["rollout/samples/('p1', 0)/token_ids"]
    assert golden["first_divergence"]["rollout/samples/('p1', 0)/token_ids"] == 0
    assert golden["problems"] == [
        f"{FILE}: non-tensor values or structure differ: samples/('p1', 0)/logprob"
    ]
    assert main(["diff", str(a), str(b), "--no-config"]) == 1
    out = capsys.readouterr().out
    assert "rollout/samples/('p1', 0)/token_ids" in out and "samples/2" not in out


def test_an_added_key_is_named_and_no_other_sample_moves(tmp_path, capsys):
    a = record(tmp_path / "a", KEYS)
    b = record(tmp_path / "b", KEYS, extra=[("p0", 2)])  # sorts before ('p1', 0)
    code, golden = diff_json(capsys, a, b)
    assert code == 1
    differing = [t["name"] for t in golden["tensors"] if not t["ok"]]
    assert differing == ["rollout/samples/('p0', 2)/token_ids"]
    only = next(t for t in golden["tensors"] if t["name"] == differing[0])
    assert only["detail"] == f"only in B ({FILE})"
    assert golden["problems"] == [
        f"{FILE}: non-tensor values or structure differ: samples/('p0', 2)"
    ]


def test_show_names_each_sample_and_the_completion_order_by_key(tmp_path, capsys):
    a = record(tmp_path / "a", KEYS[::-1])
    for path in (a, a / FILE):
        assert main(["show", str(path)]) == 0
        out = capsys.readouterr().out
        assert "samples/('p1', 0)/token_ids" in out and "samples/('p1', 0)/logprob" in out
        assert "samples/2/" not in out
        assert main(["show", str(path), "--json"]) == 0
        document = json.loads(capsys.readouterr().out)
        files = document["files"][FILE] if "files" in document else document
        assert "samples/('p1', 0)/token_ids" in files["tensors"]
        assert files["values"]["samples/('p1', 0)/logprob"]["value"] == "-0.25"
        completed = [repr(k) for k in KEYS[::-1]]  # the completion order, by key
        assert files["values"]["completed"]["value"] == repr(completed)
