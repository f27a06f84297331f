"""AReaL's SAPO loss, written here (AReaL is not installed): ``sapo_loss_fn`` of
``areal/utils/functional/functional.py`` at commit 4aef98d8d818af55b43621aaadba047ae10f4e77,
token-level importance sampling (its default), restated in the same tensor operations."""

from __future__ import annotations

import torch


def areal_sapo_loss(logprobs, old_logprobs, advantages, loss_mask, *, tau_pos=1.0, tau_neg=1.05):
    """Unclamped ratio ``exp(logp - old)``, sigmoid gates ``(4/τ)·σ(τ(r - 1))`` for both
    signs, the positive one where ``A > 0``, ``-gate·A`` summed over the mask (``where``)
    and divided by the mask's count (1 when empty)."""
    loss_mask = loss_mask.bool()  # the actor passes input_data["loss_mask"].bool()
    count = loss_mask.count_nonzero() or 1
    advantages = advantages.detach()
    ratio = torch.exp(logprobs - old_logprobs)
    gate_pos = torch.sigmoid(tau_pos * (ratio - 1.0)) * (4.0 / tau_pos)
    gate_neg = torch.sigmoid(tau_neg * (ratio - 1.0)) * (4.0 / tau_neg)
    gate = torch.where(advantages > 0, gate_pos, gate_neg)
    return torch.where(loss_mask, -gate * advantages, 0).sum() / count
