"""Correct implementations written the way frameworks write them: means as
``sum(x · m) / (m.sum() + δ)``, with the epsilon guard ``δ`` surviving in the mask's dtype.

With a bool or int mask the count is promoted to float32 (torch's default dtype), where
``n + 1e-8`` rounds to ``n``; with a float64 mask the guard shifts every mean by ``δ/n``
relative. Either way the result is correct code, so every checker must pass it.
"""

from __future__ import annotations

import torch

from pytest_rollout_golden import reference as ref
from pytest_rollout_golden.reference.masking import as_bool_mask


def guarded_mean(values, mask, dim=None, *, delta):
    """``Σ values·mask / (Σ mask + δ)``, in whatever dtype torch promotes to."""
    if dim is None:
        return (values * mask).sum() / (mask.sum() + delta)
    return (values * mask).sum(dim=dim) / (mask.sum(dim=dim) + delta)


def is_weights(level, threshold, normalize, *, delta, clamp=True):
    """IS weights with guarded means; ``clamp=False`` computes the exact weight ``exp(log w)``
    (no ±20 clamp, as TRL, AReaL, slime and ROLL do), masking the log ratio first."""
    parsed = ref.parse_is_threshold(threshold)

    def fn(old, rollout, mask):
        log_ratio = old - rollout
        if level == "sequence":
            log_ratio = (log_ratio * mask).sum(dim=-1, keepdim=True).expand_as(old)
        elif level == "geometric":
            log_ratio = guarded_mean(log_ratio, mask, -1, delta=delta).unsqueeze(-1)
            log_ratio = log_ratio.expand_as(old)
        if clamp:
            log_ratio = log_ratio.clamp(-20, 20)
        else:
            log_ratio = torch.where(as_bool_mask(mask), log_ratio, torch.zeros_like(log_ratio))
        weights = log_ratio.exp() * mask
        if parsed.icepop:
            inside = (weights >= parsed.lower) & (weights <= parsed.upper)
            weights = torch.where(inside, weights, torch.zeros_like(weights))
        elif parsed.two_sided:
            weights = weights.clamp(parsed.lower, parsed.upper) * mask
        elif parsed.upper is not None:
            weights = weights.clamp(max=parsed.upper)
        if normalize:
            if level == "token":
                mean = guarded_mean(weights, mask, delta=delta)
            else:
                rows = as_bool_mask(mask).any(dim=-1).to(weights.dtype)
                mean = guarded_mean(guarded_mean(weights, mask, -1, delta=delta), rows, delta=delta)
            if float(mean) > 1e-8:
                weights = weights / mean
        return weights

    return fn


def rs_mask(*, delta):
    def fn(old, rollout, mask, *, criterion, threshold):
        log_ratio = old - rollout
        keep = as_bool_mask(mask).clone()
        for item in ref.parse_rs_criteria(criterion, threshold):
            if item.aggregate == "mean":
                per_token = ref.token_divergence(log_ratio, item.estimator)
                stat = guarded_mean(per_token, mask, -1, delta=delta)
            else:
                stat = item.statistic(log_ratio, mask)
            lo, hi = item.bounds()
            kept = (stat >= lo) & (stat <= hi)
            keep &= kept.unsqueeze(-1) if item.sequence_level else kept
        return keep

    return fn


def ppo_loss(mode, *, delta, loss_scale_factor=16.0, **clips):
    """Dual-clip PPO with every normalizer guarded (``global_* + δ``, ``n_b + δ``)."""

    def loss_fn(batch, *, global_tokens, global_seqs, dp_size=1):
        per_token, _, _ = ref.ppo_clip_token_losses(
            batch["log_probs"], batch["old_log_probs"], batch["advantages"], **clips
        )
        mask = batch["response_mask"]
        sums = (per_token * mask).sum(dim=-1)
        if mode == "token-sum":
            loss = sums.sum()
        elif mode == "token-mean":
            loss = sums.sum() / (global_tokens + delta)
        else:
            if mode == "seq-mean-token-mean":
                sums = sums / (mask.sum(dim=-1) + delta)
            loss = sums.sum() / (global_seqs + delta)
            if mode == "seq-mean-token-sum-norm":
                loss = loss / loss_scale_factor
        return loss * dp_size

    return loss_fn
