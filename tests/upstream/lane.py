"""Settings and markers of the upstream conformance lane.

``UPSTREAM_EXAMPLES`` sets the examples per test and dtype/mask combination (25 by default,
to keep CI short; the numbers in ``docs/numerics.md`` come from 300).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, Phase, settings

EXAMPLES = int(os.environ.get("UPSTREAM_EXAMPLES", "25"))

DTYPES = {"float64": torch.float64, "float32": torch.float32, "bf16": torch.bfloat16}
MASKS = ("bool", "int", "float")
COMBOS = pytest.mark.parametrize(
    "dtype, mask", [(d, m) for d in DTYPES for m in MASKS], ids=lambda v: str(v)
)
"""The combinations each conformance test runs: every float dtype with every mask type."""

_COMMON = {
    "derandomize": True,
    "deadline": None,
    "database": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.filter_too_much],
}
conforms = settings(max_examples=EXAMPLES, **_COMMON)
"""Correct upstream code must pass every generated batch."""

discrepancy_hunt = settings(
    max_examples=300, report_multiple_bugs=False, phases=[Phase.generate], **_COMMON
)
"""A known discrepancy: stop at the first batch that shows it."""


def mask_dtype(mask: str, dtype: torch.dtype) -> torch.dtype:
    return {"bool": torch.bool, "int": torch.int64, "float": dtype}[mask]


def drawn(strategy: Callable[..., Any], dtype: str, mask: str, **options: Any) -> Any:
    """``strategy`` (``rollout_batches``, ``critic_batches``...) in the float dtype named
    ``dtype`` (a key of :data:`DTYPES`), its masks of the type named ``mask``."""
    float_dtype = DTYPES[dtype]
    return strategy(dtype=float_dtype, mask_dtype=mask_dtype(mask, float_dtype), **options)


class KnownDiscrepancy(AssertionError):
    """The checker reported the documented upstream discrepancy (and not something else)."""


@contextmanager
def known_discrepancy(*invariants: str):
    """Turn a checker failure naming one of ``invariants`` into :class:`KnownDiscrepancy`,
    for ``xfail(strict=True, raises=KnownDiscrepancy)``: any other failure still fails."""
    try:
        yield
    except AssertionError as error:
        names = "|".join(re.escape(name) for name in invariants)
        if re.search(rf"\[({names})(\.[a-z_]+)?\]", str(error)):
            raise KnownDiscrepancy(str(error)) from error
        raise


def discrepancy(reason: str) -> pytest.MarkDecorator:
    return pytest.mark.xfail(strict=True, raises=KnownDiscrepancy, reason=reason)
