"""The critic's value loss: PPO's clipped value loss (verl's ``compute_value_loss``, OpenRLHF's
``ValueLoss``), aggregated as the policy loss is (:func:`~.losses.aggregate_loss`)."""

from __future__ import annotations

import torch
from torch import Tensor

from .losses import AggMode, aggregate_loss
from .masking import masked_mean

CLIPFRAC_METRIC = "critic/vf_clipfrac"
"""The logged name of the fraction of valid tokens whose clipped term is the larger one."""


def clipped_value_predictions(vpreds: Tensor, values: Tensor, cliprange_value: float) -> Tensor:
    """``clamp(vpreds, values - c, values + c)`` (``= values + clamp(vpreds - values, -c, c)``):
    the new predictions kept within ``c`` of the values the rollout's critic gave
    (``values``). Clamping ``vpreds`` itself, as verl's ``clip_by_value`` does, leaves a
    prediction inside the range exactly as it is, so its two loss terms tie exactly and it is
    never counted as clipped (``values + (vpreds - values)`` may round off ``vpreds``)."""
    return torch.clamp(vpreds, values - cliprange_value, values + cliprange_value)


def value_token_losses(
    vpreds: Tensor,
    values: Tensor,
    returns: Tensor,
    *,
    cliprange_value: float | None = 0.5,
) -> tuple[Tensor, Tensor]:
    """Per-token value loss ``½·max((v - R)², (v_clip - R)²)`` and a bool flag: the clipped
    term is strictly the larger (the token's gradient is then zero).

    ``v`` are the critic's new predictions (``vpreds``), ``R`` the returns and ``v_clip``
    :func:`clipped_value_predictions`; ``cliprange_value=None`` gives the unclipped
    ``½·(v - R)²`` (OpenRLHF's ``ValueLoss(clip_eps=None)``).
    """
    unclipped = (vpreds - returns).square()
    if cliprange_value is None:
        return 0.5 * unclipped, torch.zeros_like(unclipped, dtype=torch.bool)
    clipped = (clipped_value_predictions(vpreds, values, cliprange_value) - returns).square()
    return 0.5 * torch.maximum(unclipped, clipped), clipped > unclipped


def value_loss(
    vpreds: Tensor,
    values: Tensor,
    returns: Tensor,
    response_mask: Tensor,
    *,
    cliprange_value: float | None = 0.5,
    agg_mode: AggMode = "token-mean",
    global_tokens: int | Tensor | None = None,
    global_seqs: int | Tensor | None = None,
    loss_scale_factor: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Aggregated value loss and its metric ``critic/vf_clipfrac`` (over this batch's valid
    tokens).

    The per-token losses of :func:`value_token_losses` are aggregated by
    :func:`~pytest_rollout_golden.reference.aggregate_loss` with the whole step's counts
    (``global_tokens``, ``global_seqs``), so that the losses of micro-batches add up to the
    full batch's: verl's ``loss_agg_mode`` (its ``batch_num_tokens`` and ``global_batch_size``
    are the counts), OpenRLHF's ``token_level_loss=True`` is ``token-mean`` and ``False``
    ``seq-mean-token-mean``.
    """
    losses, clipped = value_token_losses(vpreds, values, returns, cliprange_value=cliprange_value)
    loss = aggregate_loss(
        losses,
        response_mask,
        agg_mode,
        global_tokens=global_tokens,
        global_seqs=global_seqs,
        loss_scale_factor=loss_scale_factor,
    )
    clipfrac = masked_mean(clipped.to(losses.dtype), response_mask)
    return loss, {CLIPFRAC_METRIC: float(clipfrac)}
