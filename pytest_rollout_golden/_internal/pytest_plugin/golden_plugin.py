"""The core plugin: the session's settings, each golden test's golden, and finishing it.

Each other concern is a plugin of its own (``*_plugin.py`` beside this one): collection,
the test's settings, how a failure reads, the summary, an xdist worker's side, and those
registered only in the sessions that need them (pruning, calibration, the JSON report,
pictures, the history, sensitivity, a torchrun rank's copies, the xdist controller).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from ...errors import (
    GoldenError,
    GoldenFormatError,
    GoldenMissingError,
    GoldenNotFetchedError,
)
from ...store.location import link_out_of_root
from ..results import Mode
from ..tolerance import mismatch_bounds, trends
from ..tolerance.stack import Layer
from . import markers
from .accumulation_marker import sweep_marked
from .invocation import check_space_form, mode_of, refresh_of
from .options import (
    OptionError,
    golden_root,
    lane_setting,
    missing_step_policy,
    parse_seed,
    plot_dir,
    report_path,
    session_tolerances,
)
from .session import SessionState, UpdateMarks
from .summary import link_outside_root

if TYPE_CHECKING:
    from ..golden.golden import Golden
    from ..golden.lanes import LaneSetting
    from .snapshot import RankSnapshot

PLUGIN = pytest.StashKey["GoldenPlugin"]()
GOLDEN = pytest.StashKey["Golden"]()
MARKER_LAYER = pytest.StashKey[Layer]()
DETERMINISM = pytest.StashKey[contextlib.ExitStack]()
SETTINGS = pytest.StashKey[contextlib.ExitStack]()  # deterministic and/or calibration settings
# A test run as the float64 oracle by --golden-calibrate (not by --golden-certify, which makes
# every run one): the reference re-records the oracle, the variants replay it.
ORACLE_RUN = pytest.StashKey[bool]()
WORKER_OUTPUT = "rollout_golden"

Finisher = Callable[[pytest.Item, "Golden", bool], None]
# Called as (item, directory, oracle) before a variant opens its reference's golden.
ReferenceWait = Callable[[pytest.Item, Path, bool], None]


@contextlib.contextmanager
def as_usage_error() -> Iterator[None]:
    """A mistake in a flag, ini value or marker option, as pytest's usage error."""
    try:
        yield
    except (OptionError, ValueError) as exc:
        raise pytest.UsageError(str(exc)) from None


class GoldenPlugin:
    """Session-wide settings and state; one instance per pytest process."""

    def __init__(self, config: pytest.Config):
        self.config = config
        opt = config.option
        self.mode = mode_of(opt)
        self.certify: bool = opt.golden_certify
        self.rootdir = Path(config.rootpath)
        self.refresh = refresh_of(opt, self.rootdir) if self.mode is Mode.UPDATE else None
        check_space_form(config)
        self.root = golden_root(
            self.rootdir,
            opt.golden_dir if opt.golden_dir is not None else config.getini("golden_dir"),
        )
        self.report_path = report_path(opt.golden_report)  # written by report_plugin
        # A torchrun rank above 0 replays copies (set by rank_plugin.RankSnapshotPlugin).
        self.snapshot: RankSnapshot | None = None
        with as_usage_error():
            self.session_tolerances = session_tolerances(
                opt.golden_tolerance,
                opt.golden_ignore,
                config.getini("golden_tolerances"),
                config.getini("golden_ignore"),
                config.getini("golden_metric_profile"),
                config.getini("golden_precision"),
            )
        with as_usage_error():  # checked at start-up; each test's marker adds its own layer
            mismatch_bounds.session_bounds(
                None, opt.golden_mismatch_bound, config.getini("golden_mismatch_bounds")
            )
            trends.session_trends(None, opt.golden_trend, config.getini("golden_trends"))
        with as_usage_error():
            self.lane = lane_setting(
                opt.golden_lane,
                config.getini("golden_lane"),
                config.getini("golden_lane_fallback"),
                config.getini("golden_lane_fallback_tolerances"),
                os.environ,
            )
        self.seed = parse_seed(config.getini("golden_seed"), "ini golden_seed")
        with as_usage_error():  # a bad ini policy stops the run here, not each test at its setup
            missing_step_policy(
                None, None, config.getini("golden_missing_step"), where=str(config.inipath)
            )
        workerinput = getattr(config, "workerinput", None)
        self.is_worker = workerinput is not None
        self.token = (workerinput or {}).get("rollout_golden_token") or os.urandom(12).hex()
        self.registry = UpdateMarks(self.token)
        # An xdist worker's variant waits for its reference (set by worker_plugin.WorkerPlugin).
        self.reference_wait: ReferenceWait | None = None
        self.state = SessionState()
        self.plot_dir = plot_dir(opt.golden_plot)  # drawn by plot_plugin
        # Called as (item, golden, error) once a golden finished, before its outcome is kept.
        self.finishers: list[Finisher] = []
        self.keep_probes = False  # goldens keep what --golden-sensitivity probes of tensors
        self.failed_ids: set[str] = set()  # tests with a failed report (subtests included)

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        self.failed_ids.discard(nodeid)  # a test run again (a calibration run) starts afresh

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.failed:  # subtests report their failures here while the test itself passes
            self.failed_ids.add(report.nodeid)

    def marker_options(self, item: pytest.Item) -> dict[str, Any]:
        found = ((m.args, m.kwargs) for m in item.iter_markers("golden"))
        with as_usage_error():
            return markers.marker_options(found, item.nodeid)

    def directory_of(self, item: pytest.Item) -> Path:
        options = self.marker_options(item)
        name = item.nodeid.split("::", 1)[1] if "::" in item.nodeid else item.name
        with as_usage_error():
            return markers.golden_directory(
                self.root, self.rootdir, Path(item.path), item.nodeid, name, options
            )

    def golden_for(self, item: pytest.Item) -> Golden:
        # imported on first use: loading the plugin needs none of the engine (start-up time)
        from ..golden.golden import Golden, SessionLinks

        options = self.marker_options(item)
        with as_usage_error():
            marker = markers.marker_level(options)
        item.stash[MARKER_LAYER] = marker[1]
        oracle = self.is_oracle(item)
        tolerances = markers.declared_tolerances(
            self.session_tolerances, marker, options, exact=self.config.option.golden_exact
        )
        replay_only = None
        directory = self.directory_of(item)
        if markers.replays_reference(options):
            replay_only = markers.reference_recipe(options, certify=oracle)
            self._await_reference(item, directory, oracle=oracle)
        self.state.opened_dirs.add(str(directory))  # used, however the fixture was reached
        link = link_out_of_root(self.root, directory)
        if link is not None:
            raise GoldenError(link_outside_root(directory, link, self.root))
        if self.snapshot is not None:
            directory = self.snapshot.copy_of(directory)
        inputs = self._input_options(item, options)
        links = SessionLinks(
            usage=self.state.tolerance_usage,
            registry=self.registry,
            replay_only=replay_only,
            missing_step_source=inputs.pop("missing_step_source"),
            keep_probes=self.keep_probes,
            refresh=self.refresh,
        )
        rerecord = item.stash.get(ORACLE_RUN, False) and replay_only is None
        return Golden(
            directory,
            mode=Mode.UPDATE if rerecord else self.mode,
            tolerances=tolerances,
            test_id=item.nodeid,
            rebuild=options.get("rebuild"),
            mismatch_bounds=self._mismatch_bounds(item, options),
            trends=self._trends(item, options),
            session=links,
            lane=self._lane(),
            precision=self.precision_of(options),
            certify=oracle,
            **inputs,
        )

    def is_oracle(self, item: pytest.Item) -> bool:
        """Whether ``item`` runs as the float64 oracle (:mod:`..golden.precision`)."""
        return self.certify or item.stash.get(ORACLE_RUN, False)

    def precision_of(self, options: dict[str, Any]) -> str:
        """The precision a test declares: the marker's ``precision=``, else ini
        ``golden_precision`` (checked at start-up), else float32."""
        declared = options.get("precision")
        return str(declared if declared is not None else self.config.getini("golden_precision"))

    def _await_reference(self, item: pytest.Item, directory: Path, *, oracle: bool) -> None:
        """Under xdist, a variant whose reference records in this run waits for it
        (:meth:`.worker_plugin.WorkerPlugin.await_reference`)."""
        if self.reference_wait is not None:
            self.reference_wait(item, directory, oracle)

    def _lane(self) -> LaneSetting:
        """The session's lane, ``auto`` decided on first use (it needs torch)."""
        from ..golden.lanes import resolve_auto

        self.lane = resolve_auto(self.lane)
        return self.lane

    def _mismatch_bounds(self, item: pytest.Item, options: dict[str, Any]) -> Any:
        """The bounds of ``golden.check_mismatch``: marker, then flag, then ini."""
        with as_usage_error():
            try:
                return mismatch_bounds.session_bounds(
                    options.get("mismatch_bounds"),
                    self.config.option.golden_mismatch_bound,
                    self.config.getini("golden_mismatch_bounds"),
                )
            except ValueError as exc:
                raise ValueError(f"{item.nodeid}: {exc}") from None

    def _trends(self, item: pytest.Item, options: dict[str, Any]) -> trends.TrendBounds:
        """The bounds over the test's series: marker, then flag, then ini, then defaults."""
        with as_usage_error():
            try:
                return trends.session_trends(
                    options.get("trends"),
                    self.config.option.golden_trend,
                    self.config.getini("golden_trends"),
                )
            except ValueError as exc:
                raise ValueError(f"{item.nodeid}: {exc}") from None

    def _input_options(self, item: pytest.Item, options: dict[str, Any]) -> dict[str, Any]:
        """``regenerate`` and the missing-step policy: marker, then flag, then ini."""
        opt = self.config.option
        with as_usage_error():
            policy, source = missing_step_policy(
                options.get("missing_step"),
                opt.golden_missing_step,
                self.config.getini("golden_missing_step"),
                where=item.nodeid,
            )
        return {
            "regenerate": bool(options.get("regenerate")) or opt.golden_regenerate,
            "missing_step": policy,
            "missing_step_source": source,
        }

    def finish(self, item: pytest.Item, *, error: bool, golden_error: bool = False) -> None:
        """Finish the test's golden; ``golden_error``: its golden was missing or unreadable."""
        golden = item.stash.get(GOLDEN, None)
        if golden is None:
            return
        del item.stash[GOLDEN]
        layer = item.stash.get(MARKER_LAYER, None)
        try:
            path, lineno, _ = item.location  # the test's own line, for tolerance warnings
            warn_at = (str(self.rootdir / path), (lineno or 0) + 1)
            golden.finish(error=error, tolerance_layers=[layer] if layer else [], warn_at=warn_at)
        finally:
            if golden_error:  # missing (strict) or unreadable golden: a failed golden too
                golden.outcome.fail()
            if expected_to_fail(item):
                golden.outcome.expected_failure()
            for finisher in self.finishers:
                finisher(item, golden, error)
            self.state.add_outcome(golden.outcome)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Iterator[None]:
        """Call: the marked accumulation sweep once the body passed; finish the test's
        golden (commit, or raise the mismatch)."""
        try:
            result = yield
            sweep_marked(item, item.stash.get(GOLDEN, None))
        except BaseException as exc:
            unusable = isinstance(
                exc, (GoldenMissingError, GoldenFormatError, GoldenNotFetchedError)
            )
            self.finish(item, error=True, golden_error=unusable)
            raise
        self.finish(item, error=item.nodeid in self.failed_ids)  # e.g. a failed subtest
        return result

    @pytest.hookimpl(wrapper=True, trylast=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> Iterator[None]:
        """Teardown (innermost): finish a golden the call did not; restore the settings after the
        last fixture."""
        try:
            return (yield)
        finally:
            self.finish(item, error=True)  # no-op once finished
            stack = item.stash.get(SETTINGS, None)
            if stack is not None:
                stack.close()

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """Session end, after the other plugins': the controller removes the update marks;
        worker pools stop."""
        if not self.is_worker:
            self.registry.remove()
        launcher = sys.modules.get("pytest_rollout_golden.parallel.launcher")
        if launcher is not None:  # worker pools of parallel.launch(): stop them with the session
            launcher.shutdown()


def expected_to_fail(item: pytest.Item) -> bool:
    """Whether an ``xfail`` marker applies (pytest itself reports the xfail/xpass verdict)."""
    if item.config.option.runxfail:
        return False
    for marker in item.iter_markers("xfail"):
        condition = marker.kwargs.get("condition", marker.args[0] if marker.args else True)
        if isinstance(condition, bool) and condition:
            return True
    return False
