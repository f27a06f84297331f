"""What a session tells: the ``--golden-report`` JSON, unused goldens and ``--golden-prune``."""

from __future__ import annotations

import json
import shutil

import pytest

TWO_TESTS = """
import pytest
import torch


def test_train(golden, values):
    v = values["train"]
    golden.check(
        {"pg_loss": v["pg_loss"], "kl": 0.01, "lp": torch.tensor(v["lp"], dtype=torch.float32)}
    )


@pytest.mark.golden(tolerances={"x": {"rtol": 0.0, "atol": 0.0, "equal_nan": True}})
def test_nan(golden):
    golden.check({"x": float("nan")}, step=3)
"""


def strict_json(path) -> dict:
    """Parse ``path``, refusing the non-standard NaN/Infinity literals."""

    def refuse(literal: str) -> None:
        raise AssertionError(f"{path} holds the non-JSON literal {literal}")

    return json.loads(path.read_text(), parse_constant=refuse)


def test_report_lists_every_comparison_with_its_verdict(project):
    project.write(TWO_TESTS)
    project.set_values(train={"pg_loss": 0.5, "lp": [-1.0, -2.0, -3.0]})
    project.run().assert_outcomes(passed=2)

    project.set_values(train={"pg_loss": 0.5005, "lp": [-1.0, -2.5, -3.0]})
    result = project.run("--golden-report", "out/report.json")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["golden report written to out/report.json"])
    report = strict_json(project.path / "out" / "report.json")

    assert report["mode"] == "auto"
    assert report["summary"] == {"replayed": 1, "recorded": 0, "updated": 0, "failed": 1}
    by_name = {c["metric"]: c for c in report["comparisons"]}
    assert set(by_name) == {"pg_loss", "kl", "lp", "x"}

    pg = by_name["pg_loss"]
    assert pg["test"] == "test_it.py::test_train"
    assert (pg["step"], pg["verdict"], pg["expected"], pg["actual"]) == (0, "fail", 0.5, 0.5005)
    assert pg["abs_diff"] == pytest.approx(5e-4)
    assert pg["rel_diff"] == pytest.approx(1e-3)
    assert (pg["tolerance"]["rtol"], pg["tolerance"]["atol"]) == (1e-4, 1e-8)
    assert pg["tolerance_source"] == "built-in default"

    kl = by_name["kl"]
    assert (kl["verdict"], kl["expected"], kl["actual"], kl["abs_diff"]) == ("pass", 0.01, 0.01, 0)

    lp = by_name["lp"]
    assert lp["verdict"] == "fail"
    assert lp["expected"] == {"shape": [3], "dtype": "float32"}
    assert lp["abs_diff"] == pytest.approx(0.5)
    assert "Mismatched elements: 1 / 3" in lp["detail"]

    x = by_name["x"]
    assert x["test"] == "test_it.py::test_nan"
    assert (x["step"], x["verdict"], x["expected"], x["actual"]) == (3, "pass", "nan", "nan")
    assert x["tolerance"]["equal_nan"] is True
    assert x["tolerance_source"] == "@pytest.mark.golden(tolerances=)"


def test_report_of_an_update_and_of_a_strict_run(project):
    project.write(TWO_TESTS)
    project.set_values(train={"pg_loss": 0.5, "lp": [-1.0]})
    project.run().assert_outcomes(passed=2)

    project.set_values(train={"pg_loss": 0.25, "lp": [-1.0]})
    project.run("--update-golden", "--golden-report", "update.json").assert_outcomes(passed=2)
    report = strict_json(project.path / "update.json")
    assert report["mode"] == "update"
    assert report["summary"]["updated"] == 2
    pg = next(c for c in report["comparisons"] if c["metric"] == "pg_loss")
    assert (pg["verdict"], pg["expected"], pg["actual"]) == ("updated", 0.5, 0.25)

    project.run("-k", "test_nan", "--update-golden")  # the golden of test_train stays
    shutil.rmtree(project.golden_dir("test_nan"))  # and test_nan has none
    result = project.run("--golden-strict", "--golden-report", "strict.json")
    result.assert_outcomes(passed=1, failed=1)
    report = strict_json(project.path / "strict.json")
    assert report["mode"] == "strict"
    x = next(c for c in report["comparisons"] if c["metric"] == "x")
    assert x["verdict"] == "missing"
    assert "--update-golden" in x["detail"]


# ----------------------------------------------------------------- unused goldens

ONE = """
def test_one(golden):
    golden.check({"pg_loss": 1.0})
"""
TWO = (
    ONE
    + """

def test_two(golden):
    golden.check({"pg_loss": 2.0})
"""
)
THREE = """
def test_three(golden):
    golden.check({"pg_loss": 3.0})
"""
UNUSED = "unused golden directories (delete with --golden-prune on a full run):"


@pytest.fixture
def stale(project):
    """test_a.py::test_two and all of test_b.py were recorded, then removed; test_c.py stays."""
    project.write(TWO, "test_a")
    project.write(THREE, "test_b")
    project.write(THREE, "test_c")
    project.run().assert_outcomes(passed=4)
    project.write(ONE, "test_a")
    (project.path / "test_b.py").unlink()
    return project


def unused_lines(result: pytest.RunResult) -> list[str]:
    lines = result.outlines
    if UNUSED not in lines:
        return []
    start = lines.index(UNUSED) + 1
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("    ")), len(lines))
    return [line.strip() for line in lines[start:end]]


def test_unused_goldens_are_listed_but_kept(stale):
    result = stale.run()
    result.assert_outcomes(passed=2)
    assert unused_lines(result) == ["golden/test_a/test_two", "golden/test_b/test_three"]
    assert (stale.golden / "test_a" / "test_two" / "manifest.json").exists()


def test_prune_deletes_goldens_of_gone_files_and_keeps_those_of_existing_files(stale):
    result = stale.run("--golden-prune")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        [
            "pruned unused golden directories:",
            "    golden/test_b/test_three",
            "--golden-prune kept 1 unused golden(s) of test files that still exist*"
            "--golden-prune-tests deletes them on a whole run",
        ]
    )
    assert not (stale.golden / "test_b").exists(), "no empty folder is left behind"
    # test_a.py still exists: test_two may be a case collected only on other machines.
    assert (stale.golden / "test_a" / "test_two" / "manifest.json").exists()


def test_prune_tests_on_a_full_run_deletes_only_unused_goldens(stale):
    result = stale.run("--golden-prune-tests")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        [
            "pruned unused golden directories:",
            "    golden/test_a/test_two",
            "    golden/test_b/test_three",
        ]
    )
    assert not (stale.golden / "test_a" / "test_two").exists()
    assert not (stale.golden / "test_b").exists(), "no empty folder is left behind"
    for kept in ("test_a/test_one", "test_c/test_three"):
        assert (stale.golden / kept / "manifest.json").exists()
    again = stale.run("--golden-prune-tests")
    assert UNUSED not in again.outlines
    assert "pruned unused golden directories:" not in again.outlines


@pytest.mark.parametrize(
    ("selection", "passed"), [(("-k", "test_one"), 1), (("test_a.py::test_one", "test_c.py"), 2)]
)
def test_prune_is_skipped_on_a_partial_run(stale, selection, passed):
    before = stale.golden_files()
    result = stale.run("--golden-prune-tests", *selection)
    result.assert_outcomes(passed=passed)
    assert stale.golden_files() == before
    result.stdout.fnmatch_lines(["--golden-prune skipped: some tests were deselected*"])
    assert "golden/test_c/test_three" not in unused_lines(result), "its test was deselected"


def test_goldens_of_test_files_not_collected_are_never_unused(stale):
    result = stale.run("--golden-prune-tests", "test_a.py")
    result.assert_outcomes(passed=1)
    # test_a.py ran whole and test_b.py is gone: those goldens are provably unused.
    assert not (stale.golden / "test_a" / "test_two").exists()
    assert not (stale.golden / "test_b").exists()
    assert (stale.golden / "test_c" / "test_three" / "manifest.json").exists()


def test_prune_is_skipped_when_tests_fail(stale):
    stale.write(ONE.replace("golden.check", "assert False\n    golden.check"), "test_a")
    before = stale.golden_files()
    result = stale.run("--golden-prune-tests")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["--golden-prune skipped: tests failed; nothing was deleted"])
    assert stale.golden_files() == before


def test_goldens_of_unusually_named_test_files_are_not_taken_for_orphans(project):
    project.pytester.mkdir("rl+ppo")
    project.write(ONE, "rl+ppo/test_v1.2")
    project.write(THREE, "test_c")
    project.run().assert_outcomes(passed=2)
    before = project.golden_files()
    assert len(before) == 4  # a manifest and metrics.json each

    result = project.run("--golden-prune", "test_c.py")
    result.assert_outcomes(passed=1)
    assert UNUSED not in result.outlines
    assert project.golden_files() == before


# ----------------------------------------------------------------- the failure's headline

DRIFTS = """
def test_train(golden, values):
    for step, drift in enumerate(values["drift"]):
        golden.check({"pg_loss": 0.5 + drift, "grad_norm": 1.0 + 10 * drift}, step=step)
"""


def drifted(project) -> None:
    """A recorded golden of 3 steps, then a run that drifts a little at step 0 and far at
    step 1: the worst row is not the first divergence."""
    project.write(DRIFTS)
    project.set_values(drift=[0.0, 0.0, 0.0])
    project.run().assert_outcomes(passed=1)
    project.set_values(drift=[1e-4, 1e-2, 1e-3])


def test_the_table_starts_at_the_step_its_headline_names(project):
    drifted(project)
    result = project.run()
    result.assert_outcomes(failed=1)
    lines = result.outlines
    headline = next(x for x in lines if x.startswith("golden mismatch:"))
    assert "first divergence at step 0: grad_norm 10x beyond tolerance, pg_loss 2x;" in headline
    start = lines.index(headline) + 2  # after the table's header
    rows = [x.split() for x in lines[start : start + 6]]
    assert [(r[0], r[1]) for r in rows] == [
        ("grad_norm", "0"),
        ("pg_loss", "0"),
        ("grad_norm", "1"),
        ("pg_loss", "1"),
        ("grad_norm", "2"),
        ("pg_loss", "2"),
    ]


@pytest.mark.parametrize("xdist", [False, True], ids=["in-process", "xdist"])
def test_the_short_summary_line_is_the_headline_and_the_table_stays_above(
    project, monkeypatch, xdist
):
    """On CI pytest prints the whole failure message in its short summary (and so in a job
    summary built from it): one line is enough there."""
    drifted(project)
    monkeypatch.setenv("CI", "true")
    result = project.run_subprocess("-n", "1", "-rf") if xdist else project.run("-rf")
    lines = result.outlines
    headline = next(x for x in lines if x.startswith("golden mismatch:"))
    summary = next(i for i, x in enumerate(lines) if "short test summary info" in x)
    assert lines[summary + 1] == f"FAILED test_it.py::test_train - {headline}"
    assert "1 failed" in lines[summary + 2]
    failure = lines[:summary]
    assert any(x.split()[:2] == ["grad_norm", "1"] for x in failure)  # the table is kept


def test_a_golden_of_one_metric_is_summarised_in_the_singular(project):
    project.write(ONE)
    result = project.run()
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["recorded test_it.py::test_one -> *", "    1 metric: step 0"])
