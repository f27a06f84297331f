"""The long-run gates measured on the runs of ``traces.py``: false alarms on unchanged code
and same-math variants, detections of seeded defects, per setting and gate.

    python benchmarks/longrun/gates.py TRACES [--extra MORE] [--settings A,B] [--per-metric]
        [--calibrate-also mb8]

Each seed of each setting is one golden test: its golden run is the recording, its
calibration runs (the reference and two same-math variants under three thread counts, what
``pytest --golden-calibrate 3`` runs over ``same_math([...])``) make the calibrated
tolerances and the envelope exactly as the plugin makes them (``calibration.spreads`` /
``tolerance_for``, ``envelope.bands`` / ``read``), and every held-out run (unchanged code at
another thread count, same-math variants not calibrated) and every defect run is replayed
against them with each gate:

* ``per-step``: the calibrated ``tolerances.json`` alone (one tolerance per metric over all
  steps: what the plugin did before envelopes);
* ``envelope``: each step's band where the metric has one, else the per-step tolerance
  (what replay does now);
* ``trend``: the trend bounds in force by default (``growth<=2`` on the train-inference
  gap metrics);
* ``bias``: the bias statistic over steps against the bound calibration wrote.

Candidates (not in the plugin), for a replay of the calibrated variant mb4 (reordered, or
with a defect) and for each calibrated variant's 1- and 4-thread run against a calibration
made without it:

* ``self bias``: the bias statistic against the variant's own 2-thread calibration run
  instead of the golden, in units of the band replay held each step, bounded as calibration
  bounds the bias gate but from the variant's own runs;
* ``self lane (all)``: every replay gate with the variant's own runs as a same-layout lane.

A run counts as flagged by a gate when any metric fails it; the table gives flagged / seeds,
``-`` where a candidate does not apply.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_rollout_golden._internal.golden import checks
from pytest_rollout_golden._internal.results import Verdict
from pytest_rollout_golden._internal.tolerance import calibration, envelope, trends
from pytest_rollout_golden._internal.tolerance.build import GoldenStack
from pytest_rollout_golden._internal.tolerance.spec import Layer
from pytest_rollout_golden._internal.tolerance.stack import Stack

Series = Mapping[str, Sequence[float]]  # metric -> value per step
Numbers = dict[str, dict[str, tuple[float, str]]]


def numbers(series: Series, dtype: str = "float32") -> Numbers:
    """``{step: {name: (value, dtype)}}`` of a trace (what calibration samples hold)."""
    out: Numbers = {}
    for name, values in series.items():
        for step, value in enumerate(values):
            out.setdefault(str(step), {})[name] = (float(value), dtype)
    return out


def magnitudes(golden: Series) -> Callable[[str], float | None]:
    found = {
        n: max((abs(v) for v in vs if math.isfinite(v)), default=0.0) for n, vs in golden.items()
    }
    return found.get


def recorded_steps(golden: Series) -> Callable[[str], int]:
    """Per metric, how many steps the golden holds a finite value at (what replay counts)."""
    found = {n: sum(1 for v in vs if math.isfinite(v)) for n, vs in golden.items()}
    return lambda name: found.get(name, 0)


def calibrated_stack(golden: Series, runs: Sequence[Series]) -> Stack:
    """The tolerance stack replay has after ``--golden-calibrate``: tolerances.json's entries
    (what calibration writes; refused entries keep the default) over the built-in
    defaults."""
    resolver = Stack().resolver()
    magnitude = magnitudes(golden)
    found = calibration.spreads([numbers(golden), *map(numbers, runs)], recorded=1)
    entries = {}
    for name, spread in found.items():
        base = resolver.resolve(name, ("float32",))[0]
        tol = calibration.tolerance_for(spread, base)
        if tol is None or calibration.refusal(tol, base, spread):
            continue
        written = {"rtol": tol.rtol, "atol": tol.atol, "scale": tol.scale}
        if not calibration.entry_problem(written, name, magnitude(name)):
            entries[name] = tol
    return Stack(calibrated=Layer(calibration.SOURCE, entries))


def bands(golden: Series, runs: Sequence[Series], variant: bool) -> envelope.Envelope | None:
    """The envelope replay reads, of the lane of a variant or of the reference."""
    magnitude = magnitudes(golden)
    found, _, drifting = envelope.bands(
        numbers(golden),
        [(numbers(r), ()) for r in runs],
        base=lambda name, dtype: Stack().resolver().resolve(name, (dtype,))[0],
        magnitude=magnitude,
    )
    lane = "across variants" if variant else "same layout"
    content = envelope.document({lane: found}, {})
    if variant and drifting:
        content[envelope.DRIFTING] = drifting
    return envelope.read(
        content, Path("envelope.json"), magnitude=magnitude,
        recorded_steps=recorded_steps(golden), layout_variant=variant,
    )  # fmt: skip


def step_failures(
    golden: Series, run: Series, stack: Stack, env: envelope.Envelope | None
) -> tuple[set[str], set[str], set[str], dict[str, dict[int, float]]]:
    """``(metrics failing the calibrated per-step tolerances, metrics failing with the
    envelope, metrics beyond their bias bound, per metric and step the distance a band
    allowed)``, each step resolved as replay resolves it."""
    magnitude = magnitudes(golden)
    alone, with_envelope = set(), set()
    held: dict[str, dict[int, float]] = {}
    plain = stack.replace(drifting=None).resolver()  # before envelopes: tolerances.json alone
    built = GoldenStack(stack, env)  # per step as replay resolves it (tolerance.build)
    for step in range(len(next(iter(golden.values())))):
        at_step = plain if env is None else built.at(step)
        for name, expected in golden.items():
            g, a = expected[step], run[name][step]
            if not (math.isfinite(g) and math.isfinite(a)):
                if not (math.isnan(g) and math.isnan(a)):
                    alone.add(name), with_envelope.add(name)
                continue
            scale = magnitude(name) or 0.0
            if abs(a - g) > plain.resolve(name, ("float32",))[0].allowance(g, scale):
                alone.add(name)
            tol, source = at_step.resolve(name, ("float32",))
            if not tol.ignore and abs(a - g) > tol.allowance(g, scale):
                with_envelope.add(name)
            if envelope.band_source(source):
                held.setdefault(name, {})[step] = tol.allowance(g, scale)
    found = [] if env is None else envelope.biases(env, numbers(golden), numbers(run), held)
    return alone, with_envelope, {b.name for b in found if not b.holds}, held


LANE_OF = {
    "unchanged": "same layout",
    "same-math": "across variants",
    "bug": "same layout",
    "variant bug": "across variants",
}


def left_out(seed: Mapping[str, Any]) -> list[tuple[str, Any, Series]]:
    """Each calibrated variant left out of the calibration in turn: ``(label, the lane
    calibrated without it, its run at the default threads)``."""
    runs = seed["calibration"]
    out = []
    for variant in ("mb2", "mb4"):
        lane = [c["metrics"] for c in runs if c["variant"] != variant]
        run = next(c["metrics"] for c in runs if c["label"] == f"{variant}-threads2")
        out.append((f"{variant} (left out of calibration)", lane, run))
    return out


def lanes(seed: Mapping[str, Any]) -> dict[str, list[Series]]:
    """The calibration runs of each lane: the reference's own (same layout), and the
    reference's with the variants' (across variants)."""
    runs = seed["calibration"]
    return {
        "same layout": [c["metrics"] for c in runs if c["variant"] == "reference"],
        "across variants": [c["metrics"] for c in runs],
    }


def trend_gate(golden: Series, run: Series, env: Any, *, replay: bool) -> set[str]:
    """The metrics whose default trend bounds fail over ``run``: recording (no golden), or
    replaying against ``golden`` with the lane's envelope (a bound the calibration runs
    come near is raised to a margin over theirs there)."""
    recorded = numbers(golden) if replay else None
    found = trends.evaluate(numbers(run), trends.TrendBounds(), recorded)
    comparisons = [checks.trend_comparison(c, env if replay else None) for c in found]
    return {c.name for c in comparisons if c.verdict == Verdict.FAIL}


def self_bias(
    own: Series, own_runs: Sequence[Series], run: Series, held: Mapping[str, Mapping[int, float]]
) -> set[str]:
    """The candidate self-paired bias gate: the metrics whose mean deviation from the
    variant's ``own`` run, in units of the distance the lane's band allowed each step
    (``held``), exceeds the bound the variant's ``own_runs`` give (:func:`envelope.bias_bound`
    with the variant's own run in place of the golden)."""
    mine, others = numbers(own), [numbers(r) for r in own_runs]
    out = set()
    for name, allowed in held.items():
        bound = envelope.bias_bound(name, mine, others, allowed)["bound"]
        measured = envelope.deviation(name, mine, numbers(run), allowed)
        if bound is not None and measured is not None and abs(measured[0]) > bound:
            out.add(name)
    return out


def gates_of(
    golden: Series,
    run: Series,
    lane: Sequence[Series],
    variant: bool,
    own: tuple[Series, Sequence[Series]] | None = None,
) -> dict[str, set[str]]:
    """Per gate, the metrics that flag ``run`` against ``golden`` calibrated on ``lane``;
    with ``own`` (a calibrated variant's run and its calibration runs) the self-paired bias
    too."""
    stack, env = calibrated_stack(golden, lane), bands(golden, lane, variant)
    if variant and env is not None:
        stack = stack.replace(variant=True, drifting=env.drifting_layer())
    alone, with_envelope, biased, held = step_failures(golden, run, stack, env)
    found = {
        "per-step": alone,
        "envelope": with_envelope,
        "trend (recording)": trend_gate(golden, run, None, replay=False),
        "trend (replay)": trend_gate(golden, run, env, replay=True),
        "bias": biased,
    }
    found["replay (all)"] = found["envelope"] | found["trend (replay)"] | found["bias"]
    if own is not None:
        found["self bias"] = self_bias(*own, run, held)
        found["replay + self bias"] = found["replay (all)"] | found["self bias"]
    return found


BUG_LABELS = ("loss_x1.001", "logprob_gap_3x", "kl_3x")
# The calibrated variant a replay runs as (its same_math / variants() id): a reordering of
# mb4's sums keeps mb4's id, and the defects seeded into mb4 run as mb4.
VARIANT_OF = {"mb4-reversed": "mb4", **{f"mb4+{b}": "mb4" for b in BUG_LABELS}}
DEFAULT_THREADS = 2  # the thread count the golden and each variant's first run used


def own_lane(
    seed: Mapping[str, Any], variant: str, without: str = ""
) -> tuple[Series, list[Series]]:
    """A calibrated variant paired with itself: ``(its run at the default thread count, the
    calibration runs of that variant but ``without``)``."""
    runs = [c for c in seed["calibration"] if c["variant"] == variant and c["label"] != without]
    own = next(c["metrics"] for c in runs if c["threads"] == DEFAULT_THREADS)
    return own, [c["metrics"] for c in runs]


def self_lane(own: Series, run: Series, own_runs: Sequence[Series]) -> set[str]:
    """Every replay gate with the variant's own run as the golden and its own runs as the
    band (a same-layout lane per variant)."""
    return gates_of(own, run, own_runs, variant=False)["replay (all)"]


def own_thread_replays(seed: Mapping[str, Any]) -> list[tuple[str, str, Series]]:
    """Each calibrated variant's run at 1 and at 4 threads, replayed as a calibration made
    without it would see it: ``(row label, run label, run)``."""
    out = []
    for variant in ("mb2", "mb4"):
        for threads, others in ((1, "2/4"), (4, "2/1")):
            label = f"{variant}-threads{threads}"
            run = next(c["metrics"] for c in seed["calibration"] if c["label"] == label)
            out.append((f"{variant} at {threads} threads (calibrated at {others})", label, run))
    return out


def evaluate(setting: Mapping[str, Any]) -> dict:
    """Per run label: per gate, how many seeds flagged it, and by which metrics."""
    flagged: dict[str, Counter] = defaultdict(Counter)
    by_metric: dict[tuple[str, str], Counter] = defaultdict(Counter)
    seeds = setting["seeds"]

    def count(label: str, found: Mapping[str, set[str]]) -> None:
        for gate, names in found.items():
            flagged[label][gate] += bool(names)
            for name in names:
                by_metric[label, gate][name] += 1

    for seed in seeds.values():
        golden, of_lane = seed["golden"]["metrics"], lanes(seed)
        entries = [("golden (recording)", "unchanged", golden)]
        entries += [(e["label"], e["kind"], e["metrics"]) for e in seed["held_out"]]
        entries += left_out(seed)
        entries += [(e["label"], "bug", e["metrics"]) for e in seed["bugs"]]
        entries += [(e["label"], "variant bug", e["metrics"]) for e in seed.get("variant_bugs", ())]
        for label, kind, run in entries:
            if isinstance(kind, str):
                runs, variant = of_lane[LANE_OF[kind]], LANE_OF[kind] == "across variants"
            else:  # a variant left out of calibration: the lane calibrated without it
                runs, variant = kind, True
            own = own_lane(seed, VARIANT_OF[label]) if label in VARIANT_OF else None
            found = gates_of(golden, run, runs, variant, own)
            if own is not None:
                found["self lane (all)"] = self_lane(own[0], run, own[1])
            count(label, found)
        for label, without, run in own_thread_replays(seed):
            runs = [c["metrics"] for c in seed["calibration"] if c["label"] != without]
            own = own_lane(seed, without.split("-")[0], without)
            found = gates_of(golden, run, runs, True, own)
            found["self lane (all)"] = self_lane(own[0], run, own[1])
            count(label, found)
    return {"seeds": len(seeds), "flagged": flagged, "by_metric": by_metric}


def calibrate_also(traces: Mapping[str, Any], labels: Sequence[str]) -> None:
    """Move the held-out runs ``labels`` of every seed into its calibration, each as a variant
    of its own run at the default thread count (a calibration over one more variant)."""
    for setting in traces["settings"].values():
        for seed in setting["seeds"].values():
            moved = [e for e in seed["held_out"] if e["label"] in labels]
            if len(moved) != len(labels):
                raise SystemExit(f"--calibrate-also: no held-out run {sorted(labels)} to move")
            seed["held_out"] = [e for e in seed["held_out"] if e["label"] not in labels]
            for e in moved:
                seed["calibration"].append(
                    {
                        "label": e["label"],
                        "variant": e["label"],
                        "threads": DEFAULT_THREADS,
                        "metrics": e["metrics"],
                    }
                )


COLUMNS = (
    "per-step",
    "envelope",
    "trend (recording)",
    "trend (replay)",
    "bias",
    "replay (all)",
    "self bias",
    "replay + self bias",
    "self lane (all)",
)


def report(traces: Mapping[str, Any], per_metric: bool) -> str:
    lines = []
    for name, setting in traces["settings"].items():
        result = evaluate(setting)
        n = result["seeds"]
        lines.append(f"\n### {name} ({n} seeds, {traces['steps']} steps)\n")
        lines.append("| run | " + " | ".join(COLUMNS) + " |")
        lines.append("| :-- | " + " | ".join("--:" for _ in COLUMNS) + " |")
        for label, counts in result["flagged"].items():
            cells = [f"{counts[g]}/{n}" if g in counts else "-" for g in COLUMNS]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        if per_metric:
            for (label, gate), counts in sorted(result["by_metric"].items()):
                top = ", ".join(f"{m} {c}" for m, c in counts.most_common(6))
                lines.append(f"- {label} / {gate}: {top}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", type=Path)
    parser.add_argument("--per-metric", action="store_true")
    parser.add_argument(
        "--extra", type=Path, action="append", default=[], help="traces of more sections"
    )
    parser.add_argument("--settings", help="comma-separated settings to evaluate (default all)")
    parser.add_argument(
        "--calibrate-also",
        default="",
        help="comma-separated held-out runs (e.g. mb8) to calibrate as one more variant",
    )
    args = parser.parse_args()
    traces = json.loads(args.traces.read_text())
    if args.settings:
        wanted = args.settings.split(",")
        traces["settings"] = {k: v for k, v in traces["settings"].items() if k in wanted}
    for path in args.extra:
        for name, setting in json.loads(path.read_text())["settings"].items():
            for seed, runs in setting["seeds"].items():
                mine = traces["settings"].get(name, {}).get("seeds", {}).get(seed)
                if mine is not None and mine["golden"] == runs["golden"]:
                    mine.update({k: v for k, v in runs.items() if k != "golden"})
    if args.calibrate_also:
        calibrate_also(traces, args.calibrate_also.split(","))
    print(report(traces, args.per_metric))
    return 0


if __name__ == "__main__":
    sys.exit(main())
