"""Small functions with the arithmetic of AReaL, slime, ROLL, NeMo-RL and TRL for GAE,
rejection sampling, IS weights and whitening, written here (the frameworks are not installed).

Correct ones must pass the checkers; the ``*_defect`` ones restate a known defect.
"""

from __future__ import annotations

import torch
from guarded import guarded_mean

from pytest_rollout_golden import reference as ref
from pytest_rollout_golden.reference.masking import as_bool_mask

# --------------------------------------------------------------------------- GAE


def _unmasked_recursion(rewards, values, *, gamma, lam):
    """The recursion of a GAE that takes no mask: every column is a step, ``V_next`` is the
    next column's value (0 after the last column)."""
    width = rewards.shape[-1]
    running = torch.zeros_like(rewards[:, 0])
    advantages = []
    for t in reversed(range(width)):
        next_value = values[:, t + 1] if t < width - 1 else torch.zeros_like(running)
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        running = delta + gamma * lam * running
        advantages.append(running)
    return torch.stack(advantages[::-1], dim=-1)


def roll_gae_defect(rewards, values, mask, *, gamma=1.0, lam=0.95):
    """ROLL: rewards masked, the critic's values passed unmasked (the defect)."""
    rewards = rewards * mask
    advantages = _unmasked_recursion(rewards, values, gamma=gamma, lam=lam)
    return advantages, advantages + values


def roll_gae(rewards, values, mask, *, gamma=1.0, lam=0.95):
    """ROLL with the values masked too: correct on batches without holes."""
    rewards, values = rewards * mask, values * mask
    advantages = _unmasked_recursion(rewards, values, gamma=gamma, lam=lam)
    return advantages, advantages + values


def slime_gae(rewards, values, mask, *, gamma=1.0, lam=0.95):
    """slime: per sample, over the response's tokens (masked ones inside included), no mask."""
    valid = as_bool_mask(mask)
    advantages = torch.zeros_like(values)
    for row in range(valid.shape[0]):
        cols = valid[row].nonzero().flatten()
        if cols.numel() == 0:
            continue
        first, last = int(cols[0]), int(cols[-1]) + 1
        piece = _unmasked_recursion(
            rewards[row : row + 1, first:last],
            values[row : row + 1, first:last],
            gamma=gamma,
            lam=lam,
        )
        advantages[row, first:last] = piece[0]
    returns = advantages + values
    return advantages, returns


def areal_gae(rewards, values, mask, *, gamma=1.0, lam=0.95):
    """AReaL: masked tokens skipped by carrying ``V_next`` and ``A_next`` through them."""
    m = mask.to(values.dtype)
    width = rewards.shape[-1]
    next_value = torch.zeros_like(values[:, 0])
    running = torch.zeros_like(values[:, 0])
    advantages = torch.zeros_like(values)
    for t in reversed(range(width)):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        fresh = delta + gamma * lam * running
        next_value = next_value * (1 - m[:, t]) + values[:, t] * m[:, t]
        running = running * (1 - m[:, t]) + fresh * m[:, t]
        advantages[:, t] = running
    advantages = torch.where(as_bool_mask(mask), advantages, torch.zeros_like(advantages))
    return advantages, advantages + values * m


def trl_whiten(values, mask):
    """TRL's masked_whiten: unbiased masked variance (n/(n-1)), ``rsqrt(var + 1e-8)``."""
    m = mask.to(values.dtype)
    n = m.sum()
    mean = (values * m).sum() / n
    variance = (((values - mean) ** 2) * m).sum() / n * (n / (n - 1))
    return (values - mean) * torch.rsqrt(variance + 1e-8)


def nemo_whiten(values, mask):
    """NeMo-RL: guarded mean ``Σ x·m / (Σ m + 1e-8)``, variance divided by ``n - 1``."""
    mean = guarded_mean(values, mask, delta=1e-8)
    n = mask.sum()
    variance = (((values - mean) ** 2) * mask).sum() / (n - 1)
    return (values - mean) / torch.sqrt(variance + 1e-8) * mask


def whitened(gae, whiten):
    """``gae`` followed by the whitening ``whiten`` of its advantages (returns before)."""

    def fn(rewards, values, mask):
        advantages, returns = gae(rewards, values, mask)
        return whiten(advantages, mask), returns

    return fn


# --------------------------------------------------------------------------- RS and IS


def scaled_down(batch, factor):
    """The batch with every valid log ratio ``old - rollout`` made ``-factor·|old - rollout|``:
    down to about -750, where ``exp`` underflows (upwards it would overflow to inf)."""
    valid = as_bool_mask(batch["response_mask"])
    old, rollout = batch["old_log_probs"], batch["rollout_log_probs"]
    wide = rollout - (old - rollout).abs() * factor
    return {**batch, "old_log_probs": torch.where(valid, wide, old)}


def exact_divergence(log_ratio, estimator):
    """Per-token k1/k2/k3 of the exact log ratio (no ±20 clamp)."""
    if estimator == "k1":
        return -log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio.square()
    return torch.exp(log_ratio) - 1 - log_ratio


def roll_rs_mask(old, rollout, mask, *, criterion, threshold):
    """ROLL-style rejection: statistics aggregated from exact per-token values, the sequence
    mean with a ``+1e-8`` guard on the token count."""
    valid = as_bool_mask(mask)
    log_ratio = torch.where(valid, old - rollout, torch.zeros_like(old))
    keep = valid.clone()
    for item in ref.parse_rs_criteria(criterion, threshold):
        per_token = exact_divergence(log_ratio, item.estimator)
        if item.aggregate == "token":
            stat = per_token
        elif item.aggregate == "sum":
            stat = (per_token * mask).sum(dim=-1)
        elif item.aggregate == "mean":
            stat = guarded_mean(per_token, mask, -1, delta=1e-8)
        else:
            stat = per_token.masked_fill(~valid, float("-inf")).max(dim=-1).values
        lo, hi = item.bounds()
        kept = (stat >= lo) & (stat <= hi)
        keep &= kept.unsqueeze(-1) if item.sequence_level else kept
    return keep


def _masked_log_ratio(old, rollout, mask):
    valid = as_bool_mask(mask)
    return torch.where(valid, old - rollout, torch.zeros_like(old))


def _inside(log_value, lower, upper):
    """``lower ≤ exp(log_value) ≤ upper``, compared in log space."""
    low = float("-inf") if lower == 0 else torch.log(torch.tensor(lower)).item()
    return (log_value >= low) & (log_value <= torch.log(torch.tensor(upper)).item())


def nemo_seq_mask_tis(truncation, lower, upper, *, aggregate="mean"):
    """NeMo-RL ``seq-mask-tis``: exact token IS truncated at ``truncation``, times a filter on
    the sequence's geometric-mean ratio (``aggregate="sum"``: the product, a wrong filter)."""

    def fn(old, rollout, mask):
        log_ratio = _masked_log_ratio(old, rollout, mask)
        if aggregate == "mean":
            seq = guarded_mean(log_ratio, mask, -1, delta=1e-8)
        else:
            seq = (log_ratio * mask).sum(dim=-1)
        keep = _inside(seq, lower, upper).unsqueeze(-1)
        return log_ratio.exp().clamp(max=truncation) * mask * keep

    return fn


def areal_agg_sum(lower, upper, *, aggregate="sum"):
    """AReaL ``agg=sum``: the geometric-mean weight of the sequence, zeroed when the product
    ratio is outside ``[lower, upper]`` (``aggregate="mean"``: the geometric mean, wrong)."""

    def fn(old, rollout, mask):
        log_ratio = _masked_log_ratio(old, rollout, mask)
        geometric = guarded_mean(log_ratio, mask, -1, delta=1e-8)
        seq = (log_ratio * mask).sum(dim=-1) if aggregate == "sum" else geometric
        keep = _inside(seq, lower, upper).unsqueeze(-1)
        return geometric.exp().unsqueeze(-1) * mask * keep

    return fn
