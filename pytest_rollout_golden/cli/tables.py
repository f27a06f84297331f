"""The tables and lines that ``rollout-golden verify`` and ``show`` print."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .._internal.golden.metric_codec import scalar
from .._internal.wording import number, plural
from ..store.location import MANIFEST


def verify_row(status: str, directory: Path, message: str) -> str:
    """One golden in ``rollout-golden verify``: ``ok``, ``FAIL`` or ``ERROR``, then what follows."""
    return f"{status:<4} {directory}{message}"


def verify_summary(checked: int, problems: int, unchecked: int) -> str:
    """The last line of ``rollout-golden verify``."""
    return (
        f"{plural(checked, 'golden')} checked, {problems} with problems, {unchecked} could not "
        "be checked"
    )


def metric_cell(node: Any) -> str:
    """A recorded metric (a ``metrics.json`` node) in ``show``'s steps x metrics table."""
    value = None if node is None else scalar(node)
    return number(node if value is None else value, 8)


def not_a_lane(entry: Path) -> str:
    """An entry of a golden's ``@lanes/`` that is no lane, in ``rollout-golden verify``."""
    return (
        f"not a lane of this golden (a lane is a directory named like `cpu` or `cuda-sm90` "
        f"holding a {MANIFEST}); nothing reads it, and verify deletes nothing: move "
        f"{entry.name} out of {entry.parent.name}/ if it is yours, else delete it"
    )


def verify_totals(goldens: int, lanes: int, problems: int, unchecked: int) -> str:
    """The last line of ``rollout-golden verify``, counting the lanes it checked too."""
    if not lanes:
        return verify_summary(goldens, problems, unchecked)
    return (
        f"{plural(goldens, 'golden')} and {plural(lanes, 'lane')} checked, {problems} with "
        f"problems, {unchecked} could not be checked"
    )
