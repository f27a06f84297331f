"""Simulated nightly CI histories of one metric's distance to its golden, in units of its
tolerance: the series the change-point tests, the benchmark and the docs' figure read.

The model (``_internal/history/changepoints.py`` assumes it): a correct commit's distance is
:data:`BASE` plus independent normal noise of sd :data:`SD` (run-to-run environment noise:
reduction orders, kernels picked at run time); a planted commit adds its shift to every run
from its night on. Each night lands :data:`COMMITS_PER_NIGHT` commits and the nightly run
tests the last one; a shift is planted in the middle commit of its night, so the commit range
handed to bisect must reach back past the previous night's run to name it.
"""

from __future__ import annotations

import dataclasses
import datetime
import random
from collections.abc import Mapping
from pathlib import Path

BASE = 0.2  # a distance well within tolerance (1)
SD = 0.01  # 1% of the tolerance: the shifts the issue asks for (3%) are 3 sd
COMMITS_PER_NIGHT = 3
YEAR_SHIFTS = {120: 0.03, 250: -0.03}  # the done-when's two shifts: a regression, a fix


@dataclasses.dataclass(frozen=True)
class History:
    """``series[i]``: run ``i``'s distance; ``commits[i]``: the commit it tested;
    ``order``: every commit, oldest first; ``planted``: run -> the commit that shifted it."""

    series: list[float]
    commits: list[str]
    order: list[str]
    planted: dict[int, str]

    def named(self, good: str, bad: str, commit: str) -> bool:
        """Whether bisecting from ``good`` to ``bad`` searches ``commit``."""
        where = self.order.index
        return where(good) < where(commit) <= where(bad)


def commit(night: int, n: int) -> str:
    """The ``n``-th commit of ``night`` (0-based): ``n120b``."""
    return f"n{night:03d}{'abcdefgh'[n]}"


def nightly(
    runs: int = 365,
    shifts: Mapping[int, float] = YEAR_SHIFTS,
    *,
    seed: int = 0,
    sd: float = SD,
    base: float = BASE,
) -> History:
    """``runs`` nightly runs; ``shifts``: night -> shift (in units of tolerance) from it on."""
    rng = random.Random(seed)
    series, commits, order = [], [], []
    level = base
    for night in range(runs):
        level += shifts.get(night, 0.0)
        order += [commit(night, n) for n in range(COMMITS_PER_NIGHT)]
        commits.append(order[-1])
        series.append(level + rng.gauss(0.0, sd))
    planted = {night: commit(night, COMMITS_PER_NIGHT // 2) for night in shifts}
    return History(series, commits, order, planted)


def write_history(
    folder: Path, history: History, test: str = "test_grpo.py::test_step", metric: str = "pg_loss"
) -> None:
    """``history`` as the runs ``--golden-history folder`` would have appended: one a night,
    each with ``test``'s ``metric`` at one step, its distance the night's."""
    import numpy as np

    from pytest_rollout_golden._internal.history import store

    start = datetime.datetime(2026, 1, 1, 3, tzinfo=datetime.timezone.utc)
    for night, (value, commit_) in enumerate(zip(history.series, history.commits, strict=True)):
        document = {
            "time": (start + datetime.timedelta(days=night)).isoformat(timespec="seconds"),
            "commit": commit_,
            "lane": None,
            "counts": {"replayed": 1},
            "tests": [
                {
                    "test": test,
                    "golden": f"golden/{test.replace('.py::', '/')}",
                    "status": "replayed",
                    "lane": None,
                    "series": [{"name": metric, "kind": "metric", "failed": 0, "count": 1}],
                }
            ],
        }
        arrays = {  # record.ROWS: actual, expected, distance; rtol 1e-4 of a value of 1
            "steps": np.zeros(1, dtype=np.int64),
            "values": np.array([[1.0 + value * 1e-4], [1.0], [value]]),
        }
        store.append(folder, document, arrays, store.Limits())
