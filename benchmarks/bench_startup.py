"""What the plugin costs a pytest run that selects no golden test.

``pytest --collect-only -q test_plain.py`` runs in fresh subprocesses, with and
without the plugin (``-p no:rollout_golden``), alternating; the figure is the
median of the differences within each pair of runs. It runs twice: in a project
without goldens, and in one whose ``golden/`` holds the goldens of other test files
(not collected), as a repository that uses the plugin does. Hypothesis' pytest
plugin (~0.7 s of imports) is disabled in both runs: it only adds noise, and any
import it shares with ours is then charged to ours. ``-X importtime`` splits out
the plugin's own imports, and one in-process run checks that loading the plugin
imports neither torch nor numpy.
"""

from __future__ import annotations

import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import Section, Target, table

TARGET_MS = 50.0
PLUGIN = "pytest_rollout_golden.plugin"
HEAVY = ("torch", "numpy")
QUIET = ("-p", "no:cacheprovider", "-p", "no:hypothesispytest")
_TESTS = "\n\n".join(f"def test_{i}():\n    assert {i} == {i}" for i in range(20)) + "\n"
GOLDEN_FILES, GOLDEN_TESTS = 50, 20  # 1000 goldens of 5 files each, when a project has them


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.pop("CI", None)
    return env


def _make_project(root: Path, *, goldens: bool) -> None:
    """20 plain tests; with ``goldens``, also the goldens of 50 other test files."""
    root.mkdir()
    (root / "pytest.ini").write_text("[pytest]\n")
    (root / "test_plain.py").write_text(_TESTS)
    for i in range(GOLDEN_FILES if goldens else 0):
        (root / "other").mkdir(exist_ok=True)
        (root / "other" / f"test_m{i}.py").write_text("def test_case(golden):\n    pass\n")
        for j in range(GOLDEN_TESTS):
            directory = root / "golden" / "other" / f"test_m{i}" / f"test_case[{j}]"
            directory.mkdir(parents=True)
            for name in (
                "manifest.json",
                "metrics.json",
                *(f"rollout-{k}.safetensors" for k in range(3)),
            ):
                (directory / name).write_text("{}")


def _collect_seconds(root: Path, *extra: str) -> float:
    cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", *QUIET, *extra, "test_plain.py"]
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=root, env=_env(), capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stdout}\n{done.stderr}")
    return elapsed


def _startup(root: Path, pairs: int) -> tuple[list[float], list[float]]:
    """Wall times with and without the plugin, pair by pair (order alternating), after a warm-up."""
    with_plugin: list[float] = []
    without: list[float] = []
    for i in range(pairs + 1):
        pair = [(with_plugin, ()), (without, ("-p", "no:rollout_golden"))]
        for times, extra in pair if i % 2 else pair[::-1]:
            seconds = _collect_seconds(root, *extra)
            if i:
                times.append(seconds)
    return with_plugin, without


def _importtime(code: str) -> list[tuple[int, str, int]]:
    """``(depth, module, cumulative µs)`` of every import ``python -X importtime -c code`` made."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code],
        env=_env(),
        capture_output=True,
        text=True,
        check=True,
    )
    rows = []
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _, cumulative, name = line.removeprefix("import time:").split("|")
        depth = (len(name) - len(name.lstrip())) // 2
        rows.append((depth, name.strip(), int(cumulative)))
    return rows


def _plugin_import_ms(runs: int) -> tuple[float, float]:
    """(plugin on top of an imported pytest, plugin and pytest together), medians in ms."""
    own, total = [], []
    startup = {name for _, name, _ in _importtime("pass")}
    for _ in range(runs):
        rows = _importtime(f"import pytest; import {PLUGIN}")
        top = [(name, us) for depth, name, us in rows if depth == 0 and name not in startup]
        names = [name for name, _ in top]
        after_pytest = top[names.index("pytest") + 1 :]
        own.append(sum(us for _, us in after_pytest) / 1e3)
        total.append(sum(us for _, us in top) / 1e3)
    return statistics.median(own), statistics.median(total)


_PROBE = """
import sys, pytest
code = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", sys.argv[1]])
loaded = {plugin!r} in sys.modules
print("PROBE", int(code), loaded, *[m for m in {heavy!r} if m in sys.modules])
"""


def _heavy_imports(root: Path) -> tuple[bool, list[str]]:
    """(plugin loaded, heavy modules imported) after an in-process collect-only run."""
    probe = _PROBE.format(plugin=PLUGIN, heavy=HEAVY)
    done = subprocess.run(
        [sys.executable, "-c", probe, "test_plain.py"],
        cwd=root,
        env=_env(),
        capture_output=True,
        text=True,
        check=True,
    )
    line = next(x for x in done.stdout.splitlines() if x.startswith("PROBE"))
    _, code, loaded, *heavy = line.split()
    if code != "0":
        raise RuntimeError(f"collect-only failed in the probe:\n{done.stdout}\n{done.stderr}")
    return loaded == "True", heavy


def run(quick: bool) -> Section:
    title = "pytest start-up with the plugin installed"
    if importlib.util.find_spec(PLUGIN) is None:
        note = f"{PLUGIN} is not there yet: start-up not measured."
        return Section(title, note, [Target(f"plugin adds < {TARGET_MS:g} ms", note, None)])

    pairs = 6 if quick else 15
    projects = {"no goldens": False, f"{GOLDEN_FILES * GOLDEN_TESTS} goldens of other files": True}
    rows, targets = [], []
    with tempfile.TemporaryDirectory(prefix="prg-bench-startup-") as tmp:
        for label, goldens in projects.items():
            root = Path(tmp) / ("goldens" if goldens else "plain")
            _make_project(root, goldens=goldens)
            with_plugin, without = _startup(root, pairs)
            pairs_ms = [(w - wo) * 1e3 for w, wo in zip(with_plugin, without, strict=True)]
            added = statistics.median(pairs_ms)
            rows += [
                [
                    f"{label}: pytest --collect-only -q",
                    f"{statistics.median(with_plugin) * 1e3:.0f}",
                ],
                [
                    f"{label}: same with -p no:rollout_golden",
                    f"{statistics.median(without) * 1e3:.0f}",
                ],
                [f"{label}: **added by the plugin**", f"{added:.0f}"],
            ]
            quick_note = " (--quick)" if quick else ""
            targets.append(
                Target(
                    f"plugin adds < {TARGET_MS:g} ms to pytest start-up, {label}{quick_note}",
                    f"{added:.0f} ms",
                    added < TARGET_MS,
                )
            )
        loaded, heavy = _heavy_imports(root)
    own_ms, total_ms = _plugin_import_ms(3 if quick else 5)

    rows += [
        [f"python -X importtime: {PLUGIN} once pytest is imported", f"{own_ms:.1f}"],
        [f"python -X importtime: pytest + {PLUGIN}", f"{total_ms:.1f}"],
    ]
    body = table(["measure", "ms"], rows) + (
        f"\n\n{pairs} pairs of runs in fresh subprocesses (order alternating, one warm-up pair);"
        " *added* is the median of the differences within pairs. The project has 20 plain"
        f" tests in `test_plain.py`, the only file collected; the second one also has"
        f" {GOLDEN_FILES} other test files with {GOLDEN_TESTS} goldens each (5 files per golden)"
        f" under `golden/`. Flags: `{' '.join(QUIET)}`. Import times are medians of a few"
        " `-X importtime` runs."
        f"\n\nModules loaded by a pytest run with the plugin and no golden test: {PLUGIN}"
        f" {'loaded' if loaded else '**NOT loaded**'};"
        f" {', '.join(heavy) + ' **imported**' if heavy else 'neither torch nor numpy imported'}."
    )
    targets += [
        Target(
            "loading the plugin imports neither torch nor numpy",
            ", ".join(heavy) + " imported" if heavy else "neither imported",
            loaded and not heavy,
        ),
    ]
    return Section(title, body, targets)
