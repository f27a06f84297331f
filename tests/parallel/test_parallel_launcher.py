"""parallel.launch: results of every rank, a failing rank's traceback, hung ranks, pool reuse.

The functions launched live at the top level of this module: workers import them by name.
"""

from __future__ import annotations

import functools
import json
import os
import signal
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

from pytest_rollout_golden.parallel import LaunchError, LaunchTimeout, Layout, launch, launcher

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


def test_every_rank_runs_in_its_own_process_and_returns():
    results = launch(rank_sum, 2, 10.0)
    assert results == [(0, 2, 21.0), (1, 2, 21.0)]
    pids = launch(pid, Layout(dp=2))
    assert len(set(pids)) == 2 and os.getpid() not in pids


def test_world_size_one_runs_in_this_process_without_process_group():
    assert launch(pid, Layout()) == [os.getpid()]


def test_workers_are_reused_across_launches():
    first = launch(pid, 2)
    assert launch(pid, 2) == first
    assert launcher.pool_pids()[2] == first


def test_a_failing_rank_fails_the_launch_with_its_traceback_and_the_pool_restarts():
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


def test_a_missing_collective_times_out_naming_the_hung_rank():
    start = time.monotonic()
    with pytest.raises(LaunchTimeout) as info:
        launch(skips_a_collective, 2, timeout=2.0)
    assert time.monotonic() - start < 30
    assert info.value.hung == [0]
    assert "rank(s) [0] of 2 did not return within 2 s" in str(info.value)
    assert "Rank(s) [1] returned" in str(info.value)
    assert launch(rank_sum, 2, 0.0) == [(0, 2, 1.0), (1, 2, 1.0)]  # a fresh pool works


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
    Path(marker).with_name("pids.json").write_text(json.dumps(launcher.pool_pids()[2]))
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


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("signals", [[signal.SIGKILL], [signal.SIGTERM, signal.SIGKILL]])
def test_workers_die_with_a_killed_pytest_even_while_a_rank_hangs(tmp_path, signals):
    (tmp_path / "hanging.py").write_text(HANGING_MODULE)
    (tmp_path / "test_hangs.py").write_text(HANGING_TEST)
    marker = tmp_path / "started"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)])}
    env["HANG_MARKER"] = str(marker)
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
        pids = json.loads((tmp_path / "pids.json").read_text())
        assert len(pids) == 2 and not any(_gone(p) for p in pids)
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
