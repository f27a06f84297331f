"""Outcome advantages computed per group of responses to the same prompt (group id ``uid``).

The score of a response is the sum of its token-level rewards over valid tokens. Advantages
are broadcast over the response's valid tokens and are exactly zero on padding.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .masking import masked_fill_zero, masked_sum


def sequence_scores(token_level_rewards: Tensor, response_mask: Tensor) -> Tensor:
    """``[B]`` sum of each response's rewards over its valid tokens."""
    return masked_sum(token_level_rewards, response_mask, dim=-1)


def _group_sums(values: Tensor, uid: Tensor) -> tuple[Tensor, Tensor]:
    """Per-row sum of ``values`` over the row's group, and the group size, both ``[B]``."""
    _, inverse, counts = torch.unique(uid, return_inverse=True, return_counts=True)
    totals = torch.zeros(counts.numel(), dtype=values.dtype, device=values.device)
    totals = totals.index_add(0, inverse, values)
    return totals[inverse], counts[inverse]


def group_mean_std(scores: Tensor, uid: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per-row group mean, unbiased group std and group size; a singleton has mean 0, std 1."""
    totals, counts = _group_sums(scores, uid)
    size = counts.to(scores.dtype)
    mean = totals / size
    squares, _ = _group_sums((scores - mean).square(), uid)
    std = (squares / (size - 1).clamp(min=1)).sqrt()
    single = counts == 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(std), std)
    return mean, std, counts


def _broadcast(per_row: Tensor, response_mask: Tensor) -> Tensor:
    return masked_fill_zero(per_row.unsqueeze(-1).expand(response_mask.shape), response_mask)


def grpo_advantages(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    uid: Tensor,
    *,
    norm_by_std: bool = True,
    epsilon: float = 1e-6,
) -> Tensor:
    """GRPO: ``(s - mean_g) / (std_g + ε)``; without std normalization ``s - mean_g`` (Dr.GRPO)."""
    scores = sequence_scores(token_level_rewards, response_mask)
    mean, std, _ = group_mean_std(scores, uid)
    centered = scores - mean
    return _broadcast(centered / (std + epsilon) if norm_by_std else centered, response_mask)


def drgrpo_advantages(token_level_rewards: Tensor, response_mask: Tensor, uid: Tensor) -> Tensor:
    """Dr.GRPO: GRPO without the std division, ``s - mean_g``."""
    return grpo_advantages(token_level_rewards, response_mask, uid, norm_by_std=False)


def rloo_advantages(token_level_rewards: Tensor, response_mask: Tensor, uid: Tensor) -> Tensor:
    """RLOO: ``s - mean(others in the group) = (n·s - Σ_g) / (n - 1)``; a singleton keeps ``s``."""
    scores = sequence_scores(token_level_rewards, response_mask)
    totals, counts = _group_sums(scores, uid)
    size = counts.to(scores.dtype)
    leave_one_out = (size * scores - totals) / (size - 1).clamp(min=1)
    return _broadcast(torch.where(counts > 1, leave_one_out, scores), response_mask)
