"""A year of nightly runs in the run history (``--golden-history``): size on disk and the time
``rollout-golden history DIR list`` (and ``show``) takes to load it.

The example of ``examples/`` is recorded, then replayed once by pytest with
``--golden-history``: that run is real. The other 364 runs are appended through the same
store (:func:`...history.store.append`) with that run's document and its values moved by a
little noise, so that no two runs hold the same bytes; only the 364 pytest sessions are left
out (about a minute each on this machine).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import Section, Target, table

from pytest_rollout_golden._internal.history import store

ROOT = Path(__file__).resolve().parent.parent
RUNS = 365
MAX_MB = 5.0  # "fits in a few MB" (issue 49)
MAX_LIST_S = 1.0  # "loads in under a second" (issue 49)


def _environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def _first_run(project: Path) -> None:
    """The example recorded, then replayed with the history on: run 1."""
    examples = ROOT / "examples"
    for name in ("test_tiny_rl_golden.py", "tiny_rl.py"):
        shutil.copy(examples / name, project / name)
    (project / "pytest.ini").write_text("[pytest]\n")
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    for extra in ([], ["--golden-history", "hist"]):
        subprocess.run([*command, *extra], cwd=project, env=_environment(), check=True,
                       capture_output=True)  # fmt: skip


def _year(folder: Path) -> None:
    """Runs 2 to 365: run 1's document and values, each value moved by noise."""
    import numpy as np

    first = store.read_run(folder, 1)
    arrays = store.read_values(folder, first)
    document = {k: v for k, v in first.items() if k not in ("format", "version", "run", "values")}
    rng = np.random.default_rng(0)
    for _ in range(RUNS - 1):
        moved = {
            k: a if k == "steps" else a * (1 + 1e-7 * rng.standard_normal(a.shape))
            for k, a in arrays.items()
        }
        store.append(folder, document, moved, store.Limits(max_runs=1000, max_bytes=100 * 2**20))


def _timed(project: Path, *args: str) -> float:
    """Seconds of ``rollout-golden ARGS`` from the shell (interpreter start included)."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "pytest_rollout_golden", *args], cwd=project,
                   env=_environment(), check=True, capture_output=True)  # fmt: skip
    return time.perf_counter() - start


def _loaded(folder: Path) -> float:
    """Seconds to read every run's ``run.json`` (what ``list`` reads), in this process."""
    from pytest_rollout_golden._internal.history.commands import runs_of

    start = time.perf_counter()
    assert len(runs_of(folder)) == RUNS
    return time.perf_counter() - start


def run(quick: bool) -> Section:
    title = "A year of nightly runs in the run history"
    with tempfile.TemporaryDirectory(prefix="prg-bench-history-") as tmp:
        project = Path(tmp)
        _first_run(project)
        folder = project / "hist"
        _year(folder)
        files = [p for p in folder.rglob("*") if p.is_file()]
        size = sum(p.stat().st_size for p in files)
        blocks = sum(p.stat().st_blocks * 512 for p in files)
        test = store.read_run(folder, 1)["tests"][0]["test"]
        rounds = 1 if quick else 3
        listing = min(_timed(project, "history", "hist", "list") for _ in range(rounds))
        showing = min(_timed(project, "history", "hist", "show", test) for _ in range(rounds))
        startup = min(_timed(project, "--help") for _ in range(rounds))
        loading = min(_loaded(folder) for _ in range(rounds))
    rows = [
        ["runs", RUNS],
        ["files", len(files)],
        ["size (bytes of the files)", f"{size / 1e6:.2f} MB"],
        ["size on disk (blocks allocated)", f"{blocks / 1e6:.2f} MB"],
        ["`rollout-golden history DIR list`", f"{listing:.2f} s"],
        [f"`rollout-golden history DIR show {test.split('::')[-1]}`", f"{showing:.2f} s"],
        ["`rollout-golden --help` (interpreter and imports alone)", f"{startup:.2f} s"],
        ["every `run.json` read and checked, in process", f"{loading * 1e3:.0f} ms"],
    ]
    body = (
        "The example's replay with `--golden-history`, then 364 more runs appended through the "
        "same store (values moved by noise); times from the shell, best of "
        f"{rounds}.\n\n" + table(["", "measured"], rows)
    )
    # The load is what a history's size decides; the interpreter's start, which --help alone
    # measures, is the same for every command of the package.
    fits, fast = blocks / 1e6 <= MAX_MB, loading < MAX_LIST_S
    shell = f"{loading:.2f} s (from the shell {listing:.2f} s)"
    targets = [
        Target(f"{RUNS} runs fit in {MAX_MB:g} MB", f"{blocks / 1e6:.2f} MB", fits),
        Target(f"`history list` loads {RUNS} runs in under {MAX_LIST_S:g} s", shell, fast),
    ]
    return Section(title, body, targets)
