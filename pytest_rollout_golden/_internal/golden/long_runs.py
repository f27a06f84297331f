"""The gates over a long run's series that replay decides when a golden finishes: each
metric's mean deviation from the golden against its bias bound (:func:`bias_checks`), and
what the long-run report needs to know of this replay (:func:`long_run_facts`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...errors import GoldenError
from ...store.location import ENVELOPE, TOLERANCES
from ..results import Comparison, Verdict
from ..tolerance.envelope import BIAS_FLOOR, BIAS_MARGIN, MIN_STEPS, Envelope, band_source, biases
from . import checks
from .golden_files import GoldenFiles


def bias_checks(
    envelope: Envelope | None,
    recorded: Any,
    run: Any,
    comparisons: Sequence[Comparison],
) -> list[Comparison]:
    """Replaying against ``envelope``: each band holds the run's mean deviation from the
    golden (``recorded``, :func:`.metric_codec.numbers`) to its bias bound
    (:func:`.envelope.biases`) unless a tolerance above the envelope decided its steps
    (``comparisons``: this run's); none without an envelope or recording."""
    if recorded is None or envelope is None:
        return []
    held: dict[str, dict[int, float]] = {}  # per metric, step -> what its band allowed
    for c in comparisons:
        lane = band_source(c.tolerance_source)
        if c.kind == "metric" and lane == envelope.source and c.tolerance:
            allowed = c.tolerance.allowance(float(c.expected), c.scale)
            held.setdefault(c.name, {})[c.step] = allowed
    source = (
        f"{envelope.source}: {BIAS_MARGIN:g} x the calibration runs' largest (the "
        f"band's margin for fewer than 8 distinct runs), at least {BIAS_FLOOR:g}"
    )
    return [
        checks.bias_comparison(bias, sorted(held[bias.name]), source)
        for bias in biases(envelope, recorded, run, held)
    ]


def long_run_facts(
    comparisons: Sequence[Comparison],
    files: GoldenFiles,
    envelope: Envelope | None,
    test_id: str,
    *,
    variant: bool,
) -> dict[str, Any]:
    """What decides a replay's long-run gates (:mod:`..report.gates`; ``{}`` where no
    metric ran :data:`.envelope.MIN_STEPS` steps): per metric its steps and the envelope
    lane its band came from; the lane's metrics, or why it has none; its float64
    certificate from ``tolerances.json`` (``{}``: not a calibrated variant). ``files``: the
    values compared; ``variant``: a layout variant replaying its reference's golden."""
    steps: dict[str, set[int]] = {}
    banded: dict[str, str] = {}  # metric -> the lane its band came from, as named
    for c in comparisons:
        if c.kind == "metric" and c.verdict in (Verdict.PASS, Verdict.FAIL):
            steps.setdefault(c.name, set()).add(c.step)
            if band_source(c.tolerance_source) is not None:
                parts = c.tolerance_source.split("; ")
                lane = [p.removeprefix("atol from ") for p in parts if p.startswith("atol from ")]
                banded.setdefault(c.name, lane[0] if lane else c.tolerance_source)
    long = {n: len(s) for n, s in sorted(steps.items()) if len(s) >= MIN_STEPS}
    if not long:
        return {}
    found: dict[str, Any] = {"steps": long, "banded": banded, "certificate": {}}
    if TOLERANCES in files.recorded:
        try:
            variants = files.load(TOLERANCES).get("variants") or {}
            found["certificate"] = (variants.get(test_id) or {}).get("certificate") or {}
        except GoldenError:  # damaged: replay has already said so
            pass
    if envelope is not None:
        return {**found, "source": envelope.source, "bands": sorted(envelope.bands)}
    if ENVELOPE not in files.recorded:
        why = f"no {ENVELOPE}: `pytest --golden-calibrate N` measures one"
    elif variant:
        why = (
            f"{ENVELOPE} has no lane across variants: calibrate this variant with the "
            "reference (`pytest --golden-calibrate N` over all of them)"
        )
    else:
        why = f"{ENVELOPE} has no lane of this test's own runs"
    return {**found, "none": why}
