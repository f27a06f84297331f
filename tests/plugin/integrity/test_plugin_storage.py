"""Damaged goldens through pytest: corrupted, truncated, foreign and pickle files fail clearly."""

from __future__ import annotations

import json
import pickle

import pytest
import torch

TRAIN = """
import torch


def test_train(golden, generated):
    batch = golden.rollout(lambda: generated("rollout", {"x": torch.linspace(0, 1, 64)}))
    golden.check({"pg_loss": float(batch["x"].sum())})
    golden.check_tensors("actor", {"log_probs": batch["x"] * 2})
"""
ROLLOUT = "rollout-rollout-step000000.safetensors"
TENSORS = "tensors-actor-step000000.safetensors"
REMEDY = "run `pytest --update-golden` locally and commit the golden/ directory"


class Payload:
    """Unpickling this creates ``path``: proof that a pickle was (or was not) executed."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return open, (self.path, "w")


@pytest.fixture
def recorded(project):
    project.write(TRAIN)
    project.run().assert_outcomes(passed=1)
    assert project.calls() == ["rollout"]
    return project


def flip_bit(path, offset_from_end: int) -> None:
    data = bytearray(path.read_bytes())
    data[-offset_from_end] ^= 0x01
    path.write_bytes(bytes(data))


def assert_refused(project, filename: str, *phrases: str) -> pytest.RunResult:
    """The replay fails naming the file and the remedy, without calling the generator."""
    result = project.run()
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert f"golden/test_it/test_train/{filename}" in out
    assert REMEDY in out
    for phrase in phrases:
        assert phrase in out
    assert "FileNotFoundError" not in out and "UnpicklingError" not in out
    assert project.calls() == [], "a damaged golden must not be silently re-recorded"
    assert project.counts(result)["failed"] == 1
    return result


@pytest.mark.parametrize("filename", [ROLLOUT, TENSORS])
def test_bit_flip_in_tensor_data(recorded, filename):
    flip_bit(recorded.golden_dir("test_train") / filename, 5)
    assert_refused(recorded, filename, "checksum does not match")


def test_bit_flip_in_metrics_json(recorded):
    path = recorded.golden_dir("test_train") / "metrics.json"
    path.write_text(path.read_text().replace("32.0", "32.5"))  # a plausible hand edit
    assert_refused(recorded, "metrics.json", "checksum differs")


def test_truncated_rollout(recorded):
    path = recorded.golden_dir("test_train") / ROLLOUT
    path.write_bytes(path.read_bytes()[:-7])
    assert_refused(recorded, ROLLOUT, "truncated")


def test_file_missing_from_the_golden(recorded):
    (recorded.golden_dir("test_train") / ROLLOUT).unlink()
    assert_refused(recorded, ROLLOUT)


@pytest.mark.parametrize("protocol", [0, 2, pickle.HIGHEST_PROTOCOL])
@pytest.mark.parametrize("filename", [ROLLOUT, "metrics.json", "manifest.json"])
def test_pickle_in_place_of_a_golden_file_is_never_unpickled(
    recorded, tmp_path, filename, protocol
):
    control = tmp_path / "control"
    pickle.loads(pickle.dumps(Payload(control), protocol=protocol))
    assert control.exists(), "the payload works when unpickled"

    marker = tmp_path / "executed"
    target = recorded.golden_dir("test_train") / filename
    target.write_bytes(pickle.dumps(Payload(marker), protocol=protocol))
    phrases = ("is a pickle file",) if protocol >= 2 else ()
    assert_refused(recorded, filename, *phrases)
    assert not marker.exists(), "the pickle payload ran"


def test_torch_save_archive_in_place_of_a_rollout(recorded):
    target = recorded.golden_dir("test_train") / ROLLOUT
    torch.save({"x": torch.linspace(0, 1, 64)}, target)
    assert_refused(recorded, ROLLOUT, "zip archive")


def test_manifest_of_a_newer_schema(recorded):
    path = recorded.golden_dir("test_train") / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["schema"] = 99
    path.write_text(json.dumps(manifest))
    assert_refused(recorded, "manifest.json", "schema version 99", "upgrade")


@pytest.mark.parametrize("filename", [ROLLOUT, TENSORS, "metrics.json", "manifest.json"])
def test_update_golden_repairs_a_damaged_golden(recorded, filename):
    """The remedy every error message gives must work."""
    flip_bit(recorded.golden_dir("test_train") / filename, 5)
    result = recorded.run("--update-golden")
    result.assert_outcomes(passed=1)
    # The rollout is an input: kept unless it (or the manifest listing it) is the damage.
    assert recorded.calls() == (["rollout"] if filename in (ROLLOUT, "manifest.json") else [])
    recorded.run("--golden-strict").assert_outcomes(passed=1)
