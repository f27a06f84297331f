"""Which gates hold each long run (:data:`.envelope.MIN_STEPS` steps or more) a session
replayed: the per-step band and the lane it came from, the bias gate, the trend bounds and
the float64 certificate, and, where a metric has no band, why (the summary's "gates of long
runs" section; docs/guide/long-runs.md)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..results import Outcome, Verdict

MIN_STEPS = 10  # envelope.MIN_STEPS, which replay applies (a test checks they agree)
HEADING = f"gates of long runs ({MIN_STEPS} steps or more):"
_COMPARED = (Verdict.PASS, Verdict.FAIL)


def long_run_gates(outcomes: Iterable[Outcome]) -> list[str]:
    """One line per long-run test replayed (the last outcome of a test run several times,
    as calibration does)."""
    last = {o.test: o for o in outcomes if o.long_run.get("steps")}
    return [_line(o) for o in last.values()]


def _line(o: Outcome) -> str:
    """The gates of one replay (``o.long_run``, :func:`..golden.long_runs.long_run_facts`)."""
    facts = o.long_run
    parts = [*_bands(facts), _series(o, "bias", "bias gate"), _series(o, "trend", "trend bound")]
    parts.append(_certificate(facts.get("certificate")))
    return f"{o.test} ({max(facts['steps'].values())} steps): {'; '.join(parts)}"


def _bands(facts: Mapping[str, Any]) -> list[str]:
    """``per-step band: <metrics> (<lane>)`` per lane, and ``no band: <metrics> (<why>)``."""
    long, banded = list(facts["steps"]), facts["banded"]
    by_lane: dict[str, list[str]] = {}
    for name in long:
        if name in banded:
            by_lane.setdefault(banded[name], []).append(name)
    out = [f"per-step band: {', '.join(names)} ({lane})" for lane, names in by_lane.items()]
    missing = [n for n in long if n not in banded]
    above = [n for n in missing if n in facts.get("bands", ())]
    if above:
        out.append(f"no band: {', '.join(above)} (a tolerance given above the envelope decides)")
    rest = [n for n in missing if n not in above]
    if rest:
        why = facts.get("none") or "not measured by its calibration (fewer steps, or refused)"
        out.append(f"no band: {', '.join(rest)} ({why})")
    return out


def _series(o: Outcome, kind: str, label: str) -> str:
    """The gates of ``kind`` over the whole run (bias, trend), each with its bound."""
    found = [
        f"{c.name.removesuffix(' bias')} <= {c.bound:g}"
        for c in o.comparisons
        if c.kind == kind and c.verdict in _COMPARED and c.bound is not None
    ]
    return f"{label}: {', '.join(found)}" if found else f"no {label}"


def _certificate(found: Mapping[str, Any] | None) -> str:
    """What the float64 oracle said of this test when calibration certified its variants."""
    verdict = (found or {}).get("verdict")
    if verdict is None:
        return "float64 certificate: none (not a calibrated variant)"
    if verdict == "certified":  # a bug inside the bf16 band fails only in float64
        return (
            "float64 certificate: certified (same math in float64; "
            "`pytest --golden-certify` in CI gates it in float64)"
        )
    if verdict == "not the same math":
        return "float64 certificate: not the same math (left out of the variant lane)"
    return f"float64 certificate: not certified ({found.get('why', 'no float64 run')})"  # type: ignore[union-attr]
