"""parallel.launch: results of every rank, a failing rank's traceback, hung ranks, pool reuse.

The functions launched live at the top level of this module: workers import them by name.
"""

from __future__ import annotations

import functools
import os
import time

import pytest
import torch
import torch.distributed as dist

from pytest_rollout_golden.parallel import LaunchError, LaunchTimeout, Layout, launch, launcher


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
