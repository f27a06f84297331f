"""Golden lanes through :class:`Golden` without pytest: one set of inputs, values per lane."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from pytest_rollout_golden import Golden, GoldenMismatch, GoldenMissingError, Mode, fingerprint
from pytest_rollout_golden._internal.golden.lanes import (
    LaneSetting,
    base_lane,
    environment_lane,
    lane_problem,
    other_lanes,
    resolve_setting,
)
from pytest_rollout_golden._internal.tolerance.stack import Layer
from pytest_rollout_golden.errors import GoldenError, GoldenFormatError
from pytest_rollout_golden.store.location import find_goldens


def _batch() -> dict[str, torch.Tensor]:
    return {"ids": torch.arange(6).reshape(2, 3), "logp": torch.linspace(-2, -0.1, 6)}


def _never() -> dict[str, torch.Tensor]:
    raise AssertionError("a lane replays the recorded inputs: generate must not run")


def _run(directory: Path, lane: LaneSetting | None, loss: float, *, mode=Mode.AUTO, gen=_batch):
    with Golden(directory, mode=mode, lane=lane, test_id="t") as golden:
        batch = golden.rollout(gen, step=0)
        golden.check({"pg_loss": loss + float(batch["logp"].sum()) * 0}, step=0)
        golden.check_tensors("fwd", {"logp": batch["logp"] * (1 + loss)}, step=0)
    return golden.outcome


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(directory)): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file() and "@lanes" not in p.parts
    }


CPU, GPU = LaneSetting("cpu", "test"), LaneSetting("gpu", "test")


def test_a_second_lane_records_beside_the_inputs_and_never_touches_them(tmp_path: Path):
    d = tmp_path / "g"
    _run(d, CPU, 0.5)
    manifest = json.loads((d / "manifest.json").read_text())
    assert manifest["lane"] == "cpu"
    before = _snapshot(d)

    outcome = _run(d, GPU, 0.6, gen=_never)
    assert outcome.lane == {"name": "gpu", "source": "test", "base": "cpu"}
    assert _snapshot(d) == before
    lane = json.loads((d / "@lanes" / "gpu" / "manifest.json").read_text())
    assert lane["lane"] == "gpu"
    assert set(lane["inputs"]) == {"rollout-rollout-step000000.safetensors"}
    assert (
        lane["inputs"]["rollout-rollout-step000000.safetensors"]
        == (manifest["files"]["rollout-rollout-step000000.safetensors"]["digest"])
    )
    assert not any(name.startswith("rollout") for name in lane["files"])
    assert other_lanes(d) == ["gpu"]
    assert find_goldens(tmp_path) == [d]

    # each lane replays its own values
    _run(d, CPU, 0.5, mode=Mode.STRICT, gen=_never)
    _run(d, GPU, 0.6, mode=Mode.STRICT, gen=_never)
    with pytest.raises(GoldenMismatch, match="pg_loss"):
        _run(d, GPU, 0.5, mode=Mode.STRICT, gen=_never)
    with pytest.raises(GoldenMismatch, match="pg_loss"):
        _run(d, CPU, 0.6, mode=Mode.STRICT, gen=_never)


def test_updating_one_lane_leaves_the_other_and_the_inputs(tmp_path: Path):
    d = tmp_path / "g"
    _run(d, CPU, 0.5)
    _run(d, GPU, 0.6, gen=_never)
    before = _snapshot(d)
    _run(d, GPU, 0.7, mode=Mode.UPDATE, gen=_never)
    assert _snapshot(d) == before
    _run(d, GPU, 0.7, mode=Mode.STRICT, gen=_never)
    _run(d, CPU, 0.5, mode=Mode.STRICT, gen=_never)

    lane_files = sorted((d / "@lanes" / "gpu").rglob("*"))
    _run(d, CPU, 0.4, mode=Mode.UPDATE, gen=_never)
    assert sorted((d / "@lanes" / "gpu").rglob("*")) == lane_files
    _run(d, GPU, 0.7, mode=Mode.STRICT, gen=_never)


def test_a_lane_never_recorded_fails_in_strict_mode_naming_it(tmp_path: Path):
    d = tmp_path / "g"
    _run(d, CPU, 0.5)
    with pytest.raises(GoldenMissingError) as info:
        _run(d, GPU, 0.5, mode=Mode.STRICT, gen=_never)
    text = str(info.value)
    assert "has no lane 'gpu' (test); it holds lane cpu" in text
    assert "--golden-lane gpu" in text and "golden_lane_fallback" in text
    assert not (d / "@lanes").exists()


def test_a_declared_fallback_compares_under_its_tolerances_and_says_so(tmp_path: Path):
    d = tmp_path / "g"
    _run(d, CPU, 0.5)
    loose = Layer("ini golden_lane_fallback_tolerances", {"*": {"rtol": 0.05}})
    lane = LaneSetting("gpu", "test", fallback="cpu", fallback_tolerances=loose)
    outcome = _run(d, lane, 0.51, mode=Mode.STRICT, gen=_never)
    assert outcome.lane["fallback"] == "cpu"
    assert all(
        c.tolerance_source.startswith(f"rtol from {loose.source}") for c in outcome.comparisons
    )
    with pytest.raises(GoldenMismatch) as info:
        _run(d, lane, 0.6, mode=Mode.STRICT, gen=_never)
    assert "compared against lane 'cpu' (golden_lane_fallback)" in str(info.value)
    assert not (d / "@lanes").exists()

    missing = LaneSetting("gpu", "test", fallback="h100")
    with pytest.raises(GoldenMissingError, match="fallback lane 'h100'"):
        _run(d, missing, 0.5, mode=Mode.STRICT, gen=_never)


def test_a_lane_cannot_record_inputs(tmp_path: Path):
    d = tmp_path / "g"
    _run(d, CPU, 0.5)
    golden = Golden(d, lane=GPU, test_id="t")
    with pytest.raises(GoldenMissingError, match="records values only"), golden:
        golden.rollout(_batch, step=1)
    assert _run(d, CPU, 0.5, mode=Mode.STRICT, gen=_never).status is not None


def test_regenerating_inputs_that_other_lanes_use_is_refused(tmp_path: Path):
    d = tmp_path / "g"
    _run(d, CPU, 0.5)
    _run(d, GPU, 0.6, gen=_never)
    for lane in (CPU, GPU, None):
        golden = Golden(d, mode=Mode.UPDATE, regenerate=True, lane=lane)
        with pytest.raises(GoldenError, match="golden-regenerate"), golden:
            golden.rollout(_batch, step=0)


def test_a_lane_computed_on_other_inputs_is_refused(tmp_path: Path):
    d = tmp_path / "g"
    _run(d, CPU, 0.5)
    _run(d, GPU, 0.6, gen=_never)
    shutil.move(d / "@lanes", tmp_path / "lanes")

    def other() -> dict[str, torch.Tensor]:
        return {"ids": torch.arange(6).reshape(2, 3), "logp": torch.linspace(-3, -0.1, 6)}

    with Golden(d, mode=Mode.UPDATE, regenerate=True, lane=CPU) as golden:
        golden.rollout(other, step=0)
        golden.check({"pg_loss": 0.5})
    shutil.move(tmp_path / "lanes", d / "@lanes")
    with pytest.raises(GoldenFormatError, match="computed on other inputs"):
        _run(d, GPU, 0.6, mode=Mode.STRICT, gen=_never)
    _run(d, GPU, 0.6, mode=Mode.UPDATE, gen=_never)  # the remedy
    _run(d, GPU, 0.6, mode=Mode.STRICT, gen=_never)


def test_lanes_off_replays_the_values_beside_the_inputs(tmp_path: Path):
    d = tmp_path / "g"
    _run(d, CPU, 0.5)
    _run(d, GPU, 0.6, gen=_never)
    outcome = _run(d, None, 0.5, mode=Mode.STRICT, gen=_never)
    assert outcome.lane == {}


def test_a_golden_recorded_before_lanes_is_the_lane_of_its_fingerprint(tmp_path: Path):
    d = tmp_path / "g"
    _run(d, None, 0.5)
    manifest = json.loads((d / "manifest.json").read_text())
    assert "lane" not in manifest
    here = environment_lane(manifest["fingerprint"])  # cpu, or this machine's GPU
    assert base_lane(manifest) == here in ("cpu", environment_lane(fingerprint()))
    outcome = _run(d, LaneSetting(here, "test"), 0.5, mode=Mode.STRICT, gen=_never)
    assert outcome.lane["base"] == here
    assert not (d / "@lanes").exists()


@pytest.mark.parametrize(
    ("fingerprint", "lane"),
    [
        ({"cuda": None, "device": "cpu (x86_64)"}, "cpu"),
        ({"cuda": "12.8", "device": "NVIDIA H100 80GB HBM3", "capability": "9.0"}, "cuda-sm90"),
        ({"cuda": "12.8", "device": "NVIDIA H200"}, "cuda-sm90"),
        ({"cuda": "12.8", "device": "NVIDIA A100-SXM4-80GB"}, "cuda-sm80"),
        ({"cuda": "12.8", "device": "Some Future GPU"}, "cuda"),
        (
            {"cuda": None, "hip": "6.2", "device": "AMD", "gpu_arch": "gfx942:sramecc+"},
            "rocm-gfx942",
        ),
        (None, None),
    ],
)
def test_the_lane_of_an_environment(fingerprint, lane):
    assert environment_lane(fingerprint) == lane


def test_lane_settings_resolve_in_order_and_refuse_bad_names():
    assert resolve_setting(None, None, {}) == (None, "")
    assert resolve_setting(None, "auto", {}) == ("auto", "ini golden_lane = auto")
    env = {"ROLLOUT_GOLDEN_LANE": "h100"}
    assert resolve_setting(None, "cpu", env) == ("h100", "ROLLOUT_GOLDEN_LANE")
    assert resolve_setting("a100", "cpu", env) == ("a100", "--golden-lane")
    for bad in ("../x", "CPU", "a/b", "@lanes", "x" * 65):
        assert lane_problem(bad) is not None
    with pytest.raises(ValueError, match=r"--golden-lane: '\.\./x' is not a lane name"):
        resolve_setting("../x", None, {})


def test_a_crafted_lane_field_is_a_format_error(tmp_path: Path):
    from pytest_rollout_golden import store

    d = tmp_path / "g"
    _run(d, CPU, 0.5)
    path = d / "manifest.json"
    original = json.loads(path.read_text())
    for field, value in (("lane", "../../x"), ("lane", 3), ("inputs", ["a"])):
        manifest = dict(original)
        manifest[field] = value
        path.write_text(json.dumps(manifest))
        with pytest.raises(GoldenFormatError, match=field):
            store.read_manifest(d)
