"""``rollout-golden compare A B``: two commits on the same recorded inputs, the diff of what
they compute, and the temporary checkouts gone however the command ends."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import pytest
from history import tree_digest
from tinyrepo import TinyRepo

from pytest_rollout_golden._internal.commits import trees
from pytest_rollout_golden.cli import main


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    """goldens recorded, an unrelated commit, then the 1e-3 bug."""
    repo = TinyRepo(tmp_path_factory.mktemp("c") / "project")
    repo.record()
    repo.commit("notes", {"notes.txt": "unrelated"})
    repo.bug()
    return repo


def test_compare_shows_the_metric_and_step_beyond_tolerance(history, monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(history.path)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    before = tree_digest(history.path)

    assert main(["compare", "HEAD~2", "HEAD", "--jobs", "2", "--", "-q"]) == 1
    out = capsys.readouterr().out
    assert f"A: {history.shas[1][:10]} record goldens (pytest --update-golden: exit 0" in out
    assert f"B: {history.shas[3][:10]} scale the loss by 1.001" in out
    assert "test_calc/test_loss: DIFFERS (3 beyond tolerance)" in out
    assert "pg_loss  step 0" in out

    assert main(["compare", "HEAD~2", "HEAD~1", "--json", "--jobs", "2"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["ok"] is True and document["summary"]["within_tolerance"] == 1
    assert (document["a"]["commit"], document["b"]["commit"]) == tuple(history.shas[1:3])

    assert main(["compare", "HEAD~1", "HEAD", "--json", "--jobs", "2"]) == 1
    document = json.loads(capsys.readouterr().out)
    (golden,) = document["goldens"]
    assert golden["golden"] == "test_calc/test_loss"
    assert golden["first_divergence"] == {"pg_loss": 0}
    beyond = [r for r in golden["metrics"] if not r["ok"]]
    assert [(r["name"], r["step"]) for r in beyond] == [("pg_loss", s) for s in range(3)]
    assert beyond[0]["rel_max"] == pytest.approx(1e-3)
    assert tree_digest(history.path) == before
    assert list((tmp_path / f"rollout-golden-commits-{os.getuid()}").iterdir()) == []


def test_a_bad_ref_or_golden_source_is_an_error_naming_it(history, monkeypatch, capsys):
    monkeypatch.chdir(history.path)
    assert main(["compare", "nosuch", "HEAD"]) == 2
    assert "nosuch: no such commit" in capsys.readouterr().err
    assert main(["compare", "HEAD~1", "HEAD", "--goldens", "nosuch"]) == 2
    assert "--goldens nosuch: not a folder, and nosuch: no such commit" in capsys.readouterr().err
    assert main(["compare", "HEAD~1", "HEAD", "--golden-root", str(history.path.parent)]) == 2
    assert "is outside the git checkout" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("command", "args"),
    [
        (["compare", "HEAD~2", "HEAD"], ["{repo}/test_calc.py"]),  # an absolute test path
        (["compare", "HEAD~2", "HEAD"], ["--golden-dir", "{repo}/golden"]),  # the user's goldens
        (
            ["bisect", "--good", "HEAD~2", "--bad", "HEAD"],
            ["--golden-dir={repo}/../project/golden"],
        ),
        (["bisect", "--good", "HEAD~2", "--bad", "HEAD"], ["{repo}/test_calc.py::test_loss"]),
    ],
)
def test_arguments_into_the_checkout_run_in_the_temporary_tree(
    history, monkeypatch, capsys, tmp_path, command, args
):
    """Paths into the user's checkout are taken in each temporary tree: the user's goldens
    are never re-recorded (they were, and the error came after the write)."""
    monkeypatch.chdir(history.path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    before = tree_digest(history.path)
    pytest_args = [arg.format(repo=history.path) for arg in args]
    found = main([*command, "--", *pytest_args])
    out = capsys.readouterr().out
    if command[0] == "compare":
        assert found == 1 and "test_calc/test_loss: DIFFERS" in out
    else:
        assert found == 0 and history.shas[3][:10] in out
    assert tree_digest(history.path) == before


@pytest.mark.parametrize("arg", ["{outside}/test_x.py", "--golden-dir={outside}", "../elsewhere"])
def test_a_path_outside_the_checkout_is_refused_before_any_run(
    history, monkeypatch, capsys, tmp_path, arg
):
    monkeypatch.chdir(history.path)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    given = arg.format(outside=tmp_path / "outside")
    assert main(["compare", "HEAD~2", "HEAD", "--", given]) == 2
    err = capsys.readouterr().err
    assert f"pytest argument {given!r}" in err and "outside the git checkout" in err
    assert not (tmp_path / f"rollout-golden-commits-{os.getuid()}").exists() or not list(
        (tmp_path / f"rollout-golden-commits-{os.getuid()}").iterdir()
    )


def _as_a_terminal() -> None:
    """In the child: Ctrl-C and SIGTERM as a shell's foreground job gets them (default
    handling, not blocked), whatever this suite's worker inherited or left behind (an
    ignored SIGINT is inherited across exec, and Python then raises no KeyboardInterrupt)."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})


def _start(history, tmp_path, jobs: int = 1) -> tuple[subprocess.Popen, list[int]]:
    """A compare whose test hangs (sleeps), started in a subprocess; returns it once each of
    its ``jobs`` pytest runs is in the test, with their pids."""
    pids = tmp_path / "pids"
    pids.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp_path), "TINY_SLEEP": "600", "TINY_PIDS": str(pids)}
    command = [sys.executable, "-m", "pytest_rollout_golden", "compare", "HEAD~1", "HEAD"]
    command += ["--jobs", str(jobs)]
    compare = subprocess.Popen(
        command, cwd=history.path, env=env, stderr=subprocess.PIPE, preexec_fn=_as_a_terminal
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        running = [int(p.name) for p in pids.iterdir()]
        if len(running) == jobs:
            return compare, running
        assert compare.poll() is None, compare.stderr.read()
        time.sleep(0.05)
    compare.kill()
    raise AssertionError(f"the compare started {len(running)} of {jobs} pytest runs")


def _running(pid: int) -> bool:
    """Whether process ``pid`` runs (an ended one not yet waited for does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True)
    return state.stdout.strip()[:1] not in ("", "Z")


def _gone(pid: int, seconds: float) -> bool:
    """Whether process ``pid`` ends within ``seconds``."""
    deadline = time.monotonic() + seconds
    while _running(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _run_folders(tmp_path) -> list:
    return list((tmp_path / f"rollout-golden-commits-{os.getuid()}").glob("run-*"))


@pytest.mark.parametrize(
    ("signum", "jobs", "status"), [(signal.SIGINT, 1, 130), (signal.SIGTERM, 2, 143)]
)
def test_ctrl_c_or_sigterm_removes_the_run_folder_and_kills_pytest(
    history, tmp_path, signum, jobs, status
):
    before = tree_digest(history.path)
    compare, pids = _start(history, tmp_path, jobs)
    assert len(_run_folders(tmp_path)) == 1
    compare.send_signal(signum)
    assert compare.wait(timeout=60) == status, compare.stderr.read()
    assert _run_folders(tmp_path) == []
    assert all(_gone(pid, 20) for pid in pids)
    assert tree_digest(history.path) == before


def test_after_a_sigkill_pytest_ends_within_seconds_and_the_next_start_reaps_the_run(
    history, tmp_path
):
    """Nothing is left to clean up the pytest runs of a killed compare (each runs in a
    session of its own, the test hangs): they end by themselves. 5 s: the runs end at once,
    the margin is for a loaded machine's scheduling."""
    before = tree_digest(history.path)
    compare, pids = _start(history, tmp_path, jobs=2)
    (folder,) = _run_folders(tmp_path)
    compare.kill()
    compare.wait()
    assert all(_gone(pid, 5) for pid in pids)
    assert folder.is_dir()  # nobody removed it: the next start does
    with trees.Trees(history.path, base=tmp_path) as run:
        assert not folder.exists() and run.folder.is_dir()
    assert tree_digest(history.path) == before
