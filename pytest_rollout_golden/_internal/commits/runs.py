"""Running the selected tests at one commit, on the run's goldens, and judging the result.

The verdict of a run (``good``, ``bad`` or ``skip``, as ``git bisect`` has them) comes from
pytest's exit status and the ``--golden-report`` it wrote:

- a failed comparison (``fail`` or ``missing``, outside expected failures): bad;
- exit 0 with a comparison or recording: good;
- exit 1 without a failed comparison: bad with ``any_failure`` (every failure counts);
  skip when a test stopped early (it raised before comparing every value its golden holds:
  the steps it never reached are no evidence) or nothing was compared (a crash before any
  comparison); good otherwise (a comparison ran, and the failure is another one);
- exit 2 to 5 (collection error, interrupted, internal or usage error, no tests), a
  timeout, no readable report: skip, with the reason.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ...errors import GoldenError
from ..tolerance.spec import Tolerance
from .git import Commit, toplevel
from .goldens import GoldenSource, install
from .trees import Tree, stop

GOOD, BAD, SKIP = "good", "bad", "skip"
_FAILED = ("fail", "missing")
_EXIT = {
    2: "interrupted or a collection error",
    3: "pytest internal error",
    4: "pytest usage error",
    5: "no tests collected",
}
_EXCEPTION = re.compile(r"[\w.]*(Error|Exception|Exit|Interrupt)\b")
_TAIL = 60  # lines of the log kept
# The pytest plugin (stdlib only) that writes every test's outcome, loaded with -p from its
# folder so that any environment runs it, whichever plugin version it has installed.
PROBE = Path(__file__).with_name("probe") / "rollout_golden_outcomes.py"


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """What to run at each commit: the tests (``pytest_args``, run in ``cwd_rel`` of the
    checkout) and their goldens (``goldens``, installed at ``golden_rel``); both paths are
    relative to the top of ``repo``. ``update``: run with ``--update-golden``.
    ``pythonpath``: more import folders (relative ones are taken in the checkout).
    ``python``: the interpreter, whose environment the tests run in. ``outcomes``: record
    each test's outcome (:data:`PROBE`) in :attr:`CommitRun.outcomes`."""

    repo: Path
    cwd_rel: str
    golden_rel: str
    goldens: GoldenSource
    pytest_args: tuple[str, ...] = ()
    any_failure: bool = False
    update: bool = False
    python: str = sys.executable
    timeout: float | None = None
    pythonpath: tuple[str, ...] = ()
    outcomes: bool = False


@dataclasses.dataclass(frozen=True)
class Divergence:
    """The first failed comparison of a run (the lowest step), as the report holds it."""

    test: str
    golden: str
    metric: str
    step: int
    expected: Any
    actual: Any
    abs_diff: Any
    tolerance: str
    excess: Any

    @classmethod
    def of(cls, comparison: dict[str, Any]) -> Divergence:
        tol = comparison.get("tolerance")
        return cls(
            test=comparison.get("test", ""),
            golden=comparison.get("golden", ""),
            metric=comparison.get("metric", ""),
            step=comparison.get("step", 0),
            expected=comparison.get("expected"),
            actual=comparison.get("actual"),
            abs_diff=comparison.get("abs_diff"),
            tolerance=Tolerance(**tol).describe() if isinstance(tol, dict) else "",
            excess=comparison.get("excess"),
        )


@dataclasses.dataclass
class CommitRun:
    """What one run at one commit found."""

    commit: Commit
    outcome: str  # GOOD, BAD or SKIP
    exit_code: int | None
    seconds: float
    reason: str = ""
    failures: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    first: Divergence | None = None
    log_tail: str = ""
    cached: bool = False
    timed_out: bool = False
    report: dict[str, Any] | None = dataclasses.field(default=None, repr=False)
    # with RunSpec.outcomes: the probe's reports, one per test phase or collector, as written
    outcomes: list[dict[str, Any]] = dataclasses.field(default_factory=list, repr=False)

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        del out["report"]
        if not out["outcomes"]:  # only a triage collects them; bisect's documents stay as they were
            del out["outcomes"]
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CommitRun:
        fields = dict(data)
        fields["commit"] = Commit(**fields["commit"])
        if fields.get("first") is not None:
            fields["first"] = Divergence(**fields["first"])
        if fields.get("outcome") not in (GOOD, BAD, SKIP):
            raise ValueError(f"outcome {fields.get('outcome')!r} is not good, bad or skip")
        return cls(**fields)


def locate(cwd: Path, golden_root: Path) -> tuple[Path, str, str]:
    """``(repo, cwd_rel, golden_rel)`` of a run started in ``cwd`` with the golden folder
    ``golden_root`` (relative to ``cwd``, or absolute): the top of the git checkout holding
    ``cwd``, and both folders relative to it."""
    repo = toplevel(cwd)
    cwd = cwd.resolve()
    golden = (cwd / golden_root).resolve()
    if not golden.is_relative_to(repo):
        raise GoldenError(
            f"--golden-root {golden_root}: {golden} is outside the git checkout {repo}; "
            "give the project's golden folder"
        )
    return repo, cwd.relative_to(repo).as_posix(), golden.relative_to(repo).as_posix()


def in_tree(repo: Path, cwd_rel: str, pytest_args: tuple[str, ...]) -> tuple[str, ...]:
    """``pytest_args`` as each temporary checkout takes them: a path into the user's checkout
    (``/repo/tests/test_x.py``, ``--golden-dir=/repo/golden``, ``../golden``) made relative
    to the run's folder, so that it names the checkout's copy; :class:`GoldenError`, before
    any run, for one that leaves the checkout (a run writes what its arguments name)."""
    return tuple(_in_tree(repo.resolve(), cwd_rel, arg) for arg in pytest_args)


def _in_tree(repo: Path, cwd_rel: str, arg: str) -> str:
    """One argument of :func:`in_tree`: itself, or with its path made relative: the value of
    ``--option=PATH`` or ``NAME=PATH`` (``-o golden_dir=PATH``), else the whole argument."""
    for cut in dict.fromkeys((arg.rfind("=") + 1, 0)):
        path, colons, node = arg[cut:].partition("::")
        if os.path.isabs(path) or ".." in Path(path).parts:
            return f"{arg[:cut]}{_relative(repo, cwd_rel, path, arg)}{colons}{node}"
    return arg


def _relative(repo: Path, cwd_rel: str, path: str, arg: str) -> str:
    """``path`` (of pytest argument ``arg``) relative to the run's folder ``cwd_rel`` of
    ``repo``; :class:`GoldenError` if it leaves the checkout."""
    cwd = repo / cwd_rel
    target = Path(os.path.normpath(cwd / path)).resolve()
    if not target.is_relative_to(repo):
        raise GoldenError(
            f"pytest argument {arg!r}: {target} is outside the git checkout {repo}, which "
            "each commit runs a copy of; give a path inside the checkout (relative to it), "
            "or leave the argument out"
        )
    return os.path.relpath(target, cwd)


def run_commit(spec: RunSpec, commit: Commit, tree: Tree) -> CommitRun:
    """Run ``spec``'s tests in ``tree`` (a checkout of ``commit``) on a copy of its goldens."""
    started = time.monotonic()
    install(spec.goldens, tree.path, spec.golden_rel)
    cwd = tree.path / spec.cwd_rel
    if not cwd.is_dir():
        reason = f"{spec.cwd_rel}: no such folder at this commit"
        return CommitRun(commit, SKIP, None, time.monotonic() - started, reason)
    # named by the tree: two trees of one commit (compare HEAD HEAD) may run at once
    report, log, outcomes = (tree.path.with_suffix(s) for s in (".json", ".log", ".outcomes"))
    command = [spec.python, "-m", "pytest", *spec.pytest_args, "-p", "no:cacheprovider"]
    command.append(f"--golden-report={report}")
    env = _env(spec, tree.path)
    if spec.outcomes:
        command += ["-p", PROBE.stem]
        env["PYTHONPATH"] += os.pathsep + str(PROBE.parent)
        env["ROLLOUT_GOLDEN_OUTCOMES"] = str(outcomes)
    if spec.update:
        command.append("--update-golden")
    exit_code, timed_out = _run(command, cwd, env, log, tree, spec.timeout)
    seconds = time.monotonic() - started
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    tail = "\n".join(lines[-_TAIL:])
    if timed_out:
        reason = f"timed out after {spec.timeout:g} s"
        return CommitRun(commit, SKIP, exit_code, seconds, reason, log_tail=tail, timed_out=True)
    document = _report(report)
    run = judge(
        commit, exit_code, document, lines, any_failure=spec.any_failure, root=tree.path.resolve()
    )
    run.seconds, run.log_tail, run.report = seconds, tail, document
    run.outcomes = _outcomes(outcomes) if spec.outcomes else []
    return run


def _env(spec: RunSpec, tree: Path) -> dict[str, str]:
    """This process's environment, the checkout's folders first on ``PYTHONPATH``: its
    package shadows an installed (or editable) copy of the user's project. No ``.pyc`` is
    written."""
    paths = [str(tree)] + ([str(tree / "src")] if (tree / "src").is_dir() else [])
    paths += [str(tree / extra) for extra in spec.pythonpath]  # an absolute one stays as is
    inherited = os.environ.get("PYTHONPATH")
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(paths + ([inherited] if inherited else [])),
        # a module found in the user's checkout (not at this commit) must not leave a .pyc there
        "PYTHONDONTWRITEBYTECODE": "1",
    }


def _run(
    command: list[str], cwd: Path, env: dict[str, str], log: Path, tree: Tree, timeout: Any
) -> tuple[int | None, bool]:
    """Run ``command`` with its output into ``log``: ``(exit status, whether it timed
    out)``. Its process group is killed on a timeout, and on any exception here (Ctrl-C)."""
    with open(log, "wb") as out:
        child = tree.trees.popen(
            command, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out
        )
        try:
            return child.wait(timeout=timeout), False
        except subprocess.TimeoutExpired:
            stop(child)
            return child.returncode, True
        except BaseException:
            stop(child)
            raise
        finally:
            tree.trees.forget(child)


def _report(path: Path) -> dict[str, Any] | None:
    """The ``--golden-report`` document (``None``: not written, or not one)."""
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    ok = isinstance(document, dict) and document.get("format") == "pytest-rollout-golden-report"
    return document if ok else None


def _outcomes(path: Path) -> list[dict[str, Any]]:
    """The probe's lines (none: it wrote none); a line cut short by a killed run is left out."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        try:
            found.append(json.loads(line))
        except ValueError:
            continue
    return [f for f in found if isinstance(f, dict) and isinstance(f.get("node"), str)]


def judge(
    commit: Commit,
    exit_code: int | None,
    report: dict[str, Any] | None,
    log: list[str],
    *,
    any_failure: bool = False,
    root: Path | None = None,
) -> CommitRun:
    """The verdict on a finished run (the rules are in the module's docstring); a golden's
    folder inside ``root`` (the checkout, which is removed) is said relative to it."""
    if exit_code in _EXIT or report is None:
        what = _EXIT.get(exit_code or 0, f"exit {exit_code}, no golden report written")
        return CommitRun(commit, SKIP, exit_code, 0.0, f"{what}: {_first_error(log)}")
    failed = failures(report)
    if failed:
        reason = f"{len(failed)} failed comparison(s)"
        return CommitRun(commit, BAD, exit_code, 0.0, reason, failed, first_divergence(failed))
    compared = bool(report.get("comparisons")) or any(
        t.get("status") in ("recorded", "updated") for t in report.get("tests", [])
    )
    if exit_code == 0:
        if compared:
            return CommitRun(commit, GOOD, exit_code, 0.0, "")
        return CommitRun(commit, SKIP, exit_code, 0.0, "the tests passed but compared nothing")
    if any_failure:
        return CommitRun(commit, BAD, exit_code, 0.0, f"a test failed: {_first_error(log)}")
    stopped = _stopped(report, root)
    if stopped:
        return CommitRun(commit, SKIP, exit_code, 0.0, f"{stopped}: {_first_error(log)}")
    if compared:
        reason = f"goldens pass; another failure does not count: {_first_error(log)}"
        return CommitRun(commit, GOOD, exit_code, 0.0, reason)
    return CommitRun(commit, SKIP, exit_code, 0.0, f"no comparison ran: {_first_error(log)}")


def first_divergence(failed: list[dict[str, Any]]) -> Divergence:
    """The first of some failed comparisons: the lowest step, the first reported there."""
    return Divergence.of(min(failed, key=lambda c: c.get("step", 0)))


def failures(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The report's failed comparisons of goldens that failed (not those of an expected
    failure)."""
    failed = {
        (t.get("test"), t.get("directory"))
        for t in report.get("tests", [])
        if t.get("status") == "failed"
    }
    return [
        c
        for c in report.get("comparisons", [])
        if c.get("verdict") in _FAILED and (c.get("test"), c.get("golden")) in failed
    ]


def _stopped(report: dict[str, Any], root: Path | None) -> str:
    """The first golden whose test raised before comparing every value it holds, said with
    the values it never reached (``""``: none): its passing steps are no evidence for those."""
    for test in report.get("tests", []):
        unreached = test.get("unreached") or []
        if test.get("status") is None and unreached:
            values = ", ".join(f"{u.get('metric')} at step {u.get('step')}" for u in unreached)
            return (
                f"{test.get('test')} stopped before comparing {len(unreached)} recorded "
                f"value(s) of golden {in_checkout(str(test.get('directory')), root)} ({values})"
            )
    return ""


def in_checkout(folder: str, root: Path | None) -> str:
    """``folder`` relative to the checkout ``root`` where it lies inside it, else as is."""
    path = Path(folder)
    return path.relative_to(root).as_posix() if root and path.is_relative_to(root) else folder


def _first_error(log: list[str]) -> str:
    """The first exception pytest printed (an ``E`` line naming one), else its first ``E``
    line, else its last meaningful line."""
    errors = [line[1:].strip() for line in log if line.startswith("E   ")]
    named = [line for line in errors if _EXCEPTION.match(line)]
    return (named or errors or [_last_line(log)])[0]


def _last_line(log: list[str]) -> str:
    """The last line of the output that says something (not a rule of ``=`` or ``!``)."""
    for line in reversed(log):
        text = line.strip().strip("=!_ ").strip()
        if text:
            return text
    return "(no output)"
