"""Soft-gated policy losses: SAPO's sigmoid gate and VESPO's gamma weight.

Both replace PPO's hard clip by a smooth function of the ratio and pick their parameters by
the sign of the advantage.

* SAPO, formula from TRL 1.16.0 ``trl/trainer/grpo_trainer.py``, ``GRPOTrainer._compute_loss``
  (``loss_type="sapo"``, also at commit f2cd57710ae345ea6428ae95363267fcf38a3dc8) and AReaL
  ``areal/utils/functional/functional.py``, ``sapo_loss_fn`` (commit
  4aef98d8d818af55b43621aaadba047ae10f4e77): the per-token loss is minus the advantage times
  ``(4/τ)·σ(τ·(r - 1))``, with ``r = exp(logp - old)`` not detached and ``τ`` the positive
  temperature where ``A > 0``, the negative one elsewhere (defaults 1.0 and 1.05 in both).
  The factor ``4/τ`` makes the gate's slope 1 at ``r = 1`` for every temperature, so on
  policy SAPO has PPO's gradient ``-A``; its value there is ``-2A/τ``.
* VESPO, formula from the same TRL file, ``GRPOTrainer.get_gamma_weights`` and
  ``loss_type="vespo"``: the per-token loss is ``-sg(φ(w))·A·logp`` with ``w`` the
  *sequence* ratio ``exp(Σ_t m·clamp(logp - old, ±20))`` (a sum, not GSPO's mean), its log
  clamped to ``[log 1e-8, 20]``, and ``φ(w) = exp(λ + k·log w - λ·w)`` (so ``φ(1) = 1``), with
  ``(k, λ)`` the positive pair where ``A ≥ 0`` (defaults 2, 3) and the negative pair elsewhere
  (defaults 3, 2). TRL computes ``φ`` under ``no_grad``.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

from .correction import SAFETY_BOUND
from .losses import AggMode, aggregate_loss
from .masking import masked_fill_zero

SoftLossType = Literal["sapo", "vespo"]
SAPO_TAU_POS = 1.0
SAPO_TAU_NEG = 1.05
"""SAPO's default temperatures for positive and non-positive advantages (TRL and AReaL)."""
VESPO_K_POS, VESPO_LAMBDA_POS = 2.0, 3.0
VESPO_K_NEG, VESPO_LAMBDA_NEG = 3.0, 2.0
"""VESPO's default ``(k, λ)`` for ``A ≥ 0`` and for ``A < 0`` (TRL)."""
VESPO_LOG_W_MIN = math.log(1e-8)
VESPO_LOG_W_MAX = 20.0
"""TRL's clamp of VESPO's sequence log ratio."""


def sapo_temperatures(advantages: Tensor, tau_pos: float, tau_neg: float) -> Tensor:
    """Per-token temperature: ``tau_pos`` where ``A > 0``, ``tau_neg`` elsewhere."""
    if tau_pos <= 0 or tau_neg <= 0:
        raise ValueError(f"SAPO temperatures must be > 0, got {tau_pos} and {tau_neg}")
    pos = torch.full_like(advantages, tau_pos, dtype=torch.float64)
    return torch.where(advantages > 0, pos, torch.full_like(pos, tau_neg)).to(advantages.dtype)


def sapo_token_losses(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    *,
    tau_pos: float = SAPO_TAU_POS,
    tau_neg: float = SAPO_TAU_NEG,
) -> Tensor:
    """Per-token SAPO loss ``-(4/τ)·σ(τ·(r - 1))·A`` with ``r = exp(clamp(logp - old, ±20))``
    (the clamp changes nothing a finite-precision sigmoid can show: beyond it the gate is
    flat)."""
    tau = sapo_temperatures(advantages, tau_pos, tau_neg)
    ratio = (log_prob - old_log_prob).clamp(-SAFETY_BOUND, SAFETY_BOUND).exp()
    return -(4.0 / tau) * torch.sigmoid(tau * (ratio - 1.0)) * advantages


def vespo_log_weight(log_prob: Tensor, old_log_prob: Tensor, response_mask: Tensor) -> Tensor:
    """``[B, 1]`` VESPO's sequence log ratio ``clamp(Σ_t m·clamp(logp - old, ±20),
    log 1e-8, 20)``."""
    per_token = (log_prob - old_log_prob).clamp(-SAFETY_BOUND, SAFETY_BOUND)
    total = masked_fill_zero(per_token, response_mask).sum(dim=-1, keepdim=True)
    return total.clamp(VESPO_LOG_W_MIN, VESPO_LOG_W_MAX)


def vespo_weights(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    k_pos: float = VESPO_K_POS,
    lambda_pos: float = VESPO_LAMBDA_POS,
    k_neg: float = VESPO_K_NEG,
    lambda_neg: float = VESPO_LAMBDA_NEG,
) -> Tensor:
    """Detached per-token gamma weight ``φ(w) = exp(λ + k·log w - λ·w)`` of the token's row,
    ``(k, λ)`` chosen by the token's advantage (``A ≥ 0``: the positive pair)."""
    if lambda_pos <= 0 or lambda_neg <= 0:
        raise ValueError(f"VESPO's λ must be > 0, got {lambda_pos} and {lambda_neg}")
    with torch.no_grad():
        log_w = vespo_log_weight(log_prob, old_log_prob, response_mask)
        nonneg = advantages >= 0
        k = torch.where(nonneg, k_pos, k_neg).to(log_w.dtype)
        lam = torch.where(nonneg, lambda_pos, lambda_neg).to(log_w.dtype)
        return torch.exp(lam + k * log_w - lam * log_w.exp())


def vespo_token_losses(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    **params: float,
) -> Tensor:
    """Per-token VESPO loss ``-sg(φ(w))·A·logp`` (``params``: those of :func:`vespo_weights`)."""
    weight = vespo_weights(log_prob, old_log_prob, advantages, response_mask, **params)
    return -weight * advantages * log_prob


def soft_policy_loss(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    loss_type: SoftLossType = "sapo",
    agg_mode: AggMode = "token-mean",
    global_tokens: int | Tensor | None = None,
    global_seqs: int | Tensor | None = None,
    loss_scale_factor: float | None = None,
    tau_pos: float = SAPO_TAU_POS,
    tau_neg: float = SAPO_TAU_NEG,
    k_pos: float = VESPO_K_POS,
    lambda_pos: float = VESPO_LAMBDA_POS,
    k_neg: float = VESPO_K_NEG,
    lambda_neg: float = VESPO_LAMBDA_NEG,
) -> Tensor:
    """The SAPO or VESPO loss aggregated by :func:`~.losses.aggregate_loss` (TRL: ``sapo``
    as ``seq-mean-token-mean``, ``vespo`` as ``token-mean`` over the step's tokens; AReaL's
    ``sapo_loss_fn``: ``token-mean``)."""
    if loss_type == "sapo":
        per_token = sapo_token_losses(
            log_prob, old_log_prob, advantages, tau_pos=tau_pos, tau_neg=tau_neg
        )
    elif loss_type == "vespo":
        per_token = vespo_token_losses(
            log_prob,
            old_log_prob,
            advantages,
            response_mask,
            k_pos=k_pos,
            lambda_pos=lambda_pos,
            k_neg=k_neg,
            lambda_neg=lambda_neg,
        )
    else:
        raise ValueError(f"unknown loss_type {loss_type!r}; expected 'sapo' or 'vespo'")
    return aggregate_loss(
        per_token,
        response_mask,
        agg_mode,
        global_tokens=global_tokens,
        global_seqs=global_seqs,
        loss_scale_factor=loss_scale_factor,
    )
