"""``--golden-calibrate N``: each golden test runs N times under perturbed reduction
orders; the spread of its metrics becomes the tolerances written into its golden.

Before its N runs, each golden test with declared variants (``same_math()``,
``parallel.variants()``) runs once as the float64 oracle (:mod:`..golden.precision`): the
reference re-records its float64 values, each variant replays them, and what that run found
(certified, not the same math, or not certifiable) decides which variants the variant lane
trusts. A test without variants has nothing to certify and no oracle run.

A run that fails against the golden is shown in full once per test; its later runs' failures
say so in a line. The session exits 0 where every failure was a run's mismatch on values the
files calibration wrote now hold (:func:`..tolerance.calibration.measured_failures`): what it
measured, not a defect; any other failure keeps exit status 1.

Registered only when the flag is given; the core plugin keeps the golden of each run.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from ...errors import GoldenMismatch
from . import markers
from .failure_plugin import headlined
from .golden_plugin import ORACLE_RUN, SETTINGS, GoldenPlugin, expected_to_fail

if TYPE_CHECKING:
    from ..golden.golden import Golden

CALIBRATION_RUN = pytest.StashKey[int]()  # which of the N runs of its test an item is
# The user property that marks a failed report as a calibration run's golden mismatch; a
# property, as xdist carries it from the worker that ran the test to the controller.
RUN_MISMATCH = "golden_calibration_mismatch"


class CalibrationPlugin:
    """The copies of each golden test, their perturbations, their samples, the tolerances."""

    def __init__(self, core: GoldenPlugin):
        opt = core.config.option
        self.core = core
        self.runs: int = opt.golden_calibrate
        self.perturb = tuple(opt.golden_calibrate_perturb or ("threads",))
        self.progress = CalibrationProgress()
        self.shown: set[str] = set()  # tests whose mismatch this process showed in full
        self.mismatched: Counter[str] = Counter()  # test id -> runs failed by a mismatch
        self.other_failures = 0  # failed reports of any other kind
        core.finishers.append(self.sample)

    @pytest.hookimpl(trylast=True)  # after conftests' own: the items as they will run
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        """Collection: each golden test becomes its float64 oracle run, then its N runs."""
        items[:] = [
            copy
            for item in items
            for copy in (
                calibration_copies(item, self.runs, oracle=self._has_variants(item))
                if "golden" in getattr(item, "fixturenames", ())
                else [item]
            )
        ]

    def _has_variants(self, item: pytest.Item) -> bool:
        """Whether ``item`` is a declared variant or their reference (a marker mistake: no;
        the test errors with it at setup)."""
        try:
            return self.core.marker_options(item).get("variant") is not None
        except pytest.UsageError:
            return False

    @pytest.hookimpl(wrapper=True)  # outside the core's, which puts a mismatch's table
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Iterator[pytest.TestReport]:
        """Report: an oracle run's failure (:meth:`_oracle_report`); a calibration run's
        mismatch is marked as one, and shown in full at its test's first only."""
        report = yield
        excinfo = call.excinfo
        if not report.failed or excinfo is None:
            return report
        if item.stash.get(ORACLE_RUN, False):
            return self._oracle_report(item, report, excinfo)
        if CALIBRATION_RUN in item.stash and excinfo.errisinstance(GoldenMismatch):
            report.user_properties.append((RUN_MISMATCH, True))
            if item.nodeid in self.shown:
                headline = str(excinfo.value).split("\n", 1)[0]
                run = item.stash[CALIBRATION_RUN] + 1
                report.longrepr = headlined(
                    item,
                    f"{headline} (calibration run {run} of {self.runs}: its table is under "
                    "this test's first failing run)",
                )
            self.shown.add(item.nodeid)
        return report

    def _oracle_report(
        self, item: pytest.Item, report: pytest.TestReport, excinfo: Any
    ) -> pytest.TestReport:
        """An oracle run whose code cannot run in float64 is skipped, saying why (its
        variants are then judged by the outlier rule); a mismatch there fails."""
        from ...errors import GoldenError, GoldenMissingError
        from ..tolerance.calibration import uncertified

        if excinfo.errisinstance((GoldenError, GoldenMismatch)) and not excinfo.errisinstance(
            GoldenMissingError
        ):
            return report  # a variant that is not the same math, a damaged golden: it fails
        lines = str(excinfo.value).splitlines()
        why = f"its float64 run could not run: {excinfo.typename}: {lines[0] if lines else ''}"
        if markers.replays_reference(self.core.marker_options(item)):
            self.core.state.certificates[item.nodeid] = uncertified(why)
        path, line, _ = item.location
        report.outcome = "skipped"
        report.longrepr = (str(path), (line or 0) + 1, f"float64 oracle: {why}")
        return report

    @pytest.hookimpl(wrapper=True)  # inside the core's setup, which opens the settings stack
    def pytest_runtest_setup(self, item: pytest.Item) -> Iterator[None]:
        """Setup: this run's perturbations, after the deterministic settings they change and
        before the test's first fixture; teardown restores them first."""
        if CALIBRATION_RUN in item.stash:
            from ..tolerance.calibration import perturbed

            how = item.stash[SETTINGS].enter_context(
                perturbed(item.stash[CALIBRATION_RUN], self.perturb)
            )
            item.user_properties.append(("golden_calibration_run", how))
        return (yield)

    def sample(self, item: pytest.Item, golden: Golden, error: bool) -> None:
        """A run's golden finished: keep its metrics and the values that failed against the
        golden, unless the test is expected to fail or raised itself; its outcome does not
        list the perturbations as environment changes."""
        if item.stash.get(ORACLE_RUN, False):
            self.certify(item, golden, error)
            return
        if CALIBRATION_RUN not in item.stash:
            return
        from ..results import Verdict
        from ..tolerance.calibration import unperturbed

        options = self.core.marker_options(item)
        layout = options.get("variant")
        skipped = "the test raised" if error else ""
        if expected_to_fail(item):
            skipped = "expected to fail (xfail)"
        if golden.outcome.lane.get("fallback"):
            skipped = (
                "compared against another lane (golden_lane_fallback): record this lane "
                "first, then calibrate it"
            )
        outcome = golden.outcome
        sample = golden.calibration_sample()
        sample["lane"] = outcome.lane.get("name")
        sample["failed"] = sorted(
            {c.name for c in outcome.comparisons if c.verdict == Verdict.FAIL}
        )
        sample["unmeasured"] = sorted(  # failures no spread measures: missing, a mask, a bound
            {
                c.name
                for c in outcome.comparisons
                if c.failed and (c.verdict != Verdict.FAIL or c.kind not in ("metric", "tensor"))
            }
        )
        self.core.state.add_calibration_run(
            str(golden.values_directory),  # the run's lane keeps its own tolerances.json
            item.nodeid,
            sample,
            layout=None if layout is None else str(layout),
            replaying=markers.replays_reference(options),
            skipped=skipped,
        )
        outcome.environment_changes = unperturbed(outcome.environment_changes)

    def certify(self, item: pytest.Item, golden: Golden, error: bool) -> None:
        """A float64 oracle run finished: a variant's certificate (the reference's run only
        records the oracle)."""
        from ..tolerance.calibration import certificate

        if not markers.replays_reference(self.core.marker_options(item)):
            return
        failed = "the test raised in float64 (its error is above)" if error else ""
        if error and expected_to_fail(item):
            failed = "expected to fail (xfail)"
        found = certificate(golden.outcome.comparisons, error=failed)
        self.core.state.certificates[item.nodeid] = found

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Each failed report, as the session counts it: a calibration run's mismatch, or
        any other failure."""
        if not report.failed or hasattr(report, "wasxfail"):
            return
        if any(name == RUN_MISMATCH for name, _ in report.user_properties):
            self.mismatched[report.nodeid] += 1
        else:
            self.other_failures += 1

    # Before the core's session end, which reports what this wrote.
    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """Session end (controller): write the calibrated tolerances, then weigh the
        failures against them."""
        if not self.core.is_worker:
            self.write()
            self.exit_status(session)

    def exit_status(self, session: pytest.Session) -> None:
        """Exit status 0 where every failure was a calibration run's mismatch of a test whose
        failed values the written files now hold (the summary names them); else unchanged."""
        measured = {t for entry in self.core.state.calibrated for t in entry.get("measured", ())}
        if (
            session.exitstatus != pytest.ExitCode.TESTS_FAILED
            or session.shouldstop
            or session.shouldfail
            or self.other_failures
            or not self.mismatched
            or not set(self.mismatched) <= measured
        ):
            return
        self.core.state.calibration_passed = dict(sorted(self.mismatched.items()))
        session.exitstatus = pytest.ExitCode.OK

    def write(self) -> None:
        """Derive and write ``tolerances.json`` for every golden calibrated this session."""
        from ..tolerance.calibration import calibrate_goldens

        state, tolerances = self.core.state, self.core.session_tolerances
        state.calibrated = calibrate_goldens(
            state.calibration,
            state.calibration_skipped,
            tolerances.resolver(),
            runs=self.runs,
            perturbations=self.perturb,
            layouts=state.calibration_layouts,
            replaying=sorted(state.calibration_replaying),
            variant_resolver=tolerances.replace(variant=True).resolver(),
            certificates=state.certificates,
        )
        for entry in state.calibrated:  # the lane of the golden directory's runs, if named
            runs = state.calibration.get(entry["directory"], {}).values()
            entry["lane"] = next((r.get("lane") for test in runs for r in test), None)


class CalibrationProgress:
    """``--golden-calibrate N``: the progress counts tests, each run N times, up to 100%.

    pytest's terminal counts the distinct test ids it has reported against the items
    collected; the N runs of a test share its id (its golden and report entries are keyed
    on it), so the count of items becomes that of distinct ids."""

    def __init__(self) -> None:
        self.session: pytest.Session | None = None
        self.tests = 0  # distinct test ids; 0: not known (yet)

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        self.session = session

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.tests = len({item.nodeid for item in session.items})

    @pytest.hookimpl(tryfirst=True)  # before the terminal reports the progress
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if self.tests and self.session is not None:
            self.session.testscollected = self.tests


def calibration_copies(item: pytest.Item, runs: int, *, oracle: bool) -> list[pytest.Item]:
    """``item`` and ``runs - 1`` copies of it (same node id, fresh fixtures), numbered; with
    ``oracle``, its float64 oracle run first. An item that is no function: itself."""
    if not isinstance(item, pytest.Function):
        item.stash[CALIBRATION_RUN] = 0
        return [item]
    copies = [item, *(_copy(item) for _ in range(runs - 1))]
    for run, copy in enumerate(copies):
        copy.stash[CALIBRATION_RUN] = run
    if not oracle:
        return copies
    first = _copy(item)
    first.stash[ORACLE_RUN] = True
    return [first, *copies]


def _copy(item: pytest.Function) -> pytest.Function:
    """A copy of ``item``: same node id, fresh fixtures."""
    return pytest.Function.from_parent(
        item.parent,
        name=item.name,
        callspec=getattr(item, "callspec", None),
        callobj=item.obj,
        fixtureinfo=item._fixtureinfo,
        originalname=item.originalname,
    )
