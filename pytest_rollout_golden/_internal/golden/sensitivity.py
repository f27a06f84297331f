"""What each gate of a golden can detect: the smallest relative change of a gated value
that its comparison fails on (its minimum detectable effect), and the gates that can never
fail.

Cheap: no test body runs again. Each metric's recorded value at its first and last recorded
step is multiplied by ``1 + r`` and compared with itself through the replay's one comparison
(:func:`..tolerance.compare.compare_values`) under the tolerance replay applies there (the
step's envelope band, the calibrated files, every layer); ``r`` is bisected in log space over
[:data:`LOW`, :data:`HIGH`]. A trend bound is probed the same way: the last window of the
series is scaled by ``1 + r`` and judged by :mod:`..tolerance.trends`' own statistic and
bound (raised by the envelope as replay raises it, :func:`..golden.checks.trend_comparison`).

A gate can never fail when no change up to :data:`HIGH` (ten times the value) fails it: a
metric every layer excludes, a band or tolerance wider than the value reaches, a trend bound
above what the series reaches, a trend statistic that is undefined over the series. A value
that is 0 at both probed steps has no relative change; what absolute change fails is said.
Torch is imported when a value is compared, as replay does.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ..results import Verdict
from ..tolerance.compare import compare_values, dtype_name
from ..tolerance.envelope import Envelope
from ..tolerance.mismatch_bounds import Bound
from ..tolerance.spec import Tolerance
from ..tolerance.trends import TrendBounds, evaluate, window
from . import metric_codec
from .checks import recorded_magnitude, trend_comparison

LOW, HIGH = 1e-9, 10.0
"""The relative changes probed: below 1e-9 a float64 value is near its rounding; above ten
times the value, no regression is subtle."""
HALVINGS = 30
"""Bisections of the log-space interval: ln(HIGH / LOW) / 2**30 < 3e-8, the relative precision
of a reported effect (far below the two digits shown)."""
PRECISION = 1e-7
"""How far above a floor an effect may read and still meet it: the bisection's precision with
room to spare (``rtol=1e-3`` on its own detects any change above 1e-3, so it meets 1e-3)."""

DETECTS, NEVER, ZERO = "detects", "never fails", "zero"
JUDGED = ("metric", "tensor")
"""The gates a floor judges: those comparing a value with its golden. Absolute mismatch bounds
and trend bounds are ceilings for gross failures, far above a healthy run by design: they are
listed and flagged, not held to a relative floor."""

# (metric, step, dtypes) -> (tolerance, where it came from): what replay applies there
ToleranceAt = Callable[[str, int, tuple[str, str]], tuple[Tolerance, str]]


@dataclasses.dataclass(frozen=True)
class Probe:
    """One probed value: at ``step``, the smallest relative change that fails (``effect``;
    ``None``: none up to :data:`HIGH`; NaN: the value is 0 or not finite, no relative change
    applies), under ``tolerance`` from ``source``; ``value``: the value's largest magnitude."""

    step: int
    value: float
    effect: float | None
    tolerance: str
    source: str


@dataclasses.dataclass(frozen=True)
class Gate:
    """One gate (a metric, or a trend bound ``"<metric> <statistic>"``) and what it detects.

    ``never``: why it can never fail (``""``: it can); ``note``: what its probes could not
    measure (a value of 0)."""

    name: str
    kind: str = "metric"
    probes: tuple[Probe, ...] = ()
    never: str = ""
    note: str = ""

    @property
    def status(self) -> str:
        """:data:`DETECTS`, :data:`NEVER` or :data:`ZERO` (0 at every probed step)."""
        if self.never:
            return NEVER
        return DETECTS if self.effect is not None else ZERO

    @property
    def effect(self) -> float | None:
        """The minimum detectable effect: the largest of the probed steps' (a change of
        this size fails at each of them); ``None`` where no probe measured one."""
        found = [p.effect for p in self.probes if p.effect is not None and p.effect == p.effect]
        return max(found) if found and not self.never else None

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "status": self.status,
            "effect": self.effect,
            "never": self.never,
            "note": self.note,
            "probes": [_probe_json(p) for p in self.probes],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Gate:
        probes = tuple(
            Probe(
                p["step"],
                p["value"],
                math.nan if p["effect"] == "nan" else p["effect"],
                p["tolerance"],
                p["source"],
            )
            for p in data["probes"]
        )
        return cls(data["name"], data["kind"], probes, data["never"], data["note"])


def _probe_json(probe: Probe) -> dict[str, Any]:
    effect = probe.effect
    nan = effect is not None and effect != effect
    return {**dataclasses.asdict(probe), "effect": "nan" if nan else effect}


def smallest_failing(fails: Callable[[float], bool]) -> float | None:
    """The smallest relative change in [LOW, HIGH] for which ``fails`` holds, bisected in log
    space (``fails`` grows with the change); ``None`` when not even HIGH fails."""
    if not fails(HIGH):
        return None
    if fails(LOW):
        return LOW
    low, high = math.log(LOW), math.log(HIGH)
    for _ in range(HALVINGS):
        middle = (low + high) / 2
        if fails(math.exp(middle)):
            high = middle
        else:
            low = middle
    return math.exp(high)


def detectable_effect(
    expected: Any, tol: Tolerance, *, magnitude: float | None = None, mask: Any = None
) -> float | None:
    """The smallest ``r`` for which ``expected * (1 + r)`` fails the comparison with
    ``expected`` under ``tol`` (``magnitude``, ``mask``: as :func:`.compare.compare_values`);
    ``None`` when none up to :data:`HIGH` does, NaN where ``expected`` is 0 or not finite
    (no relative change moves it)."""
    import torch

    value = torch.as_tensor(expected).detach().to(torch.float64)
    if mask is not None:
        value = value.masked_fill(~torch.broadcast_to(mask, value.shape), 0)
    if not bool(value.isfinite().all()) or not bool(value.count_nonzero()):
        return math.nan

    def fails(r: float) -> bool:
        perturbed = value * (1 + r)
        diff = compare_values(
            value, perturbed, tol, check_dtype=False, mask=mask, magnitude=magnitude
        )
        return not diff.ok

    return smallest_failing(fails)


def metric_gate(
    name: str, steps: Mapping[str, Mapping[str, Any]], tolerance_at: ToleranceAt
) -> Gate:
    """The gate of metric ``name`` over the recorded ``steps`` (``{step: {name: node}}``),
    probed at its first and last recorded step under ``tolerance_at``."""
    present = sorted(int(s) for s, names in steps.items() if name in names)
    magnitude = recorded_magnitude(steps, name)
    probes, notes = [], {}
    for step in sorted({present[0], present[-1]}):
        expected = metric_codec.decode(steps[str(step)][name], where=f"metric {name!r}")
        dtype = dtype_name(expected)
        tol, source = tolerance_at(name, step, (dtype, dtype))
        if tol.ignore:
            return Gate(name, never=f"not compared ({source})")
        effect = detectable_effect(expected, tol, magnitude=magnitude)
        value = float(expected.double().abs().max()) if expected.numel() else 0.0
        probes.append(Probe(step, value, effect, tol.describe(), source))
        if effect is not None and effect != effect:
            notes.setdefault(_zero_note(value, tol, magnitude), []).append(str(step))
    note = "; ".join(f"{_steps(at)}: {text}" for text, at in notes.items())
    return _never_if_unbounded(Gate(name, probes=tuple(probes), note=note))


def _steps(steps: Sequence[str]) -> str:
    return f"step {steps[0]}" if len(steps) == 1 else f"steps {', '.join(steps)}"


def _zero_note(value: float, tol: Tolerance, magnitude: float | None) -> str:
    """What a probe of a value that is 0 (or not finite) can say."""
    if value != value or math.isinf(value):
        return "not finite, no relative change applies"
    allowed = tol.allowance(0.0, magnitude)
    if tol.exact or allowed == 0:
        return "0, any change fails (nothing allowed at 0)"
    return f"0, no relative change moves it; a change above {allowed:.2g} fails"


@dataclasses.dataclass(frozen=True)
class TensorProbe:
    """What a tensor gate is probed on at one step: the recorded ``value``, the ``mask`` replay
    compared it under (``None``: every position), the ``tolerance`` and its ``source``."""

    value: Any
    mask: Any
    tolerance: Tolerance
    source: str


def tensor_gate(name: str, kept: Mapping[int, TensorProbe]) -> Gate:
    """The gate of tensor ``name`` probed at the steps ``kept`` (its first and last): the whole
    tensor scaled by ``1 + r`` where its mask selects; a mask that selects none of its
    positions lets no change through (replay fails such a gate whatever the values)."""
    import torch

    probes, notes = [], {}
    for step in sorted(kept):
        probe = kept[step]
        tol, value = probe.tolerance, torch.as_tensor(probe.value)
        if tol.ignore:
            return Gate(name, "tensor", never=f"not compared ({probe.source})")
        if probe.mask is not None and value.numel() and not bool(probe.mask.any()):
            why = f"its mask at step {step} selects none of its {value.numel()} positions"
            never = f"{why}: no change of a value reaches the comparison (replay fails it as such)"
            return Gate(name, "tensor", never=never)
        effect = detectable_effect(value, tol, mask=probe.mask)
        magnitude = float(value.double().abs().max()) if value.numel() else 0.0
        probes.append(Probe(step, magnitude, effect, tol.describe(), probe.source))
        if effect is not None and effect != effect:
            notes.setdefault(_zero_note(magnitude, tol, None), []).append(str(step))
    note = "; ".join(f"{_steps(at)}: {text}" for text, at in notes.items())
    return _never_if_unbounded(Gate(name, "tensor", tuple(probes), note=note))


def _never_if_unbounded(gate: Gate) -> Gate:
    """``gate``, flagged as never failing where a probe found no change up to HIGH failing."""
    where = next((p for p in gate.probes if p.effect is None), None)
    if where is None:
        return gate
    why = (
        f"no change up to {HIGH:g}x the value fails at step {where.step} "
        f"({where.tolerance}, {where.source})"
    )
    return dataclasses.replace(gate, never=why)


def trend_gates(
    steps: Mapping[str, Mapping[str, Any]],
    bounds: TrendBounds,
    envelope: Envelope | None = None,
) -> list[Gate]:
    """A gate per trend bound in force over the recorded series, probed by scaling the
    series' last window by ``1 + r``; a bound switched off or a statistic undefined over the
    series never fails. ``envelope``: raises bounds as replay does."""
    numbers = metric_codec.numbers(steps)
    gates = []
    for check in evaluate(numbers, bounds, None):
        name = f"{check.metric} {check.statistic}"
        if check.trend is None:
            gates.append(Gate(name, "trend", never=f"switched off ({check.bound.source})"))
        elif check.trend.value is None:
            gates.append(Gate(name, "trend", never=f"undefined: {check.trend.why}"))
        else:
            gates.append(_trend_gate(name, check, numbers, bounds, envelope))
    return gates


def _trend_gate(
    name: str,
    check: Any,
    numbers: Mapping[str, Mapping[str, tuple[Any, str]]],
    bounds: TrendBounds,
    envelope: Envelope | None,
) -> Gate:
    """One trend bound in force, probed at the series' last step."""
    series = sorted((int(s), v) for s, names in numbers.items() for n, v in names.items()
                    if n == check.metric)  # fmt: skip
    last = {s for s, _ in series[-window(len(series)) :]}

    def judged(r: float) -> Any:
        scaled = {
            str(s): {check.metric: (float(v) + r * abs(float(v)) if s in last else v, d)}
            for s, (v, d) in series
        }
        found = [c for c in evaluate(scaled, bounds, None) if c.statistic == check.statistic]
        return trend_comparison(found[0], envelope)

    base = judged(0.0)
    effect = smallest_failing(lambda r: judged(r).verdict == Verdict.FAIL)
    bound = f"<= {base.bound:g}" if base.bound is not None else ""
    probe = Probe(series[-1][0], abs(check.trend.value), effect, bound, base.tolerance_source)
    if effect is None:
        why = (
            f"the bound {bound} is above what a change of up to {HIGH:g}x the last "
            f"{len(last)} steps reaches ({check.statistic} {check.trend.value:.3g} recorded)"
        )
        return Gate(name, "trend", (probe,), never=why)
    return Gate(name, "trend", (probe,))


def bound_gates(steps: Mapping[str, Mapping[str, Any]], bounds: Mapping[str, Bound]) -> list[Gate]:
    """A gate per absolute mismatch bound (``golden.check_mismatch``: ``metric <= bound``) over
    the recorded ``steps``, probed at the metric's first and last step with the bound's own
    test (:meth:`.Bound.holds`); a bound switched off never fails."""
    numbers = metric_codec.numbers(steps)
    gates = []
    for metric, bound in sorted(bounds.items()):
        name = f"{metric}<={bound.value:g}"
        if bound.off:
            gates.append(Gate(name, "bound", never=f"switched off ({bound.source})"))
            continue
        present = sorted(int(s) for s, values in numbers.items() if metric in values)
        probes, notes = [], []
        for step in sorted({present[0], present[-1]}) if present else ():
            value = float(numbers[str(step)][metric][0])
            effect = _bound_effect(bound, value)
            probes.append(Probe(step, abs(value), effect, f"<= {bound.value:g}", bound.source))
            if value <= 0:
                notes.append(f"step {step}: {value:g}, no relative change reaches the bound")
        gates.append(_never_if_unbounded(Gate(name, "bound", tuple(probes), note="; ".join(notes))))
    return gates


def _bound_effect(bound: Bound, value: float) -> float | None:
    """The smallest relative growth of ``value`` beyond ``bound`` (NaN: not above 0)."""
    if not value > 0:
        return math.nan
    return smallest_failing(lambda r: not bound.holds(value * (1 + r)))


def golden_gates(
    steps: Mapping[str, Mapping[str, Any]],
    tolerance_at: ToleranceAt,
    *,
    trends: TrendBounds | None = None,
    envelope: Envelope | None = None,
) -> list[Gate]:
    """Every gate of a golden's recorded metrics ``steps``: a gate per metric, then one per
    trend bound in force (``trends``)."""
    names = sorted({name for values in steps.values() for name in values})
    gates = [metric_gate(name, steps, tolerance_at) for name in names]
    if trends is not None:
        gates += trend_gates(steps, trends, envelope)
    return gates


def below_floor(gates: Iterable[Gate], floor: float) -> list[Gate]:
    """The gates of :data:`JUDGED` kinds that cannot detect a relative change of ``floor``:
    those that never fail, and those whose effect is larger (beyond :data:`PRECISION`). A
    value that is 0 at its probed steps is listed, not judged (no relative change applies)."""
    limit = floor * (1 + PRECISION)
    compared = [g for g in gates if g.kind in JUDGED]
    return [g for g in compared if g.never or (g.effect is not None and g.effect > limit)]


def effect_text(effect: float | None) -> str:
    """``1.0e-03``, ``<= 1e-09`` at :data:`LOW`, ``-`` for none."""
    if effect is None:
        return "-"
    return f"<= {LOW:g}" if effect <= LOW else f"{effect:.1e}"


def gate_lines(gates: Sequence[Gate], *, indent: str = "  ") -> list[str]:
    """A line per gate: its name, its effect and the probed steps with their tolerance, or
    ``NEVER FAILS`` and why, or the note of a value that is 0."""
    width = max((len(g.name) for g in gates), default=0)
    lines = []
    for gate in gates:
        head = f"{indent}{gate.name:<{width}}  "
        if gate.never:
            lines.append(f"{head}NEVER FAILS: {gate.never}")
            continue
        if gate.effect is None:
            lines.append(f"{head}{'-':>8}  {gate.note}")
            continue
        measured = [p for p in gate.probes if p.effect == p.effect]
        each = {effect_text(p.effect) for p in measured}
        at = [f"{p.step}" if len(each) == 1 else f"{p.step} ({effect_text(p.effect)})"
              for p in measured]  # fmt: skip
        tol = _tolerances_text(gate.probes)
        note = f"; {gate.note}" if gate.note else ""
        lines.append(f"{head}{effect_text(gate.effect):>8}  {_steps(at)}: {tol}{note}")
    return lines


def _tolerances_text(probes: Sequence[Probe]) -> str:
    """The tolerance of the probes and its source; each step's where they differ (a band)."""
    if len({(p.tolerance, p.source) for p in probes}) == 1:
        return f"{probes[0].tolerance} ({probes[0].source})"
    return "; ".join(f"at {p.step} {p.tolerance} ({p.source})" for p in probes)


def floor_lines(below: Sequence[tuple[str, Gate]], floor: float, source: str) -> list[str]:
    """The failure of a required floor: each gate (with its test) that cannot detect it."""
    lines = [
        f"FAILED {source} {floor:g}: {len(below)} gate(s) cannot detect a relative change "
        f"of {floor:g}"
    ]
    for test, gate in below:
        what = f"never fails: {gate.never}" if gate.never else f"detects {effect_text(gate.effect)}"
        lines.append(f"  {test}: {gate.name} {what}")
    return lines
