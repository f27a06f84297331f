"""The figures the docs show, drawn by the plugin's own plotting: one function per PNG of
``docs/figures/``, each making the goldens it draws on the fly and running the command a
user would run (``rollout-golden plot``, ``rollout-golden bisect --plot``).

Pixels differ between machines and matplotlib versions, so a figure is not compared to the
byte. What is pinned instead is what it draws: every call of the plugin's drawing functions
is captured while a figure is made, and the digest of those arguments (the curves, the
allowances, the bands, the titles; for a bisect, the commits by position, not by hash, which
differs with the machine's torch) together with the source of the drawing modules is
recorded in ``docs/figures/figures.json`` with the picture's size in pixels.
``test_docs.py`` redraws every figure and compares both. Redraw them all with
``python tests/project/doc_figures.py``, or some: ``python tests/project/doc_figures.py
bisect.png``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import math
import os
import shutil
import struct
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "unit"))  # nightly.py: simulated histories
from doc_outputs import BISECT, ROOT, bisect_env, bisected, run_pytest

FIGURES = ROOT / "docs" / "figures"
MANIFEST = FIGURES / "figures.json"
DRAWING = {  # what draws each kind of call: its source is in the figure's digest
    "metrics": ("pytest_rollout_golden/_internal/report/plot.py",),
    "bisect": (
        "pytest_rollout_golden/_internal/report/plot.py",
        "pytest_rollout_golden/_internal/commits/timeline.py",
    ),
    "changes": (
        "pytest_rollout_golden/_internal/report/plot.py",
        "pytest_rollout_golden/_internal/history/changes_plot.py",
        "pytest_rollout_golden/_internal/history/changepoints.py",
        "pytest_rollout_golden/_internal/history/changes.py",
    ),
}  # their source is in the digest
MAX_BYTES = 150_000  # a figure stays small: the repository carries every version of it

DRAWN: dict[str, Callable[[Path, Path], None]] = {}


def figure(name: str) -> Callable[[Callable[[Path, Path], None]], Callable[[Path, Path], None]]:
    def register(function: Callable[[Path, Path], None]) -> Callable[[Path, Path], None]:
        DRAWN[name] = function
        return function

    return register


def plot_cli(work: Path, *args: str) -> None:
    """``rollout-golden ARGS`` run in ``work`` (relative paths: a title names no temporary
    folder), in this process, so that its drawing calls are captured."""
    from pytest_rollout_golden.cli import main

    with contextlib.chdir(work):
        code = main(list(args))
    assert code == 0, (args, code)


# ---------------------------------------------------------------- docs/reference/cli.md


def record_steps(directory: Path, values: Callable[[int], dict[str, float]], steps: int) -> None:
    from pytest_rollout_golden import Golden, Mode

    with Golden(directory, mode=Mode.UPDATE) as golden:
        for step in range(steps):
            golden.check(values(step), step=step)


def training(
    step: int, names: tuple[str, ...], *, bug: float = 0.0, noise: float = 0.0
) -> dict[str, float]:
    """A GRPO run's metrics ``names`` at ``step`` (two: a figure of two panels fits a page's
    width): ``bug`` scales the loss from step 4 on; ``noise`` moves every value by up to that
    relative amount (a reduction order's last bits)."""
    wobble = 1 + noise * math.sin(3.1 * step + 1)
    loss = (0.6 * math.exp(-step / 6) + 0.05 * math.sin(step)) * (1 + (bug if step >= 4 else 0))
    values = {
        "pg_loss": loss * wobble,
        "kl": 1e-3 * (1 + step) * wobble,
        "grad_norm": (1.2 - 0.05 * step) * wobble,
    }
    return {name: values[name] for name in names}


@figure("drift.png")
def drift(work: Path, out: Path) -> None:
    """A recorded golden against a replay whose loss is scaled by 1 + 1e-3 from step 4 on
    (beyond the default rtol 1e-4), its other metrics 2e-6 off (within it)."""
    (work / "pytest.ini").write_text("[pytest]\n")
    names = ("pg_loss", "grad_norm")
    record_steps(work / "recorded", lambda s: training(s, names), 10)
    record_steps(work / "replayed", lambda s: training(s, names, bug=1e-3, noise=2e-6), 10)
    plot_cli(work, "plot", "recorded", "replayed", "-o", str(out))


# ---------------------------------------------------------------- docs/guide/long-runs.md

LONG_TEST = """\
import json, math, pathlib

HERE = pathlib.Path(__file__).parent
BUG = json.loads((HERE / "bug.json").read_text()) if (HERE / "bug.json").exists() else 0.0


def test_long(golden):
    counter = HERE / "runs.txt"
    run = int(counter.read_text()) if counter.exists() else 0
    if not golden.certifying:  # the float64 oracle run of calibration drifts not: no count
        counter.write_text(str(run + 1))  # 0: the recording; then each calibration run
    for step in range(16):
        drifts = run and not golden.certifying
        # runs part more and more as the steps go on, as a bf16 run's do
        spread = 4e-4 * (1 + step) * math.sin(1.7 * run + step) if drifts else 0.0
        loss = 0.9 * math.exp(-step / 10) + 0.3 + spread
        grad_norm = 1.0 + 0.02 * step - spread / 2 + (BUG if step >= 9 else 0.0)
        golden.check({"loss": loss, "grad_norm": grad_norm}, step=step)
"""


@figure("envelope.png")
def envelope(work: Path, out: Path) -> None:
    """A 16-step run recorded, calibrated over 4 runs (its envelope), and a later run of it
    drawn against it: its loss within the band, its grad_norm 0.02 off from step 9 on."""
    project = work / "long"
    project.mkdir()
    (project / "pytest.ini").write_text("[pytest]\n")
    (project / "test_long.py").write_text(LONG_TEST)
    run_pytest(project)
    run_pytest(project, "--golden-calibrate", "4")
    golden = project / "golden" / "test_long" / "test_long"
    shutil.copytree(golden, work / "calibrated")
    (project / "runs.txt").write_text("7")
    (project / "bug.json").write_text("0.02")
    run_pytest(project, "--update-golden")
    shutil.copytree(golden, work / "later")
    (work / "pytest.ini").write_text("[pytest]\n")
    plot_cli(work, "plot", "calibrated", "later", "-o", str(out))


# ---------------------------------------------------------------- docs/guide/lanes.md


@figure("lanes.png")
def lanes(work: Path, out: Path) -> None:
    """One golden with two lanes: a CPU's values and a GPU's, 3e-4 apart (another kernel's
    rounding, beyond the default rtol 1e-4: why the GPU records a lane of its own)."""
    import torch

    from pytest_rollout_golden import Golden, Mode
    from pytest_rollout_golden._internal.golden.lanes import LaneSetting

    directory = work / "golden" / "test_grpo" / "test_step"
    for lane, noise in (("cpu", 0.0), ("cuda-sm90", 3e-4)):
        setting = LaneSetting(lane, "test")
        with Golden(
            directory, mode=Mode.UPDATE, lane=setting, test_id="test_grpo.py::test_step"
        ) as g:
            for step in range(8):
                g.rollout(lambda s=step: {"ids": torch.arange(4) + s}, step=step)
                g.check(training(step, ("pg_loss", "kl"), noise=noise), step=step)
    (work / "pytest.ini").write_text("[pytest]\n")
    golden = "golden/test_grpo/test_step"
    plot_cli(work, "plot", f"{golden}@cpu", f"{golden}@cuda-sm90", "-o", str(out))


# ---------------------------------------------------------------- docs/guide/bisect.md


@figure("bisect.png")
def bisect_timeline(work: Path, out: Path) -> None:
    """The bisect of the guide's session (doc_outputs.bisected: 31 commits, the bug at 11,
    16 does not collect), again with ``--plot``: every commit it tries is in the cache."""
    from pytest_rollout_golden.cli import main

    repo, _ = bisected(work)
    saved = dict(os.environ)
    os.environ.update(bisect_env(repo))  # the cache's environment: the first bisect's
    try:
        quiet = io.StringIO()  # what it prints, the guide shows
        with (
            contextlib.redirect_stdout(quiet),
            contextlib.redirect_stderr(quiet),
            contextlib.chdir(repo),
        ):
            main([*BISECT, "--plot", str(out), "--", "test_calc.py"])
    finally:
        os.environ.clear()
        os.environ.update(saved)


# ------------------------------------------------ docs/guide/history.md: change points


@figure("changepoint.png")
def changepoint(work: Path, out: Path) -> None:
    """200 simulated nightly runs of one metric (``tests/unit/nightly.py``: noise of sd 1% of
    the tolerance) with a shift of 3% of the tolerance planted on night 120 (run 121), as a
    ``--golden-history`` folder, drawn by ``rollout-golden history hist changes --plot``."""
    from nightly import nightly, write_history

    from pytest_rollout_golden.cli import main

    write_history(work / "hist", nightly(runs=200, shifts={120: 0.03}))
    quiet = io.StringIO()  # what it prints, the guide shows
    with contextlib.redirect_stdout(quiet), contextlib.chdir(work):
        code = main(["history", "hist", "changes", "--plot", str(out)])
    assert code == 1, quiet.getvalue()  # 1: a change point


# ---------------------------------------------------------------- capture and manifest


def plain(value: Any) -> Any:
    """``value`` as JSON-ready data, floats exactly (``repr``), mappings with sorted keys."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return plain(dataclasses.asdict(value))
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = [plain(v) for v in value]
        return sorted(items, key=repr) if isinstance(value, (set, frozenset)) else items
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, Path):
        return value.name
    return value


def changes_drawn(series: Any, changes: Any, commits: Any, runs: Any, title: str) -> dict[str, Any]:
    """What a history's picture shows: the distances to 9 digits (a libm's last bit in
    ``random.gauss`` must not change the digest), each change point's runs, means to 9
    digits and statistic to 3, the commits and the title."""
    return plain(
        {
            "series": [round(x, 9) for x in series],
            "changes": [
                (c.index, c.earliest, c.latest, c.alarm, c.window, c.exact,
                 round(c.before, 9), round(c.after, 9), round(c.statistic, 3),
                 round(c.threshold, 3))
                for c in changes
            ],
            "commits": None if commits is None else list(commits),
            "runs": None if runs is None else list(runs),
            "title": title,
        }
    )  # fmt: skip


def bisect_drawn(result: Any) -> dict[str, Any]:
    """What a bisect's picture shows, its commits by place (1: the first after --good), not
    by hash: a history's hashes change with the torch that recorded its goldens."""
    place = {c.sha: n for n, c in enumerate(result.commits, start=1)}
    place[result.good.sha] = 0
    first = result.first_bad_run
    return plain(
        {
            "commits": [c.subject for c in result.commits],
            "tried": [(place[r.commit.sha], r.outcome, r.reason) for r in result.tried],
            "candidates": [place[c.sha] for c in result.candidates],
            "first": None if first is None or first.first is None else first.first,
        }
    )


@contextlib.contextmanager
def captured() -> Iterator[list[Any]]:
    """The arguments of every call of the drawing functions while the block runs."""
    from pytest_rollout_golden._internal.commits import timeline
    from pytest_rollout_golden._internal.history import changes_plot
    from pytest_rollout_golden._internal.report import plot

    calls: list[Any] = []
    real_metrics, real_bisect = plot.plot_metrics, timeline.plot_bisect
    real_changes = changes_plot.plot_changes

    def metrics(a: Any, out: Path, **kwargs: Any) -> Any:
        calls.append({"drawn by": "metrics", **plain({"a": a, "out": out, **kwargs})})
        return real_metrics(a, out, **kwargs)

    def bisect(result: Any, out: Path) -> Any:
        calls.append({"drawn by": "bisect", **bisect_drawn(result)})
        return real_bisect(result, out)

    def changes(series: Any, found: Any, out: Path, *, title: str, **kwargs: Any) -> Any:
        commits, runs = kwargs.get("commits"), kwargs.get("runs")
        drawn = changes_drawn(series, found, commits, runs, title)
        calls.append({"drawn by": "changes", **drawn})
        return real_changes(series, found, out, title=title, **kwargs)

    plot.plot_metrics, timeline.plot_bisect = metrics, bisect
    changes_plot.plot_changes = changes
    try:
        yield calls
    finally:
        plot.plot_metrics, timeline.plot_bisect = real_metrics, real_bisect
        changes_plot.plot_changes = real_changes


def png_size(path: Path) -> tuple[int, int]:
    """Width and height of a PNG, from its header."""
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{path}: not a PNG"
    return struct.unpack(">II", head[16:24])


def draw(name: str, out: Path) -> dict[str, Any]:
    """Draw figure ``name`` into ``out`` in a fresh folder; its manifest entry: the digest
    of what was drawn and of the drawing code, and the size in pixels."""
    with tempfile.TemporaryDirectory() as tmp, captured() as calls:
        saved = dict(os.environ)
        os.environ.pop("CI", None)  # a developer's desk: the figures' goldens are recorded
        try:
            DRAWN[name](Path(tmp), out)
        finally:
            os.environ.clear()
            os.environ.update(saved)
    assert calls, f"{name}: nothing was drawn by the plugin's plotting"
    drawn = json.dumps(calls, sort_keys=True).encode()
    paths = sorted({path for call in calls for path in DRAWING[call["drawn by"]]})
    code = b"".join((ROOT / path).read_bytes() for path in paths)
    digest = hashlib.sha256(code + drawn).hexdigest()
    width, height = png_size(out)
    return {"inputs": digest, "width": width, "height": height}


def main(names: list[str]) -> None:
    """Draw the figures ``names`` (none: every one) into docs/figures/, and their entries
    of the manifest."""
    FIGURES.mkdir(exist_ok=True)
    manifest = json.loads(MANIFEST.read_text()) if MANIFEST.exists() else {}
    for name in names or DRAWN:
        manifest[name] = draw(name, FIGURES / name)
    manifest = {name: manifest[name] for name in DRAWN if name in manifest}
    MANIFEST.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    for name, entry in manifest.items():
        size = (FIGURES / name).stat().st_size
        print(f"{name}: {entry['width']}x{entry['height']} px, {size} bytes")


if __name__ == "__main__":
    main(sys.argv[1:])
