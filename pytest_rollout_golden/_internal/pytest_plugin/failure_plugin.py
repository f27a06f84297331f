"""How a golden test's failure reads: a mismatch as its table, a marker or option mistake as
its message, a golden error with the user's frames only.

Registered in every session.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pluggy
import pytest

from ...errors import GoldenError, GoldenMismatch

# The package's own frames, hidden from a golden error's traceback.
_PACKAGE_DIR = Path(__file__).parents[2]


class FailurePlugin:
    """Rewrites the report of a test that failed on its golden."""

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Iterator[pytest.TestReport]:
        """Report: a mismatch as its table; a golden error with the user's frames only."""
        report = yield
        excinfo = call.excinfo
        if not report.failed or excinfo is None:
            return report
        if excinfo.errisinstance(GoldenMismatch):
            report.longrepr = headlined(item, str(excinfo.value))  # the table; no traceback
        elif excinfo.errisinstance(pytest.UsageError) and str(
            excinfo.traceback[-1].path
        ).startswith(
            str(_PACKAGE_DIR)
        ):  # a marker or option mistake found by this plugin: the message names the fix
            report.longrepr = headlined(item, f"UsageError: {excinfo.value}")
        elif excinfo.errisinstance(GoldenError):  # show the user's frames, not ours or pytest's
            # Golden's methods re-raise with the user's frames only (replay.user_facing); an
            # error raised by this plugin's own hooks (a commit at the end of the call) has
            # hook-runner frames above it instead.
            pytest_dir = Path(pytest.__file__).parent
            hidden = (str(pytest_dir), str(pytest_dir.parent / "_pytest"))
            hidden += (str(Path(pluggy.__file__).parent), str(_PACKAGE_DIR))
            hidden += (contextlib.__file__,)  # `with` glue
            excinfo.traceback = excinfo.traceback.filter(
                lambda entry: not str(entry.path).startswith(hidden)
            )
            style = item.config.getoption("tbstyle", "auto")
            report.longrepr = excinfo.getrepr(
                style="long" if style == "auto" else style,
                tbfilter=False,
                showlocals=item.config.getoption("showlocals", False),
            )
        return report


def headlined(item: pytest.Item, text: str) -> Any:
    """``text`` as a failure's report, without a traceback. Its first line alone is the crash
    message: what pytest's short summary (``-r``), ``--tb=line`` and junitxml's ``message``
    show, and what xdist carries over, where a plain text report would be shown whole."""
    from _pytest._code.code import ReprExceptionInfo, ReprFileLocation, ReprTracebackNative

    path, lineno, _ = item.location
    return ReprExceptionInfo(
        reprtraceback=ReprTracebackNative([text + "\n"]),
        reprcrash=ReprFileLocation(path, (lineno or 0) + 1, text.split("\n", 1)[0]),
    )
