"""The core plugin: each golden test's golden, its settings, its verdict, and the summary.

Pruning, calibration, a torchrun rank's copies and the xdist merge are plugins of their
own (``*_plugin.py`` beside this one), registered only in the sessions that need them.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pluggy
import pytest

from ...errors import (
    GoldenError,
    GoldenFormatError,
    GoldenMismatch,
    GoldenMissingError,
    GoldenNotFetchedError,
)
from ...store.location import MANIFEST, link_out_of_root
from ..golden.refresh import Refresh
from ..golden.results import Mode, Status, Verdict
from ..report.presentation import (
    CI_UPDATE,
    close_match,
    display,
    github_annotations,
    link_outside_root,
    rootdir_note,
    summary_lines,
)
from ..tolerance import mismatch_bounds, trends
from ..tolerance.stack import Layer
from . import markers
from .accumulation_marker import sweep_marked
from .options import (
    OptionError,
    golden_root,
    lane_setting,
    missing_step_policy,
    parse_seed,
    plot_dir,
    report_path,
    session_mode,
    session_tolerances,
    truthy_env,
)
from .prune import Unused, may_hold_tests, partial_project, unused_and_pruned
from .session import FinishedTests, SessionState, UpdateMarks, write_report

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
# How long an xdist worker's variant waits for its reference on another worker, at most: a
# bound, should the reference be queued behind it on its own worker (an ordering plugin).
REFERENCE_WAIT_S = 600.0


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


# The package's own frames, hidden from a golden error's traceback.
_PACKAGE_DIR = Path(__file__).parents[2]

Finisher = Callable[[pytest.Item, "Golden", bool], None]


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
        if opt.golden_regenerate or opt.update_golden_failing:
            opt.update_golden = True  # regenerating a rollout re-records what depends on it
        self.mode = session_mode(
            update=opt.update_golden,
            strict=opt.golden_strict,
            calibrate=opt.golden_calibrate,
            ci=truthy_env("CI"),
        )
        if opt.golden_certify and opt.golden_calibrate:
            raise pytest.UsageError(
                "--golden-calibrate certifies the same_math() variants in float64 itself "
                "(one more run per test); leave out --golden-certify"
            )
        self.certify: bool = opt.golden_certify
        self.rootdir = Path(config.rootpath)
        self.refresh = refresh_of(opt, self.rootdir) if self.mode is Mode.UPDATE else None
        _check_space_form(config)
        self.root = golden_root(
            self.rootdir,
            opt.golden_dir if opt.golden_dir is not None else config.getini("golden_dir"),
        )
        self.report_path = report_path(opt.golden_report)
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
        self.deterministic = (
            opt.golden_deterministic
            if opt.golden_deterministic is not None
            else config.getini("golden_deterministic")
        )
        workerinput = getattr(config, "workerinput", None)
        self.is_worker = workerinput is not None
        self.token = (workerinput or {}).get("rollout_golden_token") or os.urandom(12).hex()
        self.registry = UpdateMarks(self.token)
        self.finished = FinishedTests(self.token)
        self.reference_of: dict[str, str] = {}  # an xdist worker's variant -> its reference
        self.references: set[str] = set()  # ... and those references
        self.state = SessionState()
        self.plot_dir = plot_dir(opt.golden_plot)
        self.plots_removed: list[Path] = []  # an earlier run's pictures, removed at the start
        # Called as (item, golden, error) once a golden finished, before its outcome is kept.
        self.finishers: list[Finisher] = []
        self.keep_probes = False  # goldens keep what --golden-sensitivity probes of tensors
        self.unused: Unused | None = None  # judged at session end (by the prune plugin if on)
        self.report_error = ""
        self.failed_ids: set[str] = set()  # tests with a failed report (subtests included)
        self.locations: dict[str, tuple[str, int]] = {}  # ... their file and 0-based line

    # ------------------------------------------------------------------ per test

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.failed:  # subtests report their failures here while the test itself passes
            self.failed_ids.add(report.nodeid)
            self.locations.setdefault(report.nodeid, report.location[:2])  # type: ignore[arg-type]

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
        """Under xdist, a variant whose reference records or re-records in this run, on
        another worker, waits until the reference has finished (passed or not); ``oracle``:
        the variant's float64 run under ``--golden-calibrate``, whose reference re-records
        the oracle first."""
        reference = self.reference_of.get(item.nodeid)
        if reference is None:
            return
        calibrating_oracle = oracle and item.stash.get(ORACLE_RUN, False)
        if not calibrating_oracle and self.mode not in (Mode.AUTO, Mode.UPDATE):
            return
        if self.mode is Mode.AUTO and (directory / MANIFEST).exists() and not oracle:
            return  # recorded before: the reference only replays it
        deadline = time.monotonic() + REFERENCE_WAIT_S
        while not self.finished.contains(reference) and time.monotonic() < deadline:
            if queued_on_this_worker(self.config, reference):
                return  # it cannot run before this test ends: go on, as without xdist
            time.sleep(0.1)

    def _note_reference(self, item: pytest.Item, selected: set[str]) -> None:
        """An xdist worker's variant whose reference runs in this session, maybe elsewhere."""
        options = self.marker_options(item)
        if not markers.replays_reference(options) or "::" not in item.nodeid:
            return
        path, name = item.nodeid.split("::", 1)
        with as_usage_error():
            reference = f"{path}::{markers.reference_name(item.nodeid, name, options)}"
        if reference in selected:
            self.reference_of[item.nodeid] = reference
            self.references.add(reference)

    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        if nodeid in self.references:
            self.finished.add(nodeid)

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

    def wants_determinism(self, item: pytest.Item) -> bool:
        if "golden" not in getattr(item, "fixturenames", ()):
            return False
        return bool(self.marker_options(item).get("deterministic", self.deterministic))

    def seed_of(self, item: pytest.Item) -> int:
        options = self.marker_options(item)
        if "seed" not in options:
            return self.seed
        with as_usage_error():
            return parse_seed(options["seed"], f"{item.nodeid}: golden marker seed=", text=False)

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
            outcome = golden.outcome
            self.state.add_outcome(outcome)
            if self.plot_dir is not None and outcome.status is Status.FAILED:
                from ..report.plot import plot_failure

                picture = plot_failure(outcome.to_json(), self.plot_dir, item.nodeid)
                if picture is not None:
                    self.state.plots.append(str(picture))

    # ------------------------------------------------------------------ session end

    def unused_tolerances(self) -> list[str]:
        """``--golden-tolerance``/ini entries that named nothing checked in any process."""
        stack, used = self.session_tolerances, self.state.tolerance_usage
        return [
            label + close_match(key, used.names())
            for label, key in used.unused_entries([*stack.cli, *stack.ini])
        ]

    def partial_project(self) -> str:
        """Why this run may have left out test files of the project (``""``: it did not)."""
        config, opt = self.config, self.config.option
        invoked = Path(config.invocation_params.dir)
        testpaths = ""
        if config.args_source == pytest.Config.ArgsSource.TESTPATHS:
            ini = f" ({display(config.inipath, self.rootdir)})" if config.inipath else ""
            testpaths = f"testpaths = {' '.join(config.getini('testpaths'))}{ini}"
        return partial_project(
            [invoked / str(arg).split("::")[0] for arg in config.args],
            self.rootdir,
            testpaths=testpaths,
            ignored=[*(opt.ignore or ()), *(opt.ignore_glob or ())],
            skipped=sorted(self.state.skipped_files),
            collect_ignored=sorted(self.state.collect_ignored),
        )

    def find_unused(
        self, session: pytest.Session, *, prune_gone: bool = False, prune_tests: bool = False
    ) -> Unused:
        """The goldens no test of this session used; pruned as ``prune_*`` ask
        (:func:`.prune.unused_and_pruned`)."""
        return unused_and_pruned(
            self.state,
            self.root,
            self.rootdir,
            prune_gone=prune_gone,
            prune_tests=prune_tests,
            stopped=bool(session.shouldstop or session.shouldfail),
            failed=bool(session.testsfailed),
            partial=self.partial_project(),
        )

    def close(self, session: pytest.Session) -> None:
        """The controller's session end: unused goldens, the JSON report, the update marks."""
        opt = self.config.option
        if self.unused is None:
            self.unused = self.find_unused(session)
        if self.plot_dir is not None and self.snapshot is None:
            from ..report.plot import write_plots_manifest

            write_plots_manifest(self.plot_dir, self.state.plots)
        if self.report_path is not None and not opt.collectonly:
            unused, pruned = self.unused.goldens, self.unused.pruned.deleted
            try:
                write_report(
                    self.report_path, self.state, mode=self.mode.value, unused=unused, pruned=pruned
                )
            except GoldenError as exc:
                self.report_error = str(exc)
                if session.exitstatus == pytest.ExitCode.OK:
                    session.exitstatus = pytest.ExitCode.TESTS_FAILED
        self.registry.remove()

    # ------------------------------------------------------------------ hooks

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
        selected = {item.nodeid for item in items}
        for item in items:
            self.state.collected_files.add(str(Path(item.path)))
            if "golden" in getattr(item, "fixturenames", ()):
                with contextlib.suppress(pytest.UsageError):  # a marker mistake: its test errors
                    self.state.expected_dirs.add(str(self.directory_of(item)))
                    if self.is_worker:
                        self._note_reference(item, selected)

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
        path = Path(collection_path)
        in_golden = path == self.root or self.root in path.parents
        if ignored and self.rootdir in path.parents and not in_golden and may_hold_tests(path):
            self.state.collect_ignored.add(str(path))
        return ignored

    @pytest.hookimpl(tryfirst=True)  # before xdist starts workers that write pictures
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """Start: ``--golden-plot DIR`` is to hold this run's pictures only."""
        if self.plot_dir is not None and not self.is_worker and self.snapshot is None:
            from ..report.plot import remove_earlier_plots

            self.plots_removed = remove_earlier_plots(self.plot_dir)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """Collection done: the tests left to run."""
        self.state.selected.update(i.nodeid for i in session.items)

    def pytest_deselected(self, items: list[pytest.Item]) -> None:
        """Collection: files with deselected tests are not run whole."""
        for item in items:
            self.state.partial_files.add(str(Path(item.path)))

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Iterator[None]:
        """Setup (outermost): the deterministic settings, before the test's first fixture.

        They are entered into the test's ``SETTINGS`` stack, which the calibration plugin's
        perturbations join and teardown closes.
        """
        self.failed_ids.discard(item.nodeid)
        stack = item.stash[SETTINGS] = contextlib.ExitStack()
        mistake = None
        try:
            if item.get_closest_marker("golden") is not None:
                self.marker_options(item)  # every mistake of the marker, whatever the fixtures
            wanted = self.wants_determinism(item)
            seed = self.seed_of(item) if wanted else None
        except pytest.UsageError as exc:  # the test errors with it; raised after the yield:
            wanted, mistake = False, exc  # other plugins' teardown expects their setup to run
        if wanted:
            from ..golden.determinism import deterministic

            stack.enter_context(deterministic(seed))
            item.stash[DETERMINISM] = stack  # the deterministic fixture then has nothing to do
        if mistake is None and self.is_oracle(item) and "golden" in item.fixturenames:
            from ..golden.precision import ORACLE, default_dtype

            stack.enter_context(default_dtype(ORACLE))  # a model the fixtures build: float64
        result = yield
        if mistake is not None:
            raise mistake
        return result

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

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
        """Report: a mismatch as its table; a golden error with the user's frames only."""
        report = yield
        if report.skipped:  # whether it would use its golden is unknown: it keeps it
            with contextlib.suppress(pytest.UsageError):  # a bad marker: reported elsewhere
                self.state.expected_dirs.add(str(self.directory_of(item)))
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

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """Session end: workers hand their state over; the controller merges, writes;
        worker pools stop."""
        if self.is_worker:
            session.config.workeroutput[WORKER_OUTPUT] = self.state.to_json()  # type: ignore[attr-defined]
        else:
            self.close(session)
        launcher = sys.modules.get("pytest_rollout_golden.parallel.launcher")
        if launcher is not None:  # worker pools of parallel.launch(): stop them with the session
            launcher.shutdown()

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        """Summary: the ``rollout golden`` section."""
        if self.is_worker:
            return
        unused = self.unused or Unused()
        lines = summary_lines(
            self.state,
            unused=unused.goldens,
            pruned=unused.pruned.deleted,
            unused_tolerances=self.unused_tolerances(),
            plots_removed=self.plots_removed,
            report_path=None
            if self.report_error or terminalreporter.config.option.collectonly
            else terminalreporter.config.option.golden_report,
            relative_to=self.rootdir,
        )
        lines.extend(unused.notes())
        lines.extend(_recording_notes(self))
        if self.report_error:
            lines.append(self.report_error)
        if lines:
            terminalreporter.write_sep("=", "rollout golden")
            for line in lines:
                terminalreporter.write_line(line)
        if os.environ.get("GITHUB_ACTIONS") == "true":  # read by the runner from the log
            workspace = os.environ.get("GITHUB_WORKSPACE")
            found = github_annotations(self.state.outcomes, self.locations, self.rootdir, workspace)
            for line in found:
                terminalreporter.write_line(line)


_PATH_OPTIONS = ("--golden-report", "--golden-dir", "--golden-plot")


def _check_space_form(config: pytest.Config) -> None:
    """Refuse ``--golden-report PATH`` (a space, no ``=``) when pytest took PATH for a test path.

    pytest picks the rootdir and ini file before plugin options are known, so it reads an
    existing PATH after a plugin option as a test path; no plugin can undo that choice.
    """
    args = [str(a) for a in config.invocation_params.args]
    for i, arg in enumerate(args[:-1]):
        if arg in _PATH_OPTIONS and Path(config.invocation_params.dir, args[i + 1]).exists():
            rootdir, inipath = _intended_setup(config, args)
            if rootdir is not None and (rootdir, inipath) != (config.rootpath, config.inipath):
                raise pytest.UsageError(
                    f"`{arg} {args[i + 1]}`: pytest took {args[i + 1]} for a test path before "
                    f"this plugin could claim it, and chose rootdir {config.rootpath} "
                    f"(ini file {config.inipath}) instead of {rootdir} ({inipath}); "
                    f"write `{arg}={args[i + 1]}`"
                )


def _intended_setup(config: pytest.Config, args: list[str]) -> tuple[Any, Any]:
    """The (rootdir, ini file) pytest would pick knowing this plugin's options."""
    try:
        from _pytest.config.findpaths import determine_setup

        ns = config._parser.parse_known_args(args)
        rootdir, inipath, *_ = determine_setup(
            inifile=config.option.inifilename,
            override_ini=config.option.override_ini,
            args=ns.file_or_dir,
            rootdir_cmd_arg=config.option.rootdir or None,
            invocation_dir=config.invocation_params.dir,
        )
    except Exception:  # pytest's private API changed: no check rather than a wrong one
        return None, None
    return rootdir, inipath


def refresh_of(opt: Any, rootdir: Path) -> Refresh:
    """What a session that re-records goldens records of itself (:mod:`..golden.refresh`)."""
    import getpass
    import socket

    from ..commits.git import head

    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container)
        user = f"uid {os.getuid()}" if hasattr(os, "getuid") else ""
    return Refresh(
        reason=opt.golden_reason or None,
        by=user,
        host=socket.gethostname(),
        commit=head(rootdir),
        only_failing=opt.update_golden_failing,
        allow_placeholder=opt.golden_allow_placeholder,
    )


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


def expected_to_fail(item: pytest.Item) -> bool:
    """Whether an ``xfail`` marker applies (pytest itself reports the xfail/xpass verdict)."""
    if item.config.option.runxfail:
        return False
    for marker in item.iter_markers("xfail"):
        condition = marker.kwargs.get("condition", marker.args[0] if marker.args else True)
        if isinstance(condition, bool) and condition:
            return True
    return False


def _recording_notes(plugin: GoldenPlugin) -> list[str]:
    """Warnings about where and when this session recorded goldens, or found none."""
    outcomes = plugin.state.outcomes
    recorded = any(o.status in (Status.RECORDED, Status.UPDATED) for o in outcomes)
    missing = any(
        o.status is Status.FAILED and any(c.verdict == Verdict.MISSING for c in o.comparisons)
        for o in outcomes
    )
    notes = []
    if recorded and plugin.config.option.update_golden and truthy_env("CI"):
        notes.append(CI_UPDATE)
    if (recorded or missing) and plugin.config.inipath is None and plugin.snapshot is None:
        rel = os.path.relpath(plugin.root, plugin.rootdir)
        other = next((p / rel for p in plugin.rootdir.parents if (p / rel).is_dir()), None)
        if other is not None:
            notes.append(rootdir_note(plugin.root, other, plugin.rootdir, recorded=recorded))
    return notes
