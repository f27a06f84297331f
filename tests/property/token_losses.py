"""Losses under test built from per-token losses: the reference's aggregation around them."""

from __future__ import annotations

from collections.abc import Callable

import torch

from pytest_rollout_golden import reference as ref

SCALE = 16.0  # fixed loss_scale_factor for seq-mean-token-sum-norm


def aggregated(
    token_losses: Callable[[dict[str, torch.Tensor]], torch.Tensor], mode: str = "token-mean"
) -> Callable[..., torch.Tensor]:
    """A framework-style ``loss_fn`` aggregating ``token_losses(batch)`` with the reference's
    ``aggregate_loss`` and the step's counts."""

    def loss_fn(batch, *, global_tokens, global_seqs):
        return ref.aggregate_loss(
            token_losses(batch),
            batch["response_mask"],
            mode,
            global_tokens=global_tokens,
            global_seqs=global_seqs,
            loss_scale_factor=SCALE,
        )

    return loss_fn
