"""TRL 1.16.0 (``GRPOTrainer._compute_loss``) against the loss checkers.

The loss is TRL's own code, called on a stand-in trainer: a namespace holding the attributes
``_compute_loss`` reads, with the model forward replaced by the batch's ``log_probs``. TRL
exponentiates the log ratio at every position before masking, as real batches allow (their
padding log-probs are log-probs); the batches here therefore carry garbage in the
advantages' padding only (``garbage={"advantages"}``).
"""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, strategies as st
from lane import (
    COMBOS,
    conforms,
    discrepancy,
    discrepancy_hunt,
    drawn,
    known_discrepancy,
)

from pytest_rollout_golden import invariants
from pytest_rollout_golden.strategies import rollout_batches

MAX_COMPLETION_LENGTH = 16
# TRL's loss types in the reference's aggregation names (dr_grpo divides by the padded
# length max_completion_length; grpo, dr_grpo and luspo count every row of the batch).
MODES = {
    "grpo": "seq-mean-token-mean",
    "bnpo": "token-mean",
    "dr_grpo": "seq-mean-token-sum-norm",
    "dapo": "token-mean",
    "luspo": "seq-mean-token-sum",
}
EPS_LOW, EPS_HIGH = 0.2, 0.28
# GRPOConfig's defaults for the sapo and vespo loss types.
SAPO_TAUS = {"tau_pos": 1.0, "tau_neg": 1.05}
VESPO_PARAMS = {"k_pos": 2.0, "lambda_pos": 3.0, "k_neg": 3.0, "lambda_neg": 2.0}
SOFT_GATE_ARGS = {
    "sapo_temperature_pos": SAPO_TAUS["tau_pos"],
    "sapo_temperature_neg": SAPO_TAUS["tau_neg"],
    **{f"vespo_{name}": value for name, value in VESPO_PARAMS.items()},
}


class _Accelerator:
    num_processes = 1
    process_index = 0
    sync_gradients = True

    def reduce(self, tensor, reduction="sum"):
        return tensor

    def gather(self, tensor):
        return tensor

    gather_for_metrics = gather


def trl_loss(trainer, loss_type, *, level="token", epsilon_high=EPS_HIGH):
    """``loss_fn(batch, *, global_tokens, global_seqs, dp_size, n_micro_batches)`` running
    ``GRPOTrainer._compute_loss``; ``n_micro_batches`` is the gradient-accumulation count."""

    def loss_fn(batch, *, global_tokens, global_seqs, dp_size=1, n_micro_batches=1):
        log_probs, mask = batch["log_probs"], batch["response_mask"]
        accelerator = _Accelerator()
        accelerator.num_processes = dp_size
        stand_in = SimpleNamespace(
            loss_type=loss_type,
            importance_sampling_level=level,
            epsilon_low=EPS_LOW,
            epsilon_high=epsilon_high,
            beta=0.0,
            top_entropy_quantile=1.0,
            off_policy_mask_threshold=None,
            use_vllm=False,
            vllm_importance_sampling_correction=False,
            aux_loss_enabled=False,
            _entropy_bonus_enabled=False,
            current_gradient_accumulation_steps=n_micro_batches,
            max_completion_length=MAX_COMPLETION_LENGTH,
            accelerator=accelerator,
            model=SimpleNamespace(training=True),
            args=SimpleNamespace(
                delta=None,
                use_bias_correction_kl=False,
                steps_per_generation=n_micro_batches,
                **SOFT_GATE_ARGS,
            ),
            _metrics=defaultdict(lambda: defaultdict(list)),
            get_gamma_weights=trainer.get_gamma_weights,
            _get_per_token_logps_and_entropies=lambda *a, **k: (
                log_probs,
                torch.zeros_like(log_probs),
                None,
            ),
        )
        rows, width = mask.shape
        inputs = {
            "prompt_ids": torch.zeros(rows, 0, dtype=torch.long),
            "prompt_mask": torch.zeros(rows, 0, dtype=torch.long),
            "completion_ids": torch.zeros(rows, width, dtype=torch.long),
            "completion_mask": mask,
            "advantages": batch["advantages"],
            "old_per_token_logps": batch["old_log_probs"],
            "num_items_in_batch": torch.tensor(float(global_tokens)),
        }
        return trainer._compute_loss(stand_in, None, inputs)

    return loss_fn


def batches(dtype, mask, **options):
    return drawn(
        rollout_batches,
        dtype,
        mask,
        garbage={"advantages"},
        extreme_ratios=False,
        **options,
    )


@COMBOS
@pytest.mark.parametrize("loss_type", list(MODES))
def test_loss_types_conform(trl_grpo, dtype, mask, loss_type):
    # grpo, dr_grpo and luspo average over every row: no rows without valid tokens here.
    @conforms
    @given(batches(dtype, mask, min_batch=2, allow_empty_rows=False))
    def run(batch):
        loss_fn = trl_loss(trl_grpo, loss_type)
        invariants.check_ppo_clip(
            loss_fn,
            batch,
            clip_ratio_low=EPS_LOW,
            clip_ratio_high=EPS_HIGH,
            clip_ratio_c=None,
            agg_mode=MODES[loss_type],
            loss_scale_factor=MAX_COMPLETION_LENGTH,
        )
        invariants.check_padding_invariance(loss_fn, batch)
        invariants.check_permutation_invariance(loss_fn, batch)
        invariants.check_zero_advantage(loss_fn, batch)
        invariants.check_linear_in_advantages(loss_fn, batch)

    run()


@COMBOS
def test_dapo_is_micro_batch_and_dp_invariant(trl_grpo, dtype, mask):
    @conforms
    @given(batches(dtype, mask, min_batch=2), st.integers(1, 3), st.integers(1, 3))
    def run(batch, n_splits, dp_size):
        loss_fn = trl_loss(trl_grpo, "dapo")
        invariants.check_split_invariance(loss_fn, batch, n_splits=n_splits, dp_size=dp_size)

    run()


@COMBOS
def test_sequence_level_importance_sampling_is_gspo(trl_grpo, dtype, mask):
    @conforms
    @given(batches(dtype, mask, allow_empty_rows=False, advantages="sequence"))
    def run(batch):
        invariants.check_ppo_clip(
            trl_loss(trl_grpo, "grpo", level="sequence"),
            batch,
            clip_ratio_low=EPS_LOW,
            clip_ratio_high=EPS_HIGH,
            clip_ratio_c=None,
            ratio_level="sequence",
            agg_mode="seq-mean-token-mean",
        )

    run()


@COMBOS
def test_cispo_conforms(trl_grpo, dtype, mask):
    # TRL's CISPO clamps the ratio at epsilon_high itself (no lower clamp): in the reference's
    # terms clip_ratio_low = 1, clip_ratio_high = epsilon_high - 1.
    @conforms
    @given(batches(dtype, mask, min_batch=2), st.integers(1, 3))
    def run(batch, n_splits):
        loss_fn = trl_loss(trl_grpo, "cispo", epsilon_high=5.0)
        invariants.check_cispo(
            loss_fn, batch, clip_ratio_low=1.0, clip_ratio_high=4.0, agg_mode="token-mean"
        )
        invariants.check_split_invariance(loss_fn, batch, n_splits=n_splits)

    run()


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo"])
@discrepancy(
    "design choice: grpo and bnpo normalize each micro-batch by its own counts (sequences "
    "or tokens) and divide by the number of accumulation steps, so micro-batches of "
    "different token counts weigh their tokens differently; dapo normalizes globally"
)
def test_grpo_and_bnpo_normalize_per_micro_batch(trl_grpo, loss_type):
    @discrepancy_hunt
    @given(rollout_batches(min_batch=2, garbage={"advantages"}, extreme_ratios=False))
    def run(batch):
        with known_discrepancy("split_invariance"):
            invariants.check_split_invariance(trl_loss(trl_grpo, loss_type), batch, n_splits=2)

    run()


@discrepancy(
    "design choice: grpo averages the per-sequence token means over every row of the batch, "
    "rows without a valid token (all padding, e.g. rejected) included, where the reference's "
    "seq-mean-token-mean counts sequences with at least one valid token"
)
def test_grpo_counts_rows_without_valid_tokens(trl_grpo):
    @discrepancy_hunt
    @given(rollout_batches(min_batch=2, garbage={"advantages"}, extreme_ratios=False))
    def run(batch):
        with known_discrepancy("ppo_clip.reference_agreement"):
            invariants.check_ppo_clip(
                trl_loss(trl_grpo, "grpo"),
                batch,
                clip_ratio_low=EPS_LOW,
                clip_ratio_high=EPS_HIGH,
                clip_ratio_c=None,
                agg_mode="seq-mean-token-mean",
            )

    run()


@COMBOS
def test_sapo_conforms(trl_grpo, dtype, mask):
    # sapo aggregates as grpo does: a mean over every row, so no rows without valid tokens.
    @conforms
    @given(batches(dtype, mask, min_batch=2, allow_empty_rows=False))
    def run(batch):
        loss_fn = trl_loss(trl_grpo, "sapo")
        invariants.check_sapo(loss_fn, batch, agg_mode="seq-mean-token-mean", **SAPO_TAUS)
        invariants.check_permutation_invariance(loss_fn, batch)
        invariants.check_zero_advantage(loss_fn, batch)

    run()


@COMBOS
def test_vespo_conforms(trl_grpo, dtype, mask):
    @conforms
    @given(batches(dtype, mask, min_batch=2), st.integers(1, 3))
    def run(batch, n_splits):
        loss_fn = trl_loss(trl_grpo, "vespo")
        invariants.check_vespo(loss_fn, batch, agg_mode="token-mean", **VESPO_PARAMS)
        invariants.check_split_invariance(loss_fn, batch, n_splits=n_splits)

    run()


@COMBOS
def test_luspo_conforms(trl_grpo, dtype, mask):
    # LUSPO as documented: importance_sampling_level="sequence", one advantage per row; the
    # mean runs over every row, so no rows without valid tokens.
    @conforms
    @given(batches(dtype, mask, min_batch=2, allow_empty_rows=False, advantages="sequence"))
    def run(batch):
        loss_fn = trl_loss(trl_grpo, "luspo", level="sequence")
        invariants.check_luspo(loss_fn, batch, clip_ratio_low=EPS_LOW, clip_ratio_high=EPS_HIGH)

    run()
