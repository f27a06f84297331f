"""``rollout-golden bisect`` on a real 32-commit history: the first bad commit in at most six
replays, its divergence printed, the checkout untouched, tried commits cached."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from history import build_history, git, tree_digest

from pytest_rollout_golden.cli import main

BROKEN = 16  # the search's first probe: the skip is always met
# three bug positions drawn once (seeded), away from the broken commit and its repair
SEEDED_K = random.Random(28).sample([k for k in range(1, 32) if k not in (BROKEN, BROKEN + 1)], 3)
FAST = ("-p", "no:hypothesispytest")  # the toy test needs no hypothesis: a faster replay


def _main(history, argv: list[str], capsys) -> tuple[int, str, str]:
    """Run ``rollout-golden ARGV`` in the history's checkout: status, stdout, stderr."""
    cwd = os.getcwd()
    os.chdir(history.repo)
    try:
        status = main(argv)
    finally:
        os.chdir(cwd)
    return status, *capsys.readouterr()


def _bisect(history, cache: Path, *extra: str, capsys) -> tuple[int, dict]:
    """``rollout-golden bisect --json`` from the good to the bad end of the history."""
    argv = ["bisect", "--good", history.good, "--bad", history.bad, "--json"]
    argv += ["--cache-dir", str(cache), *extra, "--", *FAST]
    status, out, _ = _main(history, argv, capsys)
    return status, json.loads(out)


@pytest.fixture(scope="module", params=SEEDED_K, ids=lambda k: f"K{k}")
def bugged(request, tmp_path_factory):
    """A history with the bug at K and a dirty checkout, and the cache its bisects share."""
    folder = tmp_path_factory.mktemp(f"history-{request.param}")
    history = build_history(folder / "repo", bug_at=request.param, broken_at=BROKEN, dirty=True)
    return history, folder / "cache"


def test_bisect_finds_the_first_bad_commit_in_six_replays(bugged, capsys) -> None:
    bugged, cache = bugged
    before = tree_digest(bugged.repo)
    status, found = _bisect(bugged, cache, capsys=capsys)
    assert tree_digest(bugged.repo) == before, "the checkout was written"
    assert status == 0
    k = bugged.bug_at
    assert found["first_bad"] == {"sha": bugged.shas[k], "subject": bugged.subjects[k]}
    assert found["replays"] <= 6, found["tried"]
    divergence = found["first_bad_run"]["first"]
    assert (divergence["metric"], divergence["step"]) == ("pg_loss", 1)
    assert divergence["golden"] == "golden/test_calc/test_training"  # not the temporary tree
    assert 1 < divergence["excess"] < 10  # a 1e-3 bug against the default rtol of 1e-4
    skipped = [run for run in found["tried"] if run["outcome"] == "skip"]
    assert [run["commit"]["sha"] for run in skipped] == [bugged.shas[BROKEN]]
    assert skipped[0]["reason"].endswith("collection error: SyntaxError: invalid syntax")


def test_a_second_bisect_replays_nothing_and_prints_the_answer(bugged, capsys) -> None:
    bugged, cache = bugged
    _bisect(bugged, cache, capsys=capsys)  # a no-op when the test above ran
    argv = ["bisect", "--good", "HEAD~31", "--bad", "HEAD", "--cache-dir", str(cache)]
    status, out, err = _main(bugged, [*argv, "--", *FAST], capsys)
    k = bugged.bug_at
    assert status == 0
    assert out.startswith(f"first bad commit: {bugged.shas[k][:10]} {bugged.subjects[k]}\n")
    assert "  first divergence: pg_loss at step 1: expected 0.25841470984807896" in out
    assert "x beyond rtol=0.0001" in out
    assert "(0 replayed," in out and "cached" in err
    skipped = next(line for line in out.splitlines() if bugged.shas[BROKEN][:10] in line)
    assert skipped.split()[2:4] == ["skip", "2"] and "Half-written test helper" in skipped
    assert skipped.endswith("interrupted or a collection error: SyntaxError: invalid syntax")


def test_plot_draws_the_commits_tried(bugged, capsys, tmp_path) -> None:
    pytest.importorskip("matplotlib")
    bugged, cache = bugged
    _bisect(bugged, cache, capsys=capsys)  # a no-op when the tests above ran
    out = tmp_path / "bisect.png"
    argv = ["bisect", "--good", "HEAD~31", "--bad", "HEAD", "--cache-dir", str(cache)]
    status, printed, err = _main(bugged, [*argv, "--plot", str(out), "--", *FAST], capsys)
    assert status == 0 and printed.startswith("first bad commit: ")
    assert out.read_bytes().startswith(b"\x89PNG")
    assert err.splitlines()[-1] == f"bisect: wrote {out}"


def test_plot_without_matplotlib_fails_before_any_replay(bugged, capsys, hide_matplotlib) -> None:
    bugged, _ = bugged
    hide_matplotlib()
    argv = ["bisect", "--good", "HEAD~31", "--bad", "HEAD", "--no-cache", "--plot", "b.png"]
    status, printed, err = _main(bugged, [*argv, "--", *FAST], capsys)
    assert status == 2 and printed == ""
    assert "pip install 'pytest-rollout-golden[plot]'" in err and "bisect: [1]" not in err


def test_two_jobs_end_in_the_ambiguous_set_skipped_commits_leave(tmp_path, capsys) -> None:
    # the bug lands with the repair of the broken commit: 16 cannot be judged, 17 is bad
    history = build_history(tmp_path / "repo", bug_at=BROKEN + 1, broken_at=BROKEN)
    before = tree_digest(history.repo)
    status, found = _bisect(history, tmp_path / "cache", "--jobs", "2", capsys=capsys)
    assert tree_digest(history.repo) == before
    assert found["jobs"] == 2 and found["replays"] == len(found["tried"])
    assert status == 1 and found["ambiguous"] and found["first_bad"] is None
    assert [c["sha"] for c in found["candidates"]] == list(history.shas[BROKEN : BROKEN + 2])
    assert found["last_good"]["sha"] == history.shas[BROKEN - 1]


def test_sigkill_mid_bisect_leaves_the_checkout_untouched(tmp_path) -> None:
    history = build_history(tmp_path / "repo", commits=8, bug_at=5)
    before = tree_digest(history.repo)
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp")}
    (tmp_path / "tmp").mkdir()
    command = [sys.executable, "-m", "pytest_rollout_golden", "bisect"]
    command += ["--good", history.good, "--bad", history.bad, "--no-cache", "--", *FAST]
    bisect = subprocess.Popen(command, cwd=history.repo, env=env, stderr=subprocess.PIPE, text=True)
    assert bisect.stderr is not None
    assert bisect.stderr.readline().startswith("bisect: 7 commits after good")
    deadline = time.monotonic() + 60
    while not list((tmp_path / "tmp").glob("rollout-golden-commits-*/run-*/tree-*")):
        assert time.monotonic() < deadline, "no checkout appeared"
        time.sleep(0.05)
    bisect.send_signal(signal.SIGKILL)
    bisect.wait()
    assert tree_digest(history.repo) == before
    assert git(history.repo, "worktree", "list").count("\n") == 0  # only the checkout itself


def test_bad_ends_are_a_clear_error(tmp_path, capsys) -> None:
    history = build_history(tmp_path / "repo", commits=3)
    argv = ["bisect", "--good", history.bad, "--bad", history.good, "--no-cache"]
    status, _, err = _main(history, argv, capsys)
    assert status == 2
    assert "is not an ancestor of" in err and "give --good an older commit" in err


def test_check_ends_stops_when_the_good_end_replays_bad(tmp_path, capsys) -> None:
    history = build_history(tmp_path / "repo", commits=4, bug_at=1)
    argv = ["bisect", "--good", history.shas[1], "--bad", history.bad, "--check-ends"]
    status, _, err = _main(history, [*argv, "--jobs", "2", "--no-cache", "--", *FAST], capsys)
    assert status == 2
    assert f"--good {history.shas[1][:10]} (Scale the loss after the first step) replays bad" in err
    assert "give --good a commit that replays good" in err


def test_a_bisect_in_another_environment_reuses_no_verdict(bugged, capsys, monkeypatch) -> None:
    """Verdicts cached without ``PYTEST_ADDOPTS`` are not reused under one that loosens the
    gate (they named the first bad commit again); ``--json`` says what the cache key held."""
    bugged, cache = bugged
    if bugged.bug_at != SEEDED_K[0]:
        pytest.skip("one history is enough")
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    status, found = _bisect(bugged, cache, capsys=capsys)  # cached when the tests above ran
    assert status == 0
    monkeypatch.setenv("PYTEST_ADDOPTS", "--golden-tolerance=pg_loss:rtol=0.01")
    argv = ["bisect", "--good", bugged.good, "--bad", bugged.bad, "--cache-dir", str(cache)]
    status, _, err = _main(bugged, [*argv, "--", *FAST], capsys)
    assert status == 2, err
    assert "replays good, not bad" in err  # every commit replayed: the loosened gate passes
    key = found["cache_key"]
    assert "PYTEST_ADDOPTS" not in key["environment"] and key["pytest_args"] == list(FAST)
    assert key["plugin"]["version"] and key["packages"].endswith(" packages)")
