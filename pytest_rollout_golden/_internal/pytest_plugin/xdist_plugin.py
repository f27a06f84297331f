"""The xdist controller's side: a session token for the workers, their state merged back.

Registered only when pytest-xdist is loaded (its hooks exist only then), and not in a
worker, where these hooks never run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .calibrate_plugin import CalibrationProgress
from .golden_plugin import WORKER_OUTPUT, GoldenPlugin


class XdistPlugin:
    """Hands each worker the session's token and merges what each worker reports."""

    def __init__(self, core: GoldenPlugin, progress: CalibrationProgress | None = None):
        self.core = core
        self.progress = progress

    def pytest_xdist_node_collection_finished(self, node: Any, ids: Sequence[str]) -> None:
        if self.progress is not None:  # the controller collects nothing itself
            self.progress.tests = len(set(ids))

    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput["rollout_golden_token"] = self.core.token

    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        output = getattr(node, "workeroutput", {}).get(WORKER_OUTPUT)
        if output:
            self.core.state.merge_json(output)
