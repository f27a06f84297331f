"""verl 0.9.1 (``core_algos.py``, ``rollout_corr_helper.py``) against the checkers.

Correct functions must pass in float64, float32 and bf16 with bool, int and float masks; the
known discrepancies are strict xfails whose reason says which side the math supports.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import assume, given, strategies as st
from lane import (
    COMBOS,
    DTYPES,
    MASKS,
    conforms,
    discrepancy,
    discrepancy_hunt,
    drawn,
    known_discrepancy,
)

from pytest_rollout_golden import invariants, reference as ref
from pytest_rollout_golden.reference.masking import as_bool_mask
from pytest_rollout_golden.strategies import (
    critic_batches,
    is_thresholds,
    reward_batches,
    rollout_batches,
    rs_configs,
    rs_thresholds,
    value_batches,
)

SCALE = 16.0  # fixed loss_scale_factor for seq-mean-token-sum-norm


def batches(dtype, mask, **options):
    return drawn(rollout_batches, dtype, mask, **options)


def rewards(dtype, mask, **options):
    return drawn(reward_batches, dtype, mask, **options)


# --------------------------------------------------------------------------- IS weights


def verl_is_weights(helper, level, threshold, normalize):
    def fn(old, rollout, mask):
        weights, _ = helper.compute_rollout_correction_weights(
            old - rollout,
            mask,
            rollout_is=level,
            rollout_is_threshold=threshold,
            rollout_is_batch_normalize=normalize,
        )
        return weights

    return fn


def zeroes_every_weight(batch, level, threshold):
    """IcePop may zero every valid weight (no weight safely inside the bounds): verl's ESS
    metric then divides by zero, inside the weights function (a separate xfail below)."""
    parsed = ref.parse_is_threshold(threshold)
    if not parsed.icepop:
        return False
    raw = ref.raw_is_weights(
        batch["old_log_probs"].double(),
        batch["rollout_log_probs"].double(),
        batch["response_mask"],
        level=level,
    )[as_bool_mask(batch["response_mask"])]
    inside = (raw > parsed.lower * 1.01) & (raw < parsed.upper * 0.99)
    return not bool(inside.any())


@COMBOS
def test_is_weights_conform(verl, dtype, mask):
    _, helper = verl

    @conforms
    @given(
        batches(dtype, mask),
        st.sampled_from(["token", "sequence"]),
        is_thresholds(),
        st.booleans(),
    )
    def run(batch, level, threshold, normalize):
        assume(not zeroes_every_weight(batch, level, threshold))
        fn = verl_is_weights(helper, level, threshold, normalize)
        invariants.check_is_weights(
            fn, batch, level=level, threshold=threshold, batch_normalize=normalize
        )

    run()


# --------------------------------------------------------------------------- RS masks


def verl_rs_mask(helper):
    def fn(old, rollout, mask, *, criterion, threshold):
        keep, _ = helper.compute_rollout_rejection_mask(
            old - rollout, mask, rollout_rs=criterion, rollout_rs_threshold=threshold
        )
        return keep

    return fn


def symmetric_k1(config):
    """k1 bounds that are their own reciprocals (a bare float is upper with lower = 1/upper)."""
    criterion, threshold = config
    parts = threshold.split(",")
    names = criterion.split(",")
    if len(parts) == 1:
        parts = parts * len(names)
    return all(
        not name.endswith("k1") or "_" not in part for name, part in zip(names, parts, strict=True)
    )


@COMBOS
def test_rs_mask_conforms_without_asymmetric_k1_bounds(verl, dtype, mask):
    _, helper = verl

    @conforms
    @given(batches(dtype, mask), rs_configs(max_parts=2).filter(symmetric_k1))
    def run(batch, config):
        criterion, threshold = config
        invariants.check_rs_mask(
            verl_rs_mask(helper), batch, criterion=criterion, threshold=threshold
        )

    run()


@discrepancy(
    "verl keeps 1/upper <= ratio <= 1/lower for k1 criteria (it compares -log ratio with "
    "[log lower, log upper]); its own rollout_corr_math.md and the math say lower <= ratio "
    "<= upper. Same result only for reciprocal-symmetric bounds."
)
@pytest.mark.parametrize("criterion", ["token_k1", "seq_sum_k1", "seq_mean_k1"])
def test_rs_k1_bounds_are_reciprocal(verl, criterion):
    _, helper = verl

    @discrepancy_hunt
    @given(rollout_batches(), rs_thresholds(criterion).filter(lambda t: "_" in t))
    def run(batch, threshold):
        invariants.check_rs_mask(
            verl_rs_mask(helper), batch, criterion=criterion, threshold=threshold
        )

    with known_discrepancy("rs_mask.reference_agreement"):
        run()


# --------------------------------------------------------------------------- policy loss


class PolicyConfig:
    """The attributes and ``get`` that ``compute_policy_loss_vanilla`` reads from an ActorConfig."""

    def __init__(self, **values):
        self.__dict__.update(values)

    def get(self, key, default=None):
        return getattr(self, key, default)


def verl_ppo_loss(core, mode):
    def loss_fn(batch, *, global_tokens, global_seqs, dp_size=1):
        config = PolicyConfig(
            clip_ratio=0.2,
            clip_ratio_low=0.2,
            clip_ratio_high=0.28,
            clip_ratio_c=3.0,
            global_batch_info={
                "dp_size": dp_size,
                "batch_num_tokens": global_tokens,
                "global_batch_size": global_seqs,
                "loss_scale_factor": SCALE,
            },
        )
        loss, _ = core.compute_policy_loss_vanilla(
            batch["old_log_probs"],
            batch["log_probs"],
            batch["advantages"],
            batch["response_mask"],
            loss_agg_mode=mode,
            config=config,
        )
        return loss

    return loss_fn


@COMBOS
def test_ppo_loss_conforms(verl, dtype, mask):
    core, _ = verl

    @conforms
    @given(batches(dtype, mask, min_batch=2), st.sampled_from(ref.AGG_MODES), st.integers(1, 3))
    def run(batch, mode, dp_size):
        loss_fn = verl_ppo_loss(core, mode)
        invariants.check_ppo_clip(
            loss_fn,
            batch,
            clip_ratio_low=0.2,
            clip_ratio_high=0.28,
            clip_ratio_c=3.0,
            agg_mode=mode,
            loss_scale_factor=SCALE,
        )
        invariants.check_split_invariance(loss_fn, batch, n_splits=2, dp_size=dp_size)
        invariants.check_padding_invariance(loss_fn, batch)
        invariants.check_permutation_invariance(loss_fn, batch)
        invariants.check_zero_advantage(loss_fn, batch)
        invariants.check_linear_in_advantages(loss_fn, batch)

    run()


# --------------------------------------------------------------------------- advantages


def verl_advantages(function, **options):
    def fn(token_level_rewards, response_mask, uid):
        return function(token_level_rewards, response_mask, uid.numpy(), **options)

    return fn


ESTIMATORS = {
    "grpo": ("compute_grpo_outcome_advantage", {}, {}),
    "drgrpo": ("compute_grpo_outcome_advantage", {"norm_adv_by_std_in_grpo": False}, {}),
    "rloo": ("compute_rloo_outcome_advantage", {}, {}),
    "reinforce_baseline": (
        "compute_reinforce_plus_plus_baseline_outcome_advantage",
        {},
        {"epsilon": 1e-8},  # verl whitens with var + 1e-8
    ),
}


@pytest.mark.parametrize("estimator", list(ESTIMATORS))
@COMBOS
def test_loop_advantages_conform(verl, dtype, mask, estimator):
    core, _ = verl
    name, options, check_options = ESTIMATORS[estimator]
    fn = verl_advantages(getattr(core, name), **options)

    @conforms
    @given(rewards(dtype, mask))
    def run(batch):
        # verl's masked_var raises on a batch with a single valid token (no variance).
        assume(
            estimator != "reinforce_baseline" or int(as_bool_mask(batch["response_mask"]).sum()) > 1
        )
        invariants.check_advantages(fn, batch, estimator=estimator, **check_options)

    run()


@pytest.mark.parametrize("dtype", ["float32", "bf16"])
@pytest.mark.parametrize("mask", MASKS)
def test_vectorized_grpo_conforms_below_float64(verl, dtype, mask):
    core, _ = verl
    fn = verl_advantages(core.compute_grpo_vectorized_outcome_advantage)
    loop = verl_advantages(core.compute_grpo_outcome_advantage)

    @conforms
    @given(rewards(dtype, mask))
    def run(batch):
        invariants.check_advantages(fn, batch, estimator="grpo", variant=loop)

    run()


@discrepancy(
    "compute_grpo_vectorized_outcome_advantage computes group mean and std in float32 even "
    "for float64 scores: scores [0.1, 0.1, 0.1] give -1.49e-3 instead of ~0; the loop version "
    "and the math give 0."
)
def test_vectorized_grpo_float64_precision(verl):
    core, _ = verl
    fn = verl_advantages(core.compute_grpo_vectorized_outcome_advantage)

    @discrepancy_hunt
    @given(reward_batches(dtype=torch.float64))
    def run(batch):
        invariants.check_advantages(fn, batch, estimator="grpo")

    with known_discrepancy("advantages.precision"):
        run()


@discrepancy(
    "compute_rloo_vectorized_outcome_advantage gives 0 to a singleton group; "
    "compute_rloo_outcome_advantage (loop) and the RLOO convention keep the raw score "
    "(no other sample to form a baseline)."
)
def test_vectorized_rloo_singleton(verl):
    core, _ = verl
    fn = verl_advantages(core.compute_rloo_vectorized_outcome_advantage)

    @discrepancy_hunt
    @given(reward_batches())
    def run(batch):
        invariants.check_advantages(fn, batch, estimator="rloo")

    with known_discrepancy("advantages.singleton"):
        run()


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_vectorized_rloo_agrees_with_the_loop_on_groups_of_two_or_more(verl, dtype):
    core, _ = verl
    fn = verl_advantages(core.compute_rloo_vectorized_outcome_advantage)
    loop = verl_advantages(core.compute_rloo_outcome_advantage)

    @conforms
    @given(reward_batches(dtype=DTYPES[dtype], min_batch=2, max_groups=1))
    def run(batch):
        invariants.check_advantages(fn, batch, estimator="rloo", variant=loop)

    run()


# --------------------------------------------------------------------------- metrics


def verl_is_metrics(helper, level, threshold):
    def fn(old, rollout, mask):
        return helper.compute_rollout_correction_weights(
            old - rollout, mask, rollout_is=level, rollout_is_threshold=threshold
        )

    return fn


# verl reports the raw, untruncated sequence weight as rollout_is_min/max and counts empty rows
# in the sequence-level fractions (see the xfail below); the std and the ESS have their own.
AGREEING = {
    "token": (
        "rollout_is_mean",
        "rollout_is_min",
        "rollout_is_max",
        "rollout_is_ratio_fraction_high",
        "rollout_is_ratio_fraction_low",
        "rollout_is_oob_ratio",
    ),
    "sequence": ("rollout_is_mean", "rollout_is_oob_ratio"),
}


@COMBOS
def test_is_metrics_conform(verl, dtype, mask):
    _, helper = verl

    @conforms
    @given(batches(dtype, mask), st.sampled_from(["token", "sequence"]), is_thresholds())
    def run(batch, level, threshold):
        assume(not zeroes_every_weight(batch, level, threshold))
        invariants.check_rollout_corr_metrics(
            verl_is_metrics(helper, level, threshold),
            batch,
            level=level,
            threshold=threshold,
            metrics=AGREEING[level],
            degenerate=False,
        )

    run()


@discrepancy(
    "rollout_is_std is computed as sqrt(E[w²] - E[w]²) with +1e-8 in both denominators: "
    "~5.6e-5 where the true std is 0 (the guards do not cancel under the square root). "
    "The math (and a two-pass std) gives 0."
)
def test_is_std_biased_by_guards(verl):
    _, helper = verl

    @discrepancy_hunt
    @given(rollout_batches(mask_dtype=torch.float64), is_thresholds(icepop=False))
    def run(batch, threshold):
        invariants.check_rollout_corr_metrics(
            verl_is_metrics(helper, "token", threshold),
            batch,
            level="token",
            threshold=threshold,
            metrics=["rollout_is_std"],
            degenerate=False,
        )

    with known_discrepancy("metrics.reference_agreement"):
        run()


@discrepancy(
    "rollout_is_eff_sample_size normalizes by (mean + 1e-8): when every weight is below "
    "~1e-8 the guard dominates and the ESS exceeds 1 (34 for weights of 2e-9). By definition "
    "ESS = (Σw)² / (n Σw²) lies in (0, 1]."
)
def test_ess_above_one_for_tiny_weights(verl):
    _, helper = verl
    batch = {  # one valid token, log ratio -25: its weight is exp(-20) = 2.1e-9
        "old_log_probs": torch.tensor([[-26.0, 3.0]], dtype=torch.float64),
        "rollout_log_probs": torch.tensor([[-1.0, -7.0]], dtype=torch.float64),
        "response_mask": torch.tensor([[True, False]]),
    }
    with known_discrepancy("metrics.reference_agreement"):
        invariants.check_rollout_corr_metrics(
            verl_is_metrics(helper, "token", 2.0),
            batch,
            level="token",
            threshold=2.0,
            metrics=["rollout_is_eff_sample_size"],
            degenerate=False,
        )


@discrepancy(
    "compute_rollout_correction_weights raises on degenerate batches instead of logging "
    "finite metrics: ZeroDivisionError in the ESS (1.0 / masked_mean(w²).item()) when "
    "IcePop zeroes every valid weight, ValueError when no token is valid (every token "
    "rejected). The reference logs ESS 0 and zero statistics."
)
@pytest.mark.parametrize("threshold", ["0.5_2.0", 2.0])
def test_is_metrics_raise_on_degenerate_batches(verl, threshold):
    _, helper = verl

    @discrepancy_hunt
    @given(rollout_batches())
    def run(batch):
        invariants.check_rollout_corr_metrics(
            verl_is_metrics(helper, "token", threshold),
            batch,
            level="token",
            threshold=threshold,
            metrics=["rollout_is_mean"],
        )

    # IcePop may zero every weight of a generated batch too: then the batch as given raises.
    with known_discrepancy("metrics.degenerate_batch", "metrics.exception"):
        run()


@discrepancy(
    "At sequence level verl reports rollout_is_min/max of the raw, untruncated sequence "
    "weight (up to e^20, above the truncation threshold) over every row, empty rows as "
    "weight 1; at token level the same names describe the applied weights. The reference "
    "describes the applied weights of sequences with valid tokens at both levels."
)
def test_sequence_min_max_describe_raw_weights(verl):
    _, helper = verl

    @discrepancy_hunt
    @given(rollout_batches(), is_thresholds(icepop=False))
    def run(batch, threshold):
        invariants.check_rollout_corr_metrics(
            verl_is_metrics(helper, "sequence", threshold),
            batch,
            level="sequence",
            threshold=threshold,
            metrics=["rollout_is_min", "rollout_is_max"],
            degenerate=False,
        )

    with known_discrepancy("metrics.reference_agreement"):
        run()


@COMBOS
def test_ppo_metrics_conform(verl, dtype, mask):
    core, _ = verl

    @conforms
    @given(batches(dtype, mask))
    def run(batch):
        def fn(b):
            config_tokens = int(as_bool_mask(b["response_mask"]).sum())
            return core.compute_policy_loss_vanilla(
                b["old_log_probs"],
                b["log_probs"],
                b["advantages"],
                b["response_mask"],
                loss_agg_mode="token-mean",
                config=PolicyConfig(
                    clip_ratio=0.2,
                    clip_ratio_low=0.2,
                    clip_ratio_high=0.28,
                    clip_ratio_c=3.0,
                    global_batch_info={"dp_size": 1, "batch_num_tokens": max(config_tokens, 1)},
                ),
            )

        invariants.check_ppo_metrics(fn, batch, clip_ratio_low=0.2, clip_ratio_high=0.28)

    run()


def verl_offpolicy(helper):
    def fn(old, rollout, mask):
        return helper.compute_offpolicy_metrics(old, rollout, mask)

    return fn


@COMBOS
def test_offpolicy_kl_conforms(verl, dtype, mask):
    _, helper = verl

    @conforms
    @given(batches(dtype, mask))
    def run(batch):
        invariants.check_rollout_corr_metrics(
            verl_offpolicy(helper),
            batch,
            level="token",
            threshold=2.0,
            metrics=["kl"],
            degenerate=False,
        )

    run()


@COMBOS
def test_offpolicy_k3_kl_conforms(verl, dtype, mask):
    # k3_kl exponentiates the unclamped log ratio: on a 25-nat token that is the exact k3
    # (e^25, where the reference clamps to e^20), accepted since issue 18; masked_sum keeps
    # padding out with torch.where, so garbage overflow does not reach the mean.
    _, helper = verl

    @conforms
    @given(batches(dtype, mask))
    def run(batch):
        invariants.check_rollout_corr_metrics(
            verl_offpolicy(helper),
            batch,
            level="token",
            threshold=2.0,
            metrics=["k3_kl"],
            degenerate=False,
        )

    run()


@discrepancy(
    "compute_offpolicy_metrics asserts that some token is valid: on a batch where every "
    "token was rejected it raises AssertionError instead of logging values (the reference "
    "logs 0)."
)
def test_offpolicy_metrics_raise_without_valid_tokens(verl):
    _, helper = verl

    @discrepancy_hunt
    @given(rollout_batches(garbage=False))
    def run(batch):
        invariants.check_rollout_corr_metrics(
            verl_offpolicy(helper), batch, level="token", threshold=2.0, metrics=["kl"]
        )

    with known_discrepancy("metrics.degenerate_batch"):
        run()


# --------------------------------------------------------------------------- critic and GAE


def critics(dtype, mask, **options):
    return drawn(critic_batches, dtype, mask, **options)


def verl_value_loss(core, mode, *, global_batch_info=True):
    """``compute_value_loss`` as verl's ``value_loss`` calls it: with the step's counts (since
    verl #6957), or without them (before: each micro-batch normalized by its own)."""

    def loss_fn(batch, *, global_tokens, global_seqs, dp_size=1):
        info = {"dp_size": dp_size, "batch_num_tokens": global_tokens}
        info["global_batch_size"] = global_seqs
        loss, _ = core.compute_value_loss(
            batch["vpreds"],
            batch["returns"],
            batch["values"],
            batch["response_mask"],
            cliprange_value=0.5,
            loss_agg_mode=mode,
            loss_scale_factor=SCALE,
            **(info if global_batch_info else {}),
        )
        return loss

    return loss_fn


@COMBOS
def test_value_loss_conforms(verl, dtype, mask):
    core, _ = verl

    @conforms
    @given(critics(dtype, mask, min_batch=2), st.sampled_from(ref.AGG_MODES), st.integers(1, 3))
    def run(batch, mode, dp_size):
        invariants.check_value_loss(
            verl_value_loss(core, mode),
            batch,
            cliprange_value=0.5,
            agg_mode=mode,
            loss_scale_factor=SCALE,
            dp_size=dp_size,
        )

    run()


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_value_loss_without_the_global_batch_info_is_caught(verl, mode):
    # verl #6957: value_loss called compute_value_loss without the step's counts.
    core, _ = verl

    @discrepancy_hunt
    @given(critic_batches(min_batch=2))
    def run(batch):
        loss_fn = verl_value_loss(core, mode, global_batch_info=False)
        invariants.check_value_loss(loss_fn, batch, cliprange_value=0.5, agg_mode=mode)

    with pytest.raises(AssertionError, match=r"\[value_loss\.micro_batch_invariance") as caught:
        run()
    assert "verl #6957" in str(caught.value)


def verl_gae(core, gamma, lam):
    def fn(token_level_rewards, values, response_mask):
        return core.compute_gae_advantage_return(
            token_level_rewards, values, response_mask, gamma=gamma, lam=lam
        )

    return fn


def two_valid_tokens(batch):
    # masked_var raises ValueError for a batch with one valid token (documented there).
    return int(as_bool_mask(batch["response_mask"]).sum()) >= 2


# ``1 - response_mask`` raises on a bool mask: verl's masks are integer or float.
@pytest.mark.parametrize(
    "dtype, mask", [(d, m) for d in DTYPES for m in ("int", "float")], ids=lambda v: str(v)
)
@pytest.mark.parametrize("garbage", [True, False], ids=["garbage", "zeros"])
def test_gae_conforms(verl, dtype, mask, garbage):
    core, _ = verl
    batches = drawn(value_batches, dtype, mask, garbage=garbage)

    @conforms
    @given(batches.filter(two_valid_tokens), st.sampled_from([(1.0, 0.95), (0.99, 0.9)]))
    def run(batch, params):
        gamma, lam = params
        invariants.check_gae(verl_gae(core, gamma, lam), batch, gamma=gamma, lam=lam, whiten=True)

    run()
