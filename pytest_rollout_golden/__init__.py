"""pytest-rollout-golden: record a rollout batch and training metrics once, replay and gate them.

The package imports nothing heavy at import time: torch and numpy are loaded
only when a golden is actually read, written or compared.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._internal.lazy import lazy_attributes
from ._internal.results import Comparison, Mode, Outcome, Verdict
from ._internal.tolerance.spec import Tolerance
from ._internal.version import VERSION
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

if TYPE_CHECKING:
    from ._internal.golden.determinism import deterministic, fingerprint
    from ._internal.golden.golden import Golden
    from ._internal.golden.optimizer import optimizer_state
    from ._internal.golden.variants import same_math
    from .store import load_batch, save_batch
    from .store.codec import RolloutBatch

__version__ = VERSION

_LAZY = {
    "save_batch": "store",
    "load_batch": "store",
    "deterministic": "_internal.golden.determinism",
    "fingerprint": "_internal.golden.determinism",
    "Golden": "_internal.golden.golden",
    "optimizer_state": "_internal.golden.optimizer",
    "RolloutBatch": "store.codec",
    "same_math": "_internal.golden.variants",
}
_SUBMODULES = {"strategies", "invariants", "parallel", "reference", "quant"}

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
    "optimizer_state",
    "same_math",
    "save_batch",
]


__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, _SUBMODULES)
