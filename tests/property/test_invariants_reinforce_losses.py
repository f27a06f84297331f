"""ROLL's TOPR and Kimi k1.5 losses and the OPSM mask of slime and TRL: the checkers pass the
reference and the restated upstream code, and catch deliberately broken implementations."""

from __future__ import annotations

import policy_loss_frameworks as fw
import pytest
import torch
from hunting import finds, hunt, passes as passes_settings
from hypothesis import given, strategies as st
from token_losses import SCALE, aggregated

from pytest_rollout_golden import reference as ref
from pytest_rollout_golden.invariants import (
    check_kimi15,
    check_opsm_mask,
    check_ppo_clip,
    check_split_invariance,
    check_topr,
)
from pytest_rollout_golden.strategies import rollout_batches

DTYPES = [torch.float64, torch.float32, torch.bfloat16]
MODES = st.sampled_from(ref.AGG_MODES)

passes = passes_settings(80)


def topr(b, **options):
    args = (b["log_probs"], b["old_log_probs"], b["advantages"], b["scores"])
    return ref.topr_token_losses(*args, **options)


def kimi15(b, tau=0.1):
    return ref.kimi15_token_losses(b["log_probs"], b["old_log_probs"], b["advantages"], tau=tau)


# --------------------------------------------------------------------------- TOPR


@passes
@given(rollout_batches(dtype=DTYPES), MODES)
def test_reference_topr_passes(batch, mode):
    check_topr(aggregated(topr, mode), batch, agg_mode=mode, loss_scale_factor=SCALE)


@passes
@given(rollout_batches(dtype=DTYPES), st.sampled_from([(1.0, 1.0), (1.0, 0.5), (2.0, 1.0)]))
def test_roll_topr_passes(batch, weights):
    positive, negative = weights
    check_topr(fw.roll_topr(positive, negative), batch, positive_weight=positive,
               negative_weight=negative, agg_mode="token-mean")  # fmt: skip


def hunt_topr(per_token, **check):
    @hunt
    @given(rollout_batches())
    def run(batch):
        check_topr(aggregated(per_token), batch, **check)

    return run


def _ratio(b):
    return (b["log_probs"] - b["old_log_probs"]).exp()


TOPR_BUGS = {
    # The positive rows weighted like the negative ones (truncated IS everywhere).
    "positive-rows-weighted": (
        lambda b: -_ratio(b).clamp(max=1).detach() * b["advantages"] * b["log_probs"],
        "topr.positive_rows",
    ),
    # Negative rows: the ratio not truncated at 1.
    "ratio-not-truncated": (
        lambda b: (
            torch.where((b["scores"] > 0).unsqueeze(-1), 1.0, _ratio(b).detach())
            * -b["advantages"]
            * b["log_probs"]
        ),
        "topr.negative_rows",
    ),
    # Negative rows: the truncated ratio keeps its gradient.
    "ratio-not-detached": (
        lambda b: (
            torch.where((b["scores"] > 0).unsqueeze(-1), 1.0, _ratio(b).clamp(max=1))
            * -b["advantages"]
            * b["log_probs"]
        ),
        "topr.negative_rows",
    ),
    # Rows split by the sign of each token's advantage instead of the row's score.
    "split-by-advantage": (
        lambda b: ref.topr_token_losses(
            b["log_probs"], b["old_log_probs"], b["advantages"], b["advantages"][:, 0]
        ),
        "topr",
    ),
}
"""Broken TOPR per-token losses and the invariant that must catch each (judged without
``agg_mode``, so that the gradient invariant is the one that fires, unless ``topr``)."""


@pytest.mark.parametrize("name", sorted(TOPR_BUGS))
def test_finds_broken_topr(name):
    per_token, invariant = TOPR_BUGS[name]
    with finds(invariant):
        hunt_topr(per_token, agg_mode="token-mean" if invariant == "topr" else None)()


def test_finds_topr_with_the_weights_swapped():
    with finds("topr"):
        hunt_topr(lambda b: topr(b, positive_weight=0.5, negative_weight=1.0),
                  positive_weight=1.0, negative_weight=0.5, agg_mode="token-mean")()  # fmt: skip


# --------------------------------------------------------------------------- Kimi k1.5


@passes
@given(rollout_batches(dtype=DTYPES), MODES, st.sampled_from([0.1, 0.5, 2.0]))
def test_reference_kimi15_passes(batch, mode, tau):
    check_kimi15(aggregated(lambda b: kimi15(b, tau), mode), batch, tau=tau, agg_mode=mode,
                 loss_scale_factor=SCALE)  # fmt: skip


@passes
@given(rollout_batches(dtype=DTYPES), st.sampled_from([0.1, 1.0]))
def test_roll_kimi15_passes(batch, tau):
    check_kimi15(fw.roll_kimi15(tau), batch, tau=tau, agg_mode="token-mean")


KIMI_BUGS = {
    "penalty-without-half": lambda b: (
        -b["advantages"] * b["log_probs"] + 0.1 * (b["log_probs"] - b["old_log_probs"]).square()
    ),
    "penalty-on-the-ratio": lambda b: (
        -b["advantages"] * b["log_probs"] + 0.05 * (_ratio(b) - 1).square()
    ),
    "penalty-with-the-wrong-sign": lambda b: (
        -b["advantages"] * b["log_probs"] - 0.05 * (b["log_probs"] - b["old_log_probs"]).square()
    ),
    "penalty-dropped": lambda b: -b["advantages"] * b["log_probs"],
}


@pytest.mark.parametrize("name", sorted(KIMI_BUGS))
def test_finds_broken_kimi15(name):
    @hunt
    @given(rollout_batches())
    def run(batch):
        check_kimi15(aggregated(KIMI_BUGS[name]), batch, tau=0.1)

    with finds("kimi15.gradient"):
        run()


# --------------------------------------------------------------------------- OPSM

DELTAS = st.sampled_from([1e-4, 0.0, 0.5, -0.25])


@passes
@given(rollout_batches(dtype=DTYPES), DELTAS)
def test_reference_opsm_passes(batch, delta):
    def fn(lp, old, adv, mask):
        return ref.opsm_keep_mask(lp, old, adv, mask, delta=delta)

    check_opsm_mask(fn, batch, delta=delta)


@passes
@given(rollout_batches(dtype=DTYPES), DELTAS, st.sampled_from(["slime", "trl"]))
def test_upstream_opsm_passes(batch, delta, framework):
    fn = fw.slime_opsm(delta) if framework == "slime" else fw.trl_opsm(delta)
    if framework == "trl":  # TRL's advantages are one per row, [B, 1]
        batch = {**batch, "advantages": batch["advantages"][:, :1].expand_as(batch["log_probs"])}
    check_opsm_mask(fn, batch, delta=delta)


def _opsm(seq_kl, drop):
    """A broken OPSM built from a row statistic ``seq_kl(lp, old, mask)`` and a drop rule."""

    def fn(lp, old, adv, mask):
        return ~drop(adv, seq_kl(lp, old, mask.to(lp.dtype)).unsqueeze(-1))

    return fn


def _mean(values, mask):
    return (values * mask).sum(-1) / mask.sum(-1).clamp(min=1)


def _negative_and_far(a, kl):
    return (a < 0) & (kl > 1e-4)


def _row_mean(lp, old, m):
    return _mean(old - lp, m)


OPSM_BUGS = {
    "kl-reversed": (_opsm(lambda lp, old, m: _mean(lp - old, m), _negative_and_far), "opsm"),
    "sum-not-mean": (_opsm(lambda lp, old, m: ((old - lp) * m).sum(-1), _negative_and_far), "opsm"),
    "positive-advantages-dropped": (_opsm(_row_mean, lambda a, kl: (a > 0) & (kl > 1e-4)), "opsm"),
    "advantage-ignored": (_opsm(_row_mean, lambda a, kl: (kl > 1e-4) & (a == a)), "opsm"),
    "padding-in-the-mean": (
        _opsm(lambda lp, old, m: (old - lp).mean(-1), _negative_and_far),
        "opsm",
    ),
}


@pytest.mark.parametrize("name", sorted(OPSM_BUGS))
def test_finds_broken_opsm(name):
    fn, invariant = OPSM_BUGS[name]

    @hunt
    @given(rollout_batches())
    def run(batch):
        check_opsm_mask(fn, batch, delta=1e-4)

    with finds(invariant):
        run()


# --------------------------------------------------------------------------- TRL's empty rows


@passes
@given(rollout_batches(dtype=DTYPES))
def test_trl_grpo_passes_declared_as_dividing_by_rows(batch):
    check_ppo_clip(fw.trl_grpo(), batch, clip_ratio_c=None, agg_mode="seq-mean-token-mean",
                   seq_count="rows")  # fmt: skip


def test_trl_grpo_checked_against_valid_sequences_names_seq_count():
    @hunt
    @given(rollout_batches())
    def run(batch):
        check_ppo_clip(fw.trl_grpo(), batch, clip_ratio_c=None, agg_mode="seq-mean-token-mean")

    with finds("ppo_clip.reference_agreement") as caught:
        run()
    assert "declares seq_count='rows'" in str(caught.value)


def test_finds_valid_sequences_where_rows_are_declared():
    def loss_fn(batch, *, global_tokens, global_seqs):
        return aggregated_ppo(batch, global_tokens, global_seqs)

    @hunt
    @given(rollout_batches())
    def run(batch):
        check_ppo_clip(loss_fn, batch, clip_ratio_c=None, agg_mode="seq-mean-token-mean",
                       seq_count="rows")  # fmt: skip

    with finds("ppo_clip.reference_agreement"):
        run()


def aggregated_ppo(batch, global_tokens, global_seqs):
    inputs = (batch["log_probs"], batch["old_log_probs"], batch["advantages"])
    return ref.policy_loss(*inputs, batch["response_mask"], agg_mode="seq-mean-token-mean",
                           global_tokens=global_tokens, global_seqs=global_seqs,
                           clip_ratio_c=None)[0]  # fmt: skip


@passes
@given(rollout_batches(dtype=DTYPES, min_batch=2))
def test_trl_grpo_over_global_rows_is_split_invariant(batch):
    check_split_invariance(fw.trl_grpo(rows="global"), batch, n_splits=2)


def test_trl_grpo_per_micro_batch_rows_is_not_split_invariant():
    # TRL's .mean() over each micro-batch's rows, / accumulation steps: unequal pieces differ.
    @hunt
    @given(rollout_batches(min_batch=2))
    def run(batch):
        check_split_invariance(fw.trl_grpo(), batch, n_splits=2)

    with finds("split_invariance"):
        run()
