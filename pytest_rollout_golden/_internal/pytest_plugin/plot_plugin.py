"""``--golden-plot DIR``: a picture of each failed golden's metric curves, the run's only.

Registered only when the flag is given. The controller (neither an xdist worker nor a
torchrun rank above 0) removes an earlier run's pictures at the start and writes the
manifest of this run's at the end; every process draws the failures of its own tests.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ..results import Status
from .golden_plugin import GoldenPlugin

# An earlier run's pictures, removed at this session's start (for the summary).
PLOTS_REMOVED = pytest.StashKey[list[Path]]()


class PlotPlugin:
    """Draws each failed golden; keeps ``DIR`` to this run's pictures."""

    def __init__(self, core: GoldenPlugin, directory: Path):
        self.core = core
        self.directory = directory
        core.finishers.append(self.plot)

    def _controller(self) -> bool:
        return not self.core.is_worker and self.core.snapshot is None

    @pytest.hookimpl(tryfirst=True)  # before xdist starts workers that write pictures
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """Start: ``--golden-plot DIR`` is to hold this run's pictures only."""
        if self._controller():
            from ..report.plot import remove_earlier_plots

            session.config.stash[PLOTS_REMOVED] = remove_earlier_plots(self.directory)

    def plot(self, item: pytest.Item, golden: Any, error: bool) -> None:
        """A failed golden's picture."""
        outcome = golden.outcome
        if outcome.status is Status.FAILED:
            from ..report.plot import plot_failure

            picture = plot_failure(outcome.to_json(), self.directory, item.nodeid)
            if picture is not None:
                self.core.state.plots.append(str(picture))

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """Session end: the manifest of this run's pictures (the workers' merged in)."""
        if self._controller():
            from ..report.plot import write_plots_manifest

            write_plots_manifest(self.directory, self.core.state.plots)
