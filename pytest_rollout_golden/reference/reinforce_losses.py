"""REINFORCE-type policy losses with an off-policy correction: ROLL's TOPR and Kimi k1.5.

Both are read from ROLL (alibaba/ROLL at 8eb27cc2, ``roll/pipeline/rlvr/actor_pg_worker.py``
and ``roll/pipeline/agentic/agentic_actor_pg_worker.py``, ``_compute_topr_loss`` and
``_compute_kimi15_loss``, selected by ``pg_variant``); the per-token losses returned here are
then aggregated by ROLL's ``agg_loss`` (:func:`~.losses.aggregate_loss`).
"""

from __future__ import annotations

import torch
from torch import Tensor


def topr_token_losses(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    scores: Tensor,
    *,
    positive_weight: float = 1.0,
    negative_weight: float = 1.0,
) -> Tensor:
    """Per-token TOPR loss (Tapered Off-Policy REINFORCE, arXiv 2503.14286, eq. 8).

    A row whose score (its sequence reward, ``[B]``) is positive takes the plain REINFORCE
    term ``-A·log π`` (no importance weight); a row whose score is ``≤ 0`` takes
    ``-sg(min(r, 1))·A·log π`` with ``r = exp(logp - old)`` (ROLL clamps the ratio to
    ``[0, 1]`` and detaches it; ``r ≥ 0`` always, so only the upper bound acts). The two parts
    are scaled by ``positive_weight`` and ``negative_weight`` (ROLL's
    ``topr_positive_weight`` / ``topr_negative_weight``, default 1). ROLL computes the ratio
    without a clamp of the log ratio.
    """
    positive = (scores > 0).unsqueeze(-1)
    truncated = (log_prob - old_log_prob).exp().clamp(max=1.0).detach()
    weight = torch.where(
        positive,
        torch.full_like(truncated, positive_weight),
        negative_weight * truncated,
    )
    return -weight * advantages * log_prob


def kimi15_token_losses(
    log_prob: Tensor, old_log_prob: Tensor, advantages: Tensor, *, tau: float = 0.1
) -> Tensor:
    """Per-token Kimi k1.5 loss (arXiv 2501.12599, eq. 3): ``-A·log π + τ/2·(logp - old)²``,
    REINFORCE with a squared log-ratio penalty towards the old policy (ROLL's ``kimi15_tau``,
    default 0.1). Its gradient w.r.t. ``logp`` is ``-A + τ·(logp - old)``: at ratio 1 it is
    REINFORCE's.
    """
    return -advantages * log_prob + 0.5 * tau * (log_prob - old_log_prob).square()
