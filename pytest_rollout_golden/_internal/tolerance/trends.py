"""Bounds on how a metric evolves over a run: its growth from the first steps to the last,
or its slope, each a ceiling like the absolute mismatch bounds (:mod:`.mismatch_bounds`).

Over one metric's series (its steps in order, ``n`` of them, window ``w = max(2, ceil(n /
10))``):

``growth``
    the mean of the last ``w`` steps over the mean of the first ``w``; undefined for
    ``n < 2w``, and where the first window's mean is not above 0 or is at rounding level
    (below 1e-12, or 1e-6 x the series' largest ``|value|``): a ratio of rounding noise
    means nothing;
``slope``
    the least-squares slope per step in the metric's own units (float64), for ``n >= 3``.

A NaN or infinite value makes every statistic of its series NaN, which no bound passes.
Layers, highest first, per (metric, statistic)::

    Golden(trends=)                                call (scripts)
    @pytest.mark.golden(trends={metric: spec})     marker
    --golden-trend METRIC:STAT<=VALUE              cli (repeatable)
    ini golden_trends (one per line)               ini
    DEFAULT_TRENDS                                 default, from MIN_STEPS steps on

A metric name matches an entry as tolerances do (exact, glob, last path component);
``inf`` switches a bound off (listed as not compared). Torch-free.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ..wording import close_match
from .mismatch_bounds import PREFIX, Bound, spec_lines, split_spec
from .spec import entry_key

STATISTICS: tuple[str, ...] = ("growth", "slope")
"""The statistics a trend bound may name."""

MIN_STEPS = 10
"""The steps of a metric from which on the default bounds apply: a test of a few steps is
no run to take a trend of."""

ROUNDING_FLOOR = 1e-12  # a first window's mean below this, or below
ROUNDING_RATIO = 1e-6  # this x the series' largest |value|, is rounding noise

DEFAULT_SOURCE = (
    "default: a healthy run's train-inference gap stays flat (vime #64: 0.011 -> 0.036 in 30 "
    "steps with SGLang; verl #7519: FP8 KL 3x in 32 steps)"
)
DEFAULT_METRICS = (
    "abs_logprob_diff_mean",
    "abs_logprob_diff_seq_mean",
    "gen_kl_error",
    "policy_kl_error",
    "k3_kl",
)
"""The mismatch metrics ``golden.check_mismatch`` records whose growth is bounded by default."""

Entries = dict[str, dict[str, Bound]]
"""One layer's bounds: statistic -> metric name or glob -> bound."""

DEFAULT_TRENDS: Entries = {
    "growth": {PREFIX + name: Bound(2.0, DEFAULT_SOURCE) for name in DEFAULT_METRICS}
}

MARKER_SOURCE = "@pytest.mark.golden(trends=)"
CLI_SOURCE = "--golden-trend"
INI_SOURCE = "ini golden_trends"
CALL_SOURCE = "Golden(trends=)"

# ---------------------------------------------------------------------- statistics


@dataclasses.dataclass(frozen=True)
class Trend:
    """One statistic of one series: its value (``None``: undefined, ``why`` says why; NaN:
    ``why`` names the step), the steps it was taken over and, for ``growth``, its windows
    as ``((steps, mean), (steps, mean))``."""

    statistic: str
    value: float | None
    steps: tuple[int, ...]
    why: str = ""
    windows: tuple[tuple[tuple[int, ...], float], tuple[tuple[int, ...], float]] | None = None


Series = Sequence[tuple[int, float]]


def window(n: int) -> int:
    """The steps of a growth window over a series of ``n`` steps: a tenth, at least 2."""
    return max(2, math.ceil(n / 10))


def _not_finite(statistic: str, series: Series) -> Trend | None:
    """A NaN trend naming the first step whose value is NaN or infinite, if any."""
    steps = tuple(s for s, _ in series)
    for step, value in series:
        if not math.isfinite(value):
            why = f"{value} at step {step}: a NaN or inf value makes every trend NaN"
            return Trend(statistic, math.nan, steps, why)
    return None


def growth(series: Series) -> Trend:
    """The mean of the last window over the mean of the first (``series``: (step, value)
    in step order)."""
    n, steps = len(series), tuple(s for s, _ in series)
    w = window(n)
    if n < 2 * w:
        why = f"{n} steps, growth needs at least {2 * w} (two windows of {w} steps)"
        return Trend("growth", None, steps, why)
    nan = _not_finite("growth", series)
    if nan is not None:
        return nan
    first, last = series[:w], series[-w:]
    m1, m2 = (math.fsum(v for _, v in part) / w for part in (first, last))
    where = f"the first window's mean (steps {_span(first)})"
    if m1 <= 0:
        return Trend("growth", None, steps, f"{where} is {m1:.4g}, not above 0: no ratio")
    largest = max(abs(v) for _, v in series)
    if m1 < max(ROUNDING_FLOOR, ROUNDING_RATIO * largest):
        why = (
            f"{where} is {m1:.3g}, at rounding level (below {ROUNDING_FLOOR:g}, or "
            f"{ROUNDING_RATIO:g} x the largest |value| {largest:.3g}): a ratio of rounding "
            "noise means nothing"
        )
        return Trend("growth", None, steps, why)
    windows = ((tuple(s for s, _ in first), m1), (tuple(s for s, _ in last), m2))
    return Trend("growth", m2 / m1, steps, windows=windows)


def slope(series: Series) -> Trend:
    """The least-squares slope of the values per step (``series``: (step, value) in step
    order), float64."""
    n, steps = len(series), tuple(s for s, _ in series)
    if n < 3:
        return Trend("slope", None, steps, f"{n} steps, slope needs at least 3")
    nan = _not_finite("slope", series)
    if nan is not None:
        return nan
    mx = math.fsum(float(s) for s in steps) / n
    my = math.fsum(v for _, v in series) / n
    sxx = math.fsum((s - mx) ** 2 for s in steps)
    sxy = math.fsum((s - mx) * (v - my) for s, v in series)
    return Trend("slope", sxy / sxx, steps)


def _span(series: Series) -> str:
    return f"{series[0][0]}-{series[-1][0]}"


STATISTIC: dict[str, Callable[[Series], Trend]] = {"growth": growth, "slope": slope}

# ---------------------------------------------------------------------- grammar


def parse_spec(text: str, where: str) -> tuple[str, float]:
    """``"growth<=2"`` -> ``("growth", 2.0)`` (ValueError naming ``where``)."""
    name, value = split_spec(text, where, form="STAT<=VALUE (growth<=2, slope<=0.001)")
    return check_statistic(name, where), value


def check_statistic(name: str, where: str) -> str:
    """``name`` if it is a statistic, else ValueError with the statistic it looks like."""
    if name not in STATISTICS:
        raise ValueError(
            f"{where}: {name!r} is not a trend statistic{close_match(name, STATISTICS)}; "
            f"the statistics are {', '.join(STATISTICS)}"
        )
    return name


def parse_line(text: str, source: str) -> tuple[str, str, float]:
    """``"kl:growth<=2"`` -> ``("kl", "growth", 2.0)`` (ValueError naming ``source``)."""
    metric, sep, spec = text.rpartition(":")
    if not sep or not metric.strip() or "<=" not in spec:
        raise ValueError(
            f"{source}: {text!r} is not of the form METRIC:STAT<=VALUE "
            "(e.g. mismatch/abs_logprob_diff_mean:growth<=2)"
        )
    return (metric.strip(), *parse_spec(spec.strip(), source))


def _specs(metric: Any, specs: Any, source: str) -> list[str]:
    """The specs a mapping gives ``metric``: one string or a list of them."""
    if not isinstance(metric, str) or not metric.strip():
        raise ValueError(f"{source}: metric names must be non-empty strings, got {metric!r}")
    listed = [specs] if isinstance(specs, str) else specs
    if not isinstance(listed, (list, tuple)) or not all(isinstance(s, str) for s in listed):
        raise ValueError(
            f"{source} {metric!r}: takes 'growth<=2', 'slope<=0.001' or a list of them, "
            f"got {specs!r}"
        )
    return list(listed)


def layer(entries: Mapping[str, Any] | Iterable[str] | None, source: str) -> Entries:
    """The bounds of one layer: a mapping ``{metric: spec or [specs]}`` (marker, call) or
    ``METRIC:STAT<=VALUE`` lines (ini, cli; blank lines and ``#`` comments skipped)."""
    out: Entries = {}
    if not entries:
        return out
    if isinstance(entries, Mapping):
        for metric, specs in entries.items():
            for text in _specs(metric, specs, source):
                statistic, value = parse_spec(text, f"{source} {metric!r}")
                out.setdefault(statistic, {})[metric.strip()] = Bound(value, source)
        return out
    for text in spec_lines(entries):
        metric, statistic, value = parse_line(text, source)
        out.setdefault(statistic, {})[metric] = Bound(value, source)
    return out


# ---------------------------------------------------------------------- layers


@dataclasses.dataclass(frozen=True)
class TrendLayer:
    """One source of trend bounds. ``scoped``: a test's own (marker, call), whose names
    that no metric of the test matches are listed; ``default``: applies from
    :data:`MIN_STEPS` steps on."""

    entries: Mapping[str, Mapping[str, Bound]]
    scoped: bool = False
    default: bool = False


DEFAULTS = TrendLayer(DEFAULT_TRENDS, default=True)


@dataclasses.dataclass(frozen=True)
class TrendBounds:
    """The trend bounds of one test: its layers, highest first (the defaults last)."""

    layers: tuple[TrendLayer, ...] = (DEFAULTS,)

    def above(self, entries: Entries, *, scoped: bool = True) -> TrendBounds:
        """These bounds under a higher layer of ``entries``."""
        return TrendBounds((TrendLayer(entries, scoped=scoped), *self.layers))

    def find(self, metric: str, statistic: str) -> tuple[int, str] | None:
        """``(layer index, entry)`` of the bound in force for ``metric``'s ``statistic``."""
        for index, found in enumerate(self.layers):
            key = entry_key(metric, found.entries.get(statistic, {}))
            if key is not None:
                return index, key
        return None

    def bound(self, metric: str, statistic: str) -> Bound | None:
        """The bound in force for ``metric``'s ``statistic`` (``None``: none)."""
        found = self.find(metric, statistic)
        return None if found is None else self.layers[found[0]].entries[statistic][found[1]]


def session_trends(
    marker: Mapping[str, Any] | None, cli: Iterable[str], ini: Iterable[str]
) -> TrendBounds:
    """The trend bounds of one test: the marker's over ``--golden-trend`` over the ini's
    over the defaults (ValueError naming the source of a bad entry)."""
    if marker is not None and not isinstance(marker, Mapping):
        raise ValueError(
            f"{MARKER_SOURCE} must be a dict {{metric: 'growth<=2' or a list of specs}}, "
            f"got {marker!r}"
        )
    bounds = TrendBounds().above(layer(ini, INI_SOURCE), scoped=False)
    bounds = bounds.above(layer(cli, CLI_SOURCE), scoped=False)
    return bounds.above(layer(marker, MARKER_SOURCE))


def call_trends(entries: Mapping[str, Any] | None) -> TrendBounds:
    """The trend bounds a script gives ``Golden(trends=)``, over the defaults."""
    if entries is not None and not isinstance(entries, Mapping):
        raise TypeError(f"{CALL_SOURCE} takes {{metric: 'growth<=2' or a list}}, got {entries!r}")
    return TrendBounds().above(layer(entries, CALL_SOURCE))


# ---------------------------------------------------------------------- evaluation


@dataclasses.dataclass(frozen=True)
class TrendCheck:
    """One bound over one metric's series: ``trend`` is ``None`` where the bound is off;
    ``recorded``, the same statistic of the golden's series when replaying."""

    metric: str
    statistic: str
    bound: Bound
    steps: tuple[int, ...]
    trend: Trend | None
    recorded: Trend | None = None

    @property
    def verdict(self) -> str:
        """``off`` (bound switched off), ``undefined``, ``pass`` or ``fail``."""
        if self.trend is None:
            return "off"
        if self.trend.value is None:
            return "undefined"
        return "pass" if self.bound.holds(self.trend.value) else "fail"


def series(
    numbers: Mapping[str, Mapping[str, tuple[Any, str]]],
) -> dict[str, list[tuple[int, float]]]:
    """Each metric's ``(step, value)`` in step order, from ``{step: {name: (value, dtype)}}``
    (:func:`.metric_codec.numbers`)."""
    out: dict[str, list[tuple[int, float]]] = {}
    for step in sorted(numbers, key=int):
        for name, (value, _) in numbers[step].items():
            out.setdefault(name, []).append((int(step), float(value)))
    return out


def evaluate(
    run: Mapping[str, Mapping[str, tuple[Any, str]]],
    bounds: TrendBounds,
    recorded: Mapping[str, Mapping[str, tuple[Any, str]]] | None = None,
) -> list[TrendCheck]:
    """Every bound in force over this ``run``'s metrics (``{step: {name: (value, dtype)}}``),
    with the golden's ``recorded`` statistic when replaying; then a test's own entries
    that no metric matched."""
    found, matched = [], set()
    old = None if recorded is None else series(recorded)
    for metric, points in sorted(series(run).items()):
        for statistic in STATISTICS:
            where = bounds.find(metric, statistic)
            if where is None:
                continue
            matched.add((where[0], statistic, where[1]))
            source = bounds.layers[where[0]]
            if source.default and len(points) < MIN_STEPS:
                continue
            bound = source.entries[statistic][where[1]]
            steps = tuple(s for s, _ in points)
            if bound.off:
                found.append(TrendCheck(metric, statistic, bound, steps, None))
                continue
            trend = STATISTIC[statistic](points)
            then = None if old is None else STATISTIC[statistic](old.get(metric, []))
            found.append(TrendCheck(metric, statistic, bound, steps, trend, then))
    return found + _unmatched(bounds, matched)


def _unmatched(bounds: TrendBounds, matched: set[tuple[int, str, str]]) -> list[TrendCheck]:
    """A test's own entries (marker, call) that named no metric it checked."""
    out = []
    for index, source in enumerate(bounds.layers):
        for statistic, entries in source.entries.items() if source.scoped else ():
            for key, bound in entries.items():
                if (index, statistic, key) not in matched:
                    why = f"no metric this test checked is named {key!r}"
                    trend = Trend(statistic, None, (), why)
                    out.append(TrendCheck(key, statistic, bound, (), trend))
    return out
