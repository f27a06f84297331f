"""pytest-rollout-golden: record a rollout batch and training metrics once, replay and gate them.

The package imports nothing heavy at import time: torch and numpy are loaded
only when a golden is actually read, written or compared.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy import lazy_attributes
from .errors import (
    GoldenError,
    GoldenFormatError,
    GoldenMismatch,
    GoldenMissingError,
    GoldenNaNWarning,
    GoldenNotFetchedError,
    GoldenToleranceWarning,
    UnsupportedValueError,
)
from .results import Comparison, Mode, Outcome, Verdict
from .tolerance import Tolerance

if TYPE_CHECKING:
    from .codec import RolloutBatch
    from .determinism import deterministic, fingerprint
    from .replay import Golden
    from .store import load_batch, save_batch
    from .variants import same_math

__version__ = "0.1.0"

_LAZY = {
    "save_batch": "store",
    "load_batch": "store",
    "deterministic": "determinism",
    "fingerprint": "determinism",
    "Golden": "replay",
    "RolloutBatch": "codec",
    "same_math": "variants",
}
_SUBMODULES = {"strategies", "invariants", "parallel", "reference"}

__all__ = [
    "Comparison",
    "Golden",
    "GoldenError",
    "GoldenFormatError",
    "GoldenMismatch",
    "GoldenMissingError",
    "GoldenNaNWarning",
    "GoldenNotFetchedError",
    "GoldenToleranceWarning",
    "Mode",
    "Outcome",
    "RolloutBatch",
    "Tolerance",
    "UnsupportedValueError",
    "Verdict",
    "deterministic",
    "fingerprint",
    "load_batch",
    "same_math",
    "save_batch",
]


__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, _SUBMODULES)
