"""``--golden-prune`` and ``--golden-prune-tests``: delete the unused goldens of a whole run.

Registered only when either flag is given, in the process that judges unused goldens
(neither an xdist worker nor a torchrun rank above 0). What may be deleted, and how, is
:mod:`.prune`'s.
"""

from __future__ import annotations

import pytest

from .golden_plugin import GoldenPlugin
from .unused import UNUSED, find_unused


class PrunePlugin:
    """Judges the session's unused goldens and deletes those the flags allow."""

    def __init__(self, core: GoldenPlugin):
        self.core = core
        opt = core.config.option
        self.gone, self.tests = bool(opt.golden_prune), bool(opt.golden_prune_tests)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """Session end: prune before the summary and report plugins, registered first, judge
        the unused goldens and report what was deleted (pluggy calls the later-registered hook
        first)."""
        session.config.stash[UNUSED] = find_unused(
            self.core, session, prune_gone=self.gone, prune_tests=self.tests
        )
