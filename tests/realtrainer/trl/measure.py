"""Same-math noise and seeded-bug signal of TRL's GRPOTrainer and RLOOTrainer under replay.

Per lane, the reference config (per_device_train_batch_size 8, GA 1) generates and records
what the engine and the reward function return (``grpo_harness``: prompt/completion ids,
rewards); every variant replays exactly those, and computes everything else (log-probs, KL,
advantages, loss) itself. Per variant and logged training metric it prints the largest
``|a-e|``, the largest ``|a-e|`` over the largest recorded ``|e|`` (the ``scale="recorded"``
measure), and for ``loss`` the largest ``|a-e|`` over the scale of the loss's terms: the mean
``|advantage|`` of the reference batch (token-weighted where the loss is a token mean:
dapo/bnpo/dr_grpo; over sequences for RLOO and grpo), largest over steps. ``beyond`` is
``|a-e| / (atol + rtol * max(|e|, scale))`` at the built-in defaults (docs/tolerances.md),
for the metrics a variant is compared on (the trl profile leaves kl, entropy, clip_ratio/*
out of variants). It also records the dtype of the per-token log-prob tensors TRL computes.

    PYTHONPATH=. .venv/bin/python tests/realtrainer/trl/measure.py [--lanes rloo/float32 ...]
        [--rows b4ga2 ...] [--seed 0] [--out /tmp/trl_measure.txt] [--markdown /tmp/trl.md]
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import grpo_harness as h

RTOL = 1e-4
# built-in defaults (docs/tolerances.md): name -> (atol, compared in a same-math variant)
DEFAULTS = {
    "loss": (1e-8, True),
    "grad_norm": (1e-8, True),
    "kl": (5e-7, False),  # trl profile: averaged per micro-batch
    "entropy": (1e-8, False),
}
TERM_WEIGHTING = {"rloo": "seq", "grpo": "seq", "dapo": "tok", "bnpo": "tok", "dr_grpo": "tok"}
SHOWN = ("loss", "grad_norm", "kl", "entropy")


def lanes() -> dict[str, list[tuple[str, h.Knobs, str]]]:
    """lane -> [(name, knobs, expectation)]; the first entry is the reference."""
    out = {}

    def rows(k, bugs, extra=()):
        return [
            ("reference", k(), "records"),
            ("reference-replay", k(), "bit-exact"),
            ("b4ga2", k(batch=4, ga=2), "same-math"),
            ("b2ga4", k(batch=2, ga=4), "same-math"),
            ("b8ga1+loss_x1.001", k(bug="loss_x1.001"), "1e-3 error"),
            ("b4ga2+drop_ga_scale", k(batch=4, ga=2, bug="drop_ga_scale"), "bug"),
            *[(f"b8ga1+{bug}", k(bug=bug), "bug") for bug in bugs],
            *extra,
        ]

    bugs = ("loss_on_padding", "kl_sign", "beta_ignored")
    for norm in (False, True):

        def k(norm=norm, **kw):
            return h.Knobs(algo="rloo", normalize_advantages=norm, **kw)

        out[f"rloo{'-norm' if norm else ''}/float32"] = rows(
            k, (*bugs, "advantage_no_std") if norm else bugs
        )
    for dtype in ("float32", "float64", "bf16"):
        for loss in ("dapo", "grpo", "dr_grpo", "bnpo"):

            def k(loss=loss, dtype=dtype, **kw):
                if dtype == "bf16":  # TRL's default: float32 weights, CPU autocast to bf16
                    return h.Knobs(loss_type=loss, bf16=True, **kw)
                return h.Knobs(loss_type=loss, dtype=dtype, **kw)

            extra = []
            if dtype == "bf16":  # a 1e-3 error on top of same-math noise
                extra.append(("b4ga2+loss_x1.001", k(batch=4, ga=2, bug="loss_x1.001"), "1e-3"))
            if loss == "dapo":
                extra += [
                    (
                        f"{b}+microbatch_token_mean",
                        k(batch=n, ga=8 // n, bug="microbatch_token_mean"),
                        "bug",
                    )
                    for n, b in ((4, "b4ga2"), (2, "b2ga4"))
                ]
            out[f"{loss}/{dtype}"] = rows(k, (*bugs, "advantage_no_std"), extra)

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


def run(knobs: h.Knobs, model_dir, out_dir, recorder) -> tuple[list[dict], list[dict], set]:
    """(metrics per step, |advantage| stats per generated batch, per-token log-prob dtypes)."""
    import torch

    logged: list[dict] = []
    trainer = h.make_trainer(
        knobs, model_dir, out_dir, recorder, on_step=lambda step, m: logged.append(m)
    )
    terms: list[dict] = []
    dtypes: set = set()
    generate_and_score = trainer._generate_and_score_completions
    per_token_logps = trainer._get_per_token_logps_and_entropies

    def observe_batch(inputs):
        batch = generate_and_score(inputs)
        adv = batch["advantages"].double().abs()
        lengths = batch["completion_mask"].double().sum(1)
        terms.append(
            {
                "seq": float(adv.mean()),
                "tok": float((adv * lengths).sum() / lengths.sum()),
                "lengths": lengths.long().tolist(),
            }
        )
        return batch

    def observe_logps(*args, **kwargs):
        logps, entropies, aux = per_token_logps(*args, **kwargs)
        where = "train" if torch.is_grad_enabled() else "no_grad"
        autocast = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None
        dtypes.add(
            f"{where}: logps {logps.dtype}, entropies {getattr(entropies, 'dtype', None)}, "
            f"caller's cpu autocast {autocast}"
        )
        return logps, entropies, aux

    trainer._generate_and_score_completions = observe_batch
    trainer._get_per_token_logps_and_entropies = observe_logps
    with h.quiet():
        trainer.train()
    return [h.training_metrics(x) for x in logged], terms, dtypes


def diff(ref: list[dict], got: list[dict], name: str) -> tuple[float, float]:
    """(max |a-e|, max over steps |e|)."""
    e = [r[name] for r in ref]
    a = [g.get(name, math.nan) for g in got]
    return max(abs(x - y) for x, y in zip(a, e, strict=True)), max(abs(x) for x in e)


def ratio(num: float, den: float) -> float:
    return 0.0 if num == 0 else (num / den if den else math.inf)


MD_HEADER = (
    "| change | loss abs | loss /max\\|e\\| | loss /mean\\|A\\| | grad_norm abs "
    "| grad_norm /max\\|e\\| | kl /max\\|e\\| | entropy /max\\|e\\| | at the defaults (beyond) |\n"
    "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
)


def describe_reference(
    lane, seed, knobs, reference, terms, dtypes, took, emit
) -> tuple[float, str]:
    """Print the reference; the markdown heading of its lane; the scale of the loss's terms."""
    weighting = TERM_WEIGHTING[knobs.algo if knobs.algo == "rloo" else knobs.loss_type]
    scale_terms = max(t[weighting] for t in terms)
    emit()
    emit(f"=== lane {lane} seed {seed}: reference {knobs.id} ({took:.1f} s)")
    emit(f"    completion lengths per step {[t['lengths'] for t in terms]}")
    emit(f"    mean|A| per step, {weighting}: {[round(t[weighting], 4) for t in terms]}")
    emit(f"    per-token log-prob dtypes: {sorted(dtypes)}")
    for k in reference[0]:
        emit(f"    {k:24s} [{' '.join(f'{r[k]:.6g}' for r in reference)}]")
    heading = (
        f"\n**{lane}**, seed {seed} (reference {knobs.id}; loss terms: mean |A| = "
        f"{scale_terms:.3g}, {weighting}; max|loss| = "
        f"{max(abs(r['loss']) for r in reference):.3g}; max grad_norm = "
        f"{max(abs(r['grad_norm']) for r in reference):.3g}; log-prob dtypes: "
        f"{'; '.join(sorted(dtypes))})\n\n{MD_HEADER}"
    )
    return scale_terms, heading


def compare(name, reference, got, scale_terms, emit) -> str:
    """Print one row's differences; its markdown table row."""
    variant = name != "reference-replay"  # same_math(): every other row is a variant
    cells, fails = [], []
    for metric in SHOWN:
        if metric not in reference[0]:
            cells += ["–"] * {"loss": 3, "grad_norm": 2}.get(metric, 1)
            continue
        absd, mag = diff(reference, got, metric)
        rel = ratio(absd, mag)
        atol, in_variants = DEFAULTS[metric]
        beyond = absd / (atol + RTOL * mag)
        line = f"    {metric:10s} abs={absd:9.3g} /max|e|={rel:9.3g} beyond={beyond:7.3g}"
        if metric == "loss":
            at_terms = absd / (atol + RTOL * max(mag, scale_terms))
            line += (
                f" /mean|A|={ratio(absd, scale_terms):9.3g} beyond@scale=mean|A|={at_terms:7.3g}"
            )
            cells += [f"{absd:.2g}", f"{rel:.2g}", f"{ratio(absd, scale_terms):.2g}"]
        elif metric == "grad_norm":
            cells += [f"{absd:.2g}", f"{rel:.2g}"]
        else:
            cells.append(f"{rel:.2g}")
        if beyond > 1 and (in_variants or not variant):
            fails.append(f"{metric} {beyond:.3g}x")
        vals = " ".join(f"{g.get(metric, math.nan):.6g}" for g in got)
        emit(f"{line}  [{vals}]")
    verdict = "fails: " + ", ".join(fails) if fails else "passes"
    return f"| {name} | " + " | ".join(cells) + f" | {verdict} |"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="/tmp/trl_measure.txt")
    parser.add_argument("--markdown", default="/tmp/trl_measure.md")
    parser.add_argument("--lanes", nargs="*", default=None, help="e.g. rloo/float32 dapo/bf16")
    parser.add_argument("--rows", nargs="*", default=None, help="these rows and the reference")
    parser.add_argument("--seed", type=int, default=0, help="model, data and sampling seed")
    args = parser.parse_args()
    start = time.perf_counter()
    text: list[str] = []
    md: list[str] = []

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
        f"tiny Qwen2 hidden {h.HIDDEN}, {h.LAYERS} layers; num_generations {h.NUM_GENERATIONS}, "
        f"max_completion_length {h.MAX_COMPLETION}, {h.STEPS} steps, beta 0.04, max_grad_norm "
        "1.0, SGD lr 0.2; replay boundary: engine ids + rewards (grpo_harness)"
    )
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = h.build_model_dir(Path(tmp) / "model", seed=args.seed)
        for lane, rows in lanes().items():
            if args.lanes and lane not in args.lanes:
                continue
            recorder = h.Recorder()
            reference = None
            for i, (name, knobs, expect) in enumerate(rows):
                if i and args.rows and name not in args.rows:
                    continue
                knobs = dataclasses.replace(knobs, seed=args.seed)
                t0 = time.perf_counter()
                got, terms, dtypes = run(knobs, model_dir, Path(tmp) / f"o-{lane}-{i}", recorder)
                took = time.perf_counter() - t0
                if reference is None:
                    reference = got
                    scale_terms, heading = describe_reference(
                        lane, args.seed, knobs, reference, terms, dtypes, took, emit
                    )
                    md.append(heading)
                    continue
                emit(f"  -- {name} [{knobs.id}] expected: {expect} ({took:.1f} s)")
                md.append(compare(name, reference, got, scale_terms, emit))
    emit()
    emit(f"total runtime {time.perf_counter() - start:.1f} s")
    Path(args.out).write_text("\n".join(text) + "\n")
    Path(args.markdown).write_text("\n".join(md) + "\n")


if __name__ == "__main__":
    main()
