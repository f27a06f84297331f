"""``--golden-history DIR``: at session end, append the session's run to the history.

Registered only when the history is on, and only in the process that sees every outcome: the
xdist controller (its workers' outcomes are merged into the core's state before the session
ends), never a worker or a torchrun rank above 0, so one process writes one run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ...errors import GoldenError
from ..wording import display, plural
from .golden_plugin import GoldenPlugin
from .options import history_limits


class HistoryPlugin:
    """Appends one run per session to the history folder."""

    def __init__(self, core: GoldenPlugin, folder: Path):
        from ..history.store import Limits

        self.core = core
        self.folder = folder
        ini = core.config.getini
        self.limits = Limits(
            *history_limits(ini("golden_history_max_runs"), ini("golden_history_max_bytes"))
        )
        self.lines: list[str] = []

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.core.config.option.collectonly:
            return
        outcomes = self.core.state.outcomes
        if not outcomes:
            self.lines.append(f"history: no golden compared; nothing appended to {self.folder}")
            return
        try:
            appended = self._append(outcomes)
        except (GoldenError, OSError) as exc:
            self.lines.append(f"history: run NOT appended to {self.folder}: {exc}")
            if session.exitstatus == pytest.ExitCode.OK:
                session.exitstatus = pytest.ExitCode.TESTS_FAILED
            return
        self.lines.append(
            f"history: run {appended.run} appended to {display(self.folder, self.core.rootdir)} "
            f"({plural(len(outcomes), 'golden')})"
        )
        if appended.dropped:
            first, last = appended.dropped[0], appended.dropped[-1]
            span = f"{first}" if first == last else f"{first}-{last}"
            self.lines.append(
                f"history: dropped the {len(appended.dropped)} oldest runs ({span}) "
                f"to stay within {appended.why}"
            )

    def _append(self, outcomes: Any) -> Any:
        from ..commits.git import head
        from ..history.record import build_run, environment_fingerprint, versions
        from ..history.store import append

        core = self.core
        context = {
            "commit": head(core.rootdir),
            "lane": core.lane.name,
            "mode": core.mode.value,
            "fingerprint": environment_fingerprint(),
            "versions": versions(),
        }
        document, arrays = build_run(outcomes, context, core.rootdir)
        return append(self.folder, document, arrays, self.limits)

    @pytest.hookimpl(trylast=True)  # after the core's ``rollout golden`` section
    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        for line in self.lines:
            terminalreporter.write_line(line)


def history_folder(config: pytest.Config) -> Path | None:
    """``--golden-history DIR``, else ini ``golden_history``, relative to rootdir (``None``:
    off)."""
    value = config.option.golden_history or config.getini("golden_history")
    if not str(value).strip():
        return None
    return Path(config.rootpath) / str(value).strip()
