"""A committed tolerances.json never disarms the gate silently: entries are bounded to what
calibration writes, tolerances looser than the defaults that come from it are listed in the
summary with the file, and the command line and the exact lane override it."""

from __future__ import annotations

import json

import pytest

from pytest_rollout_golden._internal.tolerance import calibration as calibrate
from pytest_rollout_golden.cli import main

GATE = """
import json, pathlib

V = json.loads((pathlib.Path(__file__).parent / "values.json").read_text())


def test_train(golden):
    for step in range(2):
        golden.check({"pg_loss": 0.5 * (1 + V.get("drift", 0.0)), "kl": 0.01}, step=step)
"""


def plant(project, tolerances: dict, **extra) -> None:
    """A tolerances.json signed as calibration signs it (its checksum in the manifest)."""
    content = {
        "format": calibrate.FORMAT,
        "version": 1,
        "how": {"runs": 3, "perturbations": ["threads"], "tests": []},
        "tolerances": tolerances,
        "spreads": {},
        **extra,
    }
    calibrate.write(project.golden_dir("test_train"), content)


@pytest.fixture
def recorded(project):
    project.write(GATE)
    project.set_values()
    project.run().assert_outcomes(passed=1)
    return project


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ({"rtol": 1e30, "atol": 1e30}, "rtol 1e+30 is beyond what calibration writes (0.05)"),
        ({"rtol": 1e-3, "atol": "1e30"}, "atol must be a finite number >= 0"),
        ({"ignore": True}, "'ignore' is not something calibration writes"),
        ({"exact": True}, "'exact' is not something calibration writes"),
        ({"rtol": -1.0, "atol": 0.0}, "rtol must be a finite number >= 0"),
        ("loose", "must be an object of rtol, atol, scale, equal_nan"),
        ({"rtol": 0, "atol": 1e300}, "atol 1e+300 is beyond what tolerances.json may hold"),
        ({"rtol": 1e-3, "atol": 0, "scale": 1e300}, "scale 1e+300 gives"),
    ],
)
@pytest.mark.parametrize("strict", [True, False])
def test_an_entry_calibration_never_writes_is_refused_naming_the_file(
    recorded, entry, problem, strict, capsys
):
    plant(recorded, {"*": entry})
    recorded.set_values(drift=4.0)  # a 5x drift: must never pass on such a file
    result = recorded.run(*(["--golden-strict"] if strict else []))
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "tolerances.json" in out and "'*'" in out and problem in out, out
    assert "pytest --golden-calibrate N" in out
    capsys.readouterr()
    assert main(["verify", str(recorded.golden)]) == 1
    assert problem in capsys.readouterr().out


def test_an_atol_beyond_a_twentieth_of_the_recorded_magnitude_is_refused(recorded, capsys):
    plant(recorded, {"pg_loss": {"rtol": 0, "atol": 4.0}})  # pg_loss is 0.5: 0.5 -> 2.5 passes
    recorded.set_values(drift=4.0)
    result = recorded.run()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*tolerances.json: tolerances entry 'pg_loss': atol 4 is beyond what tolerances.json "
            "may hold (0.025: 0.05 x the largest recorded |pg_loss|, 0.5)*"
        ]
    )
    assert main(["verify", str(recorded.golden)]) == 1
    assert "atol 4 is beyond" in capsys.readouterr().out


def test_an_atol_within_a_twentieth_of_the_recorded_magnitude_is_kept(recorded):
    plant(recorded, {"pg_loss": {"rtol": 0, "atol": 0.02}})  # 0.05 x 0.5 = 0.025
    recorded.set_values(drift=0.03)  # 0.5 -> 0.515: within the file's atol
    recorded.run("--golden-strict").assert_outcomes(passed=1)
    assert main(["verify", str(recorded.golden)]) == 0


def test_a_tolerance_looser_than_the_default_from_a_file_is_listed_with_the_file(recorded):
    plant(recorded, {"pg_loss": {"rtol": 0.01, "atol": 1e-8}})
    recorded.set_values(drift=5e-3)  # inside the file's 1e-2, beyond the default 1e-4
    result = recorded.run()
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "tolerances looser than the defaults, from calibrated files:",
            "    test_it.py::test_train: pg_loss: rtol=0.01, atol=1e-08 from "
            "golden/test_it/test_train/tolerances.json (without it: rtol=0.0001, atol=1e-08, "
            "scale=recorded)",
        ]
    )


def test_the_command_line_and_the_exact_lane_override_a_calibrated_file(recorded):
    plant(recorded, {"pg_loss": {"rtol": 0.01, "atol": 1e-8}})
    recorded.set_values(drift=5e-3)
    result = recorded.run("--golden-tolerance", "pg_loss:rtol=1e-4,atol=0")
    result.assert_outcomes(failed=1)
    assert recorded.mismatch_row(result, "pg_loss")["allowed"].endswith("(--golden-tolerance)")
    recorded.run("--golden-exact").assert_outcomes(failed=1)


def test_calibration_refuses_to_write_a_spread_beyond_its_bound():
    spread = calibrate.Spread(rel=0.2, abs=0.1, step=0, dtype="float32")
    content = calibrate.document(
        {"pg_loss": spread},
        lambda name, dtype: calibrate.Tolerance(rtol=1e-4, atol=1e-8),
        runs=3,
        perturbations=["threads"],
        tests=["t"],
    )
    assert content["tolerances"] == {}
    assert "beyond what calibration writes" in content["spreads"]["pg_loss"]["kept"]
    json.dumps(content)


@pytest.mark.parametrize(
    ("tol", "than", "expected"),
    [
        ({"rtol": 1e-3, "atol": 0.0}, {"rtol": 1e-4, "atol": 0.0}, True),
        ({"rtol": 1e-5, "atol": 1e-8}, {"rtol": 1e-4, "atol": 1e-8, "scale": "recorded"}, False),
        ({"rtol": 1e-4, "atol": 1e-8, "scale": "recorded"}, {"rtol": 1e-4, "atol": 1e-8}, True),
        ({"rtol": 1e-4, "scale": 2.0}, {"rtol": 1e-4, "scale": 1.0}, True),
        ({"rtol": 1e-4, "scale": "recorded"}, {"rtol": 1e-4, "scale": 1.0}, False),
        ({"ignore": True}, {"rtol": 1e-4}, True),
        ({"exact": True}, {"rtol": 1e-4}, False),
    ],
)
def test_looser_compares_each_field_and_the_scale(tol, than, expected):
    from pytest_rollout_golden._internal.golden.checks import looser
    from pytest_rollout_golden._internal.tolerance.spec import Tolerance

    assert looser(Tolerance(**tol), Tolerance(**than)) is expected


def test_calibration_never_writes_an_entry_the_run_would_refuse():
    # the layer below gives atol 1.0 to a metric of magnitude 0.5: copying it into the file
    # would hold an allowance of 2x the metric
    spread = calibrate.Spread(rel=1e-5, abs=5e-6, step=0, dtype="float32", magnitude=0.5)
    spread.of_magnitude = 1e-5
    content = calibrate.document(
        {"pg_loss": spread},
        lambda name, dtype: calibrate.Tolerance(rtol=1e-4, atol=1.0, scale="recorded"),
        runs=3,
        perturbations=["threads"],
        tests=["t"],
        magnitude={"pg_loss": 0.5}.get,
    )
    assert content["tolerances"] == {}
    refused = content["spreads"]["pg_loss"]["refused"]
    assert refused == (
        "atol 1 is beyond what tolerances.json may hold "
        "(0.025: 0.05 x the largest recorded |pg_loss|, 0.5)"
    )
