"""Golden lanes through pytest: one golden serves two platforms, each with its own values."""

from __future__ import annotations

import json
import shutil
import sys

import pytest

TRAIN = """
import torch


def test_step(golden, values, generated):
    batch = golden.rollout(lambda: generated("rollout", {"x": torch.arange(4.0)}))
    golden.check({"pg_loss": values["loss"] * float(batch["x"].sum()) / 6.0})
"""


def _lanes(project) -> list[str]:
    folder = project.golden_dir("test_step") / "@lanes"
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def _base_files(project) -> dict[str, bytes]:
    return {k: v for k, v in project.golden_files().items() if "@lanes" not in k}


def test_two_lanes_record_replay_and_update_apart(project):
    project.write(TRAIN)
    project.set_values(loss=0.5)
    project.run("--golden-lane", "cpu").assert_outcomes(passed=1)
    manifest = json.loads((project.golden_dir("test_step") / "manifest.json").read_text())
    assert manifest["lane"] == "cpu"
    base = _base_files(project)

    project.set_values(loss=0.51)  # another platform's numbers
    recorded = project.run("--golden-lane", "gpu")
    recorded.assert_outcomes(passed=1)
    assert project.calls() == ["rollout"]  # only the first recording generated
    recorded.stdout.fnmatch_lines(["recorded test_it.py::test_step -> *test_step (lane gpu):"])
    assert _lanes(project) == ["gpu"] and _base_files(project) == base

    project.run("--golden-strict", "--golden-lane", "gpu").assert_outcomes(passed=1)
    failed = project.run("--golden-strict", "--golden-lane", "cpu")
    failed.assert_outcomes(failed=1)
    failed.stdout.fnmatch_lines(["*pg_loss*0.5*0.51*"])

    project.set_values(loss=0.52)
    project.run("--update-golden", "--golden-lane", "gpu").assert_outcomes(passed=1)
    assert _base_files(project) == base, "updating a lane never touches the inputs or the base"
    assert project.calls() == []
    project.run("--golden-strict", "--golden-lane", "gpu").assert_outcomes(passed=1)


def test_ci_without_the_lane_fails_naming_it_and_the_remedy(project, monkeypatch):
    project.write(TRAIN)
    project.set_values(loss=0.5)
    project.run("--golden-lane", "cpu").assert_outcomes(passed=1)
    monkeypatch.setenv("CI", "true")
    monkeypatch.setenv("ROLLOUT_GOLDEN_LANE", "cuda-sm90")
    failed = project.run()
    failed.assert_outcomes(failed=1)
    failed.stdout.fnmatch_lines(
        [
            "*has no lane 'cuda-sm90' (ROLLOUT_GOLDEN_LANE); it holds lane cpu.*",
            "*--golden-lane cuda-sm90*",
        ]
    )
    assert _lanes(project) == []


def test_a_declared_fallback_compares_under_its_tolerances_and_the_summary_says_so(project):
    project.write(TRAIN)
    project.set_values(loss=0.5)
    project.run("--golden-lane", "cpu").assert_outcomes(passed=1)
    project.pytester.makeini(
        """
        [pytest]
        golden_lane = cuda-sm90
        golden_lane_fallback = cpu
        golden_lane_fallback_tolerances = pg_loss:rtol=0.05
        """
    )
    project.set_values(loss=0.51)
    passed = project.run("--golden-strict")
    passed.assert_outcomes(passed=1)
    passed.stdout.fnmatch_lines(
        [
            "compared against another lane (golden_lane_fallback):",
            "*test_step: lane 'cuda-sm90' is not recorded: compared against lane 'cpu'*",
        ]
    )
    project.set_values(loss=0.6)
    failed = project.run("--golden-strict")
    failed.assert_outcomes(failed=1)
    failed.stdout.fnmatch_lines(["*rtol from ini golden_lane_fallback_tolerances*"])
    assert _lanes(project) == []


def test_auto_names_this_machines_lane(project):
    project.write(TRAIN)
    project.set_values(loss=0.5)
    project.run().assert_outcomes(passed=1)  # recorded before lanes: no lane field
    manifest = json.loads((project.golden_dir("test_step") / "manifest.json").read_text())
    assert "lane" not in manifest
    replayed = project.run("--golden-strict", "--golden-lane", "auto")
    replayed.assert_outcomes(passed=1)  # the golden's fingerprint says cpu, as does this run
    assert _lanes(project) == []


@pytest.mark.parametrize(
    ("args", "ini", "message"),
    [
        (["--golden-lane", "../up"], "", "*--golden-lane: '../up' is not a lane name*"),
        ([], "golden_lane_fallback = cpu", "*golden_lane_fallback*apply to lanes*"),
        ([], "golden_lane = Big", "*ini golden_lane: 'Big' is not a lane name*"),
    ],
)
def test_bad_lane_settings_stop_the_run(project, args, ini, message):
    project.write(TRAIN)
    project.pytester.makeini(f"[pytest]\n{ini}\n")
    result = project.run(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


CALIBRATED = """
import torch


def test_step(golden):
    batch = golden.rollout(lambda: {"x": torch.ones(4)})
    # a reduction-order noise of 1e-7 per thread count, as calibration perturbs it
    golden.check({"pg_loss": float(batch["x"].mean()) + 1e-7 * torch.get_num_threads()})
"""


def test_calibration_writes_into_the_runs_lane_only(project):
    project.write(CALIBRATED)
    project.run("--golden-lane", "cpu").assert_outcomes(passed=1)
    project.run("--golden-lane", "gpu").assert_outcomes(passed=1)
    base = _base_files(project)
    # no variants: no oracle run, 3 runs
    project.run("--golden-calibrate", "3", "--golden-lane", "gpu").assert_outcomes(passed=3)
    assert _base_files(project) == base, "calibrating one lane never touches another"
    assert _lanes(project) == ["gpu"]  # nothing to certify: no oracle lane
    lane = project.golden_dir("test_step") / "@lanes" / "gpu"
    manifest = json.loads((lane / "manifest.json").read_text())
    assert manifest["lane"] == "gpu" and "tolerances.json" in manifest["files"]
    assert (lane / "tolerances.json").is_file()
    assert not any(name.endswith("tolerances.json") for name in _base_files(project))
    project.run("--golden-strict", "--golden-lane", "gpu").assert_outcomes(passed=1)


def test_a_fallback_lane_computed_on_other_inputs_is_refused(project, tmp_path):
    """A fallback lane recorded on inputs since regenerated is refused as the run's own stale
    lane is: a bug that lands on its stale values must not pass under --golden-strict."""
    project.write(TRAIN)
    project.set_values(loss=0.5)
    project.run("--golden-lane", "cpu").assert_outcomes(passed=1)
    project.set_values(loss=0.51)
    project.run("--golden-lane", "gpu").assert_outcomes(passed=1)
    lanes = project.golden_dir("test_step") / "@lanes"
    lanes.rename(tmp_path / "lanes")  # regenerating the inputs is refused while lanes exist
    project.write(TRAIN.replace("torch.arange(4.0)", "torch.arange(1.0, 5.0)"))
    project.run("--update-golden", "--golden-regenerate", "--golden-lane", "cpu")
    (tmp_path / "lanes").rename(lanes)
    project.pytester.makeini("[pytest]\ngolden_lane = cuda-sm90\ngolden_lane_fallback = gpu\n")
    project.set_values(loss=0.51 * 6 / 10)  # a bug that lands on the stale lane's value
    refused = project.run("--golden-strict")
    refused.assert_outcomes(failed=1)
    refused.stdout.fnmatch_lines(["*lane 'gpu' were computed on other inputs*--golden-lane gpu*"])
    assert "compared against another lane" not in refused.stdout.str()
    project.run("--update-golden", "--golden-lane", "gpu").assert_outcomes(passed=1)  # remedy
    project.run("--golden-strict").assert_outcomes(passed=1)


@pytest.mark.parametrize("linked", ["lane", "entry"])
def test_a_linked_lane_or_entry_is_refused_in_record_update_replay_and_verify(
    project, tmp_path, linked
):
    """``@lanes/gpu`` (or a file in it) linked out of the golden: never written through,
    never replayed, and ``verify`` fails it, naming the link and the remedy."""
    project.write(TRAIN)
    project.set_values(loss=0.5)
    project.run("--golden-lane", "cpu").assert_outcomes(passed=1)
    project.run("--golden-lane", "gpu").assert_outcomes(passed=1)
    lane = project.golden_dir("test_step") / "@lanes" / "gpu"
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(lane, elsewhere)
    if linked == "lane":
        shutil.rmtree(lane)
        lane.symlink_to(elsewhere, target_is_directory=True)
        link = lane
    else:
        link = lane / "metrics.json"
        link.unlink()
        link.symlink_to(elsewhere / "metrics.json")
    outside = {p.name: p.read_bytes() for p in elsewhere.iterdir()}

    project.set_values(loss=0.7)
    for args in (["--update-golden"], ["--golden-strict"], []):
        refused = project.run("--golden-lane", "gpu", *args)
        refused.assert_outcomes(failed=1)
        refused.stdout.fnmatch_lines([f"*{link.name} is a symbolic link to {elsewhere}*"])
    assert {p.name: p.read_bytes() for p in elsewhere.iterdir()} == outside, "never written"
    verify = project.pytester.run(sys.executable, "-m", "pytest_rollout_golden", "verify", "golden")
    assert verify.ret == 1
    verify.stdout.fnmatch_lines([f"FAIL*{link.name} is a symbolic link*"])

    link.unlink()  # the remedy the message gives
    project.run("--update-golden", "--golden-lane", "gpu").assert_outcomes(passed=1)
    project.run("--golden-strict", "--golden-lane", "gpu").assert_outcomes(passed=1)


NOISY = """
import torch


def test_step(golden, values):
    batch = golden.rollout(lambda: {"x": torch.ones(4)})
    # a reduction-order noise of 1e-3 per thread count: calibrated wider than the default
    noise = 1e-3 * torch.get_num_threads() + values.get("off", 0.0)
    golden.check({"pg_loss": float(batch["x"].mean()) + noise})
"""


def test_a_lanes_calibrated_tolerance_names_the_lanes_own_file(project):
    project.write(NOISY)
    project.run("--golden-lane", "machine-a").assert_outcomes(passed=1)
    project.run("--golden-lane", "machine-b").assert_outcomes(passed=1)
    project.run("--golden-calibrate", "3", "--golden-lane", "machine-b")
    lane_file = "golden/test_it/test_step/@lanes/machine-b/tolerances.json"
    assert (project.path / lane_file).is_file()
    assert not (project.golden_dir("test_step") / "tolerances.json").exists()

    passed = project.run("--golden-strict", "--golden-lane", "machine-b")
    passed.assert_outcomes(passed=1)
    passed.stdout.fnmatch_lines(
        [
            "tolerances looser than the defaults, from calibrated files:",
            f"*test_step: pg_loss: rtol=*, scale=recorded from {lane_file} (without it: *",
        ]
    )
    project.set_values(off=0.5)
    failed = project.run("--golden-strict", "--golden-lane", "machine-b")
    failed.assert_outcomes(failed=1)
    failed.stdout.fnmatch_lines(["*pg_loss*(calibrated (@lanes/machine-b/tolerances.json))"])
