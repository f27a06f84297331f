"""Outcome advantages computed per group of responses to the same prompt (group id ``uid``).

The score of a response is the sum of its token-level rewards over valid tokens. Advantages
are broadcast over the response's valid tokens and are exactly zero on padding.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from .masking import as_bool_mask, masked_fill_zero, masked_sum


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


def reinforce_baseline_advantages(
    token_level_rewards: Tensor, response_mask: Tensor, uid: Tensor, *, epsilon: float = 1e-8
) -> Tensor:
    """REINFORCE++ with a group baseline: ``c = s - mean_g`` (a singleton keeps ``s``),
    broadcast over valid tokens, then whitened over every valid token of the batch:
    ``(c - μ) / sqrt(v + ε)`` with ``μ``/``v`` the token mean and unbiased token variance.
    A batch with a single valid token has no variance: it gets ``c - μ = 0``."""
    scores = sequence_scores(token_level_rewards, response_mask)
    mean, _, _ = group_mean_std(scores, uid)
    centered = _broadcast(scores - mean, response_mask)
    valid = as_bool_mask(response_mask)
    n = int(valid.sum())
    token_mean = masked_sum(centered, response_mask) / max(n, 1)
    deviation = masked_fill_zero(centered - token_mean, response_mask)
    variance = deviation.square().sum() / max(n - 1, 1)
    return masked_fill_zero(deviation / (variance + epsilon).sqrt(), response_mask)


ESTIMATORS: tuple[str, ...] = ("grpo", "grpo_no_std", "drgrpo", "rloo", "reinforce_baseline")


def outcome_advantages(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    uid: Tensor,
    *,
    estimator: str,
    epsilon: float = 1e-6,
) -> Tensor:
    """Advantages ``[B, T]`` of one of :data:`ESTIMATORS`; ``epsilon`` guards the std (GRPO)
    or the variance (``reinforce_baseline``) and is unused otherwise."""
    if estimator == "grpo":
        return grpo_advantages(token_level_rewards, response_mask, uid, epsilon=epsilon)
    if estimator in ("grpo_no_std", "drgrpo"):
        return drgrpo_advantages(token_level_rewards, response_mask, uid)
    if estimator == "rloo":
        return rloo_advantages(token_level_rewards, response_mask, uid)
    if estimator == "reinforce_baseline":
        return reinforce_baseline_advantages(
            token_level_rewards, response_mask, uid, epsilon=epsilon
        )
    raise ValueError(f"unknown advantage estimator {estimator!r}; expected one of {ESTIMATORS}")


def masked_whiten(values: Tensor, response_mask: Tensor, *, epsilon: float = 1e-8) -> Tensor:
    """``(x - μ) / sqrt(v + ε)`` over every valid token of the batch (``μ`` the token mean,
    ``v`` the unbiased token variance; 0 with a single valid token), zero on padding."""
    valid = as_bool_mask(response_mask)
    n = int(valid.sum())
    mean = masked_sum(values, response_mask) / max(n, 1)
    deviation = masked_fill_zero(values - mean, response_mask)
    variance = deviation.square().sum() / max(n - 1, 1)
    return masked_fill_zero(deviation / (variance + epsilon).sqrt(), response_mask)


GAEMaskedTokens = Literal["skip", "step"]
"""How GAE treats masked tokens inside a response: skipped (verl, AReaL, NeMo-RL) or ordinary
steps of the recursion (slime and ROLL, whose GAE takes no mask)."""


def response_span(response_mask: Tensor) -> Tensor:
    """Bool ``[B, T]``: every position from a row's first valid token to its last, masked
    tokens inside the response included."""
    valid = as_bool_mask(response_mask)
    started = valid.long().cumsum(-1) > 0
    return started & (valid.flip(-1).long().cumsum(-1).flip(-1) > 0)


def gae_advantages(
    token_level_rewards: Tensor,
    values: Tensor,
    response_mask: Tensor,
    *,
    gamma: float,
    lam: float,
    last_values: Tensor | None = None,
    whiten: bool = False,
    epsilon: float = 1e-8,
    masked_tokens: GAEMaskedTokens = "skip",
) -> tuple[Tensor, Tensor]:
    """Generalized advantage estimation: ``(advantages, returns)``, both ``[B, T]``.

    Over each row's valid tokens in order (masked tokens, e.g. tool observations inside a
    multi-turn response, are skipped: the recursion passes through them unchanged),
    ``δ_t = r_t + γ·V_next - V_t`` and ``A_t = δ_t + γλ·A_next``, where ``next`` is the next
    *valid* token; after the last valid token ``V_next = last_values`` (a bootstrap value per
    row for a truncated response; 0, a terminal state, by default) and ``A_next = 0``.
    ``returns = A + V``, taken before the optional whitening of the advantages
    (:func:`masked_whiten`, as verl's ``compute_gae_advantage_return`` does). Both are zero on
    masked positions. ``masked_tokens="step"``: masked tokens inside a response are ordinary
    steps with their own reward and value (slime, ROLL); advantages and returns are then
    defined on the whole :func:`response_span`, whitening still runs over valid tokens only.
    """
    if masked_tokens not in ("skip", "step"):
        raise ValueError(f"masked_tokens must be 'skip' or 'step', got {masked_tokens!r}")
    valid = as_bool_mask(response_mask)
    steps = response_span(valid) if masked_tokens == "step" else valid
    rows = token_level_rewards.shape[0]
    zeros = torch.zeros(rows, dtype=values.dtype, device=values.device)
    next_value = zeros if last_values is None else last_values.to(values.dtype)
    running = zeros
    advantages = torch.zeros_like(values)
    for t in reversed(range(token_level_rewards.shape[-1])):
        here = steps[:, t]
        delta = token_level_rewards[:, t] + gamma * next_value - values[:, t]
        running = torch.where(here, delta + gamma * lam * running, running)
        next_value = torch.where(here, values[:, t], next_value)
        advantages[:, t] = torch.where(here, running, torch.zeros_like(running))
    returns = masked_fill_zero(advantages + values, steps)
    if whiten:
        advantages = masked_whiten(advantages, response_mask, epsilon=epsilon)
    return advantages, returns
