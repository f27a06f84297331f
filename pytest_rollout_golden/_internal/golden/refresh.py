"""A golden re-recorded with provenance, and the placeholder values a refresh refuses.

``--update-golden`` writes into the manifest of each golden it re-records a ``provenance``
object: why (``--golden-reason``, else the commit checked out), who (the user name), from
which environment (host, lane; the manifest's ``fingerprint`` beside it is this run's), and
the old values' distance to the new ones, per metric, in units of tolerance.

``--update-golden-failing`` re-records only goldens with a value beyond tolerance, and
refuses new values of those metrics that look like placeholders (torchtitan committed
placeholder goldens that failed every ROCm job): all zeros, a NaN, or one value at every
step of several. ``--golden-allow-placeholder`` lets them through.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from typing import Any

from ..results import Comparison, Verdict, json_number

PROVENANCE = "provenance"  # the manifest key


@dataclasses.dataclass(frozen=True)
class Refresh:
    """What a session that re-records goldens says of itself, the same for every golden."""

    reason: str | None = None
    by: str = ""
    host: str = ""
    commit: str | None = None
    only_failing: bool = False
    allow_placeholder: bool = False

    def provenance(self, comparisons: Iterable[Comparison], lane: str | None) -> dict[str, Any]:
        """The manifest's ``provenance`` of a golden re-recorded after ``comparisons`` (its
        values against the old ones)."""
        distance: dict[str, Any] = {}
        for c in comparisons:
            if c.verdict not in (Verdict.UPDATED, Verdict.PASS) or c.excess is None:
                continue
            label = c.name if c.kind == "metric" else f"{c.kind}:{c.name}"
            old = distance.get(label)
            if old is None or c.excess > old or math.isnan(c.excess):
                distance[label] = c.excess
        return {
            "reason": self.reason or (f"commit {self.commit}" if self.commit else None),
            "by": self.by,
            "environment": {"host": self.host, "lane": lane},
            "commit": self.commit,
            "distance": {k: json_number(distance[k]) for k in sorted(distance)},
        }


def changed_values(comparisons: Iterable[Comparison]) -> bool:
    """Whether a re-recording changes the golden's values: a value new, or one that differs
    from the old at all (a NaN against a NaN counts as changed)."""
    for c in comparisons:
        if c.verdict == Verdict.NEW:
            return True
        if c.verdict in (Verdict.UPDATED, Verdict.PASS) and c.abs_diff != 0:
            return True
    return False


def _values(steps: Mapping[str, Mapping[str, Any]], name: str) -> list[tuple[int, Any]]:
    from . import metric_codec

    return sorted(
        (int(step), metric_codec.scalar(names[name]))
        for step, names in steps.items()
        if name in names
    )


def placeholder_problem(steps: Mapping[str, Mapping[str, Any]], name: str) -> str | None:
    """Why metric ``name``'s new values (``{step: {name: node}}``) look like a placeholder:
    all zeros, a NaN, or one value at every step of two or more (``None``: they do not; an
    array-valued metric is not judged)."""
    values = _values(steps, name)
    if not values or any(not isinstance(v, (int, float)) or isinstance(v, bool) for _, v in values):
        return None
    nan = [step for step, v in values if math.isnan(v)]
    if nan:
        return f"NaN at step {nan[0]}"
    if all(v == 0 for _, v in values):
        return f"all zeros ({len(values)} step{'s' * (len(values) > 1)})"
    if len(values) > 1 and len({v for _, v in values}) == 1:
        return f"the same value {values[0][1]!r} at all {len(values)} steps"
    return None
