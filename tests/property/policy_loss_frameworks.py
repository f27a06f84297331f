"""ROLL's TOPR and Kimi k1.5 losses and slime's and TRL's OPSM masks, restated from their
code (the frameworks are not installed here): ROLL 8eb27cc2
``roll/pipeline/rlvr/actor_pg_worker.py`` (``_compute_topr_loss``, ``_compute_kimi15_loss``,
``agg_loss``), slime 624b824a ``slime/utils/ppo_utils.py::compute_opsm_mask``, TRL f2cd5771
``GRPOTrainer.get_off_policy_mask``. Each works in the inputs' dtype, as upstream does."""

from __future__ import annotations

import torch


def roll_token_mean(loss_mat, mask, global_tokens):
    """ROLL ``agg_loss('token-mean')`` with ``batch_num_tokens``: ``Σ L·m / tokens``."""
    return (loss_mat * mask).sum() / global_tokens


def roll_topr(positive_weight=1.0, negative_weight=1.0):
    """ROLL ``pg_variant="topr"``: ratio ``exp(logp - old)`` unclamped, rows split by
    ``scores > 0``, negative rows weighted by the detached ratio clamped to ``[0, 1]``."""

    def loss_fn(batch, *, global_tokens, global_seqs):
        log_probs, old = batch["log_probs"], batch["old_log_probs"]
        advantages, scores = batch["advantages"], batch["scores"]
        ratio = (log_probs - old).exp()
        positive = (scores > 0).to(log_probs.dtype).unsqueeze(-1)
        negative = (scores <= 0).to(log_probs.dtype).unsqueeze(-1)
        positive_loss = -advantages * log_probs * positive
        clipped = torch.clamp(ratio, min=0.0, max=1.0).detach()
        negative_loss = -clipped * advantages * log_probs * negative
        loss = positive_weight * positive_loss + negative_weight * negative_loss
        mask = batch["response_mask"].to(log_probs.dtype)
        return roll_token_mean(loss, mask, global_tokens)

    return loss_fn


def roll_kimi15(tau=0.1):
    """ROLL ``pg_variant="kimi15"``: ``-A·logp + τ·½·(logp - old)²``, token-mean."""

    def loss_fn(batch, *, global_tokens, global_seqs):
        log_probs, old = batch["log_probs"], batch["old_log_probs"]
        loss = -batch["advantages"] * log_probs + tau * 0.5 * (log_probs - old).pow(2)
        mask = batch["response_mask"].to(log_probs.dtype)
        return roll_token_mean(loss, mask, global_tokens)

    return loss_fn


def slime_opsm(delta=1e-4):
    """slime ``compute_opsm_mask``, per sample over the response's tokens (here: the row's
    valid tokens, what slime's per-sample tensors hold), ``1 - mask`` kept."""

    def fn(log_probs, old_log_probs, advantages, response_mask):
        rows = []
        for lp, old, adv, loss_mask in zip(
            log_probs, old_log_probs, advantages, response_mask.to(log_probs.dtype), strict=True
        ):
            seq_kl = ((old - lp) * loss_mask).sum() / torch.clamp_min(loss_mask.sum(), 1)
            mask = ((adv < 0) & (seq_kl > delta)).to(lp.dtype)
            rows.append(1 - mask)
        return torch.stack(rows)

    return fn


def trl_opsm(delta=1e-4):
    """TRL ``get_off_policy_mask`` with ``sampling_per_token_logps`` = the old log-probs:
    keep where ``A ≥ 0`` or the row's mean ``sampling - logp`` is ``≤ delta``."""

    def fn(log_probs, old_log_probs, advantages, response_mask):
        mask = response_mask.to(log_probs.dtype)
        kl_div = old_log_probs - log_probs.detach()
        seq_kl_sum = (kl_div * mask).sum(dim=1, keepdim=True)
        avg_seq_kl = seq_kl_sum / mask.sum(dim=1, keepdim=True).clamp(min=1.0)
        return ((advantages >= 0) | (avg_seq_kl <= delta)).to(dtype=mask.dtype)

    return fn


def trl_grpo(epsilon_low=0.2, epsilon_high=0.2, *, rows="micro-batch"):
    """TRL ``GRPOTrainer._compute_loss`` with ``loss_type="grpo"``, token-level ratio, no KL:
    ``coef_1 = exp(logp - old)`` (no clamp), ``-min(coef_1·A, clamp(coef_1)·A)``, each row's
    token mean (``mask.sum(-1).clamp(min=1)``), ``.mean()`` over the rows (empty rows add 0
    and count), divided by the gradient accumulation steps. ``rows="global"`` divides the
    sum of row means by ``global_rows`` instead: the same on one piece, split invariant."""

    def loss_fn(batch, *, global_tokens, global_seqs, global_rows, n_micro_batches):
        log_probs, advantages = batch["log_probs"], batch["advantages"]
        coef_1 = torch.exp(log_probs - batch["old_log_probs"])
        coef_2 = torch.clamp(coef_1, 1 - epsilon_low, 1 + epsilon_high)
        per_token_loss = -torch.min(coef_1 * advantages, coef_2 * advantages)
        mask = batch["response_mask"].to(log_probs.dtype)
        row_means = (per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
        if rows == "global":
            return row_means.sum() / global_rows
        return row_means.mean() / n_micro_batches

    return loss_fn
