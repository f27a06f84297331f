"""``rollout-golden compare A B --python-a OLD --python-b NEW``: which tests an environment
change (a dependency upgrade) breaks, with no engine re-run.

Each side replays the selected tests (no ``--update-golden``; ``--golden-strict``: a missing
golden fails, as in CI) in its own temporary checkout, with its own interpreter, on a copy of
the same committed goldens. Each test's outcome is what pytest reported (the probe
:data:`.runs.PROBE`), judged as CI judges it; a test is then *before passes, after fails*
(the regressions B brings), *fails in both*, *fixed by the upgrade* or passes in both. For a
test failing in B, its first divergence is the lowest step of its failed comparisons in B's
``--golden-report``, with its distance in units of the tolerance.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
from pathlib import Path
from typing import Any

from ...errors import GoldenError
from .compare_commits import run_both
from .environments import Difference, Installed, difference, installed
from .git import resolve
from .runs import CommitRun, Divergence, RunSpec, failures, first_divergence, in_checkout
from .trees import Trees

REGRESSED, BOTH, FIXED, PASSED = (
    "before passes, after fails",
    "fails in both",
    "fixed by the upgrade",
    "passes in both",
)
CLASSES = (REGRESSED, BOTH, FIXED, PASSED)
NOT_RUN = "not run"
_PASSING = ("passed", "skipped", "xfail", "xpass", "collected")  # what fails no CI run
_CLASS = {
    (True, False): REGRESSED,
    (False, False): BOTH,
    (False, True): FIXED,
    (True, True): PASSED,
}
_SHOWN_LOG = 20  # lines of a run's output in the error when it ran no test


@dataclasses.dataclass(frozen=True)
class TriageRow:
    """One test (or a collector that failed on a side): its outcome in A and in B, its class
    (:data:`CLASSES`), and for a failure in B its first divergence, else the failure's
    message."""

    test: str
    a: str
    b: str
    category: str
    first: Divergence | None = None
    message: str = ""

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["class"] = out.pop("category")
        return out


@dataclasses.dataclass
class TriageResult:
    """Both runs, each side's interpreter and what it has installed, the goldens' source,
    and a row per test, regressions first."""

    a: CommitRun
    b: CommitRun
    python: tuple[str, str]
    installed: tuple[Installed, Installed]
    source: str
    rows: list[TriageRow]

    @property
    def environment(self) -> Difference:
        return difference(*self.installed)

    @property
    def counts(self) -> dict[str, int]:
        return {c: sum(r.category == c for r in self.rows) for c in CLASSES}

    @property
    def regressed(self) -> bool:
        return bool(self.counts[REGRESSED])

    def to_json(self) -> dict[str, Any]:
        def side(run: CommitRun, python: str, env: Installed) -> dict[str, Any]:
            return {
                "commit": run.commit.sha,
                "subject": run.commit.subject,
                "python": python,
                "python_version": env.python,
                "exit_code": run.exit_code,
                "seconds": round(run.seconds, 3),
            }

        return {
            "format": "pytest-rollout-golden-triage",
            "version": 1,
            "a": side(self.a, self.python[0], self.installed[0]),
            "b": side(self.b, self.python[1], self.installed[1]),
            "environment": self.environment.to_json(),
            "goldens_from": self.source,
            "ok": not self.regressed,
            "summary": self.counts,
            "tests": [r.to_json() for r in self.rows],
        }


def triage(
    spec: RunSpec,
    ref_a: str,
    ref_b: str,
    python: tuple[str, str],
    *,
    jobs: int = 1,
    base: Path | None = None,
) -> TriageResult:
    """Replay ``spec`` at ``ref_a`` with interpreter ``python[0]`` and at ``ref_b`` with
    ``python[1]``, and classify every test. :class:`GoldenError` when both sides are the
    same commit in the same interpreter, an interpreter cannot be asked what it has
    installed, or a side ran no test. ``base``: where the run folder goes."""
    commits = [resolve(spec.repo, ref_a), resolve(spec.repo, ref_b)]
    if commits[0] == commits[1] and _same_path(*python):
        raise GoldenError(
            f"A and B are the same commit ({commits[0].short}) in the same Python "
            f"({python[0]}): nothing differs. Give --python-b the upgraded environment's "
            "python (and --python-a the old one's), or two different refs"
        )
    envs = (_installed("--python-a", python[0]), _installed("--python-b", python[1]))
    replay = dataclasses.replace(
        spec, update=False, outcomes=True, pytest_args=(*spec.pytest_args, "--golden-strict")
    )
    specs = [dataclasses.replace(replay, python=p) for p in python]
    with Trees(spec.repo, base=base) as run:
        checkouts = [run.add(commit) for commit in commits]
        done = run_both(specs, checkouts, jobs)
        root = (checkouts[1].path / spec.golden_rel).resolve()
    for side, result, interpreter in zip("AB", done, python, strict=True):
        _require_tests(side, result, interpreter)
    found = rows(done[0], done[1], root)
    return TriageResult(done[0], done[1], python, envs, spec.goldens.describe(), found)


def rows(a: CommitRun, b: CommitRun, root: Path | None = None) -> list[TriageRow]:
    """A row per test either side ran (or collector that failed), by class then node id;
    collectors that collected on both sides are no tests, and are left out. A golden of a
    divergence is said relative to ``root``, B's golden folder."""
    seen_a, seen_b = outcomes(a), outcomes(b)
    firsts = {d.test: d for d in _divergences(b, root)}
    found = []
    for node in sorted(seen_a.keys() | seen_b.keys()):
        (oa, ma), (ob, mb) = seen_a.get(node, (NOT_RUN, "")), seen_b.get(node, (NOT_RUN, ""))
        if {oa, ob} <= {"collected", NOT_RUN}:  # a collector that collected: no test
            continue
        passes = (oa in _PASSING, ob in _PASSING)
        row_class = _CLASS[passes]
        first = None if passes[1] else firsts.get(node)
        message = ma if passes[1] else mb  # why it fails in B, or failed in A
        found.append(TriageRow(node, oa, ob, row_class, first, message))
    return sorted(found, key=lambda r: CLASSES.index(r.category))


def outcomes(run: CommitRun) -> dict[str, tuple[str, str]]:
    """Each node's outcome from the probe's reports, ``{node: (outcome, message)}``:
    ``error`` (setup, teardown or collection failed), ``failed``, ``xpass``, ``xfail``,
    ``skipped``, ``passed``, or ``collected`` for a collector that did; the message of the
    first failed report."""
    found: dict[str, tuple[str, str]] = {}
    for report in run.outcomes:
        node, when, outcome = report["node"], report.get("when"), report.get("outcome")
        before, message = found.get(node, ("", ""))
        if outcome == "failed":
            now = "failed" if when == "call" else "error"
            message = message or str(report.get("message", ""))
        elif when == "collect":
            now = "collected" if outcome == "passed" else str(outcome)
        elif when != "call":  # a setup that skipped (skip marker) says so, a passing one not
            now = "skipped" if outcome == "skipped" else ""
        elif report.get("xfail"):
            now = "xfail" if outcome == "skipped" else "xpass"
        else:
            now = str(outcome)
        if before in ("error", "failed") or not now:
            now = before or now
        found[node] = (now or "passed", message)
    return found


def _divergences(run: CommitRun, root: Path | None) -> list[Divergence]:
    """The first divergence of each test whose goldens failed in ``run``, its golden said
    relative to ``root``."""
    by_test: dict[str, list[dict[str, Any]]] = {}
    for comparison in failures(run.report or {}):
        by_test.setdefault(comparison.get("test", ""), []).append(comparison)
    firsts = [first_divergence(found) for found in by_test.values()]
    return [dataclasses.replace(d, golden=in_checkout(d.golden, root)) for d in firsts]


def _same_path(a: str, b: str) -> bool:
    """Whether two interpreters are one: the same file, symbolic links not followed (each
    virtual environment's ``python`` is a link to the same base interpreter)."""
    return os.path.abspath(a) == os.path.abspath(b)


def _installed(option: str, python: str) -> Installed:
    """What ``python`` has installed; :class:`GoldenError` naming the option if it cannot say."""
    try:
        return installed(python)
    except (OSError, ValueError, KeyError, TypeError, subprocess.SubprocessError) as exc:
        raise GoldenError(
            f"{option} {python}: could not ask it what it has installed ({type(exc).__name__}: "
            f"{str(exc).strip()[-200:]}); give the python of a virtual environment "
            "(e.g. /path/to/venv/bin/python)"
        ) from None


def _require_tests(side: str, run: CommitRun, python: str) -> None:
    """A side whose pytest reported no test (it did not start, or collected none) has no
    outcome to classify."""
    if any(r.get("when") != "collect" for r in run.outcomes) or any(
        r.get("outcome") == "failed" for r in run.outcomes
    ):
        return
    tail = "\n".join(run.log_tail.splitlines()[-_SHOWN_LOG:])
    raise GoldenError(
        f"{side} = {run.commit.short} ({run.commit.subject}) with {python}: "
        f"pytest ran no test (exit {run.exit_code}); nothing to triage. Its output ends:\n{tail}"
    )
