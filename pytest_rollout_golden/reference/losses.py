"""Policy losses (PPO-clip with dual clip and token- or sequence-level (GSPO) ratios, CISPO,
REINFORCE, bypass mode), aggregation, KL estimators.

Aggregation is written with explicit global normalizers so that the losses of micro-batches
and data-parallel shards, each computed with the counts of the *whole* step, add up to the
full-batch loss (see :func:`aggregate_loss`).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from .correction import SAFETY_BOUND, ISLevel, rollout_correction
from .masking import as_bool_mask, masked_count, masked_fill_zero, masked_mean, segment_sum

AggMode = Literal[
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
]
AGG_MODES: tuple[str, ...] = (
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)
LossType = Literal["ppo_clip", "reinforce", "cispo"]
RatioLevel = Literal["token", "sequence"]
RATIO_LEVELS: tuple[str, ...] = ("token", "sequence")
KL_ESTIMATORS: tuple[str, ...] = ("k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl")
K3_BOUND = 10.0
"""verl's clamp of the k3 value, ``[-10, 10]`` (NeMo-RL's and AReaL's default output clamp)."""


def _denominator(count: int | float | Tensor, like: Tensor) -> Tensor:
    return torch.as_tensor(count, device=like.device).to(like.dtype).clamp(min=1)


def aggregate_loss(
    loss_mat: Tensor,
    response_mask: Tensor,
    mode: AggMode = "token-mean",
    *,
    global_tokens: int | Tensor | None = None,
    global_seqs: int | Tensor | None = None,
    loss_scale_factor: float | None = None,
    cu_seqlens: Tensor | None = None,
) -> Tensor:
    """Reduce per-token losses to a scalar.

    With ``S_b = Σ_t m·L`` and ``n_b = Σ_t m`` per sequence:

    * ``token-mean``: ``Σ_b S_b / global_tokens``
    * ``token-sum``: ``Σ_b S_b``
    * ``seq-mean-token-sum``: ``Σ_b S_b / global_seqs``
    * ``seq-mean-token-mean``: ``Σ_b (S_b / n_b) / global_seqs`` (empty sequences add 0)
    * ``seq-mean-token-sum-norm``: ``Σ_b S_b / global_seqs / loss_scale_factor``

    ``global_tokens`` / ``global_seqs`` default to this batch's counts of valid tokens and of
    sequences with at least one valid token; pass the whole step's counts when this batch is
    a micro-batch or a DP shard. ``loss_scale_factor`` defaults to the padded length ``T``
    (packed input has none, so it is then required). Packed input: ``loss_mat`` and
    ``response_mask`` are ``[1, N]`` and ``cu_seqlens`` ``[S + 1]`` delimits the sequences.
    A zero normalizer is treated as 1.
    """
    if mode not in AGG_MODES:
        raise ValueError(f"unknown aggregation mode {mode!r}; expected one of {AGG_MODES}")
    kept = masked_fill_zero(loss_mat, response_mask)
    if mode == "token-sum":
        return kept.sum()
    if mode == "token-mean":
        tokens = masked_count(response_mask) if global_tokens is None else global_tokens
        return kept.sum() / _denominator(tokens, kept)
    if cu_seqlens is None:
        seq_sums = kept.sum(dim=-1)
        seq_tokens = masked_count(response_mask, dim=-1)
    else:
        seq_sums = segment_sum(kept, cu_seqlens)
        seq_tokens = segment_sum(as_bool_mask(response_mask).long(), cu_seqlens)
    seqs = (seq_tokens > 0).sum() if global_seqs is None else global_seqs
    if mode == "seq-mean-token-mean":
        seq_sums = seq_sums / seq_tokens.to(seq_sums.dtype).clamp(min=1)
    loss = seq_sums.sum() / _denominator(seqs, kept)
    if mode == "seq-mean-token-sum-norm":
        if loss_scale_factor is None:
            if cu_seqlens is not None:
                raise ValueError("seq-mean-token-sum-norm on packed input needs loss_scale_factor")
            loss_scale_factor = float(loss_mat.shape[-1])
        loss = loss / loss_scale_factor
    return loss


def sequence_log_ratio(log_prob: Tensor, old_log_prob: Tensor, response_mask: Tensor) -> Tensor:
    """``[B]`` mean over each row's valid tokens of ``logp - old``: the log of GSPO's sequence
    ratio ``s_i = (π_θ(y_i)/π_old(y_i))^(1/|y_i|)`` (0 for a row without valid tokens)."""
    return masked_mean(log_prob - old_log_prob, response_mask, dim=-1)


def policy_log_ratio(
    log_prob: Tensor,
    old_log_prob: Tensor,
    response_mask: Tensor | None = None,
    *,
    ratio_level: RatioLevel = "token",
) -> Tensor:
    """Per-token log ratio ``[B, T]`` of the policy loss.

    ``"token"``: ``logp - old``. ``"sequence"`` (GSPO): ``sg(log s_i) + logp - sg(logp)``,
    whose value is the row's sequence log ratio and whose derivative w.r.t. ``logp_t`` is 1,
    so that aggregating with ``seq-mean-token-mean`` gives GSPO's gradient ``s_i/|y_i|``.
    """
    if ratio_level == "token":
        return log_prob - old_log_prob
    if ratio_level != "sequence":
        raise ValueError(f"ratio_level must be one of {RATIO_LEVELS}, got {ratio_level!r}")
    if response_mask is None:
        raise ValueError("a sequence-level ratio needs the response mask")
    seq = sequence_log_ratio(log_prob.detach(), old_log_prob, response_mask)
    # logp - sg(logp) is exactly 0: added first, seq would be rounded at the scale of logp.
    return (log_prob - log_prob.detach()) + seq.unsqueeze(-1)


def ppo_clip_token_losses(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float | None = None,
    clip_ratio_c: float | None = 3.0,
    ratio_level: RatioLevel = "token",
    response_mask: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Per-token dual-clip PPO loss and two bool flags: clipped, dual-clipped.

    ``r = exp(clamp(log ratio, ±20))`` (:func:`policy_log_ratio`: per token, or GSPO's sequence
    ratio with ``ratio_level="sequence"``, which needs ``response_mask``), ``l1 = -A·r``,
    ``l2 = -A·clamp(r, 1-ε_low, 1+ε_high)``, ``c1 = max(l1, l2)``,
    ``c2 = min(-A·clip_ratio_c, c1)``, loss ``= c2 if A < 0 else c1``. ``clip_ratio_high``
    defaults to ``clip_ratio_low``; ``clip_ratio_c`` must exceed 1, or be ``None`` (no dual
    clip, as in GSPO).
    """
    if clip_ratio_c is not None and clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c must be > 1 (or None), got {clip_ratio_c}")
    high = clip_ratio_low if clip_ratio_high is None else clip_ratio_high
    log_ratio = policy_log_ratio(log_prob, old_log_prob, response_mask, ratio_level=ratio_level)
    ratio = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND).exp()
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_ratio_low, 1.0 + high)
    upper = torch.maximum(unclipped, clipped)
    if clip_ratio_c is None:
        return upper, clipped > unclipped, torch.zeros_like(clipped > unclipped)
    dual_bound = -advantages * clip_ratio_c
    dual = torch.minimum(dual_bound, upper)
    negative = advantages < 0
    loss = torch.where(negative, dual, upper)
    return loss, clipped > unclipped, negative & (upper > dual_bound)


def cispo_token_losses(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float | None = None,
) -> tuple[Tensor, Tensor]:
    """Per-token CISPO loss ``-sg(clamp(r, 1-ε_low, 1+ε_high))·A·log π`` and the bool flag
    "clipped" (``r`` outside the interval), with ``r = exp(clamp(logp - old, ±20))``.

    The clipped IS weight is detached: every token keeps the gradient ``-w·A`` (unlike
    PPO-clip, which zeroes the gradient of clipped tokens).
    """
    high = clip_ratio_low if clip_ratio_high is None else clip_ratio_high
    ratio = (log_prob - old_log_prob).clamp(-SAFETY_BOUND, SAFETY_BOUND).exp()
    weight = ratio.clamp(1.0 - clip_ratio_low, 1.0 + high).detach()
    return -weight * advantages * log_prob, weight != ratio.detach()


def reinforce_token_losses(
    log_prob: Tensor, advantages: Tensor, is_weights: Tensor | None = None
) -> Tensor:
    """Per-token REINFORCE surrogate ``-A·log π·w`` (``w`` detached, 1 when absent)."""
    loss = -advantages * log_prob
    return loss if is_weights is None else loss * is_weights.detach()


def policy_loss(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    loss_type: LossType = "ppo_clip",
    is_weights: Tensor | None = None,
    agg_mode: AggMode = "token-mean",
    global_tokens: int | Tensor | None = None,
    global_seqs: int | Tensor | None = None,
    loss_scale_factor: float | None = None,
    cu_seqlens: Tensor | None = None,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float | None = None,
    clip_ratio_c: float | None = 3.0,
    ratio_level: RatioLevel = "token",
) -> tuple[Tensor, dict[str, float]]:
    """Aggregated policy loss and ``actor/`` metrics (pg_clipfrac, pg_clipfrac_lower, ppo_kl).

    ``ppo_clip`` (token ratios, or GSPO's sequence ratios with ``ratio_level="sequence"``)
    and ``cispo`` multiply the per-token loss by ``is_weights`` when given (decoupled mode);
    ``reinforce`` uses ``-A·log π·w``. Metrics are means over this batch's valid tokens.
    """
    if loss_type == "ppo_clip":
        if ratio_level == "sequence" and cu_seqlens is not None:
            raise ValueError("sequence-level ratios are computed on padded [B, T] input")
        per_token, clipped, dual = ppo_clip_token_losses(
            log_prob,
            old_log_prob,
            advantages,
            clip_ratio_low=clip_ratio_low,
            clip_ratio_high=clip_ratio_high,
            clip_ratio_c=clip_ratio_c,
            ratio_level=ratio_level,
            response_mask=response_mask,
        )
        if is_weights is not None:
            per_token = per_token * is_weights.detach()
    elif loss_type == "cispo":
        per_token, clipped = cispo_token_losses(
            log_prob,
            old_log_prob,
            advantages,
            clip_ratio_low=clip_ratio_low,
            clip_ratio_high=clip_ratio_high,
        )
        dual = torch.zeros_like(clipped)
        if is_weights is not None:
            per_token = per_token * is_weights.detach()
    elif loss_type == "reinforce":
        per_token = reinforce_token_losses(log_prob, advantages, is_weights)
        clipped = dual = torch.zeros_like(as_bool_mask(response_mask))
    else:
        raise ValueError(
            f"unknown loss_type {loss_type!r}; expected 'ppo_clip', 'reinforce' or 'cispo'"
        )
    loss = aggregate_loss(
        per_token,
        response_mask,
        agg_mode,
        global_tokens=global_tokens,
        global_seqs=global_seqs,
        loss_scale_factor=loss_scale_factor,
        cu_seqlens=cu_seqlens,
    )
    with torch.no_grad():
        kl = (old_log_prob - log_prob).to(torch.float64)
        metrics = {
            "actor/pg_clipfrac": float(masked_mean(clipped.double(), response_mask)),
            "actor/pg_clipfrac_lower": float(masked_mean(dual.double(), response_mask)),
            "actor/ppo_kl": float(masked_mean(kl, response_mask)),
        }
    return loss, metrics


def bypass_policy_loss(
    log_prob: Tensor,
    rollout_log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    loss_type: LossType = "ppo_clip",
    is_level: ISLevel | None = None,
    is_threshold: float | str | None = 2.0,
    is_batch_normalize: bool = False,
    rs: str | None = None,
    rs_threshold: float | str | None = None,
    agg_mode: AggMode = "token-mean",
    global_tokens: int | Tensor | None = None,
    global_seqs: int | Tensor | None = None,
    loss_scale_factor: float | None = None,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float | None = None,
    clip_ratio_c: float = 3.0,
) -> tuple[Tensor, dict[str, float]]:
    """Bypass mode: the rollout log-probs stand in for the old ones.

    IS weights ``π_θ/π_rollout`` (detached) and the RS mask are computed from the current
    log-probs. ``reinforce`` applies the weights explicitly; ``ppo_clip`` uses
    ``old = rollout`` and no extra weight (the PPO ratio already is the IS ratio). Both
    train on the RS-filtered mask. Metrics: ``actor/`` plus ``rollout_corr/``.
    """
    weights, keep, metrics = rollout_correction(
        log_prob.detach(),
        rollout_log_prob,
        response_mask,
        is_level=is_level,
        is_threshold=is_threshold,
        is_batch_normalize=is_batch_normalize,
        rs=rs,
        rs_threshold=rs_threshold,
    )
    loss, actor_metrics = policy_loss(
        log_prob,
        rollout_log_prob,
        advantages,
        keep,
        loss_type=loss_type,
        is_weights=weights if loss_type == "reinforce" else None,
        agg_mode=agg_mode,
        global_tokens=global_tokens,
        global_seqs=global_seqs,
        loss_scale_factor=loss_scale_factor,
        clip_ratio_low=clip_ratio_low,
        clip_ratio_high=clip_ratio_high,
        clip_ratio_c=clip_ratio_c,
    )
    metrics.update(actor_metrics)
    return loss, metrics


def kl_penalty(
    log_prob: Tensor, ref_log_prob: Tensor, estimator: str = "low_var_kl", *, clamp: bool = True
) -> Tensor:
    """Per-token KL estimate between the policy and the reference, with verl's clamps.

    ``k1``/``kl``: ``logp - ref``; ``abs``: ``|logp - ref|``; ``k2``/``mse``:
    ``½(logp - ref)²``; ``k3``/``low_var_kl``: ``clamp(e^d - d - 1, -10, 10)`` with
    ``d = clamp(ref - logp, ±20)`` (verl); ``clamp=False`` gives the exact ``e^d - d - 1``
    (TRL). A ``+`` suffix (``"k3+"``) keeps the estimator's value and takes the gradient of
    k2 (straight-through), ``sg(k) + k2 - sg(k2)``. Other clamps: :func:`kl_estimate`.
    """
    if clamp and estimator.rstrip("+") in ("k3", "low_var_kl"):
        return kl_estimate(
            log_prob, ref_log_prob, estimator, input_clamp=SAFETY_BOUND, output_clamp=K3_BOUND
        )
    return kl_estimate(log_prob, ref_log_prob, estimator)


def kl_estimate(
    log_prob: Tensor,
    ref_log_prob: Tensor,
    estimator: str,
    *,
    input_clamp: float | None = None,
    output_clamp: float | None = None,
    weights: Tensor | None = None,
) -> Tensor:
    """``clamp(w · k(clamp(d, ±input_clamp)), ±output_clamp)``, per token, with
    ``d = ref - logp`` and ``k`` the estimator of :func:`kl_penalty` (``+`` forms included);
    each clamp is skipped when ``None``, ``w`` when ``weights`` is ``None``.

    NeMo-RL's ``calculate_kl`` in this order (``kl_input_clamp_value=20``,
    ``kl_output_clamp_value=10``, ``importance_sampling_weights``), AReaL and OpenRLHF with the
    output clamp at 10 on every estimator, slime's weighted ``low_var_kl``. Where the input
    clamp is active the weight is detached (NeMo-RL): a clamped token passes no gradient.
    """
    if estimator.endswith("+"):
        forward = kl_estimate(
            log_prob,
            ref_log_prob,
            estimator[:-1],
            input_clamp=input_clamp,
            output_clamp=output_clamp,
            weights=weights,
        )
        backward = kl_estimate(log_prob, ref_log_prob, "k2", weights=weights)
        return forward.detach() + (backward - backward.detach())
    d = ref_log_prob - log_prob
    if input_clamp is not None:
        clamped = d.clamp(-input_clamp, input_clamp)
        if weights is not None:
            weights = torch.where(d == clamped, weights, weights.detach())
        d = clamped
    kl = _estimator_value(d, estimator)
    if weights is not None:
        kl = weights * kl
    return kl if output_clamp is None else kl.clamp(-output_clamp, output_clamp)


def _estimator_value(d: Tensor, estimator: str) -> Tensor:
    """The estimator at ``d = ref - logp``."""
    if estimator in ("k1", "kl"):
        return -d
    if estimator == "abs":
        return d.abs()
    if estimator in ("k2", "mse"):
        return 0.5 * d.square()
    if estimator in ("k3", "low_var_kl"):
        return torch.expm1(d) - d
    raise ValueError(f"unknown KL estimator {estimator!r}; expected one of {KL_ESTIMATORS}")
