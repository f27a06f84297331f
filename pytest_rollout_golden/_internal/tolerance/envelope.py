"""Per-step envelopes of long runs: how far calibration runs strayed from the golden, step
by step, stored in the golden as ``envelope.json``.

A long bf16 run has no single per-step tolerance: reduction-order noise is tiny at the first
steps and grows as the trajectories of same-math runs drift apart, so one tolerance taken at
the widest step lets a bias pass at every early step. ``--golden-calibrate N`` on a test of at
least :data:`MIN_STEPS` steps therefore also records, per metric and step, the band the runs
spanned around the golden's value (``below`` / ``above``: how far the lowest and highest run
lay from it), in two lanes like ``tolerances.json`` (:data:`LANES`): the runs of the tests
that record the golden, and across variants. On replay the band is that step's ``atol`` over
the metric's uncalibrated tolerance (:meth:`.build.GoldenStack.at`), so it never holds a metric
tighter than the defaults::

    allowed at step s = M(s) x H(s) + DTYPE_FLOOR x eps(dtype) x the metric's magnitude
                        + the uncalibrated rtol x max(|golden(s)|, scale)
    H(s) = the largest half-width max(below, above) at steps s - SMOOTH .. s + SMOOTH
    M(s) = margin(k), k the fewest distinct values the runs had at those steps
    H, M at the first step = its own half-width, margin(its own k)

The band is stored relative to the golden, so ``--update-golden`` keeps it around the new
values (it describes the setup's noise, not the values). ``H`` takes the widest of the
neighbouring steps because the widths of a few runs at one step are a small sample, and the
margin grows as the sample shrinks (:func:`margin`): in bf16 a variant's runs at other
thread counts repeat it bit for bit, so a band may rest on one or two distinct trajectories.
The first step a test records is the exception: every run starts there from the same
weights, so the runs differ by reduction order alone, and its later neighbours' widths
would hide a small constant defect there (the loss x 1.001 of docs/guide/long-runs.md).
Runs that repeat the golden bit for bit at every step still get a band: 0 wide, so each step
allows the rounding level over the defaults, and the bias gate at :data:`BIAS_FLOOR`, which
catches a constant defect inside the defaults that no step's tolerance can.

Each band also holds a bias bound (:func:`bias_bound`: a replay's mean deviation over the
steps, in units of each step's allowance, against what the calibration runs had) and the
largest trend statistics its runs reached (on replay, a trend bound they come near is raised
to :data:`TREND_MARGIN` x theirs, :meth:`Envelope.raised_trend_bound`). Across variants, a value
the calibrated variants stray from by more than :data:`MAX_WIDTH` x its size (the
train–inference gap of a bf16 variant drifting from the recorded rollouts), or move while the
golden holds it at 0, has no band: it is listed as not comparable across variants
(:data:`DRIFTING`).

Whoever wrote the file, a band wider than :data:`MAX_WIDTH` x the metric's largest recorded
magnitude, a negative, NaN or unsorted entry, a bias bound outside [:data:`BIAS_FLOOR`,
:data:`BIAS_CAP`] or a metric never recorded is refused naming the file, the metric and the
step (:func:`problem`): a band that cannot fail is a defect. A value listed as not comparable
across variants turns a gate off, so it must be one calibration could have measured
(:func:`drifting_problem`).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ...errors import GoldenFormatError
from ...store.location import ENVELOPE, LANES as LANES_DIR, in_golden
from .spec import IGNORE, Layer, Tolerance, named_file

FORMAT = "pytest-rollout-golden-envelope"
# A run shorter than this has no trend to follow: its calibrated tolerances.json suffices.
MIN_STEPS = 10
# The band of N runs underestimates where the next run lands: MARGIN for 8 distinct runs or
# more (the float32 calibration of 3 variants x 3 thread counts), MARGINS[k - 1] for k < 8.
MARGIN = 2.0
# margin(k): the factor at which the next of k + 1 exchangeable normal deviations exceeds
# the largest |deviation| of the other k with the probability MARGIN gives k = 8,
#   P(|Z| > m max(|Z_1|, ..., |Z_k|)) = E[erf(|Z| / (m sqrt 2))^k] = 8.28e-3 per step;
# recomputed by tests/unit/test_envelope.py. One run says little of the next (76.9).
MARGINS = (76.9, 8.72, 4.47, 3.24, 2.68, 2.36, 2.15)
# A trend bound the calibration runs reach within this factor is raised to it on replay: a
# same-math run's growth strays beyond the largest of a few runs' (measured, bf16 Qwen2:
# a calibrated variant left out of calibration reached 1.3x the others', 1 of 20 seeds).
TREND_MARGIN = 1.4
# Steps on each side whose widths a step's allowance takes: on the bf16 Qwen2 long-run
# harness a calibrated variant strayed up to 1.9x its band's half-width with 1 (MARGIN 2
# barely holds), 1.5x with 3 (docs/guide/long-runs.md).
SMOOTH = 3
DTYPE_FLOOR = 4.0  # as calibration's: a few units in the last place of the metric's dtype
EPS = {"float16": 2**-10, "bfloat16": 2**-7, "float32": 2**-23, "float64": 2**-52}
# The widest half-width a band may have, relative to the metric's largest recorded magnitude:
# runs of correct code that stray from the golden by more than the value itself do not
# scatter around it (a bf16 variant's train-inference gap against the recorded rollouts
# reaches 2x the golden's by step 39), and a band that wide would gate nothing.
MAX_WIDTH = 1.0
# The bias gate: a run's mean deviation over the steps, in units of each step's allowance,
# may not exceed BIAS_MARGIN (or margin(k) of k distinct runs, if larger) x the largest the
# calibration runs had, nor less than BIAS_FLOOR;
# a bound beyond BIAS_CAP could never fire before the band itself does, and is not written.
BIAS_MARGIN = 3.0
BIAS_FLOOR = 0.05
BIAS_CAP = 0.9
SOURCE = f"envelope ({ENVELOPE})"
VARIANT_SOURCE = f"envelope across variants ({ENVELOPE})"
DRIFTING_SOURCE = (
    f"not comparable across variants ({ENVELOPE}: the calibrated variants drift from the "
    f"recorded golden by more than {MAX_WIDTH:g}x its largest value)"
)
DRIFTING = "layout_drifting"  # the section of the values not comparable across variants

Numbers = Mapping[str, Mapping[str, tuple[Any, str]]]  # {step: {name: (value, dtype)}}


def band_source(tolerance_source: str) -> str | None:
    """The envelope lane (:data:`SOURCE`, :data:`VARIANT_SOURCE`) whose band gave a
    comparison its ``atol``, from the comparison's tolerance source; ``None`` if none did."""
    plain = re.sub(rf"\({LANES_DIR}/[^/]+/", "(", tolerance_source)  # a lane's file: its kind
    parts = plain.split("; ")
    for lane in (SOURCE, VARIANT_SOURCE):
        if plain == lane or f"atol from {lane}" in parts:
            return lane
    return None


@dataclasses.dataclass(frozen=True)
class Band:
    """One metric's band: per step, how far the runs lay below and above the golden."""

    steps: tuple[int, ...]
    below: tuple[float, ...]
    above: tuple[float, ...]
    dtype: str = "float32"
    magnitude: float = 0.0  # the metric's largest recorded |value|
    bias_bound: float | None = None  # the largest mean deviation allowed (None: no bias gate)
    trends: Mapping[str, float] = dataclasses.field(default_factory=dict)  # runs' largest
    runs: int = 0  # how many calibration runs spanned it
    distinct: tuple[int, ...] = ()  # per step, the runs' distinct values but the golden's

    def half_widths(self) -> list[float]:
        """Per step, the widest half-width of it and its :data:`SMOOTH` neighbours; the first
        step, its own."""
        widths = [max(b, a) for b, a in zip(self.below, self.above, strict=True)]
        return widths[:1] + [max(widths[w.start : w.stop]) for w in _windows(len(widths))[1:]]

    def margins(self) -> list[float]:
        """Per step, the factor on its half-width: :func:`margin` of the fewest distinct
        values the runs had over its window, the first step of its own (:data:`MARGIN` where
        the file predates the count)."""
        if len(self.distinct) != len(self.steps):
            return [MARGIN] * len(self.steps)
        counts = [
            [c for c in self.distinct[w.start : w.stop] if c] for w in _windows(len(self.steps))
        ]
        counts[0] = [self.distinct[0]]  # the first step: its own
        return [margin(min(c, default=0)) for c in counts]

    def allowances(self) -> dict[int, float]:
        """Per step, the distance from the golden this band allows: a small sample's margin
        stops where :data:`MARGIN` over the widest band a file may hold would (twice the
        metric's largest recorded magnitude)."""
        floor = DTYPE_FLOOR * EPS.get(self.dtype, EPS["float64"]) * self.magnitude
        cap = MARGIN * MAX_WIDTH * self.magnitude + floor
        found = zip(self.steps, self.margins(), self.half_widths(), strict=True)
        return {s: min(m * h + floor, cap) for s, m, h in found}


def margin(distinct: int) -> float:
    """The factor on a band's half-width when ``distinct`` runs spanned it (:data:`MARGINS`;
    :data:`MARGIN` from 8 runs on, and where no run differed from the golden)."""
    return MARGINS[distinct - 1] if 0 < distinct <= len(MARGINS) else MARGIN


def _windows(n: int) -> list[range]:
    """Per step of ``n``, the steps of its window, :data:`SMOOTH` on each side."""
    return [range(max(0, i - SMOOTH), min(n, i + SMOOTH + 1)) for i in range(n)]


@dataclasses.dataclass(frozen=True)
class Envelope:
    """The bands of one lane of a golden: its own tests' runs, or across variants."""

    bands: Mapping[str, Band]
    variants: bool = False
    source: str = SOURCE
    drifting: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    file: str = ENVELOPE  # the file read, as messages name it (a lane's: @lanes/<lane>/...)

    def __post_init__(self) -> None:
        per_step: dict[int, dict[str, Tolerance]] = {}
        for name, band in self.bands.items():
            for step, allowed in band.allowances().items():
                per_step.setdefault(step, {})[name] = Tolerance(atol=allowed)
        layers = {s: Layer(self.source, e, exact_names=True) for s, e in per_step.items()}
        object.__setattr__(self, "_layers", layers)

    def layer(self, step: int) -> Layer | None:
        """The tolerances the bands give at ``step`` (exact metric names only): an ``atol``,
        the band; ``rtol`` and ``scale`` come from the layers below the calibrated files."""
        return self._layers.get(step)  # type: ignore[attr-defined]

    def reached(self, metric: str, statistic: str) -> float | None:
        """The largest trend ``statistic`` of ``metric`` the calibration runs reached."""
        band = self.bands.get(metric)
        found = band.trends if band is not None else self.drifting.get(metric, {}).get("trends")
        return None if not found else found.get(statistic)

    def raised_trend_bound(self, metric: str, statistic: str, bound: float) -> float | None:
        """The value a trend ``bound`` on ``metric``'s ``statistic`` is raised to on replay:
        :data:`TREND_MARGIN` x the largest the calibration runs of correct code reached, where
        that is above it (a same-math run strays beyond the largest of a few runs'); ``None``
        where the bound stands."""
        reached = self.reached(metric, statistic)
        if math.isinf(bound) or reached is None or not TREND_MARGIN * reached > bound:
            return None
        return _round_up(TREND_MARGIN * reached)

    def drifting_layer(self) -> Layer | None:
        """Across variants, the values the calibrated variants drift away from the recorded
        golden with (wider than :data:`MAX_WIDTH` x the value): not comparable across
        variants, as a profile's per-micro-batch averages are (a tolerance a user gives
        above still applies)."""
        if not self.drifting:
            return None
        source = named_file(DRIFTING_SOURCE, ENVELOPE, self.file)
        return Layer(source, dict.fromkeys(self.drifting, IGNORE), defaults=True)


def deviation(
    name: str, golden: Numbers, run: Numbers, allowances: Mapping[int, float]
) -> tuple[float, int] | None:
    """``(mean deviation, steps)`` of metric ``name`` of ``run`` from the ``golden`` over
    the steps of ``allowances``: per step ``sign(golden) x (run - golden) / allowance``,
    so that a value scaled up by a constant factor deviates the same way at every step,
    whatever the metric's sign. ``None`` under :data:`MIN_STEPS` steps with both values."""
    found = []
    for step, allowed in allowances.items():
        g, a = golden.get(str(step), {}).get(name), run.get(str(step), {}).get(name)
        if g is None or a is None or allowed <= 0:
            continue
        g, a = float(g[0]), float(a[0])
        if math.isfinite(g) and math.isfinite(a):
            found.append(math.copysign(1.0, g) * (a - g) / allowed)
    if len(found) < MIN_STEPS:
        return None
    return math.fsum(found) / len(found), len(found)


def bias_bound(
    name: str, golden: Numbers, runs: Sequence[Numbers], allowances: Mapping[int, float]
) -> dict[str, Any]:
    """The bias gate of one band: each run's mean deviation, and the bound they give
    (``None`` beyond :data:`BIAS_CAP`, with why)."""
    found = [deviation(name, golden, run, allowances) for run in runs]
    means = [_round_up(abs(d[0])) * (1 if d[0] >= 0 else -1) for d in found if d]
    largest = max((abs(m) for m in means), default=0.0)
    factor = max(BIAS_MARGIN, margin(len({m for m in means if m})))
    bound = max(factor * largest, BIAS_FLOOR)
    if bound > BIAS_CAP:
        why = (
            f"the runs' own mean deviation, {largest:.3g} of the band, x {factor:g} (for "
            f"{len({m for m in means if m})} distinct runs) leaves no room for a bias gate"
        )
        return {"runs": means, "bound": None, "why": why}
    return {"runs": means, "bound": _round_up(bound)}


@dataclasses.dataclass(frozen=True)
class Bias:
    """One metric's mean deviation over a replay's steps, against its bias bound."""

    name: str
    mean: float
    steps: int
    bound: float

    @property
    def holds(self) -> bool:
        return abs(self.mean) <= self.bound


def biases(
    found: Envelope, golden: Numbers, run: Numbers, allowed: Mapping[str, Mapping[int, float]]
) -> list[Bias]:
    """The bias gate of every band that has one, over this ``run`` against the ``golden``,
    at the steps where its band held the metric (``allowed``: metric -> step -> the distance
    replay allowed; a tolerance given above the envelope takes a metric out of its band,
    and out of this gate)."""
    out = []
    for name, band in sorted(found.bands.items()):
        if band.bias_bound is None or name not in allowed:
            continue
        measured = deviation(name, golden, run, allowed[name])
        if measured is not None:
            out.append(Bias(name, measured[0], measured[1], band.bias_bound))
    return out


# --------------------------------------------------------------------------- building


def _round_up(x: float) -> float:
    """``x`` to 3 significant digits, never below ``x`` (a band only widens by rounding)."""
    if x <= 0 or not math.isfinite(x):
        return x
    quantum = 10.0 ** (math.floor(math.log10(x)) - 2)
    out = float(f"{math.ceil(x / quantum) * quantum:.3g}")
    return out if out >= x else float(f"{out + quantum:.3g}")


def band_of(name: str, golden: Numbers, runs: Sequence[Numbers]) -> dict[str, Any] | None:
    """Metric ``name``'s band over ``runs`` around the ``golden`` values (``None`` where no
    step has a finite golden value and a finite run)."""
    steps, below, above, distinct, dtype = [], [], [], [], "float64"
    for key in sorted(golden, key=int):
        if name not in golden[key]:
            continue
        value, dtype = golden[key][name]
        values = [float(r[key][name][0]) for r in runs if name in r.get(key, {})]
        values = [v for v in values if math.isfinite(v)]
        if not values or not math.isfinite(float(value)):
            continue
        steps.append(int(key))
        below.append(_round_up(max(0.0, float(value) - min(values))))
        above.append(_round_up(max(0.0, max(values) - float(value))))
        distinct.append(len(set(values) - {float(value)}))
    if not steps:
        return None
    return {"steps": steps, "below": below, "above": above, "distinct": distinct, "dtype": dtype}


def bands(
    golden: Numbers,
    runs: Sequence[tuple[Numbers, Iterable[str]]],
    *,
    base: Callable[[str, str], Tolerance],
    magnitude: Callable[[str], float | None],
) -> tuple[dict[str, Any], dict[str, str], dict[str, Any]]:
    """``(bands, refused, drifting)``: per metric of ``golden`` its band over ``runs`` (each
    a run's numbers and the names it is left out for), for a metric of :data:`MIN_STEPS`
    steps or more that its uncalibrated tolerance ``base(name, dtype)`` compares (where the
    runs repeat the golden bit for bit, a band 0 wide: its rounding level,
    :meth:`Band.allowances`, and the bias gate); per metric the band refused, with why; and of
    those, the metrics refused because the runs strayed wider than :data:`MAX_WIDTH` x the
    metric (how far, and the trends they reached): across variants, values that drift from
    the recorded golden rather than scatter around it (:func:`drifting_layer`)."""
    out, refused, drifting = {}, {}, {}
    names = sorted({n for values in golden.values() for n in values})
    for name in names:
        kept = [numbers for numbers, left_out in runs if name not in set(left_out)]
        band = band_of(name, golden, kept)
        if band is None or len(band["steps"]) < MIN_STEPS:
            continue
        below = base(name, band["dtype"])
        if below.ignore:
            continue
        why = problem(band, name, magnitude(name))
        if why:
            refused[name] = why
            widest, unit = max(band["below"] + band["above"]), _unit(band, magnitude(name))
            if unit and widest > MAX_WIDTH * (magnitude(name) or 0.0):
                drifting[name] = {
                    "widest": _round_up(widest / unit),
                    "trends": run_trends(name, kept),
                }
            continue
        made = _band(band, magnitude(name) or 0.0)
        bias = bias_bound(name, golden, kept, held(made, below, golden, name))
        trends = run_trends(name, kept)
        out[name] = {**band, "runs": len(kept), "bias": bias, "trends": trends}
    return out, refused, drifting


def _unit(band: Mapping[str, Any], magnitude: float | None) -> float | None:
    """What a drifting value's straying is measured in: the metric's largest recorded
    magnitude, or, where the golden is 0 at every step (a fraction of tokens that correct
    code leaves at 0 and a variant moves to 1 in 128), :data:`DTYPE_FLOOR` units in the
    last place of its dtype."""
    if magnitude is None:
        return None
    return magnitude or DTYPE_FLOOR * EPS.get(band["dtype"], EPS["float64"])


def held(band: Band, below: Tolerance, golden: Numbers, name: str) -> dict[int, float]:
    """Per step, the distance from the golden replay allows metric ``name``: the band's over
    its uncalibrated tolerance ``below`` (the band's ``atol``, ``below``'s ``rtol`` and
    ``scale``), as :meth:`.build.GoldenStack.at` resolves it."""
    out = {}
    for step, allowed in band.allowances().items():
        value = golden.get(str(step), {}).get(name)
        if value is not None:
            tol = Tolerance(rtol=below.rtol, atol=allowed, scale=below.scale or None)
            out[step] = tol.allowance(float(value[0]), band.magnitude)
    return out


def run_trends(name: str, runs: Sequence[Numbers]) -> dict[str, float]:
    """Per trend statistic (:mod:`.trends`), the largest the runs of correct code reach for
    metric ``name``: a bound below it cannot tell a defect from them on replay."""
    from .trends import STATISTIC, series

    out: dict[str, float] = {}
    for run in runs:
        points = series(run).get(name, [])
        for statistic, measure in STATISTIC.items():
            value = measure(points).value
            if value is not None and math.isfinite(value):
                out[statistic] = max(value, out.get(statistic, -math.inf))
    return out


def _band(entry: Mapping[str, Any], magnitude: float) -> Band:
    """The :class:`Band` of a checked ``envelope.json`` entry."""
    bias = entry.get("bias") or {}
    return Band(
        tuple(entry["steps"]),
        tuple(float(x) for x in entry["below"]),
        tuple(float(x) for x in entry["above"]),
        str(entry.get("dtype", "float32")),
        magnitude,
        None if bias.get("bound") is None else float(bias["bound"]),
        {k: float(v) for k, v in (entry.get("trends") or {}).items()},
        runs if isinstance(runs := entry.get("runs"), int) and runs > 0 else 0,
        tuple(entry.get("distinct") or ()),
    )


LANES = {"same layout": "metrics", "across variants": "layout_metrics"}  # lane -> section


def document(lanes: Mapping[str, Mapping[str, Any]], how: Mapping[str, Any]) -> dict[str, Any]:
    """The content of ``envelope.json``: per lane measured (:data:`LANES`), its bands."""
    out = {"format": FORMAT, "version": 1, "how": {"margin": MARGIN, "smooth": SMOOTH, **how}}
    out["how"]["margins"] = list(MARGINS)
    out.update({LANES[lane]: dict(found) for lane, found in lanes.items()})
    return out


# --------------------------------------------------------------------------- reading


def problem(entry: Any, name: str, magnitude: float | None) -> str:
    """Why ``entry`` may not stand in ``envelope.json`` for metric ``name``, or ``""``."""
    if not isinstance(entry, dict):
        return f"metric {name!r}: an entry is an object, got {type(entry).__name__}"
    steps, below, above = (entry.get(k) for k in ("steps", "below", "above"))
    if not all(isinstance(x, list) for x in (steps, below, above)):
        return f"metric {name!r}: 'steps', 'below' and 'above' must be lists"
    if not len(steps) == len(below) == len(above):
        return f"metric {name!r}: 'steps', 'below' and 'above' differ in length"
    if any(not isinstance(s, int) or isinstance(s, bool) or s < 0 for s in steps):
        return f"metric {name!r}: steps must be integers >= 0"
    if steps != sorted(set(steps)):
        return f"metric {name!r}: steps must be increasing"
    if magnitude is None:
        return f"metric {name!r} was never recorded in this golden"
    why = _bias_problem(entry.get("bias"), name) or _trends_problem(entry.get("trends"), name)
    if why:
        return why
    cap = MAX_WIDTH * magnitude
    for step, *widths in zip(steps, below, above, strict=True):
        for width in widths:
            if isinstance(width, bool) or not isinstance(width, (int, float)):
                return f"metric {name!r} at step {step}: a width must be a number"
            if not 0 <= width <= cap:  # NaN fails both
                return (
                    f"metric {name!r} at step {step}: width {width:g} is beyond what "
                    f"{ENVELOPE} may hold ({cap:g}: {MAX_WIDTH:g} x the largest recorded "
                    f"|{name}|, {magnitude:g})"
                )
    return _distinct_problem(entry, name)


def _distinct_problem(entry: Mapping[str, Any], name: str) -> str:
    """Why a band's per-step ``distinct`` counts may not stand, or ``""``: each a whole
    number of the runs the band names, and 0 only where the band is 0 wide."""
    distinct = entry.get("distinct")
    if distinct is None:
        return ""
    runs = entry.get("runs")
    if not isinstance(distinct, list) or len(distinct) != len(entry["steps"]):
        return f"metric {name!r}: 'distinct' must be a list as long as 'steps'"
    rows = zip(entry["steps"], distinct, entry["below"], entry["above"], strict=True)
    for step, count, below, above in rows:
        whole = isinstance(count, int) and not isinstance(count, bool)
        if not whole or count < 0 or (isinstance(runs, int) and count > runs):
            return f"metric {name!r} at step {step}: {count!r} distinct runs of {runs!r}"
        if count == 0 and (below or above):
            return f"metric {name!r} at step {step}: a band of width > 0 from 0 distinct runs"
    return ""


def _trends_problem(trends: Any, name: str) -> str:
    """Why a band's ``trends`` entry may not stand, or ``""``."""
    if trends is None:
        return ""
    if not isinstance(trends, dict):
        return f"metric {name!r}: 'trends' must be an object"
    for statistic, value in trends.items():
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if statistic not in ("growth", "slope") or not number or not math.isfinite(value):
            return (
                f"metric {name!r}: trends {statistic!r}: {value!r} is not what calibration writes"
            )
    return ""


def _bias_problem(bias: Any, name: str) -> str:
    """Why a band's ``bias`` entry may not stand, or ``""``."""
    if bias is None:
        return ""
    if not isinstance(bias, dict):
        return f"metric {name!r}: 'bias' must be an object"
    bound = bias.get("bound")
    if bound is None:
        return ""
    if isinstance(bound, bool) or not isinstance(bound, (int, float)):
        return f"metric {name!r}: the bias bound must be a number"
    if not BIAS_FLOOR <= bound <= BIAS_CAP:  # NaN fails both
        return (
            f"metric {name!r}: bias bound {bound:g} is beyond what {ENVELOPE} may hold "
            f"({BIAS_FLOOR:g} to {BIAS_CAP:g} of the band)"
        )
    return ""


def read(
    content: Any,
    path: Path,
    *,
    magnitude: Callable[[str], float | None],
    recorded_steps: Callable[[str], int],
    layout_variant: bool = False,
) -> Envelope | None:
    """The envelope of one lane of ``content`` (the file at ``path``): a variant's
    (``layout_variant``) the bands across variants, the golden's own tests' the bands of
    their own runs; ``None`` if the file holds no such lane. Both lanes are checked entry by
    entry (:func:`problem`), and the values not comparable across variants against what
    calibration could have measured (:func:`drifting_problem`; ``recorded_steps``: how many
    steps the golden holds a metric's finite value at): a bad file raises
    :class:`~.errors.GoldenFormatError` naming it, the metric and the step or rule."""
    remedy = (
        "re-run `pytest --golden-calibrate N` for this test, or `pytest --update-golden` to drop it"
    )
    if not isinstance(content, dict) or content.get("format") != FORMAT:
        raise GoldenFormatError(f"{path}: not an envelope file ({FORMAT}); {remedy}")
    lanes = {}
    for section in LANES.values():
        metrics = content.get(section, {})
        if not isinstance(metrics, dict):
            raise GoldenFormatError(f"{path}: {section!r} must be an object; {remedy}")
        for name, entry in sorted(metrics.items()):
            why = problem(entry, name, magnitude(name))
            if why:
                raise GoldenFormatError(
                    f"{path}: {why}: calibration never writes that, so this file was edited; "
                    f"{remedy}"
                )
        lanes[section] = {n: _band(e, magnitude(n) or 0.0) for n, e in sorted(metrics.items())}
    drifting = content.get(DRIFTING, {})
    why = drifting_problem(content, magnitude, recorded_steps)
    if why:
        raise GoldenFormatError(
            f"{path}: {why}: calibration never writes that, so this file was edited; {remedy}"
        )
    section = LANES["across variants" if layout_variant else "same layout"]
    if section not in content:
        return None
    name = in_golden(path.parent, ENVELOPE)
    if not layout_variant:
        return Envelope(lanes[section], False, named_file(SOURCE, ENVELOPE, name), file=name)
    source = named_file(VARIANT_SOURCE, ENVELOPE, name)
    return Envelope(lanes[section], True, source, dict(drifting), file=name)


def drifting_problem(
    content: Mapping[str, Any],
    magnitude: Callable[[str], float | None],
    recorded_steps: Callable[[str], int],
) -> str:
    """Why the values ``content`` (an envelope file) lists as not comparable across variants
    (:data:`DRIFTING`) may not stand, or ``""``. Each takes a metric out of every variant's
    comparison, so each must be what calibration writes (:func:`bands`): a metric the golden
    recorded at :data:`MIN_STEPS` steps or more, measured in the across-variants lane (which
    the file then holds) and given no band there, whose variants strayed from the golden by
    more than :data:`MAX_WIDTH` x its largest recorded magnitude (where that is 0, by more
    than 0: :func:`_unit`)."""
    drifting = content.get(DRIFTING, {})
    if not isinstance(drifting, dict):
        return f"{DRIFTING!r} must be an object"
    across = content.get(LANES["across variants"])
    for name, entry in sorted(drifting.items()):
        why = _drifting_rule(entry, magnitude(name), recorded_steps(name))
        if not why and not isinstance(across, dict):
            why = f"listed without the across-variants lane ({LANES['across variants']!r})"
        elif not why and name in across:
            why = (
                f"it also has a band across variants ({LANES['across variants']!r}), and "
                "calibration gives a metric one or the other"
            )
        if why:
            return f"metric {name!r} not comparable across variants: {why}"
        why = _trends_problem(entry.get("trends"), name)
        if why:
            return why
    return ""


def _drifting_rule(entry: Any, magnitude: float | None, steps: int) -> str:
    """The rule of :func:`drifting_problem` one entry breaks on its own, or ``""``."""
    widest = entry.get("widest") if isinstance(entry, dict) else None
    number = isinstance(widest, (int, float)) and not isinstance(widest, bool)
    least = 0.0 if magnitude == 0 else MAX_WIDTH  # a golden of 0: in units in the last place
    if not number or not widest > least or not math.isfinite(widest):
        beyond = "0" if magnitude == 0 else f"{MAX_WIDTH:g}x the metric"
        return f"its variants' widest straying {widest!r} is not beyond {beyond}"
    if magnitude is None:
        return "it was never recorded in this golden"
    if steps < MIN_STEPS:
        return (
            f"recorded at {steps} step{'' if steps == 1 else 's'}, and calibration writes an "
            f"envelope only for metrics of {MIN_STEPS} steps or more"
        )
    return ""
