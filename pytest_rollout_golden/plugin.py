"""pytest glue: options, the ``golden`` and ``deterministic`` fixtures, and the plugins.

The core plugin (:mod:`._internal.pytest_plugin.golden_plugin`) runs in every session, with
the test's settings, collection and how a failure reads; the summary, the JSON report,
pictures, pruning, calibration, sensitivity, the run history, a torchrun rank's copies and
either side of xdist are registered only where they apply. Loading this module imports neither
torch nor numpy; they are imported when a golden is first read, written or compared.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from ._internal.hypothesis_profiles import NAMES, register_profiles
from ._internal.pytest_plugin import accumulation_marker, flags, markers
from ._internal.pytest_plugin.calibrate_plugin import CalibrationPlugin
from ._internal.pytest_plugin.collection_plugin import CollectionPlugin
from ._internal.pytest_plugin.failure_plugin import FailurePlugin
from ._internal.pytest_plugin.golden_plugin import (
    DETERMINISM,
    GOLDEN,
    PLUGIN,
    GoldenPlugin,
    as_usage_error,
)
from ._internal.pytest_plugin.history_plugin import HistoryPlugin, history_folder
from ._internal.pytest_plugin.plot_plugin import PlotPlugin
from ._internal.pytest_plugin.prune_plugin import PrunePlugin
from ._internal.pytest_plugin.rank_plugin import RankSnapshotPlugin
from ._internal.pytest_plugin.report_plugin import ReportPlugin
from ._internal.pytest_plugin.sensitivity_plugin import SensitivityPlugin
from ._internal.pytest_plugin.settings_plugin import SETTINGS_PLUGIN, SettingsPlugin
from ._internal.pytest_plugin.summary_plugin import SummaryPlugin
from ._internal.pytest_plugin.worker_plugin import WorkerPlugin
from ._internal.pytest_plugin.xdist_plugin import XdistPlugin
from .parallel.environment import torchrun_rank

if TYPE_CHECKING:
    from ._internal.golden.golden import Golden


def pytest_addoption(parser: pytest.Parser) -> None:
    flags.add_options(parser)


@pytest.hookimpl(tryfirst=True)  # before hypothesis' own plugin loads a profile
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", markers.MARKER_DOC)
    config.addinivalue_line("markers", accumulation_marker.MARKER_DOC)
    with as_usage_error():
        core = GoldenPlugin(config)
    config.stash[PLUGIN] = core
    register = config.pluginmanager.register
    register(core, "rollout-golden-session")
    register_core_plugins(core)
    # pluggy calls plain hooks of later-registered plugins first: these run before the
    # summary's, e.g. pruning before the summary judges the unused goldens at session end.
    rank = torchrun_rank()
    if rank:
        register(RankSnapshotPlugin(core, rank), "rollout-golden-rank-snapshot")
    opt = config.option
    calibration = CalibrationPlugin(core) if opt.golden_calibrate else None
    if calibration is not None:
        register(calibration, "rollout-golden-calibrate")
        register(calibration.progress, "rollout-golden-calibration-progress")
    sensitivity = opt.golden_sensitivity or opt.golden_sensitivity_require
    if sensitivity or config.getini("golden_sensitivity_require").strip():
        register(SensitivityPlugin(core), "rollout-golden-sensitivity")
    if (opt.golden_prune or opt.golden_prune_tests) and not core.is_worker and not rank:
        register(PrunePlugin(core), "rollout-golden-prune")  # rank 0 prunes golden/
    history = history_folder(config)
    if history is not None and not core.is_worker and not rank and calibration is None:
        with as_usage_error():
            register(HistoryPlugin(core, history), "rollout-golden-history")
    if config.pluginmanager.hasplugin("xdist") and not core.is_worker:
        progress = calibration.progress if calibration is not None else None
        register(XdistPlugin(core, progress), "rollout-golden-xdist")
    if "hypothesis" in sys.modules or config.getoption("hypothesis_profile", None) in NAMES:
        register_profiles()


def register_core_plugins(core: GoldenPlugin) -> None:
    """The plugins beside the core, registered before every optional one (pluggy calls the
    plain hooks of later-registered plugins first: at session end the summary judges the
    unused goldens, then the pictures' manifest and the report are written, then the core
    removes the update marks)."""
    config, register = core.config, core.config.pluginmanager.register
    settings = config.stash[SETTINGS_PLUGIN] = SettingsPlugin(core)
    register(settings, "rollout-golden-settings")
    register(CollectionPlugin(core), "rollout-golden-collection")
    register(FailurePlugin(), "rollout-golden-failure")
    if core.is_worker:
        register(WorkerPlugin(core), "rollout-golden-worker")
    if core.report_path is not None and not core.is_worker:
        register(ReportPlugin(core, core.report_path), "rollout-golden-report")
    if core.plot_dir is not None:
        register(PlotPlugin(core, core.plot_dir), "rollout-golden-plot")
    if not core.is_worker:
        register(SummaryPlugin(core), "rollout-golden-summary")


@pytest.fixture
def golden(request: pytest.FixtureRequest) -> Golden:
    """The golden of this test: ``rollout()``, ``check()``, ``check_tensors()``."""
    __tracebackhide__ = True
    golden = request.config.stash[PLUGIN].golden_for(request.node)
    request.node.stash[GOLDEN] = golden
    return golden


@pytest.fixture(name="deterministic")
def deterministic_fixture(request: pytest.FixtureRequest) -> Iterator[int]:
    """Deterministic settings for this test; yields the seed (see ``deterministic()``)."""
    seed = request.config.stash[SETTINGS_PLUGIN].seed_of(request.node)
    if DETERMINISM in request.node.stash:
        yield seed
        return
    from ._internal.golden.determinism import deterministic

    with deterministic(seed):
        yield seed
