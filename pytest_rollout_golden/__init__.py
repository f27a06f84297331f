"""pytest-rollout-golden: record a rollout batch and training metrics once, replay and gate them.

The package imports nothing heavy at import time: torch and numpy are loaded
only when a golden is actually read, written or compared.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from .errors import (
    GoldenError,
    GoldenFormatError,
    GoldenMismatch,
    GoldenMissingError,
    UnsupportedValueError,
)
from .tolerance import Tolerance

if TYPE_CHECKING:
    from .codec import RolloutBatch
    from .compare import Comparison
    from .determinism import deterministic, fingerprint
    from .replay import Golden, GoldenToleranceWarning, Mode
    from .store import load_batch, save_batch

__version__ = "0.1.0"

_LAZY = {
    "save_batch": "store",
    "load_batch": "store",
    "deterministic": "determinism",
    "fingerprint": "determinism",
    "Golden": "replay",
    "Mode": "replay",
    "GoldenToleranceWarning": "replay",
    "Comparison": "compare",
    "RolloutBatch": "codec",
}
_SUBMODULES = {"strategies", "invariants", "parallel", "reference"}

__all__ = [
    "Comparison",
    "Golden",
    "GoldenError",
    "GoldenFormatError",
    "GoldenMismatch",
    "GoldenMissingError",
    "GoldenToleranceWarning",
    "Mode",
    "RolloutBatch",
    "Tolerance",
    "UnsupportedValueError",
    "deterministic",
    "fingerprint",
    "load_batch",
    "save_batch",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(f".{_LAZY[name]}", __name__), name)
    if name in _SUBMODULES:
        return import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
