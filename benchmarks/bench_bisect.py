"""What ``rollout-golden bisect`` costs against one replay of the tests it bisects.

The history is the tests' (``tests/commits/history.py``): 32 commits of a toy project whose
golden test checks pure-Python metrics over 3 steps, goldens at the first commit, a 1e-3
bug at commit 11 and a commit that does not collect at 16 (the search's first probe, so a
skip is paid). Timed in alternation, in fresh processes, the same pytest arguments
(``-p no:hypothesispytest``) everywhere:

- one replay: ``python -m pytest`` in the user's checkout at the bad end (before and after
  the bisects of each round);
- ``rollout-golden bisect --no-cache`` from the first commit to the last, one job, then two;
- the same bisect again on a warm cache (every tried commit's result stored).

The issue's target: the whole bisect within 6 times one replay. A last row prices the
alternative to ``PYTHONPATH`` for importing each commit's package: ``pip install -e
--no-deps`` into a fresh virtual environment that sees this one's packages (no index), which
a bisect would pay per commit on top of the replay.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

from harness import Section, Target, table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "commits"))
from history import build_history  # noqa: E402  (the tests' history, not a copy of it)

TARGET = 6.0
BUG_AT, BROKEN_AT = 11, 16
FAST = ("-p", "no:hypothesispytest")


def _seconds(command: list[str], cwd: Path) -> float:
    """Wall time of ``command`` in ``cwd`` (it must succeed, or exit 1 for a failing test)."""
    start = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - start
    if done.returncode not in (0, 1):
        raise RuntimeError(f"{' '.join(command)} exited {done.returncode}:\n{done.stderr[-2000:]}")
    return elapsed


def _bisect(repo: Path, cache: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "pytest_rollout_golden", "bisect", "--good", "HEAD~31",
        "--bad", "HEAD", "--cache-dir", str(cache), *extra, "--", *FAST,
    ]  # fmt: skip


def _pip_editable(tmp: Path) -> float:
    """Seconds to make a fresh venv that sees this environment's packages (a ``.pth`` file)
    and ``pip install -e --no-deps`` a one-module package into it."""
    project = tmp / "pkg"
    project.mkdir(exist_ok=True)
    (project / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "toy-calc"\nversion = "0"\n'
    )
    (project / "toy_calc.py").write_text("VALUE = 1\n")
    venv = tmp / f"venv-{time.monotonic_ns()}"
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    Path(site, "user-env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
         "--no-build-isolation", "--no-index", "-e", str(project)],
        check=True, capture_output=True,
    )  # fmt: skip
    return time.perf_counter() - start


def run(quick: bool) -> Section:
    title = "bisect: the whole search against one replay (32 commits)"
    rounds = 1 if quick else 2
    times: dict[str, list[float]] = {"replay": [], "bisect": [], "bisect2": [], "cached": []}
    with tempfile.TemporaryDirectory(prefix="prg-bench-bisect-") as tmp:
        history = build_history(Path(tmp) / "repo", bug_at=BUG_AT, broken_at=BROKEN_AT)
        replay = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *FAST]
        for r in range(rounds):
            cache = Path(tmp) / f"cache-{r}"
            times["replay"].append(_seconds(replay, history.repo))
            times["bisect"].append(_seconds(_bisect(history.repo, cache), history.repo))
            times["cached"].append(_seconds(_bisect(history.repo, cache), history.repo))
            jobs2 = _bisect(history.repo, cache, "--jobs", "2", "--no-cache")
            times["bisect2"].append(_seconds(jobs2, history.repo))
            times["replay"].append(_seconds(replay, history.repo))
        pip = _pip_editable(Path(tmp))
    med = {name: statistics.median(values) for name, values in times.items()}
    labels = {
        "replay": "one replay (`pytest` at the bad end)",
        "bisect": "bisect, `--jobs 1`, no cache",
        "bisect2": "bisect, `--jobs 2`, no cache",
        "cached": "bisect again, cache warm",
        "pip": "venv + `pip install -e --no-deps` (per commit, instead of `PYTHONPATH`)",
    }
    med["pip"] = pip
    rows = [
        [label, f"{med[k]:.1f}", f"{med[k] / med['replay']:.2f}"] for k, label in labels.items()
    ]
    ratio = med["bisect"] / med["replay"]
    body = (
        f"Median of {rounds} interleaved round(s); bug at commit {BUG_AT}, commit {BROKEN_AT} "
        "does not collect.\n\n" + table(["run", "seconds", "× one replay"], rows)
    )
    quick_note = " (--quick)" if quick else ""
    target = Target(
        f"bisect of 32 commits ≤ {TARGET:g}× one replay{quick_note}",
        f"{ratio:.1f}×",
        ratio <= TARGET,
    )
    return Section(title, body, [target])


if __name__ == "__main__":
    section = run("--quick" in sys.argv)
    print(f"## {section.title}\n\n{section.body}\n")
    print(table(["target", "measured", "verdict"], [t.row() for t in section.targets]))
