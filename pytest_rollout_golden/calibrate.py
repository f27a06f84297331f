"""Calibrated tolerances: measured from repeated runs, stored in the golden they belong to.

``pytest --golden-calibrate N`` runs each selected golden test N times under
perturbations that change the order of floating-point reductions but not the
math (CPU thread counts; on GPU optionally non-deterministic algorithms and
TF32). Each metric's spread over those runs becomes its tolerance::

    rtol = max(MARGIN * max relative spread, DTYPE_FLOOR * eps(dtype))
    atol = max(MARGIN * max absolute spread at steps whose value is ~0, lower layers' atol)

A metric whose runs agree bit for bit gets no entry: it keeps the tight
default. The result is ``tolerances.json`` inside the golden directory, listed
in its manifest (so the atomic swap of an update keeps it), readable in review:
each entry carries the spread it was derived from.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .errors import GoldenFormatError
from .tolerance import CALIBRATED, Layer

FILENAME = "tolerances.json"
FORMAT = "pytest-rollout-golden-tolerances"
# The largest spread seen in N runs underestimates the spread of the next run
# (with N = 3 by a lot): 2x leaves room without reaching a bug's 1e-3.
MARGIN = 2.0
# The smallest rtol written: a few units in the last place of the metric's dtype.
DTYPE_FLOOR = 4.0
EPS = {"float16": 2**-10, "bfloat16": 2**-7, "float32": 2**-23, "float64": 2**-52}
SOURCE = "calibrated (tolerances.json)"


def calibrated_layer(document: Any, path: Path) -> Layer:
    """The resolution layer of a ``tolerances.json`` document."""
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise GoldenFormatError(
            f"{path}: is not a calibrated-tolerances file of ours; "
            "re-run `pytest --golden-calibrate N` for this test"
        )
    try:
        return Layer(SOURCE, document.get("tolerances", {}), order=CALIBRATED)
    except (TypeError, ValueError) as exc:
        raise GoldenFormatError(f"{path}: {exc}") from None
