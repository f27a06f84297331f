"""A pytest plugin (stdlib only) that writes each test's and collector's outcome, one JSON line
per report, to the file named by ``ROLLOUT_GOLDEN_OUTCOMES``.

``compare --python-a/--python-b`` loads it with ``-p rollout_golden_outcomes`` from this
folder (put on ``PYTHONPATH``), so that it runs in any environment, whatever version of the
plugin that environment has installed. Lines are appended as pytest reports them: a run that
dies keeps what it reported. xdist workers write nothing: their reports reach the
controller, which writes them.
"""

from __future__ import annotations

import json
import os
from typing import Any

_MESSAGE = 300  # characters of a failure's message kept
_TARGET: list[str] = []  # the file, set by pytest_configure (none in an xdist worker)


def pytest_configure(config: Any) -> None:
    target = os.environ.get("ROLLOUT_GOLDEN_OUTCOMES", "")
    _TARGET[:] = [target] if target and not hasattr(config, "workerinput") else []


def pytest_runtest_logreport(report: Any) -> None:
    _write(report, report.when)


def pytest_collectreport(report: Any) -> None:
    if report.nodeid:  # not the session
        _write(report, "collect")


def _write(report: Any, when: str) -> None:
    if not _TARGET:
        return
    line = {
        "node": report.nodeid,
        "when": when,
        "outcome": report.outcome,
        "xfail": hasattr(report, "wasxfail"),
        "message": _message(report) if report.failed else "",
    }
    with open(_TARGET[0], "a", encoding="utf-8") as out:
        out.write(json.dumps(line) + "\n")


def _message(report: Any) -> str:
    """The failure's first line: the exception pytest names, else the report's text."""
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr or "")
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return first[:_MESSAGE]
