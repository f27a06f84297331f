"""Exceptions raised by pytest-rollout-golden.

Every message names the file, key or step involved and says what to do next.
"""

from __future__ import annotations

_COMMIT = "locally and commit the golden/ directory"
REMEDY_UPDATE = f"run `pytest --update-golden` {_COMMIT}"  # every remedy of a golden says this


def update_command(selection: str) -> str:
    """The remedy's command for the tests ``selection`` picks (``-k "name"``), then commit."""
    return f"`pytest --update-golden {selection}` {_COMMIT}"


class GoldenError(Exception):
    """Base class of every error this package raises on purpose."""


class GoldenFormatError(GoldenError):
    """A golden file is corrupted, truncated, foreign (e.g. a pickle) or of an unknown schema."""


class GoldenNotFetchedError(GoldenError):
    """A golden file is a Git LFS pointer: the clone has not fetched what it stands for.

    Not a :class:`GoldenFormatError`: the golden is not damaged, and re-recording over it
    would lose it."""


class GoldenMissingError(GoldenError):
    """A golden, step, batch or metric was asked for in a mode that never records."""


class UnsupportedValueError(GoldenError, TypeError):
    """A value handed to the recorder cannot be stored without pickle."""


class GoldenMismatch(AssertionError):
    """Replayed values drifted beyond their tolerances; the message lists every mismatch."""


class GoldenToleranceWarning(UserWarning):
    """A tolerance was given for a metric name that never appeared."""


class GoldenNaNWarning(UserWarning):
    """A NaN metric was recorded: replay fails on it unless its tolerance sets equal_nan."""
