"""Checkers for the soft-gated policy losses SAPO (TRL, AReaL) and VESPO (TRL), and for
TRL's length-unbiased LUSPO (GSPO's sequence ratio, each sequence weighed by its length)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..reference import correction as corr, soft_gates as soft
from ..reference.losses import AggMode, aggregate_loss, sequence_log_ratio
from ..reference.masking import masked_fill_zero
from .comparison import (
    GUARD_RTOL,
    Batch,
    accumulation_roundoff,
    batch_counts,
    f64,
    fail,
    fmt,
    positions,
    resolve_tolerance,
    unequal_coefficients,
    unit_roundoff,
    valid_mask,
)
from .evaluation import Evaluation, LossTolerance, as_float64, compare_losses
from .losses import PPO_CLIP_INVARIANTS, ClipSettings, PPOClipRun

__all__ = ["check_luspo", "check_sapo", "check_vespo"]

UNJUDGED_SLACK = 0.1
"""Tokens whose expected gradient carries more than this relative rounding are not judged
(the gradient is then mostly rounding, either way)."""


@dataclass(frozen=True)
class _SoftSettings:
    """The aggregation the user declares, the loss's parameters, the tolerance asked for."""

    agg_mode: AggMode | None
    loss_scale_factor: float | None
    rtol: float | None
    atol: float | None
    params: dict[str, float]


class _SoftRun:
    """A soft-gated loss evaluated on the batch (``rollout_log_probs = old_log_probs``): its
    gradient is ``-A_t·slope_t·c_t`` with ``c_t`` the aggregation's coefficient (one value per
    row). Subclasses set ``slope``, ``slack`` (its relative rounding), ``judgeable`` (tokens
    whose gradient can be judged) and ``describe``."""

    name: str
    slope: Tensor
    slack: Tensor
    judgeable: Tensor

    def __init__(self, loss_fn: Callable[..., Any], batch: Batch, settings: _SoftSettings):
        self.batch, self.settings = batch, settings
        self.work = dict(batch)
        self.work["rollout_log_probs"] = batch["old_log_probs"].clone()
        self.result = Evaluation(self.name, loss_fn, self.work)
        self.grad = self.result.grad
        self.valid = valid_mask(batch)
        self.eps = unit_roundoff(batch["log_probs"].dtype, self.result.dtype)
        self.tiny = max(torch.finfo(batch["log_probs"].dtype).tiny, 1e-300)
        self.log_probs64, self.old64 = f64(batch["log_probs"]), f64(batch["old_log_probs"])
        self.log_ratio = self.log_probs64 - self.old64
        self.advantages = f64(batch["advantages"])

    @property
    def judged(self) -> Tensor:
        return self.valid & self.judgeable & (self.advantages != 0)

    def describe(self, b: int, t: int) -> str:
        raise NotImplementedError

    def line(self, b: int, t: int) -> str:
        return (
            f"(b={b}, t={t}): A={fmt(float(self.advantages[b, t]))}, {self.describe(b, t)}, "
            f"gradient={fmt(float(self.grad[b, t]))}"
        )

    def gradient_sign(self, summary: str) -> None:
        """Judged tokens must have a gradient of the sign of ``-A``."""
        wrong = self.judged & ~(self.grad * -self.advantages.sign() > 0)
        if bool(wrong.any()):
            fail(f"{self.name}.gradient_sign", summary, [self.line(*p) for p in positions(wrong)])

    def one_coefficient_per_row(self, invariant: str, summary: str) -> None:
        """``gradient / (-A·slope)`` is the aggregation's coefficient: one value per row."""
        judged = self.judged
        denominator = (-self.advantages * self.slope).where(judged, torch.ones_like(self.slope))
        coefficient = self.grad / denominator
        lines = []
        for b, t, first in unequal_coefficients(coefficient, judged, self.slack, per_row=True):
            lines.append(
                f"{self.line(b, t)}: gradient/(-A·slope)={fmt(float(coefficient[b, t]))}, "
                f"at t={first} {fmt(float(coefficient[b, first]))}"
            )
        if lines:
            fail(invariant, summary, lines)

    def reference_agreement(self, what: str) -> None:
        """With ``agg_mode``: value and gradient equal :func:`soft_policy_loss`'s."""
        settings = self.settings
        if settings.agg_mode is None:
            return
        global_tokens, global_seqs = batch_counts(self.batch)
        options = {
            "loss_type": self.name,
            "agg_mode": settings.agg_mode,
            "global_tokens": global_tokens,
            "global_seqs": global_seqs,
            "loss_scale_factor": settings.loss_scale_factor,
            **settings.params,
        }

        def reference(b: Batch, **_: Any) -> Tensor:
            inputs = (b["log_probs"], b["old_log_probs"], b["advantages"], b["response_mask"])
            return soft.soft_policy_loss(*inputs, **options)

        expected = Evaluation(self.name, reference, as_float64(self.work))
        tolerance = LossTolerance(
            self.batch, [self.result.dtype], expected, rtol=settings.rtol, atol=settings.atol
        )
        # The per-token terms may cancel in the sum: their rounding scales with their sizes.
        sizes = aggregate_loss(
            self.magnitudes(),
            self.batch["response_mask"],
            settings.agg_mode,
            global_tokens=global_tokens,
            global_seqs=global_seqs,
            loss_scale_factor=settings.loss_scale_factor,
        )
        tolerance.value_scale += float(sizes)
        grad_rtol = torch.maximum(self.slack, torch.full_like(self.slack, tolerance.grad.rtol))
        tolerance.grad = resolve_tolerance(
            grad_rtol, tolerance.grad.atol, settings.rtol, settings.atol
        )
        compare_losses(
            f"{self.name}.reference_agreement",
            what,
            tolerance,
            self.result,
            expected,
            got_name="fn",
            expected_name="reference",
            grad_mask=self.judgeable | ~self.valid,
        )

    def magnitudes(self) -> Tensor:
        raise NotImplementedError


# --------------------------------------------------------------------------- SAPO


class _SAPORun(_SoftRun):
    """SAPO's gate ``(4/τ)·σ(τ(r-1))`` per token and its slope ``d gate / d log r``."""

    name = "sapo"

    def __init__(self, loss_fn: Callable[..., Any], batch: Batch, settings: _SoftSettings):
        super().__init__(loss_fn, batch, settings)
        params, eps = settings.params, self.eps
        self.tau = soft.sapo_temperatures(self.advantages, params["tau_pos"], params["tau_neg"])
        self.ratio = self.log_ratio.clamp(-corr.SAFETY_BOUND, corr.SAFETY_BOUND).exp()
        x = self.tau * (self.ratio - 1)
        upper, lower = torch.sigmoid(x), torch.sigmoid(-x)
        self.gate = 4 / self.tau * upper
        self.slope = 4 * upper * lower * self.ratio
        # Autograd takes the sigmoid's slope from its rounded output, σ·(1 - σ): where 1 - σ
        # is near the dtype's eps it is mostly rounding, and 0 once σ rounds to 1.
        inputs = 2 + self.log_probs64.abs() + self.old64.abs()
        self.slack = (
            16 * eps * inputs * (1 + self.tau * self.ratio) + 4 * eps / lower + 2 * GUARD_RTOL
        )
        beyond = self.log_ratio.abs() >= corr.SAFETY_BOUND
        self.judgeable = ~(self.valid & (beyond | (self.slack > UNJUDGED_SLACK)))

    def describe(self, b: int, t: int) -> str:
        return (
            f"ratio={fmt(float(self.ratio[b, t]))}, τ={fmt(float(self.tau[b, t]))}, "
            f"expected slope={fmt(float(self.slope[b, t]))}"
        )

    def magnitudes(self) -> Tensor:
        return self.gate * self.advantages.abs()


def _sapo_gradient_sign(run: _SoftRun) -> None:
    run.gradient_sign(
        "tokens must have a gradient with the sign of -A (the sigmoid gate never stops the "
        "gradient; a hard clip does)"
    )


def _sapo_soft_gate(run: _SoftRun) -> None:
    run.one_coefficient_per_row(
        "sapo.soft_gate",
        "the gradient is not -A·4σ(x)(1-σ(x))·r, x = τ·(r - 1), times one coefficient per "
        "row: the gate is clipped or not a sigmoid of the ratio, lacks the 4/τ scale, or "
        "uses the temperature of the other advantage sign",
    )


def _sapo_reference_agreement(run: _SoftRun) -> None:
    run.reference_agreement(f"SAPO with agg_mode={run.settings.agg_mode!r}, {run.settings.params}")


_SAPO_INVARIANTS: tuple[Callable[[_SoftRun], None], ...] = (
    _sapo_gradient_sign,
    _sapo_soft_gate,
    _sapo_reference_agreement,
)
"""The invariants of :func:`check_sapo`, in the order they are judged."""


def check_sapo(
    loss_fn: Callable[..., Any],
    batch: Batch,
    *,
    tau_pos: float = soft.SAPO_TAU_POS,
    tau_neg: float = soft.SAPO_TAU_NEG,
    agg_mode: AggMode | None = None,
    loss_scale_factor: float | None = None,
    rtol: float | None = None,
    atol: float | None = None,
) -> None:
    """Check a SAPO policy loss ``-(4/τ)·σ(τ·(r - 1))·A`` (token-level ratio ``r``, ``τ`` =
    ``tau_pos`` where ``A > 0``, ``tau_neg`` elsewhere) through its gradient and, with
    ``agg_mode``, its value.

    The checker sets ``rollout_log_probs = old_log_probs``. The gradient of token ``t`` is
    ``-A·slope·c_t`` with ``slope = 4σ(x)(1 - σ(x))·r``, ``x = τ(r - 1)`` (1 at ``r = 1``
    for every ``τ``: on policy SAPO has PPO's gradient) and ``c_t`` the aggregation's
    coefficient:

    * ``sapo.gradient_sign``: every judged token with ``A != 0`` has a gradient of sign
      ``-A`` (a hard clip zeroes it);
    * ``sapo.soft_gate``: ``gradient / (-A·slope)`` is one value per row (a clipped gate,
      a missing ``4/τ`` or temperatures swapped between the advantage signs change it
      token by token);
    * ``sapo.reference_agreement`` (with ``agg_mode``): value and gradient equal
      :func:`~pytest_rollout_golden.reference.soft_gates.soft_policy_loss`'s (TRL
      ``loss_type="sapo"``: ``seq-mean-token-mean``; AReaL ``sapo_loss_fn``: ``token-mean``).

    Not judged: tokens with a log ratio beyond ±20, and tokens where the gate is saturated
    in the dtype (``1 - σ(x)`` within a few ``eps``, where autograd's slope is rounding).
    """
    params = {"tau_pos": tau_pos, "tau_neg": tau_neg}
    settings = _SoftSettings(agg_mode, loss_scale_factor, rtol, atol, params)
    run = _SAPORun(loss_fn, batch, settings)
    for invariant in _SAPO_INVARIANTS:
        invariant(run)


# --------------------------------------------------------------------------- VESPO


class _VESPORun(_SoftRun):
    """VESPO's detached gamma weight ``φ(w)`` of each token's row and its rounding."""

    name = "vespo"

    def __init__(self, loss_fn: Callable[..., Any], batch: Batch, settings: _SoftSettings):
        super().__init__(loss_fn, batch, settings)
        eps, mask, p = self.eps, batch["response_mask"], settings.params
        self.log_w = soft.vespo_log_weight(self.log_probs64, self.old64, mask)
        nonneg = self.advantages >= 0
        k = torch.where(nonneg, p["k_pos"], p["k_neg"]).to(torch.float64)
        lam = torch.where(nonneg, p["lambda_pos"], p["lambda_neg"]).to(torch.float64)
        w = self.log_w.exp()
        self.log_phi = lam + k * self.log_w - lam * w
        self.slope = self.log_phi.exp()
        # log w is a row sum of rounded differences; log φ is then rounded at its terms' size.
        n_row = self.valid.sum(dim=-1, keepdim=True).to(torch.float64)
        row_inputs = masked_fill_zero(self.log_probs64.abs() + self.old64.abs(), mask)
        row_ratio = masked_fill_zero(self.log_ratio.abs(), mask)
        acc = accumulation_roundoff(eps)
        delta_log_w = 8 * eps * row_inputs.sum(-1, keepdim=True)
        delta_log_w = delta_log_w + 8 * acc * n_row * row_ratio.sum(-1, keepdim=True)
        log_phi_terms = lam + k * self.log_w.abs() + lam * w
        self.slack = (
            (k - lam * w).abs() * delta_log_w
            + 8 * eps * (2 + log_phi_terms + self.log_probs64.abs())
            + 2 * GUARD_RTOL
        )
        # φ near the dtype's underflow leaves a gradient of rounding (or 0).
        underflow = self.log_phi < math.log(self.tiny) + 30
        self.judgeable = ~(self.valid & (underflow | (self.slack > UNJUDGED_SLACK)))

    def describe(self, b: int, t: int) -> str:
        return (
            f"row log w={fmt(float(self.log_w[b, 0]))}, φ(w)={fmt(float(self.slope[b, t]))}, "
            f"log_prob={fmt(float(self.log_probs64[b, t]))}"
        )

    def magnitudes(self) -> Tensor:
        return self.slope * (self.advantages * self.log_probs64).abs()


def _vespo_gradient_sign(run: _SoftRun) -> None:
    run.gradient_sign("tokens must have a gradient with the sign of -A (φ(w) > 0)")


def _vespo_stop_gradient(run: _SoftRun) -> None:
    run.one_coefficient_per_row(
        "vespo.stop_gradient",
        "the gradient is not -A·φ(w) times one coefficient per row: φ is not detached, or "
        "not computed from the row's log ratio (a per-token ratio), or (in rows with "
        "advantages of both signs) uses the other sign's (k, λ)",
    )


def _vespo_reference_agreement(run: _SoftRun) -> None:
    run.reference_agreement(f"VESPO with agg_mode={run.settings.agg_mode!r}, {run.settings.params}")


_VESPO_INVARIANTS: tuple[Callable[[_SoftRun], None], ...] = (
    _vespo_gradient_sign,
    _vespo_stop_gradient,
    _vespo_reference_agreement,
)
"""The invariants of :func:`check_vespo`, in the order they are judged."""


def check_vespo(
    loss_fn: Callable[..., Any],
    batch: Batch,
    *,
    k_pos: float = soft.VESPO_K_POS,
    lambda_pos: float = soft.VESPO_LAMBDA_POS,
    k_neg: float = soft.VESPO_K_NEG,
    lambda_neg: float = soft.VESPO_LAMBDA_NEG,
    agg_mode: AggMode | None = None,
    loss_scale_factor: float | None = None,
    rtol: float | None = None,
    atol: float | None = None,
) -> None:
    """Check a VESPO policy loss ``-sg(φ(w))·A·log π`` through its gradient and, with
    ``agg_mode``, its value. ``w`` is the row's sequence ratio ``exp(Σ_t clamp(logp - old,
    ±20))`` with its log clamped to ``[log 1e-8, 20]`` (TRL), ``φ(w) = exp(λ + k·log w -
    λ·w)``, ``(k, λ)`` the positive pair where ``A ≥ 0``.

    The checker sets ``rollout_log_probs = old_log_probs``; the gradient of token ``t`` is
    ``-A·φ·c_t``:

    * ``vespo.gradient_sign``: every judged token with ``A != 0`` has a gradient of sign
      ``-A``;
    * ``vespo.stop_gradient``: ``gradient / (-A·φ)`` is one value per row (a weight that is
      not detached adds ``-A·log π·∂φ``; a per-token ratio changes ``φ`` token by token);
    * ``vespo.reference_agreement`` (with ``agg_mode``; TRL: ``token-mean`` over the step's
      tokens): value and gradient, which also catch a mean log ratio instead of the sum and
      ``(k, λ)`` swapped between the advantage signs in rows of one sign.

    Not judged: tokens whose ``φ`` is near the dtype's underflow, or carries more than 10%
    rounding (a long row's summed log ratio far from 0 in bf16).
    """
    params = {"k_pos": k_pos, "lambda_pos": lambda_pos, "k_neg": k_neg, "lambda_neg": lambda_neg}
    settings = _SoftSettings(agg_mode, loss_scale_factor, rtol, atol, params)
    run = _VESPORun(loss_fn, batch, settings)
    for invariant in _VESPO_INVARIANTS:
        invariant(run)


# --------------------------------------------------------------------------- LUSPO


def _luspo_length_unbiased(run: PPOClipRun) -> None:
    """On unclipped tokens ``gradient / (-A·s)`` is one batch-wide value."""
    clipped = run.regions["ppo_clip.upper_clip"] | run.regions["ppo_clip.lower_clip"]
    free = run.judged & (run.advantages != 0) & ~clipped
    eps, mask = run.eps, run.batch["response_mask"]
    n_row = run.valid.sum(dim=-1, keepdim=True).to(torch.float64)
    inputs = masked_fill_zero(run.log_probs64.abs() + run.old64.abs(), mask)
    row_max = inputs.max(dim=-1, keepdim=True).values
    seq = sequence_log_ratio(run.log_probs64, run.old64, mask).unsqueeze(-1).abs()
    acc = accumulation_roundoff(eps)
    slack = (16 * (eps + acc * n_row) * (2 + row_max) + 2 * GUARD_RTOL * (1 + seq)).expand_as(
        run.grad
    )
    denominator = (-run.advantages * run.ratio).where(free, torch.ones_like(run.ratio))
    coefficient = run.grad / denominator
    lines = [
        f"{run.line(b, t)}: gradient/(-A·s)={fmt(float(coefficient[b, t]))}, at the batch's "
        f"first judged token {fmt(float(coefficient[free].flatten()[0]))}"
        for b, t, _ in unequal_coefficients(coefficient, free, slack, per_row=False)
    ]
    if lines:
        fail(
            "luspo.length_unbiased",
            "the gradient is not -A·s (s the sequence ratio) times one batch-wide constant: "
            "LUSPO scales each sequence's loss by its length, so a token's gradient does not "
            "depend on its row's length (1/|y| per row is GSPO's seq-mean-token-mean)",
            lines,
        )


def check_luspo(
    loss_fn: Callable[..., Any],
    batch: Batch,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float | None = None,
    agg_mode: AggMode | None = "seq-mean-token-sum",
    rtol: float | None = None,
    atol: float | None = None,
) -> None:
    """Check a LUSPO policy loss: GSPO's clipped sequence ratio ``s`` (no dual clip), each
    sequence's loss multiplied by its length, averaged over sequences (TRL
    ``loss_type="luspo"`` with ``importance_sampling_level="sequence"``).

    Runs the invariants of :func:`check_ppo_clip` with ``ratio_level="sequence"``,
    ``clip_ratio_c=None`` and ``agg_mode`` (``seq-mean-token-sum`` is LUSPO's; ``None``
    skips the reference agreement), then

    * ``luspo.length_unbiased``: on unclipped tokens, ``gradient / (-A·s)`` is one value
      for the whole batch, whatever the rows' lengths.

    Give sequence-level advantages (one value per row), as LUSPO does.
    """
    settings = ClipSettings(clip_ratio_low, clip_ratio_high, agg_mode, None, rtol, atol)
    run = PPOClipRun(loss_fn, batch, settings, clip_ratio_c=None, ratio_level="sequence")
    for invariant in PPO_CLIP_INVARIANTS:
        invariant(run)
    _luspo_length_unbiased(run)
