"""The ``rollout golden`` section of the terminal summary, and GitHub annotations.

Registered in the process that sees every outcome (not an xdist worker). At session end it
judges the unused goldens (:mod:`.unused`), which the section lists with what this session
recorded, compared and left unused, and warnings about where and when it recorded.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from ..results import Status, Verdict
from .annotations import github_annotations
from .golden_plugin import GoldenPlugin
from .options import truthy_env
from .plot_plugin import PLOTS_REMOVED
from .prune import Unused
from .report_plugin import REPORT_ERROR
from .summary import CI_UPDATE, rootdir_note, summary_lines
from .unused import UNUSED, judged, unused_tolerances


class SummaryPlugin:
    """Prints the session's goldens at its end."""

    def __init__(self, core: GoldenPlugin):
        self.core = core
        self.locations: dict[str, tuple[str, int]] = {}  # failed tests' file and 0-based line

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.failed:  # subtests report their failures here while the test itself passes
            self.locations.setdefault(report.nodeid, report.location[:2])  # type: ignore[arg-type]

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """Session end: the unused goldens, judged (after pruning, if on)."""
        judged(self.core, session)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        """Summary: the ``rollout golden`` section."""
        core, config = self.core, terminalreporter.config
        unused = config.stash.get(UNUSED, None) or Unused()
        report_error = config.stash.get(REPORT_ERROR, "")
        lines = summary_lines(
            core.state,
            unused=unused.goldens,
            pruned=unused.pruned.deleted,
            unused_tolerances=unused_tolerances(core),
            plots_removed=config.stash.get(PLOTS_REMOVED, []),
            report_path=None
            if report_error or config.option.collectonly
            else config.option.golden_report,
            relative_to=core.rootdir,
        )
        lines.extend(unused.notes())
        lines.extend(recording_notes(core))
        if report_error:
            lines.append(report_error)
        if lines:
            terminalreporter.write_sep("=", "rollout golden")
            for line in lines:
                terminalreporter.write_line(line)
        if os.environ.get("GITHUB_ACTIONS") == "true":  # read by the runner from the log
            workspace = os.environ.get("GITHUB_WORKSPACE")
            found = github_annotations(core.state.outcomes, self.locations, core.rootdir, workspace)
            for line in found:
                terminalreporter.write_line(line)


def recording_notes(core: GoldenPlugin) -> list[str]:
    """Warnings about where and when this session recorded goldens, or found none."""
    outcomes = core.state.outcomes
    recorded = any(o.status in (Status.RECORDED, Status.UPDATED) for o in outcomes)
    missing = any(
        o.status is Status.FAILED and any(c.verdict == Verdict.MISSING for c in o.comparisons)
        for o in outcomes
    )
    notes = []
    if recorded and core.config.option.update_golden and truthy_env("CI"):
        notes.append(CI_UPDATE)
    if (recorded or missing) and core.config.inipath is None and core.snapshot is None:
        rel = os.path.relpath(core.root, core.rootdir)
        other = next((p / rel for p in core.rootdir.parents if (p / rel).is_dir()), None)
        if other is not None:
            notes.append(rootdir_note(core.root, other, core.rootdir, recorded=recorded))
    return notes
