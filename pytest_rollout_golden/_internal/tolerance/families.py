"""The built-in tolerances of RL training values: families, the names that belong to them,
and the metric profiles of frameworks (``golden_metric_profile = verl``).

A *family* is a kind of value whose numerical noise has one shape. The noise of correct
code that only reorders float32 reductions (micro-batching, dynamic batch size,
remove-padding, a thread count) is relative to the magnitude of the *terms* summed, not
to the result: a GRPO loss is a mean of ± terms of order 1 that cancel to ~0.01, so a
reordering error of 1e-6 absolute reads as 1e-4 relative to the loss. Families of
cancelling means therefore measure ``rtol`` against ``max(|expected|, S)``, with ``S`` the
metric's largest magnitude over the recorded steps (``scale="recorded"``; for a tensor,
its largest recorded element): a step where the loss crosses 0 is not held to a relative
bound that only its small value makes tight. Every number is derived in
``docs/numerics.md`` ("Built-in tolerances"), with the measurements behind it.

Torch-free: the plugin resolves tolerances without importing torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from .spec import IGNORE, RECORDED, Layer, Tolerance

# Same-math float32 noise on real trainers, as a fraction of the metric's largest recorded
# magnitude (micro-batch 8 -> 4 -> 2, dynamic batch size, remove-padding on verl 0.7's
# DataParallelPPOActor; gradient accumulation on TRL's GRPOTrainer): pg_loss <= 1.6e-5,
# grad_norm <= 1.1e-5, log-probs <= 2.3e-6. rtol 1e-4 leaves >= 6x for that noise and
# fails a drift of 1e-3 by 10x at the metric's largest step. docs/numerics.md has the table.
LOSS = Tolerance(rtol=1e-4, atol=1e-8, scale=RECORDED)
# A loss that is a mean of centred terms: group-normalized or leave-one-out advantages sum to
# 0 per group, so at ratio 1 the loss is 0 up to rounding (TRL's RLOO logs |loss| <= 3.7e-8 for
# terms |A| of 0.19-0.86; a GRPO loss with beta is ~beta*kl). Against its own magnitude that
# rounding (<= 9.7e-8 absolute under a same-math change) reads as 1-7x beyond rtol. An absolute
# floor at the rounding level of float32 terms of order 1 (8 ulps: 1e-6) passes it by 10x, while
# a loss that does not cancel (dapo) keeps its relative gate: a 1e-3 error still fails by ~10x,
# and loss over padding (0.076) fails by 1e5x (tests/realtrainer/trl/MEASURED.md).
CENTRED_LOSS = Tolerance(rtol=1e-4, atol=1e-6, scale=RECORDED)
# grad norms and entropies: norms and means of same-sign terms, no cancellation, but their
# inputs (log-probs, gradients) carry the reordering noise of the losses.
POSITIVE = Tolerance(rtol=1e-4, atol=1e-8, scale=RECORDED)
# Mean log-ratios (ppo_kl = mean(old - new), kl, k3): ~0 on an on-policy mini-batch and at
# the first step, where only an absolute floor in nats means anything: float32 log-probs of
# magnitude ~10 move by up to 1.4e-5 per token under a same-math change, their mean by
# 1.5e-7 (verl remove-padding).
LOG_RATIO = Tolerance(rtol=1e-4, atol=5e-7, scale=RECORDED)
# Fractions of counted tokens (clip fractions): they move in steps of 1/tokens, so either
# no token flipped (bit-equal) or one did (a real change of >= 1/N).
FRACTION = Tolerance(rtol=0.0, atol=1e-7)
# Train–inference mismatch metrics (golden.check_mismatch, "mismatch/*"): means, maxima and
# k3 KLs of d = train - engine log probs. A same-math change on either side moves a float32
# log prob by up to 1.4e-5 (verl remove-padding, docs/numerics.md), so |d|, its mean and its
# maximum move by as much, exp(|d|) by e^|d| times that, k3 ~ d^2/2 by |d| times that:
# atol 2e-5 absorbs it, rtol 1e-4 against the largest recorded value covers large ones. A
# real growth of the mismatch (a kernel, a dtype, a temperature) moves them by 1e-3 and more.
MISMATCH = Tolerance(rtol=1e-4, atol=2e-5, scale=RECORDED)
# Per-token tensors, compared normwise: every element against the tensor's largest
# recorded magnitude, as the error of a reduction is bounded by the size of its terms.
PER_TOKEN = Tolerance(rtol=1e-4, atol=1e-6, scale=RECORDED)
# Optimizer moments (golden.check_optimizer: optimizer/<parameter>/<entry>), compared
# normwise like the gradients they average: every element against the tensor's largest
# recorded element. The first moment (Adam's exp_avg, SGD's momentum_buffer) is a positive
# combination of gradients and carries their relative noise: grad_norm's rtol. The second,
# exp_avg_sq, averages squared gradients: d(g^2) = 2 g dg, twice the relative noise, so
# twice the rtol. No absolute floor: exp_avg_sq of gradients of 1e-3 is ~1e-9 after the
# first step, below any floor that would not also pass moments reset to zero.
MOMENT = Tolerance(rtol=1e-4, atol=0.0, scale=RECORDED)
SECOND_MOMENT = Tolerance(rtol=2e-4, atol=0.0, scale=RECORDED)
# Counts kept as floats (Adam's step): one step more or less is a defect, never noise.
COUNT = Tolerance(rtol=0.0, atol=0.0)
# A name no family claims: a training value computed in float32 at best, whatever type
# carries it (a Python float is not a float64 computation).
TRAINING = Tolerance(rtol=1e-4, atol=1e-8, scale=RECORDED)

FAMILIES: dict[str, Tolerance] = {
    "loss": LOSS,
    "centred_loss": CENTRED_LOSS,
    "positive": POSITIVE,
    "log_ratio": LOG_RATIO,
    "fraction": FRACTION,
    "mismatch": MISMATCH,
    "per_token": PER_TOKEN,
    "moment": MOMENT,
    "second_moment": SECOND_MOMENT,
    "count": COUNT,
    "training": TRAINING,
}

BUILTIN_NAMES: dict[str, str] = {
    # first: the first matching glob of a layer answers
    "mismatch/*fraction": "fraction",
    "mismatch/*": "mismatch",
    **dict.fromkeys(["optimizer/*/exp_avg", "optimizer/*/momentum_buffer"], "moment"),
    **dict.fromkeys(["optimizer/*/exp_avg_sq", "optimizer/*/max_exp_avg_sq"], "second_moment"),
    "optimizer/*/step": "count",
    **dict.fromkeys(
        [
            "pg_loss",
            "policy_loss",
            "actor_loss",
            "loss",
            "total_loss",
            "value_loss",
            "vf_loss",
            "critic_loss",
            "entropy_loss",
            "kl_loss",
        ],
        "loss",
    ),
    **dict.fromkeys(["entropy", "grad_norm", "rollout_is*"], "positive"),
    **dict.fromkeys(["kl", "ppo_kl", "approx_kl", "k3_kl"], "log_ratio"),
    **dict.fromkeys(
        [
            "pg_clipfrac",
            "pg_clipfrac_lower",
            "clipfrac",
            "vf_clipfrac",
            "clip_ratio",
            "rollout_rs*",
        ],
        "fraction",
    ),
    **dict.fromkeys(
        [
            "log_probs",
            "old_log_probs",
            "ref_log_prob",
            "rollout_log_probs",
            "entropys",
            "advantages",
            "returns",
            "values",
        ],
        "per_token",
    ),
}

# Timing, throughput and memory: they measure the machine, not the math, and differ at every
# run, so not even the exact lane compares them. Only names frameworks give such measures: a
# first path segment that says so (verl timing_s/gen, timing_per_token_ms/*, perf/throughput,
# perf/max_memory_allocated_gb, perf/mfu/actor; OpenRLHF and NeMo-RL timing/*; ROLL time/*;
# slime perf/*), and whole names, matched as a name or its last path segment (transformers'
# Trainer train_runtime, train_samples_per_second...; TRL step_time). A name that only
# mentions throughput, memory or seconds (reward/throughput, actor/memory_loss,
# env/episode_seconds, tokens_per_step) is a training value, and compared.
MACHINE = (
    "timing/*",
    "timing_s/*",
    "timing_per_token_ms/*",
    "time/*",
    "perf/*",
    *(
        f"{split}_{what}"
        for split in ("train", "eval")
        for what in ("runtime", "samples_per_second", "steps_per_second")
    ),
    "step_time",
)
MACHINE_REASON = "timing, throughput or memory: measures the machine (built-in)"


@dataclasses.dataclass(frozen=True)
class Profile:
    """How one framework names its metrics: families of its names, the names it averages
    per micro-batch (not comparable across same-math variants), and names never compared."""

    name: str
    families: Mapping[str, str]
    per_micro_batch: tuple[str, ...] = ()
    not_compared: tuple[str, ...] = ()


PROFILES: dict[str, Profile] = {
    profile.name: profile
    for profile in (
        Profile(
            "verl",
            families={
                "actor/pg_loss": "loss",
                "actor/kl_loss": "loss",
                "actor/entropy*": "positive",
                "actor/grad_norm": "positive",
                "actor/ppo_kl": "log_ratio",
                "actor/pg_clipfrac*": "fraction",
                "actor/lr": "training",
                "critic/vf_loss": "loss",
                "critic/vf_clipfrac": "fraction",
                "critic/grad_norm": "positive",
                "critic/*": "training",
                "response_length/*": "training",
                "prompt_length/*": "training",
                "rollout_corr/*": "training",
            },
            # dp_actor and dp_critic append these once per micro-batch and the trainer
            # averages the list
            per_micro_batch=(
                "actor/pg_clipfrac*",
                "actor/ppo_kl",
                "actor/entropy",
                "critic/vf_clipfrac",
                "critic/vpred_mean",
            ),
            not_compared=("timing_s/*", "timing_per_token_ms/*", "perf/*", "global_seqlen/*"),
        ),
        Profile(
            "openrlhf",
            families={
                "policy_loss": "loss",
                "critic_loss": "loss",
                "kl": "log_ratio",
                "ppo_kl": "log_ratio",
                "ppo_clip_ratio": "fraction",
                "entropy_loss": "loss",
                "actor_lr": "training",
                "critic_lr": "training",
            },
            # status dicts are averaged over micro-batches before they are logged
            per_micro_batch=("ppo_clip_ratio", "ppo_kl", "kl"),
            not_compared=("timing/*", "generate_time"),
        ),
        Profile(
            "trl",
            families={
                # GRPO, RLOO: minus the mean of centred advantages times the ratio
                "loss": "centred_loss",
                "grad_norm": "positive",
                "entropy": "positive",
                "kl": "log_ratio",
                "clip_ratio/*": "fraction",
                "learning_rate": "training",
                "reward*": "training",
                "completions/*": "training",
                "num_tokens": "training",
            },
            # _metrics lists get one entry per micro-batch, averaged when logged
            per_micro_batch=("clip_ratio/*", "entropy", "kl"),
            not_compared=("train_runtime", "train_samples_per_second", "train_steps_per_second"),
        ),
        Profile(
            "slime",
            families={
                "train/loss": "loss",
                "train/pg_loss": "loss",
                "train/entropy_loss": "loss",
                "train/kl_loss": "loss",
                "train/ppo_kl": "log_ratio",
                "train/pg_clipfrac": "fraction",
                "train/grad_norm": "positive",
                "train/train_rollout_logprob_abs_diff": "training",
                "rollout/*": "training",
            },
            per_micro_batch=("train/pg_clipfrac", "train/ppo_kl"),
            not_compared=("perf/*",),
        ),
    )
}
PROFILES["megatron"] = dataclasses.replace(PROFILES["slime"], name="megatron")


# bf16 training (ini golden_precision = bf16, marker precision="bf16"): gradients pass through
# bf16 matmuls, so a same-math change (gradient accumulation 8x1 -> 4x2 -> 2x4) moves TRL
# GRPOTrainer's grad_norm by 1.1e-4 to 9.4e-4 of its largest value (3 seeds); 2x the largest.
# Losses and log probs are accumulated in float32 (<= 5.5e-6) and keep their families. A 1e-3
# error moves grad_norm by 4e-4 to 2.2e-3 there: in bf16 one comparison of grad_norm cannot
# tell it from noise (docs/tolerances.md).
BF16_GRAD_NORM = Tolerance(rtol=2e-3, atol=1e-8, scale=RECORDED)
PRECISIONS: dict[str, dict[str, Tolerance]] = {
    "float32": {},
    "bf16": {"grad_norm": BF16_GRAD_NORM},
}
_PRECISION_ALIASES = {"bfloat16": "bf16", "fp32": "float32", "fp64": "float64", "double": "float64"}

# The float64 oracle (--golden-certify): a same-math variant replays its reference's float64
# values within this bound. Reordering a float64 sum of n terms moves it by at most
# n x 1.1e-16 of the sum of magnitudes (n <= 1e6: 1e-10), and a cancelling mean relative to
# the recorded magnitude stays far below 1e-9; 1e-6 also admits a float32 operation left in
# the float64 run (6e-8 a rounding, a few compounded) while staying 1000x below a 1e-3 bug.
# atol 1e-12 for values whose every step sits at 0 (a GRPO loss at ratio 1): float64 leaves
# ~1e-17 there.
CERTIFY = Tolerance(rtol=1e-6, atol=1e-12, scale=RECORDED)
CERTIFY_SOURCE = "float64 oracle bound (--golden-certify)"


def canonical_precision(value: str) -> str:
    """A precision's canonical name (``bfloat16`` -> ``bf16``; empty -> ``float32``)."""
    key = value.strip().lower() or "float32"
    return _PRECISION_ALIASES.get(key, key)


def precision_layer(value: str, source: str) -> Layer | None:
    """The layer of a declared training precision (``None`` for float32, the defaults'
    own); ValueError naming ``source`` and the known precisions for another value."""
    key = canonical_precision(value)
    if key not in PRECISIONS:
        raise ValueError(
            f"{source}: unknown precision {value!r}; use one of {', '.join(PRECISIONS)}"
        )
    if not PRECISIONS[key]:
        return None
    return Layer(f"{source} = {key}", PRECISIONS[key], defaults=True)


def profile(name: str) -> Profile:
    """The profile called ``name`` (ValueError listing the known ones)."""
    key = name.strip().lower()
    if key not in PROFILES:
        raise ValueError(
            f"golden_metric_profile: unknown profile {name!r}; "
            f"use one of {', '.join(sorted(PROFILES))}"
        )
    return PROFILES[key]


def entries(names: Mapping[str, str]) -> dict[str, Tolerance]:
    """Name -> tolerance of a name -> family table."""
    return {name: FAMILIES[family] for name, family in names.items()}


def profile_layers(name: str) -> tuple[list[Layer], Layer]:
    """The layers of ini ``golden_metric_profile = name``: its families and the names it
    never compares (both defaults), and the names not comparable across variants."""
    chosen = profile(name)
    label = f"golden_metric_profile = {chosen.name}"
    return [
        Layer(label, entries(chosen.families), defaults=True),
        Layer(
            f"{label}: never compared", dict.fromkeys(chosen.not_compared, IGNORE), defaults=True
        ),
    ], Layer(
        f"not comparable across variants: averaged per micro-batch ({label})",
        dict.fromkeys(chosen.per_micro_batch, IGNORE),
        defaults=True,
    )
