"""One run of the history from a session's outcomes: the ``run.json`` document and the
arrays of ``values.safetensors``.

A *series* is one metric (or tensor) of one golden, at one rank and micro-batch, across the
steps compared; the run's arrays hold every series one after the other, in the order
``run.json`` lists them with their ``count`` of steps: ``steps`` (int64) and ``values``
(float64, 3 rows), per step the value this run computed (``actual``), the golden's
(``expected``) and the distance in units of tolerance (``excess``: the difference over the
difference allowed; above 1 the step failed). A value that is not one number (a tensor, a
missing step) is NaN.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import math
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..results import Comparison, Outcome

ROWS = ("actual", "expected", "excess")  # the rows of the array ``values``

# Distributions whose version a run records where installed: the numerics' stack and the
# RL frameworks whose goldens this plugin keeps.
PACKAGES = (
    "torch",
    "numpy",
    "pytest-rollout-golden",
    "transformers",
    "accelerate",
    "deepspeed",
    "flash-attn",
    "vllm",
    "sglang",
    "verl",
    "openrlhf",
    "trl",
    "megatron-core",
    "nemo-rl",
    "areal",
    "slime",
)


def versions() -> dict[str, str]:
    """The version of each of :data:`PACKAGES` installed here."""
    found = {}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def environment_fingerprint() -> dict[str, Any] | None:
    """The golden's fingerprint of this process (:func:`..golden.determinism.fingerprint`),
    where torch was imported by the tests (``None`` otherwise: nothing computed with it)."""
    if "torch" not in sys.modules:
        return None
    from ..golden.determinism import fingerprint

    return fingerprint()


def series_label(c: Comparison) -> str:
    """The name of a comparison's series: the metric, with its rank and micro-batch if any."""
    where = [f"rank{c.rank}"] * (c.rank is not None) + [f"micro{c.micro}"] * (c.micro is not None)
    return f"{c.name}[{','.join(where)}]" if where else c.name


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return math.nan
    return float(value)


def distance(c: Comparison) -> float:
    """A step's distance in units of tolerance: the comparison's excess beyond tolerance
    (the comparison measures one only there: within, its excess is 0), else, for a number,
    ``|actual - expected|`` over the difference its tolerance allows, so that a drift
    within tolerance shows; NaN where there is neither (not compared)."""
    excess, tol = _number(c.excess), c.tolerance
    if excess > 0 or tol is None or tol.exact or tol.ignore:
        return excess
    expected, diff = _number(c.expected), _number(c.abs_diff)
    allowed = tol.allowance(expected, c.scale) if math.isfinite(expected) else math.nan
    return diff / allowed if allowed > 0 and math.isfinite(diff) else excess


def build_run(
    outcomes: Iterable[Outcome], context: Mapping[str, Any], rootdir: Path
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(run.json document, arrays)`` of a session; ``context``: lane, commit, fingerprint,
    versions and whatever else describes the run as a whole."""
    import numpy as np

    tests, steps, rows = [], [], []
    counts: dict[str, int] = {}
    for outcome in sorted(outcomes, key=lambda o: o.test):
        status = outcome.status.value if outcome.status is not None else "untouched"
        counts[status] = counts.get(status, 0) + 1
        grouped: dict[tuple[str, str], list[Comparison]] = {}
        for c in outcome.comparisons:
            grouped.setdefault((series_label(c), c.kind), []).append(c)
        series = []
        for (label, kind), comparisons in sorted(grouped.items()):
            comparisons.sort(key=lambda c: c.step)
            steps += [c.step for c in comparisons]
            rows += [(_number(c.actual), _number(c.expected), distance(c)) for c in comparisons]
            failed = sum(c.failed for c in comparisons)
            series.append(
                {"name": label, "kind": kind, "failed": failed, "count": len(comparisons)}
            )
        tests.append(
            {
                "test": outcome.test,
                "golden": _relative(outcome.directory, rootdir),
                "status": status,
                "lane": outcome.lane.get("name") if outcome.lane else None,
                "series": series,
            }
        )
    arrays = {
        "steps": np.array(steps, dtype=np.int64),
        "values": np.array(rows, dtype=np.float64).reshape(-1, 3).T.copy(),
    }
    now = datetime.datetime.now(datetime.timezone.utc)
    document = {
        "time": now.isoformat(timespec="seconds"),
        **context,
        "counts": counts,
        "tests": tests,
    }
    return document, arrays


def _relative(directory: str, rootdir: Path) -> str:
    path = Path(directory)
    try:
        return path.relative_to(rootdir).as_posix()
    except ValueError:
        return path.as_posix()
