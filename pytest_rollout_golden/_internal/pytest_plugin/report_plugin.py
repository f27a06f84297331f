"""``--golden-report PATH``: the session's goldens as one JSON file, written at session end.

Registered only when the flag is given, in the process that sees every outcome (not an xdist
worker). A file that cannot be written fails the session; the summary says why.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ...errors import GoldenError
from .golden_plugin import GoldenPlugin
from .session import write_report
from .unused import judged

# Why the report could not be written (for the summary); absent: written, or not asked for.
REPORT_ERROR = pytest.StashKey[str]()


class ReportPlugin:
    """Writes the ``--golden-report`` file once the session's goldens are judged."""

    def __init__(self, core: GoldenPlugin, path: Path):
        self.core = core
        self.path = path

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """Session end: the report, with the unused goldens (pruned first, if asked)."""
        core = self.core
        if core.config.option.collectonly:
            return
        unused = judged(core, session)
        try:
            write_report(
                self.path,
                core.state,
                mode=core.mode.value,
                unused=unused.goldens,
                pruned=unused.pruned.deleted,
            )
        except GoldenError as exc:
            session.config.stash[REPORT_ERROR] = str(exc)
            if session.exitstatus == pytest.ExitCode.OK:
                session.exitstatus = pytest.ExitCode.TESTS_FAILED
