"""pytest --golden-calibrate N: spreads of perturbed runs become a tolerance layer of a golden."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from pytest_rollout_golden._internal.tolerance.calibration import (
    MARGIN,
    perturbed,
    spreads,
    thread_counts,
)
from pytest_rollout_golden.cli import main

EXAMPLES = Path(__file__).parents[3] / "examples"

# "loss" depends on the intra-op thread count by 1e-7 per thread, as a reduction
# whose order follows the thread count would; "steady" does not.
NOISY = """
import json, pathlib
import pytest
import torch

V = json.loads((pathlib.Path(__file__).parent / "values.json").read_text())


@pytest.mark.golden(tolerances=V.get("marker", {}))
def test_noisy(golden):
    for step in range(2):
        loss = 1.0 + 1e-7 * torch.get_num_threads() + V.get("drift", 0.0) * step
        golden.check({"loss": loss, "steady": 0.5 + step}, step=step)


@pytest.mark.xfail(reason="a known bug", strict=False)
def test_buggy(golden):
    golden.check({"loss": 1.0 + 0.01 * torch.get_num_threads()})
    assert False
"""


def tolerances(project, test="test_noisy") -> dict:
    return json.loads((project.golden_dir(test) / "tolerances.json").read_text())


@pytest.fixture
def calibrated(project):
    project.write(NOISY)
    project.set_values()
    project.run().assert_outcomes(passed=1, xfailed=1)
    result = project.run("--golden-calibrate", "3")
    result.assert_outcomes(passed=3, xfailed=3)  # no variants: no oracle run, 3 runs each
    return project, result


def test_spread_times_margin_becomes_the_tolerance(calibrated):
    project, result = calibrated
    base = torch.get_num_threads()
    counts = thread_counts(base)[:3]
    values = [1.0 + 1e-7 * n for n in counts]
    rel = (max(values) - min(values)) / max(values)
    doc = tolerances(project)
    assert doc["tolerances"]["loss"]["rtol"] == pytest.approx(MARGIN * rel)
    assert doc["tolerances"]["loss"]["atol"] == 1e-8  # the built-in atol of a loss
    assert "steady" not in doc["tolerances"]  # spread 0: the tight default stays
    assert doc["spreads"]["steady"]["kept"].startswith("spread 0")
    assert doc["how"]["runs"] == 3 and doc["how"]["tests"] == ["test_it.py::test_noisy"]
    # The xfail test is left out, so its golden is not calibrated at all.
    assert not (project.golden_dir("test_buggy") / "tolerances.json").exists()
    result.stdout.fnmatch_lines(
        [
            "not calibrated: golden/test_it/test_buggy (expected to fail (xfail))",
            "calibrated tolerances written to golden/test_it/test_noisy/tolerances.json:",
            "    metric  rel spread  abs spread  at step  rtol * atol*",
            "    loss    *",
            "    steady  0           0           -        default: spread 0  -",
        ]
    )
    # The thread counts calibration changes on purpose are not reported as environment changes.
    assert "replayed under another environment" not in result.stdout.str()
    # Listed in the manifest, so `verify` checks it and the atomic swap of a commit keeps it.
    manifest = json.loads((project.golden_dir("test_noisy") / "manifest.json").read_text())
    assert manifest["files"]["tolerances.json"]["kind"] == "tolerances"
    assert main(["verify", str(project.golden)]) == 0


def test_calibrated_tolerances_are_a_layer_named_in_the_failure(calibrated):
    project, _ = calibrated
    project.run().assert_outcomes(passed=1, xfailed=1)  # unchanged code passes
    # 1e-6 relative passes the built-in 1e-5 but not the calibrated ~6e-7.
    project.set_values(drift=1e-6)
    result = project.run()
    result.assert_outcomes(failed=1, xfailed=1)
    row = project.mismatch_row(result, "loss")
    assert row["allowed"].endswith("(calibrated (tolerances.json))")
    # The marker sits above the calibrated layer.
    project.set_values(drift=1e-6, marker={"loss": {"rtol": 1e-4}})
    project.run().assert_outcomes(passed=1, xfailed=1)


def test_an_update_keeps_the_calibrated_tolerances(calibrated):
    project, _ = calibrated
    before = (project.golden_dir("test_noisy") / "tolerances.json").read_bytes()
    project.set_values(drift=1e-3)
    project.run("--update-golden").assert_outcomes(passed=1, xfailed=1)
    directory = project.golden_dir("test_noisy")
    assert (directory / "tolerances.json").read_bytes() == before
    manifest = json.loads((directory / "manifest.json").read_text())
    assert "tolerances.json" in manifest["files"]
    assert project.metrics("test_noisy")["1"]["loss"] == pytest.approx(1.001 + 2e-7, abs=1e-6)
    project.run().assert_outcomes(passed=1, xfailed=1)
    assert main(["verify", str(project.golden)]) == 0


def test_calibration_needs_two_runs_and_no_update(project):
    project.write(NOISY)
    assert "needs N >= 2" in project.run("--golden-calibrate", "1").stderr.str()
    result = project.run("--golden-calibrate", "2", "--update-golden")
    assert "record them first" in result.stderr.str()


def test_spreads_take_the_largest_step_and_skip_non_finite():
    runs = [
        {
            "0": {"a": (1.0, "float32"), "b": (float("nan"), "float64")},
            "1": {"a": (2.0, "float32")},
        },
        {"0": {"a": (1.0, "float32"), "b": (1.0, "float64")}, "1": {"a": (2.002, "float32")}},
    ]
    found = spreads(runs)
    assert found["a"].step == 1 and found["a"].rel == pytest.approx(0.002 / 2.002)
    assert found["a"].dtype == "float32" and "b" not in found


def test_values_around_zero_widen_atol_never_rtol():
    # kl at step 0 is 0 in one run and 1e-7 in another: "100%" relative, yet only noise at 0.
    # A relative spread taken there (rtol 2) would let any later drift of kl pass.
    from pytest_rollout_golden._internal.tolerance.calibration import tolerance_for
    from pytest_rollout_golden._internal.tolerance.spec import Tolerance

    runs = [
        {"0": {"kl": (0.0, "float32")}, "1": {"kl": (1e-3, "float32")}},
        {"0": {"kl": (1e-7, "float32")}, "1": {"kl": (1e-3 * (1 + 1e-6), "float32")}},
    ]
    found = spreads(runs)["kl"]
    assert found.near_zero and found.rel == pytest.approx(1e-6, rel=1e-3) and found.step == 1
    tol = tolerance_for(found, Tolerance(rtol=1e-5, atol=1e-9))
    assert tol.rtol == pytest.approx(MARGIN * 1e-6, rel=1e-3)
    assert tol.atol == pytest.approx(MARGIN * 1e-7)
    only_at_zero = spreads([runs[0], {"0": {"kl": (1e-7, "float32")}, "1": runs[0]["1"]}])
    assert only_at_zero["kl"].rel == 0
    assert tolerance_for(only_at_zero["kl"], Tolerance(rtol=1e-5, atol=1e-9)).rtol == 1e-5
    # Not touching 0, but 500x below the metric's own scale (the real reference policy: kl is
    # ~2e-6 at step 0 with a 6% spread there, ~1e-3 later): atol again, not a 6% rtol.
    tiny = [
        {"0": {"kl": (2.0e-6, "float32")}, "1": {"kl": (1e-3, "float32")}},
        {"0": {"kl": (2.12e-6, "float32")}, "1": {"kl": (1e-3 * (1 + 1e-6), "float32")}},
    ]
    found = spreads(tiny)["kl"]
    assert found.rel == pytest.approx(1e-6, rel=1e-3)
    assert found.near_zero_abs == pytest.approx(1.2e-7)


def test_perturbations_change_the_settings_and_restore_them():
    before = (
        torch.get_num_threads(),
        torch.are_deterministic_algorithms_enabled(),
        torch.backends.cuda.matmul.allow_tf32,
    )
    kinds = ("threads", "nondeterministic", "tf32")
    with perturbed(1, kinds) as how:
        assert torch.get_num_threads() == thread_counts(before[0])[1]
        assert not torch.are_deterministic_algorithms_enabled()
        assert torch.backends.cuda.matmul.allow_tf32
        assert how == f"threads={thread_counts(before[0])[1]}, nondeterministic, tf32=on"
    after = (
        torch.get_num_threads(),
        torch.are_deterministic_algorithms_enabled(),
        torch.backends.cuda.matmul.allow_tf32,
    )
    assert after == before


def test_calibrating_the_example_passes_it_and_still_fails_the_micro_batch_bug(project):
    """The done-criterion on examples/ and its committed goldens: --golden-calibrate 3, then
    replay, the known bug (xfail), and the bug in the main test's own calibrated golden."""
    module = project.copy_example()
    committed = EXAMPLES.parent / "golden" / "examples" / "test_tiny_rl_golden"
    shutil.copytree(committed, project.golden / module)
    result = project.run("--golden-calibrate", "3")
    # the layouts' 3 oracle runs (they declare variants) + 4 x 3; the xfail: 1 + 3
    result.assert_outcomes(passed=15, xfailed=4)
    for golden in ("test_grpo_training_matches_golden", "grpo_layouts"):
        directory = project.golden / module / golden
        if not (directory / "tolerances.json").exists():  # runs that agree bit for bit
            kept = f"calibrated golden/{module}/{golden}: every value keeps its default; nothing"
            assert kept in result.stdout.str()
            continue
        doc = json.loads((directory / "tolerances.json").read_text())
        assert set(doc["spreads"]) == {
            "pg_loss", "kl", "entropy", "pg_clipfrac", "grad_norm", "response_length"
        }  # fmt: skip
        for name, tol in doc["tolerances"].items():  # whatever was measured stays tight
            assert tol["rtol"] < 1e-4, (golden, name, tol)
    project.run("--golden-strict").assert_outcomes(passed=4, xfailed=1)  # bug still fails
    source = (project.path / "test_example.py").read_text()
    (project.path / "test_example.py").write_text(
        source.replace(
            "train(golden, TrainConfig())",
            'train(golden, TrainConfig(micro_batches=4, aggregation="sample-fraction"))',
        )
    )
    result = project.run("--golden-strict", "-k", "matches_golden")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["golden mismatch: first divergence at step 0: *"])


def test_a_damaged_tolerances_file_fails_and_update_drops_it(calibrated):
    project, _ = calibrated
    path = project.golden_dir("test_noisy") / "tolerances.json"
    path.write_text(path.read_text().replace("5.99", "9.99"))  # a hand edit
    result = project.run()
    result.assert_outcomes(errors=0, failed=1, xfailed=1)
    assert "tolerances.json: is corrupted or was edited by hand" in result.stdout.str()
    project.run("--update-golden").assert_outcomes(passed=1, xfailed=1)
    assert not path.exists()
    manifest = json.loads((project.golden_dir("test_noisy") / "manifest.json").read_text())
    assert "tolerances.json" not in manifest["files"]
    project.run("--golden-strict").assert_outcomes(passed=1, xfailed=1)
    assert main(["verify", str(project.golden)]) == 0


def test_the_report_lists_what_calibration_wrote(calibrated):
    project, _ = calibrated
    project.run("--golden-calibrate", "2", "--golden-report", "r.json")
    report = json.loads((project.path / "r.json").read_text())
    entry = next(e for e in report["calibrated"] if e["directory"].endswith("test_noisy"))
    rows = {r["metric"]: r for r in entry["rows"]}
    assert rows["loss"]["rtol"] > 0 and "rtol" not in rows["steady"]


def test_xdist_workers_send_their_runs_and_the_controller_writes(project):
    pytest.importorskip("xdist")
    project.write(NOISY)
    project.set_values()
    project.run().assert_outcomes(passed=1, xfailed=1)
    result = project.run_subprocess("-n", "2", "--golden-calibrate", "3")
    result.assert_outcomes(passed=3, xfailed=3)  # no variants: no oracle run, 3 runs each
    assert "[100%]" in result.stdout.str()  # progress counts tests, not their runs
    doc = tolerances(project)
    # All three runs were merged, whichever worker ran them: the spread covers 3 thread counts.
    counts = thread_counts(torch.get_num_threads())[:3]
    assert doc["spreads"]["loss"]["abs_spread"] == pytest.approx(
        1e-7 * (max(counts) - min(counts)), rel=1e-6
    )


# Layout variants of one shared golden: the layout moves pg_loss by 2e-6 relative per extra TP
# rank (as a reduction split across ranks would); thread counts move nothing.
LAYOUT_GATE = """
import pytest
from pytest_rollout_golden.parallel import variants

LAYOUTS = variants(tp=[1, 2], pp=[1], dp=[1], packing=[False], micro_batches=[1])

@pytest.mark.golden(shared="policy")
@pytest.mark.parametrize("layout", LAYOUTS)
def test_gate(golden, values, layout):
    # reduction-order noise: gone in float64, as a real reordering's (~1e-15) would be
    shift = 1 + 2e-6 * (layout.tp - 1) * (not golden.certifying)
    golden.check({"pg_loss": 0.5 * shift * values.get(layout.id, 1.0), "grad_norm": 2.0}, step=0)
"""
REF, VARIANT = "tp1-pp1-dp1-padded-mb1", "tp2-pp1-dp1-padded-mb1"


def test_calibration_across_layouts_becomes_the_variants_layout_lane(project):
    project.write(LAYOUT_GATE)
    project.set_values()
    project.run().assert_outcomes(passed=2)
    result = project.run("--golden-calibrate", "3")
    result.assert_outcomes(passed=8)  # 2 oracle runs + 2 x 3
    written = json.loads((project.golden / "@shared" / "policy" / "tolerances.json").read_text())
    assert written["how"]["layouts"] == [REF, VARIANT]
    assert written["tolerances"] == {}  # no layout moves with the thread count
    # against the reference's magnitude, the one the comparison's scale="recorded" uses
    rel = (0.5 * (1 + 2e-6) - 0.5) / 0.5
    lane = written["layout_tolerances"]
    assert lane["pg_loss"]["rtol"] == pytest.approx(MARGIN * rel)
    assert "grad_norm" not in lane  # equal across layouts: the shipped lane stays
    assert written["layout_spreads"]["grad_norm"]["kept"].startswith("spread 0")
    summary = "\n".join(result.outlines)
    assert "across variants  pg_loss" in summary
    assert f"test_gate[{VARIANT}]: certified same math in float64 (identical" in summary

    # 2e-5 more on the variant: inside the shipped lane (rtol 1e-4), beyond the measured one
    project.set_values(**{VARIANT: 1.00002})
    result = project.run()
    result.assert_outcomes(passed=1, failed=1)
    row = project.mismatch_row(result, "pg_loss")
    assert row["allowed"].endswith("(calibrated variant lane (tolerances.json))")
    assert f"test_gate[{VARIANT}]" in next(x for x in result.outlines if x.startswith("FAILED"))

    # the reference layout is not a variant: the variant lane never applies to it
    project.set_values(**{REF: 1.0003})
    result = project.run()
    result.assert_outcomes(passed=1, failed=1)
    assert project.mismatch_row(result, "pg_loss")["allowed"].endswith("(built-in default)")
    assert f"test_gate[{REF}]" in next(x for x in result.outlines if x.startswith("FAILED"))


def test_calibrating_a_selection_with_a_test_never_recorded_says_so_and_calibrates_the_rest(
    project,
):
    project.write(
        "import torch\n\n\ndef test_one(golden):\n"
        "    golden.check({'loss': 1.0 + 1e-7 * torch.get_num_threads()})\n\n\n"
        "def test_two(golden):\n    golden.check({'loss': 2.0})\n"
    )
    project.run("-k", "test_one").assert_outcomes(passed=1, deselected=1)
    result = project.run("--golden-calibrate", "2", "-rs")
    # no variants, no oracle runs: test_one's 2 runs pass, test_two's fail (no golden)
    result.assert_outcomes(passed=2, failed=2)
    out = result.stdout.str()
    assert "Traceback" not in out and "INTERNALERROR" not in out
    assert "not calibrated: golden/test_it/test_two (" in out
    assert "calibrated tolerances written to golden/test_it/test_one/tolerances.json" in out
    assert not (project.golden_dir("test_two") / "tolerances.json").exists()


# "loss" moves with the thread count by V["noise"] per thread; "timing" is not compared.
STEADY = """
import json, pathlib
import pytest
import torch

V = json.loads((pathlib.Path(__file__).parent / "values.json").read_text())


@pytest.mark.golden(tolerances={"timing": {"ignore": True}})
def test_steady(golden):
    for step in range(2):
        loss = 0.5 + step + V.get("noise", 0.0) * torch.get_num_threads()
        golden.check({"loss": loss, "timing": 1.0 + torch.get_num_threads()}, step=step)
"""


def test_calibration_where_every_value_keeps_its_default_writes_nothing_and_removes_the_old(
    project,
):
    """Progress counts tests (each run N times) to 100%; "not compared" is said once per
    golden; a calibration that would write nothing but defaults writes no tolerances.json,
    and takes away the one an earlier calibration wrote."""
    project.write(STEADY)
    project.set_values(noise=1e-7)
    project.run().assert_outcomes(passed=1)
    path = project.golden_dir("test_steady") / "tolerances.json"
    project.run("--golden-calibrate", "3").assert_outcomes(passed=3)  # no variants: 3 runs
    assert "loss" in json.loads(path.read_text())["tolerances"]

    project.set_values(noise=0.0)  # the runs now agree bit for bit: every default stays
    result = project.run("--golden-calibrate", "3")
    result.assert_outcomes(passed=3)  # no variants: no oracle run, 3 runs
    out = result.stdout.str()
    assert "[100%]" in out and "33%" not in out
    assert out.count("timing (steps 0-1;") == 1
    assert not path.exists()
    manifest = json.loads((project.golden_dir("test_steady") / "manifest.json").read_text())
    assert "tolerances.json" not in manifest["files"]
    result.stdout.fnmatch_lines(
        [
            "calibrated golden/test_it/test_steady: every value keeps its default; nothing "
            "written (the earlier tolerances.json removed):",
            "    metric  rel spread  abs spread  at step  rtol               atol",
            "    loss    0           0           -        default: spread 0  -",
            "    timing  *  not compared       -",
        ]
    )
    assert main(["verify", str(project.golden)]) == 0
    project.run("--golden-strict").assert_outcomes(passed=1)

    result = project.run("--golden-calibrate", "2")  # nothing to remove either
    result.stdout.fnmatch_lines(
        ["calibrated golden/test_it/test_steady: every value keeps its default; nothing written:"]
    )
    assert not path.exists()


# A reference (mb8) and a same-math variant (mb4) that moves "loss" by V["mb4"] relative, as
# bf16 rounding of a reordered sum would (gone in float64, golden.certifying); test_other is
# unrelated to them and fails where V["other"] moves it.
SAME_MATH_BF16 = """
import json, pathlib
import pytest
import torch
from pytest_rollout_golden import same_math

V = json.loads((pathlib.Path(__file__).parent / "values.json").read_text())


@pytest.mark.parametrize("v", same_math(["mb8", "mb4"]))
def test_x(golden, v):
    noise = 1 + (V.get(v, 0.0) + 1e-8 * torch.get_num_threads()) * (not golden.certifying)
    for step in range(2):
        golden.check({"loss": (0.5 - 0.1 * step) * noise}, step=step)


def test_other(golden):
    golden.check({"loss": 1.0 + V.get("other", 0.0)})
"""
TABLE_HEADER = "  metric  step  expected"


def summary_top(result: pytest.RunResult, lines: int) -> list[str]:
    """The first ``lines`` lines of the rollout golden section after its counts line."""
    start = next(i for i, x in enumerate(result.outlines) if x.startswith("golden: "))
    return result.outlines[start + 1 : start + 1 + lines]


def test_a_calibration_whose_variant_failed_only_by_what_it_measured_exits_0(project):
    """A same-math variant beyond the defaults (bf16-sized, 3e-4) fails against the golden in
    every round; calibration measures it into the variant lane, says first what it wrote,
    prints the failure's table once, and exits 0: the rounds' failures are its measurement."""
    project.write(SAME_MATH_BF16)
    project.set_values()
    project.run().assert_outcomes(passed=3)
    project.set_values(mb4=3e-4)
    project.run().assert_outcomes(passed=2, failed=1)  # beyond the defaults, uncalibrated

    result = project.run("--golden-calibrate", "3")
    result.assert_outcomes(passed=8, failed=3)  # 2 oracle runs + 3 x 3; mb4 fails each round
    assert result.ret == pytest.ExitCode.OK
    out = result.stdout.str()
    assert out.count(TABLE_HEADER) == 1  # the failure once, not once per round
    assert out.count("(calibration run 2 of 3: its table is under this test's first failing") == 1
    assert summary_top(result, 3) == [
        "calibration wrote:",
        "    golden/test_it/test_x[mb8]/tolerances.json",
        "calibration exits 0: test_it.py::test_x[mb4] failed against the golden in 3 "
        "calibration runs only on values the files written now calibrate (the failures above "
        "are what was measured)",
    ]
    project.run("--golden-strict").assert_outcomes(passed=3)  # the written lane passes it


def test_a_calibration_with_an_unrelated_failure_exits_1_saying_per_lane_what_it_wrote(project):
    """Another test's failure is no measurement: exit status 1; the files written come first,
    under their lane; that test's failure is printed once."""
    project.write(SAME_MATH_BF16)
    project.set_values()
    project.run("--golden-lane", "machine-b").assert_outcomes(passed=3)
    project.set_values(mb4=3e-4, other=0.5)

    result = project.run("--golden-calibrate", "3", "--golden-lane", "machine-b")
    result.assert_outcomes(passed=5, failed=6)  # 2 oracle runs, mb8 x 3; mb4 x 3, test_other x 3
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    out = result.stdout.str()
    assert out.count(TABLE_HEADER) == 2  # mb4's table once, test_other's once
    assert "calibration exits 0" not in out
    assert summary_top(result, 2) == [
        "calibration wrote (lane machine-b):",
        "    golden/test_it/test_x[mb8]/tolerances.json",
    ]
