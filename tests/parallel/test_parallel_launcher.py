"""parallel.launch: results of every rank, a failing rank's traceback, hung ranks, pool reuse,
the fork server and the spawned-interpreter fallback.

The functions launched live at the top level of this module: workers import them by name.
"""

from __future__ import annotations

import functools
import json
import os
import pickle
import signal
import socket
import subprocess
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from pytest_rollout_golden.parallel import (
    LaunchError,
    LaunchTimeout,
    Layout,
    forkserver,
    launch,
    launcher,
)

ROOT = Path(__file__).parents[2]


def rank_sum(rank: int, offset: float) -> tuple[int, int, float]:
    value = torch.tensor([rank + offset], dtype=torch.float64)
    dist.all_reduce(value)
    return rank, dist.get_world_size(), float(value)


def fails_on_rank_one(rank: int) -> int:
    if rank == 1:
        raise ValueError("deliberate failure on rank 1")
    return rank


def skips_a_collective(rank: int) -> int:
    if rank == 0:  # rank 1 never joins this all-reduce
        dist.all_reduce(torch.zeros(1))
    return rank


def pid(rank: int) -> int:
    return os.getpid()


def process_facts(rank: int, name: str) -> dict[str, Any]:
    """What a rank sees of its process: parent, group, threads, environment, directory."""
    return {
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "own_group": os.getpgrp() == os.getpid(),
        "env": os.environ.get(name),
        "cwd": os.getcwd(),
        "backend": dist.get_backend(),
    }


LINUX = sys.platform.startswith("linux")
linux_only = pytest.mark.skipif(not LINUX, reason="the fork server and /proc are Linux-only")


@pytest.fixture(params=["forkserver", "spawn"])
def start_path(request, monkeypatch):
    """Run a test on forked ranks (the default on Linux) and on spawned interpreters."""
    if request.param == "forkserver" and not LINUX:
        pytest.skip("the fork server is Linux-only")
    launcher.shutdown()
    if request.param == "spawn":
        monkeypatch.setenv(forkserver.ENV_VAR, "0")
    else:
        monkeypatch.delenv(forkserver.ENV_VAR, raising=False)
    yield request.param
    launcher.shutdown()


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def test_every_rank_runs_in_its_own_process_and_returns():
    results = launch(rank_sum, 2, 10.0)
    assert results == [(0, 2, 21.0), (1, 2, 21.0)]
    pids = launch(pid, Layout(dp=2))
    assert len(set(pids)) == 2 and os.getpid() not in pids


def test_world_size_one_runs_in_this_process_without_process_group(monkeypatch):
    monkeypatch.delenv(forkserver.ENV_VAR, raising=False)
    launcher.shutdown(server=True)
    assert launch(pid, Layout()) == [os.getpid()]
    assert not dist.is_initialized()
    if LINUX:  # started for the variants that usually follow, not waited for
        assert launcher.server_pid() is not None


def test_workers_are_reused_across_launches():
    first = launch(pid, 2)
    assert launch(pid, 2) == first
    assert launcher.pool_pids()[2] == first


def test_a_failing_rank_fails_the_launch_with_its_traceback_and_the_pool_restarts(start_path):
    before = launch(pid, 2)
    with pytest.raises(LaunchError) as info:
        launch(fails_on_rank_one, 2, timeout=60)
    message = str(info.value)
    assert "rank(s) [1] of 2 failed" in message
    assert "ValueError: deliberate failure on rank 1" in message
    assert 'in fails_on_rank_one\n    raise ValueError("deliberate failure on rank 1")' in message
    assert 2 not in launcher.pool_pids()  # torn down: its process group is in doubt
    after = launch(pid, 2)
    assert set(after).isdisjoint(before)


def test_a_missing_collective_times_out_naming_the_hung_rank(start_path):
    start = time.monotonic()
    with pytest.raises(LaunchTimeout) as info:
        launch(skips_a_collective, 2, timeout=2.0)
    assert time.monotonic() - start < 30
    assert info.value.hung == [0]
    assert "rank(s) [0] of 2 did not return within 2 s" in str(info.value)
    assert "Rank(s) [1] returned" in str(info.value)
    assert launch(rank_sum, 2, 0.0) == [(0, 2, 1.0), (1, 2, 1.0)]  # a fresh pool works


@linux_only
def test_ranks_are_forked_by_a_single_threaded_server_by_default(monkeypatch):
    monkeypatch.delenv(forkserver.ENV_VAR, raising=False)
    launcher.shutdown()
    monkeypatch.setenv("ROLLOUT_GOLDEN_PROBE", "seen by the ranks")
    facts = launch(process_facts, 2, "ROLLOUT_GOLDEN_PROBE")
    server = launcher.server_pid()
    assert server is not None and server != os.getpid()
    assert [f["ppid"] for f in facts] == [server, server]
    assert all(f["own_group"] for f in facts)  # killed with whatever it starts
    assert [f["env"] for f in facts] == ["seen by the ranks"] * 2  # this process's environment
    assert {f["cwd"] for f in facts} == {os.getcwd()}
    assert {f["backend"] for f in facts} == {"gloo"}
    assert _threads(server) == 1  # it never computes: no OpenMP, OpenBLAS or gloo thread
    assert launcher.pool_pids()[2] == [f["pid"] for f in facts]


@linux_only
def test_two_world_sizes_share_one_server_and_keep_their_pools(monkeypatch):
    monkeypatch.delenv(forkserver.ENV_VAR, raising=False)
    launcher.shutdown()
    two, four = launch(process_facts, 2, "HOME"), launch(process_facts, 4, "HOME")
    assert {f["ppid"] for f in two + four} == {launcher.server_pid()}
    assert launch(rank_sum, 2, 0.0) == [(r, 2, 1.0) for r in range(2)]
    assert launch(rank_sum, 4, 0.0) == [(r, 4, 6.0) for r in range(4)]
    assert launcher.pool_pids() == {2: [f["pid"] for f in two], 4: [f["pid"] for f in four]}


@linux_only
def test_ranks_die_with_their_server_and_the_next_launch_starts_a_fresh_one(monkeypatch):
    monkeypatch.delenv(forkserver.ENV_VAR, raising=False)
    launcher.shutdown()
    ranks = launch(pid, 2)
    server = launcher.server_pid()
    assert server is not None
    os.kill(server, signal.SIGKILL)
    assert _wait_for(lambda: all(_gone(p) for p in [server, *ranks]), 10), "ranks outlived it"
    after = launch(pid, 2)  # the dead pool is noticed and replaced, under a new server
    assert set(after).isdisjoint(ranks)
    assert launcher.server_pid() not in (None, server)


@linux_only
def test_a_late_reply_of_the_server_is_never_taken_for_the_next_request(monkeypatch):
    monkeypatch.delenv(forkserver.ENV_VAR, raising=False)
    ranks = launch(pid, 2)
    server = forkserver.server()
    assert server is not None and server.pid == launcher.server_pid()
    # A request whose reply is never read, as when an interrupt hits between send and receive:
    stale = pickle.dumps((next(server.requests), "poll", [1]))
    socket.send_fds(server.sock, [stale], [])
    assert server.poll(ranks) == [None, None]  # not the stale {1: -9}
    assert launch(pid, 2) == ranks


def test_the_spawn_fallback_runs_fresh_interpreters_when_forced(monkeypatch):
    launcher.shutdown(server=True)
    monkeypatch.setenv(forkserver.ENV_VAR, "0")
    try:
        facts = launch(process_facts, 2, forkserver.ENV_VAR)
        assert launcher.server_pid() is None
        assert [f["ppid"] for f in facts] == [os.getpid()] * 2
        assert [f["env"] for f in facts] == ["0", "0"]
        assert launch(rank_sum, 2, 0.0) == [(0, 2, 1.0), (1, 2, 1.0)]
    finally:
        launcher.shutdown()


A_THREAD = "import threading, time; threading.Thread(target=time.sleep, args=(60,)).start(); "


@linux_only
@pytest.mark.parametrize(
    ("command", "reason"),
    [
        ("raise SystemExit(3)", r"exited \(exit code 3\)"),
        (A_THREAD + forkserver._SERVER_COMMAND, r"runs 2 threads \(forking is safe from one only"),
    ],
    ids=["exits", "threaded"],
)
def test_a_server_unfit_to_fork_falls_back_to_spawning_with_a_warning(monkeypatch, command, reason):
    launcher.shutdown(server=True)
    monkeypatch.setattr(forkserver, "_BROKEN", None)  # restored afterwards: the server is back
    monkeypatch.setattr(forkserver, "_SERVER_COMMAND", command)
    try:
        with pytest.warns(RuntimeWarning, match=f"fork server failed .*{reason}"):
            facts = launch(process_facts, 2, "HOME")
        assert [f["ppid"] for f in facts] == [os.getpid()] * 2
        assert launcher.server_pid() is None
    finally:
        launcher.shutdown(server=True)


RANK_VIEW = """
import os


def view(rank, leave_behind):
    seen = (os.environ.get("FROM_A"), os.environ.get("FROM_B"), os.environ.get("FROM_RANK"))
    seen += (os.getcwd(),)
    if leave_behind:  # what a rank of one test changes in its own process
        os.environ["FROM_RANK"] = "left by a rank of test_a"
        os.chdir("/")
    return seen
"""

TWO_TESTS_ONE_POOL = """
import os

from rank_view import view

from pytest_rollout_golden.parallel import launch, launcher


def test_a(monkeypatch, tmp_path):
    monkeypatch.setenv("FROM_A", "a")
    monkeypatch.chdir(tmp_path)
    assert launch(view, 2, True) == [("a", None, None, str(tmp_path))] * 2
    os.environ["POOL"] = repr(launcher.pool_pids()[2])


def test_b(monkeypatch):
    monkeypatch.setenv("FROM_B", "b")
    assert launch(view, 2, False) == [(None, "b", None, os.getcwd())] * 2
    assert repr(launcher.pool_pids()[2]) == os.environ["POOL"]  # the same, reused pool
"""


def test_a_reused_pool_runs_each_launch_in_the_environment_and_directory_of_its_test(
    pytester, start_path
):
    pytester.makepyfile(rank_view=RANK_VIEW, test_two=TWO_TESTS_ONE_POOL)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "test_two.py", timeout=300)
    result.assert_outcomes(passed=2)


def test_functions_workers_cannot_import_are_refused_up_front():
    def nested(rank: int) -> int:
        return rank

    with pytest.raises(TypeError, match="top level of an importable module"):
        launch(nested, 2)


def test_any_picklable_callable_launches_and_others_are_refused_by_name():
    assert launch(functools.partial(rank_sum, offset=10.0), 2) == [(0, 2, 21.0), (1, 2, 21.0)]

    def nested(rank: int) -> int:
        return rank

    with pytest.raises(TypeError, match=r"launch\(functools.partial\(.*nested, .*top level"):
        launch(functools.partial(nested), 2)
    with pytest.raises(TypeError, match=r"launch\(functools.partial.*\): .*picklable"):
        launch(functools.partial(rank_sum, offset=lambda: 0), 2)


def test_under_torchrun_launch_joins_the_existing_group(monkeypatch):
    """Environment detection only; the real torchrun run is in test_parallel_torchrun.py."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    assert launcher.under_torchrun()
    monkeypatch.delenv("MASTER_ADDR")
    assert not launcher.under_torchrun()


def test_idle_pools_are_capped_least_recently_used_first(monkeypatch):
    monkeypatch.setattr(launcher, "MAX_WORKERS", 4)
    launch(pid, 2)
    launch(pid, 3)  # 2 + 3 > 4: the world-2 pool is stopped first
    assert set(launcher.pool_pids()) == {3}
    launch(pid, 1)  # in-process: no pool
    assert set(launcher.pool_pids()) == {3}


def sleeps_then_returns(rank: int, tag: str, seconds: float) -> tuple[str, int]:
    time.sleep(seconds)
    return tag, rank


def returns_what_only_the_worker_can_unpickle(rank: int) -> Any:
    if rank == 0:
        return rank
    module = types.ModuleType("only_in_the_worker")
    module.Local = type("Local", (), {"__module__": module.__name__})  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    return module.Local()  # type: ignore[attr-defined]


class _Timeout(Exception):
    """What pytest-timeout's signal method raises in the test, whatever it was doing."""


@pytest.mark.parametrize("interruption", [_Timeout, KeyboardInterrupt])
def test_an_interrupted_launch_discards_its_pool_so_the_next_gets_its_own_results(interruption):
    launch(pid, 2)  # a warm pool, as a previous test leaves it

    def interrupt(signum: int, frame: Any) -> None:
        raise interruption("interrupted while the ranks work")

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.5)
        with pytest.raises(interruption):
            launch(sleeps_then_returns, 2, "first", 60.0)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert 2 not in launcher.pool_pids()
    assert launch(sleeps_then_returns, 2, "second", 0.0) == [("second", 0), ("second", 1)]


def test_a_result_this_process_cannot_unpickle_fails_the_launch_naming_the_rank():
    with pytest.raises(LaunchError, match=r"rank\(s\) \[1\] of 2 failed") as info:
        launch(returns_what_only_the_worker_can_unpickle, 2, timeout=60)
    assert "No module named 'only_in_the_worker'" in str(info.value)
    assert 2 not in launcher.pool_pids()
    assert launch(rank_sum, 2, 0.0) == [(0, 2, 1.0), (1, 2, 1.0)]


HANGING_MODULE = """
import os
import time
from pathlib import Path


def pid(rank):
    return os.getpid()


def hangs(rank, marker):
    Path(f"{marker}.{rank}").touch()
    time.sleep(3600)
"""

HANGING_TEST = """
import json
import os
from pathlib import Path

from hanging import hangs, pid

from pytest_rollout_golden.parallel import launch, launcher


def test_hangs():
    launch(pid, 2)
    marker = os.environ["HANG_MARKER"]
    pids = [*launcher.pool_pids()[2], launcher.server_pid()]  # no server: [..., None]
    Path(marker).with_name("pids.json").write_text(json.dumps(pids))
    launch(hangs, 2, marker)
"""


def _gone(pid: int) -> bool:
    """Whether process ``pid`` has exited (a zombie nobody reaped counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")


def _wait_for(condition: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@linux_only
@pytest.mark.parametrize(
    ("signals", "forked"),
    [
        ([signal.SIGKILL], True),
        ([signal.SIGTERM, signal.SIGKILL], True),  # a CI timeout
        ([signal.SIGKILL], False),  # spawned interpreters, the fallback
    ],
    ids=["sigkill-forkserver", "sigterm-sigkill-forkserver", "sigkill-spawn"],
)
def test_workers_die_with_a_killed_pytest_even_while_a_rank_hangs(tmp_path, signals, forked):
    (tmp_path / "hanging.py").write_text(HANGING_MODULE)
    (tmp_path / "test_hangs.py").write_text(HANGING_TEST)
    marker = tmp_path / "started"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)])}
    env["HANG_MARKER"] = str(marker)
    env[forkserver.ENV_VAR] = "1" if forked else "0"
    command = [sys.executable, "-m", "pytest", "test_hangs.py", "-p", "no:cacheprovider"]
    pytest_process = subprocess.Popen(
        [*command, "-q", "-s"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    pids: list[int] = []
    try:
        ranks = [marker.with_name(f"started.{rank}") for rank in (0, 1)]
        assert _wait_for(lambda: all(r.exists() for r in ranks), 120), "the ranks never started"
        *pids, server = json.loads((tmp_path / "pids.json").read_text())
        assert (server is not None) == forked
        pids += [server] if forked else []  # the ranks' parent must die too
        assert len(pids) == 2 + forked and not any(_gone(p) for p in pids)
        for number in signals:  # a CI timeout: SIGTERM, then SIGKILL
            pytest_process.send_signal(number)
        pytest_process.wait(30)
        assert _wait_for(lambda: all(_gone(p) for p in pids), 10), "workers outlived pytest"
    finally:
        pytest_process.kill()
        pytest_process.wait()
        for leftover in pids:
            if not _gone(leftover):
                os.kill(leftover, signal.SIGKILL)


CHILDREN_MODULE = """
import json
import os
import subprocess
import sys
import time
from pathlib import Path


def starts_a_child_and_sleeps(rank, folder):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    Path(folder, f"rank{rank}.json").write_text(json.dumps([os.getpid(), child.pid]))
    time.sleep(600)
"""

CHILDREN_TEST = """
import os

from children import starts_a_child_and_sleeps

from pytest_rollout_golden.parallel import launch


def test_children():
    launch(starts_a_child_and_sleeps, 2, os.environ["PIDS_FOLDER"])
"""


def _descendants(root: int) -> set[int]:
    """The live processes below ``root`` (Linux)."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] not in ("Z", "X"):
                parents[int(entry)] = int(fields[1])
    found, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


REPEATS = 5


def _ranks_started(folder: Path) -> set[int]:
    """The pids the two ranks of the test in ``folder`` wrote (each its own and its child's)."""
    files = [folder / f"rank{rank}.json" for rank in (0, 1)]
    started = _wait_for(lambda: all(f.exists() and f.stat().st_size for f in files), 180)
    assert started, "the ranks never started"
    return {pid for f in files for pid in json.loads(f.read_text())}


@linux_only
@pytest.mark.parametrize("forked", [True, False], ids=["forkserver", "spawn"])
def test_no_process_of_the_tree_outlives_a_sigkilled_pytest_when_ranks_have_children(
    tmp_path, forked
):
    """REPEATS pytest processes at once (independent tries: the outcome was a race), each
    SIGKILLed once its ranks and their children run."""
    (tmp_path / "children.py").write_text(CHILDREN_MODULE)
    (tmp_path / "test_children.py").write_text(CHILDREN_TEST)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)])}
    env[forkserver.ENV_VAR] = "1" if forked else "0"
    command = [sys.executable, "-m", "pytest", "test_children.py", "-p", "no:cacheprovider", "-q"]
    processes, trees = [], []
    try:
        for attempt in range(REPEATS):
            env["PIDS_FOLDER"] = str(tmp_path / f"pids{attempt}")
            Path(env["PIDS_FOLDER"]).mkdir()
            processes.append(subprocess.Popen(command, cwd=tmp_path, env=env))
        for attempt, process in enumerate(processes):
            written = _ranks_started(tmp_path / f"pids{attempt}")
            trees.append(_descendants(process.pid))
            assert written <= trees[-1] and len(written) == 4, (written, trees[-1])
        survivors = []
        for process, tree in zip(processes, trees, strict=True):
            process.kill()
            process.wait(30)
            _wait_for(lambda: all(_gone(p) for p in tree), 5)  # noqa: B023 (used at once)
            survivors.append(sorted(p for p in tree if not _gone(p)))
        assert survivors == [[]] * REPEATS, f"processes outlived pytest: {survivors}"
    finally:
        for process in processes:
            process.kill()
            process.wait()
        for leftover in set().union(*trees):
            if not _gone(leftover):
                os.kill(leftover, signal.SIGKILL)
