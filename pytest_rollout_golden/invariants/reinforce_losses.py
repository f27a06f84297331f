"""Checkers for ROLL's REINFORCE-type losses: TOPR and Kimi k1.5 (``pg_variant`` ``topr``,
``kimi15``), judged through the per-token gradient and, with ``agg_mode``, the value."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ..reference.losses import AggMode, aggregate_loss
from ..reference.masking import masked_mean
from ..reference.reinforce_losses import kimi15_token_losses, topr_token_losses
from .comparison import (
    GUARD_RTOL,
    Batch,
    batch_counts,
    f64,
    fail,
    fmt,
    positions,
    unequal_coefficients,
    unit_roundoff,
    valid_mask,
)
from .evaluation import Evaluation, LossTolerance, as_float64, compare_losses

__all__ = ["check_kimi15", "check_topr"]


class _Run:
    """``loss_fn`` on ``batch``, its gradient, and the float64 inputs it is judged by."""

    def __init__(self, name: str, loss_fn: Callable[..., Any], batch: Batch):
        self.name, self.batch = name, batch
        self.result = Evaluation(name, loss_fn, batch)
        self.grad = self.result.grad
        self.valid = valid_mask(batch)
        self.eps = unit_roundoff(batch["log_probs"].dtype, self.result.dtype)
        self.lp, self.old = f64(batch["log_probs"]), f64(batch["old_log_probs"])
        self.advantages = f64(batch["advantages"])

    def line(self, b: int, t: int, expected: Tensor) -> str:
        return (
            f"(b={b}, t={t}): A={fmt(float(self.advantages[b, t]))}, "
            f"log_prob={fmt(float(self.lp[b, t]))}, old={fmt(float(self.old[b, t]))}, "
            f"expected direction={fmt(float(expected[b, t]))}, "
            f"gradient={fmt(float(self.grad[b, t]))}"
        )

    def one_coefficient_per_row(
        self, invariant: str, summary: str, expected: Tensor, error: Tensor, judged: Tensor
    ) -> None:
        """``gradient / expected`` (the aggregation's coefficient) must be one value per row
        over the ``judged`` tokens, within the relative rounding ``error / |expected|``."""
        coefficient = self.grad / expected.where(judged, torch.ones_like(expected))
        slack = error / expected.abs().clamp(min=1e-300) + 16 * self.eps + GUARD_RTOL
        lines = [
            f"{self.line(b, t, expected)}: gradient/direction={fmt(float(coefficient[b, t]))}, "
            f"at t={first} {fmt(float(coefficient[b, first]))}"
            for b, t, first in unequal_coefficients(coefficient, judged, slack, per_row=True)
        ]
        if lines:
            fail(invariant, summary, lines)
        opposed = judged & ~(self.grad * expected.sign() > 0)
        if bool(opposed.any()):
            fail(
                f"{invariant}",
                "tokens whose gradient does not point along the expected direction",
                [self.line(b, t, expected) for b, t in positions(opposed)],
            )

    def reference_agreement(
        self,
        what: str,
        per_token: Callable[[Batch], Tensor],
        agg_mode: AggMode | None,
        loss_scale_factor: float | None,
        rtol: float | None,
        atol: float | None,
    ) -> None:
        """With ``agg_mode``: value and gradient equal the float64 reference, aggregated with
        the batch's global counts."""
        if agg_mode is None:
            return
        global_tokens, global_seqs = batch_counts(self.batch)

        def reference(b: Batch, **_: Any) -> Tensor:
            return aggregate_loss(
                per_token(b),
                b["response_mask"],
                agg_mode,
                global_tokens=global_tokens,
                global_seqs=global_seqs,
                loss_scale_factor=loss_scale_factor,
            )

        expected = Evaluation(self.name, reference, as_float64(self.batch))
        tolerance = LossTolerance(self.batch, [self.result.dtype], expected, rtol=rtol, atol=atol)
        compare_losses(
            f"{self.name}.reference_agreement",
            what,
            tolerance,
            self.result,
            expected,
            got_name="fn",
            expected_name="reference",
        )


def _with_scores(batch: Batch) -> dict[str, Any]:
    """The batch with ``scores`` ``[B]`` (kept when present): each row's mean valid advantage,
    so rows of either sign, and rows at 0 (negative for TOPR), occur."""
    if "scores" in batch:
        return dict(batch)
    advantages = f64(batch["advantages"])
    scores = masked_mean(advantages, batch["response_mask"], dim=-1)
    return {**batch, "scores": scores.to(batch["advantages"].dtype)}


def check_topr(
    loss_fn: Callable[..., Any],
    batch: Batch,
    *,
    positive_weight: float = 1.0,
    negative_weight: float = 1.0,
    agg_mode: AggMode | None = None,
    loss_scale_factor: float | None = None,
    rtol: float | None = None,
    atol: float | None = None,
) -> None:
    """Check a TOPR loss (ROLL ``pg_variant="topr"``): ``-A·log π`` in rows whose score is
    ``> 0``, ``-sg(min(r, 1))·A·log π`` in rows whose score is ``≤ 0``, ``r = exp(logp - old)``.

    ``loss_fn(batch, *, global_tokens, global_seqs)`` reads the row's sequence reward from
    ``batch["scores"]`` (``[B]``); a batch without it gets each row's mean valid advantage.
    With ``c_row`` the aggregation's coefficient, the gradient of token ``t`` is
    ``-A_t·w_t·c_row``:

    * ``topr.positive_rows``: in rows with score ``> 0``, ``gradient / (-A·positive_weight)``
      is one value per row (no importance weight);
    * ``topr.negative_rows``: in rows with score ``≤ 0``,
      ``gradient / (-A·negative_weight·min(r, 1))`` is one value per row (the truncated
      ratio, detached: a weight with a gradient adds ``-A·log π·∂w``);
    * ``topr.reference_agreement`` (with ``agg_mode``): value and gradient.

    Tokens with ``A = 0``, and in negative rows tokens whose ratio is within rounding of 1,
    are not judged.
    """
    work = _with_scores(batch)
    run = _Run("topr", loss_fn, work)
    positive = (f64(work["scores"]) > 0).unsqueeze(-1).expand_as(run.lp)
    log_ratio = run.lp - run.old
    ratio = log_ratio.clamp(max=0).exp()
    error = 8 * run.eps * (1 + run.lp.abs() + run.old.abs())
    judged = run.valid & (run.advantages != 0)
    run.one_coefficient_per_row(
        "topr.positive_rows",
        "rows with a positive score: the gradient is not -A times one coefficient per row "
        "(an importance weight where TOPR takes none)",
        -run.advantages * positive_weight,
        torch.zeros_like(error),
        judged & positive,
    )
    near_one = log_ratio.abs() <= error
    run.one_coefficient_per_row(
        "topr.negative_rows",
        "rows with a score ≤ 0: the gradient is not -A·min(r, 1) times one coefficient per "
        "row (the ratio not truncated at 1, or not detached)",
        -run.advantages * negative_weight * ratio,
        error * ratio * run.advantages.abs() * negative_weight,
        judged & ~positive & ~near_one,
    )
    options = {"positive_weight": positive_weight, "negative_weight": negative_weight}
    run.reference_agreement(
        f"TOPR with agg_mode={agg_mode!r}",
        lambda b: topr_token_losses(
            b["log_probs"], b["old_log_probs"], b["advantages"], b["scores"], **options
        ),
        agg_mode,
        loss_scale_factor,
        rtol,
        atol,
    )


def check_kimi15(
    loss_fn: Callable[..., Any],
    batch: Batch,
    *,
    tau: float = 0.1,
    agg_mode: AggMode | None = None,
    loss_scale_factor: float | None = None,
    rtol: float | None = None,
    atol: float | None = None,
) -> None:
    """Check a Kimi k1.5 loss (ROLL ``pg_variant="kimi15"``): ``-A·log π + τ/2·(logp - old)²``.

    * ``kimi15.gradient``: ``gradient / (-A + τ·(logp - old))`` is one value per row (the
      aggregation's coefficient) and the gradient points along ``-A + τ·(logp - old)``. A
      missing ½ doubles τ, a penalty on the ratio instead of the log ratio, or of the wrong
      sign, moves the direction;
    * ``kimi15.reference_agreement`` (with ``agg_mode``): value and gradient.

    Tokens whose direction is within rounding of 0 are not judged.
    """
    run = _Run("kimi15", loss_fn, batch)
    log_ratio = run.lp - run.old
    direction = -run.advantages + tau * log_ratio
    error = 8 * run.eps * (1 + run.lp.abs() + run.old.abs()) * (tau + run.advantages.abs())
    judged = run.valid & (direction.abs() > 4 * error)
    run.one_coefficient_per_row(
        "kimi15.gradient",
        "the gradient is not (-A + τ·(logp - old)) times one coefficient per row",
        direction,
        error,
        judged,
    )
    run.reference_agreement(
        f"Kimi k1.5 with tau={tau!r}, agg_mode={agg_mode!r}",
        lambda b: kimi15_token_losses(b["log_probs"], b["old_log_probs"], b["advantages"], tau=tau),
        agg_mode,
        loss_scale_factor,
        rtol,
        atol,
    )
