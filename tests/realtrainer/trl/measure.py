"""Same-math noise and seeded-bug signal of TRL's GRPOTrainer under batch replay.

Per lane (a loss type), the reference config (per_device_train_batch_size 8, GA 1) generates
and records its batches; every variant replays exactly those batches, so only the training
side differs. For each variant and logged training metric it prints the largest relative
difference ``|a-e|/|e|``, the largest absolute difference, the largest ``|a-e|`` over the
largest ``|e|`` across steps, and the values.

    .venv/bin/python tests/realtrainer/trl/measure.py [--out /tmp/trl_measure.txt]
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import grpo_harness as h


def lanes(dtypes=("float32", "float64", "bf16")) -> dict[str, list[tuple[str, h.Knobs, str]]]:
    """lane -> [(name, knobs, expectation)]; the first entry is the reference."""
    out = {}
    for dtype in dtypes:
        for loss in ("dapo", "grpo", "dr_grpo", "bnpo"):
            if dtype == "bf16" and loss not in ("dapo", "bnpo"):
                continue

            def k(loss=loss, dtype=dtype, **kw):
                if dtype == "bf16":  # TRL's default: float32 weights, CPU autocast to bf16
                    return h.Knobs(loss_type=loss, bf16=True, **kw)
                return h.Knobs(loss_type=loss, dtype=dtype, **kw)

            invariant = "same-math" if loss in ("dapo", "grpo", "dr_grpo") else "REAL change"
            rows = [
                ("reference", k(), "records"),
                ("reference-replay", k(), "bit-exact"),
                ("b4ga2", k(batch=4, ga=2), invariant),
                ("b2ga4", k(batch=2, ga=4), invariant),
                ("b4ga2+drop_ga_scale", k(batch=4, ga=2, bug="drop_ga_scale"), "bug"),
                ("b8ga1+loss_x1.001", k(bug="loss_x1.001"), "1e-3 error"),
            ]
            if loss == "dapo" and dtype != "bf16":
                rows += [
                    (
                        "b4ga2+microbatch_token_mean",
                        k(batch=4, ga=2, bug="microbatch_token_mean"),
                        "bug",
                    ),
                    (
                        "b2ga4+microbatch_token_mean",
                        k(batch=2, ga=4, bug="microbatch_token_mean"),
                        "bug",
                    ),
                    ("b8ga1+loss_on_padding", k(bug="loss_on_padding"), "bug"),
                    ("b8ga1+kl_sign", k(bug="kl_sign"), "bug"),
                ]
            out[f"{loss}/{dtype}"] = rows
    if "float32" in dtypes:  # num_iterations 2: old_per_token_logps, clipping active

        def k2(**kw):
            return h.Knobs(loss_type="dapo", num_iterations=2, steps=4, **kw)

        out["dapo/float32/num_iterations=2"] = [
            ("reference", k2(), "records"),
            ("reference-replay", k2(), "bit-exact"),
            ("b4ga2", k2(batch=4, ga=2), "same-math"),
            ("b2ga4", k2(batch=2, ga=4), "same-math"),
            ("b8ga1+no_clip", k2(bug="no_clip"), "bug"),
            ("b8ga1+loss_x1.001", k2(bug="loss_x1.001"), "1e-3 error"),
        ]
    return out


def rel(a: float, e: float) -> float:
    if a == e:
        return 0.0
    return abs(a - e) / abs(e) if e != 0 else math.inf


def compare(ref: list[dict], got: list[dict]) -> list[str]:
    lines = []
    names = [k for k in h.TRAINING_METRICS if k in ref[0]]
    for name in names:
        e = [r[name] for r in ref]
        a = [g.get(name, math.nan) for g in got]
        scale = max(abs(x) for x in e)
        rels = max(rel(x, y) for x, y in zip(a, e, strict=True))
        abss = max(abs(x - y) for x, y in zip(a, e, strict=True))
        scaled = abss / scale if scale else (0.0 if abss == 0 else math.inf)
        vals = " ".join(f"{x:.6g}" for x in a)
        lines.append(
            f"    {name:24s} rel={rels:9.3g} abs={abss:9.3g} abs/max|e|={scaled:9.3g}  [{vals}]"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="/tmp/trl_measure.txt")
    parser.add_argument("--lanes", nargs="*", default=None, help="e.g. dapo/float32")
    parser.add_argument("--quick", action="store_true", help="skip the b2ga4 rows")
    args = parser.parse_args()
    start = time.perf_counter()
    text: list[str] = []

    def emit(line: str = "") -> None:
        print(line, flush=True)
        text.append(line)

    import torch
    import transformers
    import trl

    emit(
        f"trl {trl.__version__}, transformers {transformers.__version__}, torch {torch.__version__}"
    )
    emit(
        f"tiny Qwen2 hidden {h.HIDDEN}, {h.LAYERS} layers, float32; num_generations "
        f"{h.NUM_GENERATIONS}, max_completion_length {h.MAX_COMPLETION}, {h.STEPS} steps, "
        "beta 0.04, max_grad_norm 1.0, SGD lr 0.2 constant, bf16=False unless the lane says bf16 "
        "(TRL's default bf16=True = CPU autocast)"
    )
    emit("Every variant replays the batches its lane's reference generated (bs8 ga1).")
    emit(
        "kl/entropy/clip_ratio are logged as the unweighted mean over micro-batches of "
        "per-micro-batch token means: they move with micro-batching by definition."
    )
    emit("rel = max over steps |a-e|/|e|; abs = max |a-e|;")
    emit("abs/max|e| = max |a-e| / max over steps |e|")
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = h.build_model_dir(Path(tmp) / "model")
        for lane, rows in lanes().items():
            if args.lanes and lane not in args.lanes:
                continue
            recorder = h.Recorder()
            reference = None
            for i, (name, knobs, expect) in enumerate(rows):
                if args.quick and name.startswith("b2ga4"):
                    continue
                t0 = time.perf_counter()
                logs = h.train(knobs, model_dir, Path(tmp) / f"out-{lane}-{i}", recorder)
                got = [h.training_metrics(x) for x in logs]
                took = time.perf_counter() - t0
                if reference is None:
                    reference = got
                    lengths = [
                        b["completion_mask"].sum(1).tolist() for b in recorder.batches.values()
                    ]
                    emit()
                    emit(
                        f"=== lane loss_type/dtype={lane}: reference {knobs.id} ({took:.1f} s); "
                        f"completion lengths per step {lengths}"
                    )
                    for k in reference[0]:
                        vals = " ".join(f"{r[k]:.6g}" for r in reference)
                        emit(f"    {k:24s} [{vals}]")
                    continue
                emit(f"  -- {name} [{knobs.id}] expected: {expect} ({took:.1f} s)")
                for line in compare(reference, got):
                    emit(line)
    emit()
    emit(f"total runtime {time.perf_counter() - start:.1f} s")
    Path(args.out).write_text("\n".join(text) + "\n")


if __name__ == "__main__":
    main()
