"""``--golden-history DIR``: each session appends one run; ``rollout-golden history`` reads them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from pytest_rollout_golden._internal.history import store
from pytest_rollout_golden.cli import main

TRAIN = """
def test_train(golden, values):
    shift = values.get("shift", 0.0)
    for step in range(3):
        golden.check({"loss": 1.0 + step + shift, "kl": 0.01 * step}, step=step)
"""


def history(capsys, *args: str) -> tuple[int, str]:
    """``rollout-golden history ARGS``: exit status and output (not the inner runs' before)."""
    capsys.readouterr()
    code = main(["history", *args])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_three_runs_are_listed_and_a_perturbation_shows_as_a_jump(project, capsys):
    project.write(TRAIN)
    for _ in range(3):
        project.run("--golden-history", "hist").assert_outcomes(passed=1)
    folder = project.path / "hist"
    code, out = history(capsys, str(folder), "list")
    assert code == 0
    assert f"{folder}: 3 runs" in out
    rows = [line.split() for line in out.splitlines()[2:]]
    assert [(r[0], r[-2], r[-1]) for r in rows] == [
        ("1", "1", "0"),
        ("2", "1", "0"),
        ("3", "1", "0"),
    ]

    # loss's default rtol 1e-4 is measured against its recorded magnitude (3.0, its largest
    # step): 3e-4 allowed, so a shift of 1e-3 is 3.33 tolerances at every step
    project.set_values(shift=0.001)
    result = project.run("--golden-history", "hist")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["history: run 4 appended to hist (1 golden)"])

    code, out = history(capsys, str(folder), "show", "test_train", "--metric", "loss")
    assert code == 0
    distances = {r.split()[0]: r.split()[2:] for r in out.splitlines()[2:]}
    assert distances["1"] == ["recorded", "-"]  # recorded: nothing to be far from
    assert distances["3"] == ["replayed", "0"]
    status, jump = distances["4"]
    assert status == "failed" and float(jump) == pytest.approx(0.001 / 3e-4, rel=1e-2)

    code, out = history(capsys, str(folder), "compare", "3", "-1")
    assert code == 1  # diff's exit status: the runs differ beyond tolerance
    assert "test_it.py::test_train: DIFFERS (3 beyond tolerance)" in out
    assert "loss    step 0            3/3" in out  # diff's own table
    code, out = history(capsys, str(folder), "compare", "2", "3")
    assert code == 0 and "1 within tolerance" in out


def test_the_run_records_values_distances_and_environment(project):
    project.write(TRAIN)
    project.run("--golden-history", "hist").assert_outcomes(passed=1)
    project.set_values(shift=0.001)
    project.run("--golden-history", "hist").assert_outcomes(failed=1)
    folder = project.path / "hist"
    run = store.read_run(folder, 2)
    assert run["counts"] == {"failed": 1}
    assert run["fingerprint"]["torch"] == run["versions"]["torch"]
    assert "pytest-rollout-golden" in run["versions"] and "mode" in run
    (test,) = run["tests"]
    assert (test["test"], test["golden"]) == ("test_it.py::test_train", "golden/test_it/test_train")
    assert {s["name"]: s["failed"] for s in test["series"]} == {"kl": 0, "loss": 3}
    arrays = store.read_values(folder, run)
    assert [s["count"] for s in test["series"]] == [3, 3]  # kl, then loss
    assert arrays["steps"].tolist() == [0, 1, 2, 0, 1, 2]
    actual, expected, excess = arrays["values"][:, 3:].tolist()  # loss's
    assert actual == [1.001, 2.001, 3.001]
    assert expected == [1.0, 2.0, 3.0]
    assert excess[0] > 1


def test_the_commit_is_git_head(project):
    project.write(TRAIN)
    head = project.commit()
    project.run("--golden-history", "hist").assert_outcomes(passed=1)
    assert store.read_run(project.path / "hist", 1)["commit"] == head


def test_the_oldest_runs_are_dropped_and_the_output_says_so(project, capsys):
    project.write(TRAIN)
    for _ in range(3):
        project.run("--golden-history", "hist", "-o", "golden_history_max_runs=2")
    result = project.run("--golden-history", "hist", "-o", "golden_history_max_runs=2")
    result.stdout.fnmatch_lines(
        ["history: dropped the 1 oldest runs (2) to stay within golden_history_max_runs = 2"]
    )
    assert store.run_numbers(project.path / "hist") == [3, 4]

    one_run = sum(f.stat().st_size for f in store.run_path(project.path / "hist", 4).iterdir())
    bound = f"golden_history_max_bytes={one_run + one_run // 2}"  # room for one run, not two
    result = project.run("--golden-history", "hist", "-o", bound)
    result.stdout.fnmatch_lines(["history: dropped the 2 oldest runs (3-4) to stay within *"])
    assert store.run_numbers(project.path / "hist") == [5]


def test_a_bad_bound_is_a_usage_error(project):
    project.write(TRAIN)
    result = project.run("--golden-history", "hist", "-o", "golden_history_max_bytes=lots")
    result.stderr.fnmatch_lines(["*ini golden_history_max_bytes must be a size >= 0*'lots'*"])
    assert not (project.path / "hist").exists()


def test_off_by_default_and_from_the_ini(project):
    project.write(TRAIN)
    project.run().assert_outcomes(passed=1)
    assert not (project.path / "hist").exists()
    project.pytester.makeini("[pytest]\ngolden_history = hist\n")
    project.run().assert_outcomes(passed=1)
    assert store.run_numbers(project.path / "hist") == [1]


def test_xdist_workers_append_one_run_holding_every_test(project):
    pytest.importorskip("xdist")
    project.write(TRAIN.replace("test_train", "test_a") + TRAIN.replace("test_train", "test_b"))
    result = project.run_subprocess("-n", "2", "--golden-history", "hist")
    result.assert_outcomes(passed=2)
    assert store.run_numbers(project.path / "hist") == [1]
    tests = [t["test"] for t in store.read_run(project.path / "hist", 1)["tests"]]
    assert tests == ["test_it.py::test_a", "test_it.py::test_b"]


EMPTY_RUN = {"time": "2026-01-01T00:00:00+00:00", "counts": {}, "tests": []}

# Appends a run whose run.json write blocks until the parent kills the process: the values
# and the run's document are on disk in the staging folder, nothing is published yet.
KILLED_APPEND = """
import pathlib, sys, time
from pytest_rollout_golden import store as files
from pytest_rollout_golden._internal.history import store
import numpy as np

folder = pathlib.Path(sys.argv[1])
real = files.atomic_write

def stalled(path, chunks):
    real(path, chunks)
    if path.name == "run.json":
        (folder / "ready").touch()
        time.sleep(600)

store.store.atomic_write = stalled
store.append(folder, {"tests": []}, {"x": np.zeros(3)}, store.Limits())
"""


def test_a_sigkill_during_an_append_loses_that_run_only(tmp_path, capsys):
    folder = tmp_path / "hist"
    store.append(folder, EMPTY_RUN, {}, store.Limits())
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(KILLED_APPEND), str(folder)],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    deadline = time.monotonic() + 120
    while not (folder / "ready").exists():
        assert child.poll() is None and time.monotonic() < deadline, "the append never started"
        time.sleep(0.05)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    staged = [e.name for e in (folder / "runs").iterdir() if e.name.startswith(".stage-")]
    assert staged  # the killed run's leftovers, hidden
    assert store.run_numbers(folder) == [1]
    code, out = history(capsys, str(folder), "list")
    assert code == 0 and f"{folder}: 1 run" in out

    appended = store.append(folder, EMPTY_RUN, {}, store.Limits())
    assert appended.run == 2
    assert sorted(e.name for e in (folder / "runs").iterdir()) == ["000001", "000002"]
    assert json.loads((store.run_path(folder, 2) / "run.json").read_text())["run"] == 2


def test_history_commands_name_what_is_missing(tmp_path, capsys):
    code, out = history(capsys, str(tmp_path), "list")
    assert code == 2 and "no run in this history; run pytest with --golden-history" in out
    store.append(tmp_path, EMPTY_RUN, {}, store.Limits())
    code, out = history(capsys, str(tmp_path), "compare", "1", "7")
    assert code == 2 and "no run '7'; it holds runs 1-1 (-1: the newest)" in out
    code, out = history(capsys, str(tmp_path), "show", "nothing")
    assert code == 2 and "'nothing' matches no test of this history" in out


def test_dropping_old_runs_never_touches_what_the_history_did_not_write(tmp_path):
    """A numbered folder without the history's run.json, and a numbered link to elsewhere,
    are not runs: the bound drops only runs the history wrote."""
    folder, outside = tmp_path / "hist", tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("theirs")
    foreign = folder / store.RUNS / "000001"
    foreign.mkdir(parents=True)
    (foreign / "notes.txt").write_text("theirs")
    (folder / store.RUNS / "000002").symlink_to(outside, target_is_directory=True)
    for _ in range(3):
        store.append(folder, {"tests": []}, {}, store.Limits(max_runs=1))
    assert (foreign / "notes.txt").read_text() == "theirs"
    assert (folder / store.RUNS / "000002").is_symlink()
    assert (outside / "keep.txt").read_text() == "theirs"
    assert [n for n in store.run_numbers(folder) if store.is_run(folder, n)] == [5]
