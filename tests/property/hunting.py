"""Hypothesis settings shared by the property tests, and the assertion that a checker fired."""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, Phase, settings

_COMMON = {
    "derandomize": True,
    "deadline": None,
    "database": None,
    "suppress_health_check": [HealthCheck.too_slow],
}


def passes(max_examples: int) -> settings:
    """A correct implementation must pass every generated batch: fixed seed, no shrinking needed."""
    return settings(max_examples=max_examples, **_COMMON)


# Bug hunts: stop at the first failure (no shrinking) to keep the suite fast.
hunt = settings(
    max_examples=200,
    report_multiple_bugs=False,
    phases=[Phase.explicit, Phase.generate],
    **_COMMON,
)


def finds(invariant: str):
    """``pytest.raises`` for a checker failure naming ``invariant`` (or one of its parts)."""
    return pytest.raises(AssertionError, match=rf"\[{re.escape(invariant)}(\.[a-z_]+)?\]")
