"""Measure how far verl 0.7's legacy actor moves under same-math changes and seeded bugs.

Run from the repo root, with verl 0.7 first on the path::

    PYTHONPATH=.venv/verl07 .venv/bin/python tests/realtrainer/verl/measure.py

Every case of ``actor_harness.ALL_CASES`` runs 3 steps on the same rollout batches
(``make_batch(step)``); each is compared with its reference (``mb8``: micro-batch 8,
padded, static batch, seq-mean-token-mean; ``tm_mb4`` with ``tm_mb8``, both token-mean).
For every metric ``update_policy`` returns (reduced as verl's trainer does: mean of the
per-micro-batch / per-mini-batch lists) and for the old-log-prob tensor (masked by
``response_mask``) it prints, over the 3 steps:

* ``max_rel``  max |a-e| / |e|
* ``max_abs``  max |a-e|
* ``rel_mag``  max |a-e| / max over steps |e| (for the tensor: / max |e| over the masked tensor)

and the values per step. ``mb8 (rerun)`` repeats the reference in the same process
(bitwise determinism). ``ue_*``: update_policy logs its own ``actor/entropy``
(``calculate_entropy=True``), a mean over micro-batches, instead of the trainer's.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import actor_harness as H
import torch


def run_case(kwargs):
    start = time.perf_counter()
    run = H.ActorRun(**kwargs)
    steps = []
    for step in range(H.STEPS):
        steps.append(run.step(H.make_batch(step)))
    return steps, time.perf_counter() - start


def _ratio(diff, scale):
    if scale:
        return diff / scale
    return 0.0 if diff == 0 else float("inf")


def compare(actual, expected):
    rows = []
    names = sorted(set(expected[0].metrics) | set(actual[0].metrics))
    for name in names:
        a = [s.metrics.get(name, float("nan")) for s in actual]
        e = [s.metrics.get(name, float("nan")) for s in expected]
        diffs = [abs(x - y) for x, y in zip(a, e, strict=True)]
        rel = [_ratio(d, abs(y)) for d, y in zip(diffs, e, strict=True)]
        rel_mag = _ratio(max(diffs), max(abs(y) for y in e))
        rows.append((name, max(rel), max(diffs), rel_mag, a, e))
    a = torch.cat([s.old_log_prob[s.response_mask] for s in actual])
    e = torch.cat([s.old_log_prob[s.response_mask] for s in expected])
    diff = (a - e).abs()
    rel = diff / e.abs()
    rows.append(
        (
            "old_log_prob/log_probs (masked)",
            float(rel.max()),
            float(diff.max()),
            float(diff.max() / e.abs().max()),
            None,
            None,
        )
    )
    return rows


def fmt(values):
    return "[" + ", ".join(f"{v:.7g}" for v in values) + "]"


def main() -> None:
    t0 = time.perf_counter()
    H.install_cpu_shims()
    threads = torch.get_num_threads()
    print(f"# verl actor lane measurement; torch {torch.__version__}, threads {threads}")
    print(f"# shims+imports {time.perf_counter() - t0:.2f}s; {H.STEPS} steps per case")
    results, timings, sizes = {}, {}, {}
    cases = {**H.ALL_CASES, **H.UPDATE_ENTROPY, "mb8 (rerun)": H.ALL_CASES["mb8"]}
    order = list(cases)
    for case in order:
        kwargs = cases[case]
        results[case], timings[case] = run_case(kwargs)
        sizes[case] = [s.micro_batch_sizes for s in results[case]]
    print()
    print("# runtime per case (s) and micro-batch sizes per step (per mini-batch)")
    for case in order:
        print(f"{case:18s} {timings[case]:6.2f}s  {sizes[case]}")
    for case in order:
        ref = (
            H.TOKEN_MEAN_REFERENCE
            if case in H.TOKEN_MEAN
            else H.UPDATE_ENTROPY_REFERENCE
            if case in H.UPDATE_ENTROPY
            else H.REFERENCE
        )
        if case == ref:
            continue
        kind = (
            "same-math"
            if case in H.SAME_MATH or case in H.UPDATE_ENTROPY or case == "mb8 (rerun)"
            else ("seeded bug" if case in H.BUGGED else "token-mean micro-batching (real change)")
        )
        print()
        print(f"## {case} vs {ref}   [{kind}]  {cases[case]}")
        header = f"{'metric':34s} {'max_rel':>10s} {'max_abs':>10s} {'rel_mag':>10s}"
        print(header + "  values (a) / reference (e)")
        for name, rel, ab, rel_mag, a, e in compare(results[case], results[ref]):
            line = f"{name:34s} {rel:10.3g} {ab:10.3g} {rel_mag:10.3g}"
            if a is not None:
                line += f"  {fmt(a)} / {fmt(e)}"
            print(line)


if __name__ == "__main__":
    main()
