"""A torchrun rank above 0: it replays private copies of the goldens, never records.

Registered only in such a rank; the copies themselves are :mod:`.snapshot`'s.
"""

from __future__ import annotations

import contextlib

import pytest

from ..results import Mode
from .golden_plugin import GoldenPlugin
from .snapshot import RankSnapshot


class RankSnapshotPlugin:
    """Copies the goldens of the selected tests early, and removes the copies at the end."""

    def __init__(self, core: GoldenPlugin, rank: int):
        self.core = core
        self.snapshot = RankSnapshot(core.root, rank)
        core.snapshot = self.snapshot  # the core's goldens open the copies
        core.mode = Mode.STRICT  # only rank 0 records

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """Collection done: copy the goldens of the tests left to run, as they are before
        rank 0 re-records any."""
        for item in session.items:
            if "golden" in getattr(item, "fixturenames", ()):
                with contextlib.suppress(pytest.UsageError):  # its test reports it
                    self.snapshot.copy_of(self.core.directory_of(item))

    def pytest_unconfigure(self) -> None:
        """The end: the copies are removed."""
        self.snapshot.remove()
