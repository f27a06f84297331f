"""An xdist worker's side: a variant waits for its reference on another worker, and the
worker's session state goes back to the controller at the end.

Registered only in an xdist worker; the controller's side is :mod:`.xdist_plugin`.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import pytest

from ...store.location import MANIFEST
from ..results import Mode
from . import markers
from .golden_plugin import ORACLE_RUN, WORKER_OUTPUT, GoldenPlugin, as_usage_error
from .session import FinishedTests

# How long an xdist worker's variant waits for its reference on another worker, at most: a
# bound, should the reference be queued behind it on its own worker (an ordering plugin).
REFERENCE_WAIT_S = 600.0


class WorkerPlugin:
    """Which variants' references run in this session, their waits, the state handed over."""

    def __init__(self, core: GoldenPlugin):
        self.core = core
        self.finished = FinishedTests(core.token)
        self.reference_of: dict[str, str] = {}  # a variant -> its reference
        self.references: set[str] = set()  # ... and those references
        core.reference_wait = self.await_reference

    @pytest.hookimpl(trylast=True)  # after conftests' own: the items as they will run
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        """Collection: the variants whose reference runs in this session, maybe elsewhere."""
        selected = {item.nodeid for item in items}
        for item in items:
            if "golden" in getattr(item, "fixturenames", ()):
                with contextlib.suppress(pytest.UsageError):  # a marker mistake: its test errors
                    self._note_reference(item, selected)

    def _note_reference(self, item: pytest.Item, selected: set[str]) -> None:
        """A variant whose reference runs in this session, maybe on another worker."""
        options = self.core.marker_options(item)
        if not markers.replays_reference(options) or "::" not in item.nodeid:
            return
        path, name = item.nodeid.split("::", 1)
        with as_usage_error():
            reference = f"{path}::{markers.reference_name(item.nodeid, name, options)}"
        if reference in selected:
            self.reference_of[item.nodeid] = reference
            self.references.add(reference)

    def await_reference(self, item: pytest.Item, directory: Path, oracle: bool) -> None:
        """A variant whose reference records or re-records in this run, on another worker,
        waits until the reference has finished (passed or not); ``oracle``: the variant's
        float64 run under ``--golden-calibrate``, whose reference re-records the oracle
        first."""
        reference = self.reference_of.get(item.nodeid)
        if reference is None:
            return
        mode = self.core.mode
        calibrating_oracle = oracle and item.stash.get(ORACLE_RUN, False)
        if not calibrating_oracle and mode not in (Mode.AUTO, Mode.UPDATE):
            return
        if mode is Mode.AUTO and (directory / MANIFEST).exists() and not oracle:
            return  # recorded before: the reference only replays it
        deadline = time.monotonic() + REFERENCE_WAIT_S
        while not self.finished.contains(reference) and time.monotonic() < deadline:
            if queued_on_this_worker(self.core.config, reference):
                return  # it cannot run before this test ends: go on, as without xdist
            time.sleep(0.1)

    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        if nodeid in self.references:
            self.finished.add(nodeid)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """Session end: the worker's state goes to the controller, which merges it."""
        session.config.workeroutput[WORKER_OUTPUT] = self.core.state.to_json()  # type: ignore[attr-defined]


def queued_on_this_worker(config: pytest.Config, nodeid: str) -> bool:
    """Whether ``nodeid`` waits in this xdist worker's own queue, behind the running test.

    Reads the queue of xdist's worker loop (``torun``, ``nextitem_index``: not a public API);
    where it is not found, ``False``, and the variant waits for its reference as before."""
    for plugin in config.pluginmanager.get_plugins():
        queue, session = getattr(plugin, "torun", None), getattr(plugin, "session", None)
        if queue is None or session is None or not hasattr(queue, "lock"):
            continue
        with queue.lock() as queued:
            indices = [i for i in queued if isinstance(i, int)]
        following = getattr(plugin, "nextitem_index", None)
        if isinstance(following, int):
            indices.append(following)
        return any(session.items[i].nodeid == nodeid for i in indices)
    return False
