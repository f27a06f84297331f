"""What one pytest session did with goldens, mergeable across xdist workers.

Workers serialize their :class:`SessionState` into ``workeroutput``; the
controller merges them and alone writes the report, prints the summary and
prunes unused goldens.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...errors import GoldenError
from ..results import STATUSES, Outcome, Status
from ..tolerance.stack import ToleranceUsage
from .summary import report_document


def _session_folder(token: str) -> Path:
    """The folder all processes of one session (xdist workers too) share marks in."""
    return Path(tempfile.gettempdir()) / f"pytest-rollout-golden-{token}"


def _mark(folder: Path, key: str) -> Path:
    import hashlib

    return folder / hashlib.blake2s(key.encode(), digest_size=8).hexdigest()


class UpdateMarks:
    """Marks, shared by all workers of a session, of the goldens re-recorded so far.

    Satisfies :class:`..golden.run.UpdateRegistry`.
    """

    def __init__(self, token: str):
        self.path = _session_folder(token)

    def contains(self, directory: Path) -> bool:
        return _mark(self.path, str(directory.resolve())).exists()

    def add(self, directory: Path) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        _mark(self.path, str(directory.resolve())).touch()

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


class FinishedTests:
    """Marks, shared by all workers of a session, of the tests that have finished (whatever
    their outcome); removed with the session's :class:`UpdateMarks`."""

    def __init__(self, token: str):
        self.path = _session_folder(token) / "finished"

    def contains(self, test_id: str) -> bool:
        return _mark(self.path, test_id).exists()

    def add(self, test_id: str) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        _mark(self.path, test_id).touch()


@dataclass
class SessionState:
    """Outcomes of every golden test plus what collection saw, for unused-golden detection."""

    outcomes: list[Outcome] = field(default_factory=list)
    expected_dirs: set[str] = field(default_factory=set)  # declared, or of a test skipped here
    opened_dirs: set[str] = field(default_factory=set)  # goldens opened, however reached
    collected_files: set[str] = field(default_factory=set)
    partial_files: set[str] = field(default_factory=set)
    skipped_files: set[str] = field(default_factory=set)  # skipped at collection (importorskip)
    collect_ignored: set[str] = field(default_factory=set)  # paths collection ignored
    # test file -> node ids its collectors produced, before any plugin or conftest filtered them
    produced: dict[str, set[str]] = field(default_factory=dict)
    selected: set[str] = field(default_factory=set)  # node ids left to run after collection
    tolerance_usage: ToleranceUsage = field(default_factory=ToleranceUsage)
    plots: list[str] = field(default_factory=list)
    # --golden-calibrate: golden directory -> test id -> each run's metrics, and tests left out
    calibration: dict[str, dict[str, list[Any]]] = field(default_factory=dict)
    calibration_skipped: dict[str, dict[str, str]] = field(default_factory=dict)
    calibration_layouts: dict[str, dict[str, str]] = field(default_factory=dict)  # variant ids
    calibration_replaying: set[str] = field(default_factory=set)  # variants of a reference
    certificates: dict[str, dict[str, Any]] = field(default_factory=dict)  # test id -> oracle's
    calibrated: list[dict[str, Any]] = field(default_factory=list)  # what was written
    # test id -> its calibration runs that failed, on values only what was written now holds
    calibration_passed: dict[str, int] = field(default_factory=dict)
    # --golden-sensitivity: test id -> {"golden": its directory, "gates": each gate's JSON}
    sensitivity: dict[str, dict[str, Any]] = field(default_factory=dict)

    def add_outcome(self, outcome: Outcome) -> None:
        if outcome.status is not None or outcome.comparisons:
            self.outcomes.append(outcome)

    def add_calibration_run(
        self,
        directory: str,
        test: str,
        metrics: Any,
        *,
        layout: str | None = None,
        replaying: bool = False,
        skipped: str = "",
    ) -> None:
        """One ``--golden-calibrate`` run of ``test``: its ``metrics``, unless ``skipped`` (why).

        ``layout``: the variant id of a ``same_math()`` or ``parallel.variants()`` test,
        also measured across variants; ``replaying``: it replays its reference's golden.
        """
        runs = self.calibration.setdefault(directory, {}).setdefault(test, [])
        if replaying:
            self.calibration_replaying.add(test)
        if layout is not None:
            self.calibration_layouts.setdefault(directory, {})[test] = layout
        if skipped:
            self.calibration_skipped.setdefault(directory, {})[test] = skipped
            return
        runs.append(metrics)

    def to_json(self) -> str:
        return json.dumps(
            {
                "outcomes": [o.to_json() for o in self.outcomes],
                "expected_dirs": sorted(self.expected_dirs),
                "opened_dirs": sorted(self.opened_dirs),
                "collected_files": sorted(self.collected_files),
                "partial_files": sorted(self.partial_files),
                "skipped_files": sorted(self.skipped_files),
                "collect_ignored": sorted(self.collect_ignored),
                "produced": {f: sorted(ids) for f, ids in self.produced.items()},
                "selected": sorted(self.selected),
                "used_tolerances": self.tolerance_usage.labels(),
                "checked_names": self.tolerance_usage.names(),
                "plots": self.plots,
                "calibration": self.calibration,
                "calibration_skipped": self.calibration_skipped,
                "calibration_layouts": self.calibration_layouts,
                "calibration_replaying": sorted(self.calibration_replaying),
                "certificates": self.certificates,
                "sensitivity": self.sensitivity,
            }
        )

    def merge_json(self, text: str) -> None:
        data = json.loads(text)
        self.outcomes.extend(Outcome.from_json(o) for o in data["outcomes"])
        self.expected_dirs.update(data["expected_dirs"])
        self.opened_dirs.update(data.get("opened_dirs", ()))
        self.collected_files.update(data["collected_files"])
        self.partial_files.update(data["partial_files"])
        self.skipped_files.update(data.get("skipped_files", ()))
        self.collect_ignored.update(data.get("collect_ignored", ()))
        for file, ids in data.get("produced", {}).items():
            self.produced.setdefault(file, set()).update(ids)
        self.selected.update(data.get("selected", ()))
        self.tolerance_usage.merge(data["used_tolerances"], data.get("checked_names", ()))
        self.plots.extend(data.get("plots", []))
        for directory, tests in data.get("calibration", {}).items():
            for test, runs in tests.items():
                merged = self.calibration.setdefault(directory, {}).setdefault(test, [])
                merged.extend(runs)
        for directory, tests in data.get("calibration_skipped", {}).items():
            self.calibration_skipped.setdefault(directory, {}).update(tests)
        for directory, tests in data.get("calibration_layouts", {}).items():
            self.calibration_layouts.setdefault(directory, {}).update(tests)
        self.calibration_replaying.update(data.get("calibration_replaying", ()))
        self.certificates.update(data.get("certificates", {}))
        self.sensitivity.update(data.get("sensitivity", {}))

    def counts(self) -> dict[str, int]:
        """Goldens by status; ``xfailed`` (failed inside an expected failure) only if any."""
        counts = dict.fromkeys((s.value for s in STATUSES), 0)
        for outcome in self.outcomes:
            if outcome.status in (*STATUSES, Status.XFAILED):
                counts[outcome.status.value] = counts.get(outcome.status.value, 0) + 1
        return counts

    def partial_collection(self) -> list[str]:
        """Test files some of whose collected tests did not run, whoever filtered them out.

        Compares what each file's collectors produced with what was left to run, so it
        sees ``--lf``, ``-k``, node ids and a conftest trimming ``items[:]`` alike.
        """
        partial = set(self.partial_files)
        partial |= {f for f, ids in self.produced.items() if not ids <= self.selected}
        return sorted(partial)

    def whole_files(self) -> set[str]:
        """Test files every collected test of which was left to run."""
        partial = set(self.partial_collection())
        return {f for f, ids in self.produced.items() if ids and f not in partial}

    def used_dirs(self) -> set[str]:
        """Golden directories this session used: declared by a collected test, of a test
        skipped on this machine (of any kind: a doctest may reach ``golden`` only when it
        runs), or opened, however the ``golden`` fixture was reached."""
        return self.expected_dirs | self.opened_dirs


def write_report(
    path: Path, state: SessionState, *, mode: str, unused: list[Path], pruned: list[Path]
) -> None:
    """Write the ``--golden-report`` JSON file; GoldenError naming the remedy if it fails."""
    document = report_document(state, mode=mode, unused=unused, pruned=pruned)
    text = json.dumps(document, indent=2, allow_nan=False)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
    except OSError as exc:
        raise GoldenError(
            f"--golden-report {path}: NOT written ({exc.strerror or exc}); "
            "free disk space on that filesystem or name another file"
        ) from None
