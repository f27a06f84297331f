"""Property checkers for rollout-correction and loss code: point them at your own functions.

Each checker takes your function and one rollout batch (from
:func:`pytest_rollout_golden.strategies.rollout_batches` or your own), returns ``None`` when
every invariant holds and raises ``AssertionError`` otherwise. The message starts with the
broken invariant's name in brackets (``[rs_mask.reference_agreement]``) and lists the
offending batch/token positions with their values.

Batches are dicts with ``old_log_probs``, ``rollout_log_probs``, ``log_probs``,
``response_mask``, ``advantages`` (``[B, T]``) and ``uid`` (``[B]``). Padding positions may
hold any finite garbage. Checkers never modify the batch they are given.

:func:`check_accumulation_invariance` takes a whole training step instead:
``step(batch, setting)`` with an :class:`AccumulationSetting` (micro-batch size, gradient
accumulation steps, steps per generation, dtype), run over a sweep of settings in float64.

Loss functions are called as ``loss_fn(batch, *, global_tokens, global_seqs)`` and return a
scalar tensor (or a tuple whose first item is one), where ``global_tokens`` is the number of
valid tokens and ``global_seqs`` the number of sequences with at least one valid token in the
*whole* step (full batch). Gradients are taken with respect to ``batch["log_probs"]``: the
checker passes a fresh leaf tensor there, so the loss must be computed from it.

Tolerances. Agreement is judged in float64. The reference runs in float64 on the exact values
your function received; your function's rounding is allowed for from the unit roundoff
``eps`` of the lowest-precision dtype involved (input or output): about
``4·eps·(1 + |log w|)`` relative for a value ``exp(log w)`` (exp turns an absolute error in
the exponent into a relative one), plus ``n·eps_acc`` for reductions over ``n`` terms, with
``eps_acc`` the float32 roundoff for float32/bf16 (torch accumulates low-precision sums in
float32) and the float64 roundoff for float64. Boolean decisions (RS keep/drop, IcePop,
PPO clip regions) are not judged where the deciding statistic lies within that tolerance of
a bound: there, either decision is correct. This keeps the checkers free of false alarms for
every generated batch while a bug in float64 still shows as an error many orders of
magnitude above the tolerance. In bf16 the tolerances are honest and therefore wide (a
sequence-level IS weight over 12 tokens is only known to a few percent).

:func:`check_quantization` takes a quantizer (FP8, MXFP8, NVFP4) and a weight tensor instead
(from :func:`pytest_rollout_golden.strategies.quantization_weights` or your own) and judges it
against the float64 formats of :mod:`pytest_rollout_golden.quant`.
"""

from .accumulation import (
    AccumulationSetting,
    AccumulationStep,
    accumulation_grid,
    accumulation_settings,
    check_accumulation_invariance,
)
from .advantages import check_advantages
from .correction import check_is_weights, check_rs_mask
from .critic import check_value_loss
from .gae import check_gae
from .kl import check_kl_penalty
from .losses import (
    check_cispo,
    check_linear_in_advantages,
    check_packing_invariance,
    check_padding_invariance,
    check_permutation_invariance,
    check_ppo_clip,
    check_ppo_reduces_to_reinforce,
    check_split_invariance,
    check_zero_advantage,
)
from .metrics import IS_METRICS, PPO_METRICS, check_ppo_metrics, check_rollout_corr_metrics
from .mismatch import check_mismatch_metrics
from .quantization import check_quantization
from .reinforce_losses import check_kimi15, check_topr
from .rollouts import check_group_diversity, check_token_ids_kept
from .sequence_masks import check_opsm_mask
from .soft_gates import check_luspo, check_sapo, check_vespo

__all__ = [
    "IS_METRICS",
    "PPO_METRICS",
    "AccumulationSetting",
    "AccumulationStep",
    "accumulation_grid",
    "accumulation_settings",
    "check_accumulation_invariance",
    "check_advantages",
    "check_cispo",
    "check_gae",
    "check_group_diversity",
    "check_is_weights",
    "check_kimi15",
    "check_kl_penalty",
    "check_linear_in_advantages",
    "check_luspo",
    "check_mismatch_metrics",
    "check_opsm_mask",
    "check_packing_invariance",
    "check_padding_invariance",
    "check_permutation_invariance",
    "check_ppo_clip",
    "check_ppo_metrics",
    "check_ppo_reduces_to_reinforce",
    "check_quantization",
    "check_rollout_corr_metrics",
    "check_rs_mask",
    "check_sapo",
    "check_split_invariance",
    "check_token_ids_kept",
    "check_topr",
    "check_value_loss",
    "check_vespo",
    "check_zero_advantage",
]
