"""What a session covers: the test files collected, trimmed, skipped or ignored, and the
goldens their tests declare.

Registered in every session: the controller judges the unused goldens from it
(:mod:`.unused`), a worker's part merged in by the xdist plugin.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .golden_plugin import GoldenPlugin
from .prune import may_hold_tests


class CollectionPlugin:
    """Records, into the core's session state, which files and goldens this run covers."""

    def __init__(self, core: GoldenPlugin):
        self.core = core
        self.state = core.state

    @pytest.hookimpl(trylast=True)  # after conftests' own: the items as they will run
    def pytest_collection_modifyitems(
        self, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        """Collection: which files and goldens this run covers."""
        for arg in config.args:
            if "::" in arg:
                # abspath, not resolve(): item.path keeps symlinks, and the two must compare equal
                named = Path(config.invocation_params.dir) / arg.split("::")[0]
                self.state.partial_files.add(os.path.abspath(named))
        for item in items:
            self.state.collected_files.add(str(Path(item.path)))
            if "golden" in getattr(item, "fixturenames", ()):
                with contextlib.suppress(pytest.UsageError):  # a marker mistake: its test errors
                    self.state.expected_dirs.add(str(self.core.directory_of(item)))

    @pytest.hookimpl(wrapper=True, trylast=True)  # innermost: before --lf or others trim the result
    def pytest_make_collect_report(self, collector: pytest.Collector) -> Any:
        """Collection: every test a file or class produced, before any filter trims them."""
        report = yield
        if report.skipped:  # e.g. pytest.importorskip: its tests were never seen
            self.state.skipped_files.add(str(Path(collector.path)))
        if isinstance(collector, (pytest.File, pytest.Class)):  # a file without tests too
            ids = self.state.produced.setdefault(str(Path(collector.path)), set())
            ids.update(x.nodeid for x in report.result if isinstance(x, pytest.Item))
        return report

    @pytest.hookimpl(wrapper=True)  # the final answer of every implementation, pytest's too
    def pytest_ignore_collect(self, collection_path: Path) -> Any:
        """Collection: the paths under the rootdir, outside the golden root, it ignored that
        may hold tests."""
        ignored = yield
        path, root = Path(collection_path), self.core.root
        in_golden = path == root or root in path.parents
        if ignored and self.core.rootdir in path.parents and not in_golden and may_hold_tests(path):
            self.state.collect_ignored.add(str(path))
        return ignored

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """Collection done: the tests left to run."""
        self.state.selected.update(i.nodeid for i in session.items)

    def pytest_deselected(self, items: list[pytest.Item]) -> None:
        """Collection: files with deselected tests are not run whole."""
        for item in items:
            self.state.partial_files.add(str(Path(item.path)))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Iterator[pytest.TestReport]:
        """Report: a skipped test keeps its golden (whether it would use it is unknown)."""
        report = yield
        if report.skipped:
            with contextlib.suppress(pytest.UsageError):  # a bad marker: reported elsewhere
                self.state.expected_dirs.add(str(self.core.directory_of(item)))
        return report
