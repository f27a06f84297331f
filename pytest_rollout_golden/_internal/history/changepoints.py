"""Change points in a metric's distance series across CI runs: the first run after which the
distance to the golden (in units of its tolerance, one value per run, oldest first) moved,
the runs it may be, and the commits to hand to ``rollout-golden bisect``.

The method, and why. A nightly history is read run by run, as CI sees it, so that what
:func:`detect` says of the first ``n`` runs never changes when more runs come (an alarm
raised last week is still raised). At each run ``t`` the newest ``w`` runs, for each window
``w`` of ``windows`` (1, 2, 5, 10, 20: a large shift is seen in one run, a small one needs
more), are compared with the runs before them back to the last change point (the
reference, at least ``min_reference`` runs) by Student's two-sample t statistic with the
pooled variance. The noise's sd is not known in advance, and need not be: under the model
below, without a change, that statistic follows Student's t with ``n_ref + w - 2`` degrees
of freedom exactly, whatever the mean and the sd, so each look's false-alarm probability is
exact. Each look is held to ``false_alarm_rate / (horizon * len(windows))``; by the union
bound (Bonferroni, valid however the overlapping looks correlate) the probability that
``horizon`` clean runs raise any alarm is at most ``false_alarm_rate``, and that ``n`` clean
runs do at most ``false_alarm_rate * n / horizon``. An anytime-valid e-detector would need
the sd in advance, and e-divisive means with a permutation test cannot reach a per-look level
of 2e-5 with the five runs the issue allows for detection (the smallest p of five against
thirty runs by permutation is 3e-6, with no power left).

The model: a correct commit's distances are independent draws of one normal distribution
(run-to-run environment noise: reduction orders, kernels picked at run time). Heavier tails
than normal raise the false-alarm rate (``benchmarks/bench_changepoints.py`` measures it).
A deterministic lane repeats its distance exactly; a reference of at least
:data:`EXACT_REPEATS` identical runs makes the series exact, and then any other value is a
change point at once (``exact``).

Where it happened: after an alarm, the first bad run is the split of the segment into two
means with the least squared error, and the runs it may be are the splits within
``2 ln(2 / LOCATION_MISS) * sd**2`` of it: for normal noise of known sd, the excess squared
error of the true split over the best one is the larger of two random walks' maxima, each
exceeding ``c * sd**2`` with probability at most ``exp(-c / 2)`` whatever the shift's size
(the maximum of a Brownian motion with drift), so the true run lies in
``earliest..latest`` with probability about ``1 - LOCATION_MISS``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

WINDOWS = (1, 2, 5, 10, 20)
"""The numbers of newest runs compared with the reference at each run."""
HORIZON = 100
"""Runs over which ``false_alarm_rate`` is the probability of any false alarm."""
MIN_REFERENCE = 10
"""Runs of reference before a look: fewer estimate the noise's sd too poorly to see 3 sd."""
EXACT_REPEATS = 2
"""Identical runs that make a series exact (a deterministic lane): noise never repeats."""
LOCATION_MISS = 0.01
"""The probability, under the model, that the first bad run lies outside
``earliest..latest``."""


@dataclasses.dataclass(frozen=True)
class ChangePoint:
    """A shift in a distance series: ``index`` is the first run after it (runs count from 0,
    oldest first), most likely; it lies in ``earliest..latest`` (see :data:`LOCATION_MISS`).
    ``before`` and ``after`` are the mean distances of the runs since the previous change
    point and of those from ``index`` to the next one. ``statistic`` is the |t| of the look
    that raised the alarm at run ``alarm`` over the newest ``window`` runs, ``threshold``
    the |t| it had to exceed; an ``exact`` change (a deterministic series moved) has the
    difference as its statistic and 0 as its threshold."""

    index: int
    before: float
    after: float
    statistic: float
    threshold: float
    earliest: int
    latest: int
    alarm: int
    window: int
    exact: bool = False


_Found = tuple[int, int, int, int, float, float, int, bool]  # ChangePoint's fields, no means


class NoCommitBetween(ValueError):
    """The runs on both sides of a change point tested the same commit."""


def detect(
    series: Sequence[float],
    *,
    false_alarm_rate: float = 0.01,
    horizon: int = HORIZON,
    windows: Sequence[int] = WINDOWS,
    min_reference: int = MIN_REFERENCE,
) -> list[ChangePoint]:
    """The change points of ``series`` (distances in units of tolerance, one per run, oldest
    first), oldest first. ``false_alarm_rate``: the probability that ``horizon`` runs
    without a change raise any (see the module's docstring for the model)."""
    values = _checked(series)
    if not 0 < false_alarm_rate < 1 or horizon < 1 or min_reference < 2 or not windows:
        raise ValueError(
            "detect: false_alarm_rate must be in (0, 1), horizon >= 1, min_reference >= 2 and "
            f"windows not empty (got {false_alarm_rate}, {horizon}, {min_reference}, {windows})"
        )
    level = false_alarm_rate / (horizon * len(windows))
    sums = _Sums(values)
    found: list[_Found] = []
    start, repeated_from = 0, 0  # the segment's first run; the first of the newest equal runs
    for t in range(1, len(values)):
        exact = repeated_from <= start and t - start >= EXACT_REPEATS
        if values[t] != values[t - 1]:
            repeated_from = t
            if exact:
                found.append((t, t, t, t, abs(values[t] - values[t - 1]), 0.0, 1, True))
                start = t
                continue
        if exact:
            continue  # the same value again: a deterministic series that did not move
        alarm = _look(sums, start, t, sorted(windows), min_reference, level)
        if alarm is not None:
            index = _locate(sums, start, t)[0]
            found.append((index, index, index, t, *alarm, False))
            start = index
    return _refined(sums, found)


def commit_range(change: ChangePoint, commits: Sequence[str]) -> tuple[str, str]:
    """``(good, bad)`` for ``rollout-golden bisect --good GOOD --bad BAD``: the commit of the
    last run before ``change.earliest`` and that of run ``change.latest`` (``commits``: each
    run's commit, in the order of the series). Raises :class:`NoCommitBetween` when both
    are the same commit: the shift came with the runs' environment, not with a commit."""
    if change.earliest < 1 or change.latest >= len(commits):
        raise ValueError(
            f"commit_range: runs {change.earliest - 1}..{change.latest} are not all among "
            f"the {len(commits)} commits given; pass one commit per run of the series"
        )
    good, bad = commits[change.earliest - 1], commits[change.latest]
    if good == bad:
        raise NoCommitBetween(
            f"runs {change.earliest - 1} and {change.latest} both tested commit {good}: the "
            "shift came with the environment (a driver, a library, a machine), not a commit; "
            "compare the two runs' environments instead of bisecting"
        )
    return good, bad


def _checked(series: Sequence[float]) -> list[float]:
    values = [float(x) for x in series]
    for i, x in enumerate(values):
        if not math.isfinite(x):
            raise ValueError(
                f"detect: run {i}'s distance is {x}; change points need finite distances "
                "(a non-finite one fails its comparison already): leave that run out"
            )
    return values


class _Sums:
    """Prefix sums of the values (less the first, against cancellation) and their squares:
    the mean and squared error of any run of values in O(1)."""

    def __init__(self, values: list[float]) -> None:
        self.values = values
        shift = values[0] if values else 0.0
        self.s1, self.s2 = [0.0], [0.0]
        for x in values:
            self.s1.append(self.s1[-1] + (x - shift))
            self.s2.append(self.s2[-1] + (x - shift) ** 2)
        self.shift = shift

    def mean_and_error(self, a: int, b: int) -> tuple[float, float]:
        """Mean and sum of squared deviations of ``values[a:b]``."""
        n = b - a
        s1, s2 = self.s1[b] - self.s1[a], self.s2[b] - self.s2[a]
        error = s2 - s1 * s1 / n
        if error <= 1e-9 * s2:  # all but cancelled: exact, two passes
            mean = math.fsum(self.values[a:b]) / n
            return mean, math.fsum((x - mean) ** 2 for x in self.values[a:b])
        return self.shift + s1 / n, error


def _look(
    sums: _Sums, start: int, t: int, windows: list[int], min_reference: int, level: float
) -> tuple[float, float, int] | None:
    """``(|t|, threshold, window)`` of the first window whose newest runs up to ``t`` differ
    from the reference before them at two-sided ``level``; ``None`` when none does."""
    floor = _normal_critical(level)  # t's tails are heavier: below this, p > level
    for w in windows:
        cut = t + 1 - w
        if cut - start < min_reference:
            return None
        mean_r, error_r = sums.mean_and_error(start, cut)
        mean_w, error_w = sums.mean_and_error(cut, t + 1)
        df = t + 1 - start - 2
        pooled = (error_r + error_w) / df
        if pooled <= 0:
            continue  # constant on both sides: the exact path judges a move
        stat = abs(mean_w - mean_r) / math.sqrt(pooled * (1 / (cut - start) + 1 / w))
        if stat > floor and _t_tail(stat, df) <= level:
            return stat, _t_critical(level, df), w
    return None


def _locate(sums: _Sums, start: int, t: int) -> tuple[int, int, int]:
    """The most likely first bad run of ``start..t`` (two means, least squared error) and
    the range of those within the cut-off of :data:`LOCATION_MISS`."""
    errors = {}
    for split in range(start + 1, t + 1):
        errors[split] = sums.mean_and_error(start, split)[1] + sums.mean_and_error(split, t + 1)[1]
    best = min(errors, key=lambda s: (errors[s], s))
    sd2 = errors[best] / max(t + 1 - start - 2, 1)
    cutoff = 2 * math.log(2 / LOCATION_MISS) * sd2
    near = [s for s, e in errors.items() if e - errors[best] <= cutoff]
    return best, min(near), max(near)


def _refined(sums: _Sums, found: list[_Found]) -> list[ChangePoint]:
    """The change points, each located again over all the runs between its neighbours
    (the alarm's own location used only the runs up to the alarm), with the mean distances
    on either side."""
    values = sums.values
    bounds = [0] + [f[0] for f in found] + [len(values)]
    changes = []
    for n, (index, earliest, latest, alarm, stat, threshold, window, exact) in enumerate(found):
        if not exact:
            index, earliest, latest = _locate(sums, bounds[n], bounds[n + 2] - 1)
        before, after = values[bounds[n] : index], values[index : bounds[n + 2]]
        changes.append(
            ChangePoint(
                index=index,
                before=math.fsum(before) / len(before),
                after=math.fsum(after) / len(after),
                statistic=stat,
                threshold=threshold,
                earliest=earliest,
                latest=latest,
                alarm=alarm,
                window=window,
                exact=exact,
            )
        )
    return changes


def _normal_critical(level: float) -> float:
    """The z with two-sided normal tail ``level``."""
    return _solve(lambda z: math.erfc(z / math.sqrt(2)), level)


def _t_critical(level: float, df: int) -> float:
    """The |t| with two-sided Student tail ``level`` at ``df`` degrees of freedom."""
    return _solve(lambda x: _t_tail(x, df), level)


def _solve(tail: Callable[[float], float], level: float) -> float:
    """The x > 0 where the decreasing ``tail(x)`` falls to ``level`` (bisection)."""
    low, high = 0.0, 1.0
    while tail(high) > level:
        low, high = high, 2 * high
    for _ in range(200):
        middle = (low + high) / 2
        if middle in (low, high):
            break
        low, high = (middle, high) if tail(middle) > level else (low, middle)
    return high


def _t_tail(x: float, df: int) -> float:
    """P(|T| > x) for Student's t with ``df`` degrees of freedom: I_{df/(df+x²)}(df/2, 1/2)."""
    return _incomplete_beta(df / (df + x * x), df / 2, 0.5)


def _incomplete_beta(x: float, a: float, b: float) -> float:
    """The regularized incomplete beta function I_x(a, b) (continued fraction, Lentz)."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    if x > (a + 1) / (a + b + 2):
        return 1.0 - _incomplete_beta(1 - x, b, a)
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x)
        + b * math.log1p(-x)
    )  # fmt: skip
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1 / (d if abs(d) > tiny else tiny)
    result = d
    for m in range(1, 500):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1 + numerator * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + numerator / c
            c = c if abs(c) > tiny else tiny
            result *= c * d
        if abs(c * d - 1) < 1e-15:
            break
    return math.exp(log_front) * result / a
