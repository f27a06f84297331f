"""The cost of the long-run gates: a 200-step golden of 20 metrics replayed with and without
its envelope (per-step bands, bias) and the default trend bounds, and the golden's size on
disk.

Both replays run the same ``golden.check`` calls in one process, interleaved round after
round; the figure is the median of per-round ratios of a whole replay (open, 200 checks,
finish). The golden is written through the real calibration writer (``calibration.write``)
with bands of every metric, as ``--golden-calibrate`` writes them for a long bf16 run.
"""

from __future__ import annotations

import math
import random
import statistics
import tempfile
from pathlib import Path
from typing import Any

from harness import Section, Target, interleaved, ms, table

from pytest_rollout_golden import Golden
from pytest_rollout_golden._internal.tolerance import calibration, envelope
from pytest_rollout_golden._internal.tolerance.stack import Stack

STEPS, METRICS = 200, 20
# What the gates may add to a replay, per metric and step, one-time reads included: a tenth
# of a millisecond is nothing next to the training step that computed the metric.
TARGET_MS_PER_VALUE = 0.1
TARGET_KIB = 1024  # a 200-step golden of 20 metrics, envelope included, stays under 1 MiB


def _values(step: int, noise: float = 0.0) -> dict[str, float]:
    """One step's metrics: smooth curves, ``noise`` relative added."""
    out = {}
    for i in range(METRICS):
        name = f"mismatch/metric_{i}" if i % 4 == 0 else f"metric_{i}"
        out[name] = (1.0 + 0.1 * i) * (1.0 + 0.3 * math.sin(step / 17 + i)) * (1 + noise)
    return out


def _record(directory: Path) -> None:
    with Golden(directory) as golden:
        for step in range(STEPS):
            golden.check(_values(step), step=step)


def _runs(count: int) -> list[dict[str, dict[str, tuple[float, str]]]]:
    """Calibration runs that drift from the golden more and more over the steps."""
    rng = random.Random(0)
    runs = []
    for _ in range(count):
        run = {}
        for step in range(STEPS):
            noise = 1e-3 * (step / STEPS) * rng.uniform(-1, 1)
            run[str(step)] = {k: (v, "float32") for k, v in _values(step, noise).items()}
        runs.append(run)
    return runs


def _calibrate(directory: Path) -> None:
    """An envelope.json of every metric, written as calibration writes it."""
    golden = {str(s): {k: (v, "float32") for k, v in _values(s).items()} for s in range(STEPS)}
    magnitude = {k: max(abs(v[k][0]) for v in golden.values()) for k in golden["0"]}.get
    resolver = Stack().resolver()
    found, _, _ = envelope.bands(
        golden,
        [(run, ()) for run in _runs(9)],
        base=lambda name, dtype: resolver.resolve(name, (dtype,))[0],
        magnitude=magnitude,
    )
    calibration.write(directory, None, envelope=envelope.document({"same layout": found}, {}))


def _replay(directory: Path, trends: dict[str, Any] | None = None) -> Any:
    with Golden(directory, trends=trends) as golden:
        for step in range(STEPS):
            golden.check(_values(step), step=step)
    return golden.outcome


def run(quick: bool) -> Section:
    rounds = 3 if quick else 9
    with tempfile.TemporaryDirectory() as tmp:
        plain, gated = Path(tmp) / "plain", Path(tmp) / "gated"
        _record(plain)
        _record(gated)
        _calibrate(gated)
        every = {"*": ["growth<=1e9", "slope<=1e9"]}  # both statistics of every metric
        outcome = _replay(gated, every)
        banded = sum(
            c.kind == "metric" and "envelope.json" in c.tolerance_source
            for c in outcome.comparisons
        )
        biased = sum(c.kind == "bias" for c in outcome.comparisons)
        trended = sum(c.kind == "trend" for c in outcome.comparisons)
        samples = interleaved(
            {
                "without gates": lambda: _replay(plain),
                "envelope, bias, trends": lambda: _replay(gated, every),
            },
            rounds,
        )
        sizes = {p.name: p.stat().st_size for p in sorted(gated.iterdir())}
    ratios = [
        g / p
        for p, g in zip(
            samples["without gates"].seconds, samples["envelope, bias, trends"].seconds, strict=True
        )
    ]
    ratio = statistics.median(ratios)
    gated, plain_s = samples["envelope, bias, trends"].median, samples["without gates"].median
    per_value = (gated - plain_s) * 1e3 / (STEPS * METRICS)
    rows = [[name, ms(s.median), f"{ms(s.median / STEPS)}"] for name, s in samples.items()]
    body = table(["replay of 200 steps x 20 metrics", "ms", "ms per step"], rows)
    body += "\n\n" + table(
        ["golden file", "KiB"], [[name, f"{size / 1024:.1f}"] for name, size in sizes.items()]
    )
    total = sum(sizes.values()) / 1024
    body += (
        f"\n\nThe gated replay held {banded} values to their bands, checked {biased} bias and "
        f"{trended} trend statistics; it took {ratio:.2f}x the time of the replay without "
        f"gates (median of {rounds} interleaved rounds' ratios), {per_value:.3f} ms more per "
        f"metric and step, its one-time reads of envelope.json included. The golden with its "
        f"envelope is {total:.0f} KiB."
    )
    targets = [
        Target(
            f"long-run gates add under {TARGET_MS_PER_VALUE} ms per metric and step",
            f"{per_value:.3f} ms ({ratio:.2f}x a replay of the checks alone)",
            per_value <= TARGET_MS_PER_VALUE,
        ),
        Target(
            f"a 200-step golden of 20 metrics with its envelope under {TARGET_KIB} KiB",
            f"{total:.0f} KiB",
            total <= TARGET_KIB,
        ),
    ]
    return Section("Long-run gates: time per step and size on disk", body, targets)
