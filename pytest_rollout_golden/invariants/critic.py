"""Checker for the critic's value loss: the clipped value loss, its aggregation, its padding and
its sum over micro-batches and data-parallel ranks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from .. import parallel
from ..reference.critic import value_loss
from ..reference.losses import AggMode, aggregate_loss
from .comparison import (
    GUARD_RTOL,
    Batch,
    CheckTolerance,
    accepts,
    accumulation_roundoff,
    batch_counts,
    f64,
    fail,
    fmt,
    positions,
    refill_padding,
    require_fields,
    resolve_tolerance,
    unit_roundoff,
    valid_mask,
)
from .evaluation import (
    Evaluation,
    LossTolerance,
    SplitHints,
    SplitRun,
    as_float64,
    compare_losses,
    split_invariance,
)

__all__ = ["check_value_loss"]

_FIELDS = ("vpreds", "values", "returns", "response_mask")
_WRT = "vpreds"


class _ValueRun:
    """``loss_fn`` on the batch (value and gradient w.r.t. ``vpreds``), the float64 inputs, and
    per token: the clipped term strictly the larger (``clipped``), the tokens ``judged``
    (valid, not within rounding of the clip edge or of a tie of the two terms)."""

    def __init__(
        self,
        loss_fn: Callable[..., Any],
        batch: Batch,
        *,
        cliprange_value: float | None,
        agg_mode: AggMode | None,
        loss_scale_factor: float | None,
        rtol: float | None,
        atol: float | None,
    ):
        self.loss_fn, self.batch, self.cliprange_value = loss_fn, batch, cliprange_value
        self.agg_mode, self.loss_scale_factor = agg_mode, loss_scale_factor
        self.rtol, self.atol = rtol, atol
        self.result = Evaluation("value_loss", loss_fn, batch, wrt=_WRT)
        self.grad = self.result.grad
        self.valid = valid = valid_mask(batch)
        dtypes = [batch[key].dtype for key in ("vpreds", "values", "returns")]
        self.eps = eps = unit_roundoff(*dtypes, self.result.dtype)
        self.vpreds, self.values, self.returns = (f64(batch[k]) for k in _FIELDS[:3])
        clip = 0.0 if cliprange_value is None else cliprange_value
        # Every difference the loss takes is off by at most about eps·magnitude.
        self.magnitude = self.vpreds.abs() + self.values.abs() + self.returns.abs() + clip + 1
        self.band = 8 * eps * self.magnitude
        self.error = self.vpreds - self.returns
        near = torch.zeros_like(valid)
        clipped = torch.zeros_like(valid)
        if cliprange_value is not None:
            offset = self.vpreds - self.values
            outside = offset.abs() > cliprange_value
            edge = (offset.abs() - cliprange_value).abs() <= self.band
            bound = self.values + offset.clamp(-cliprange_value, cliprange_value)
            gap = (bound - self.returns).square() - self.error.square()
            tie = outside & (gap.abs() <= 4 * self.band * self.magnitude)
            near = edge | tie
            clipped = outside & (gap > 0)
        self.judged = valid & ~near
        self.clipped = self.judged & clipped

    def line(self, b: int, t: int) -> str:
        return (
            f"(b={b}, t={t}): vpred={fmt(float(self.vpreds[b, t]))}, "
            f"value={fmt(float(self.values[b, t]))}, return={fmt(float(self.returns[b, t]))}, "
            f"gradient={fmt(float(self.grad[b, t]))}"
        )

    def fail_at(self, invariant: str, summary: str, tokens: Tensor) -> None:
        if bool(tokens.any()):
            fail(invariant, summary, [self.line(*p) for p in positions(tokens)])

    def reference(self, batch: Batch, counts: tuple[int, int] | None) -> Evaluation:
        """The reference loss of ``batch`` in float64, with ``counts`` (tokens, sequences) as
        the normalizers (those of ``batch`` itself when ``None``)."""
        agg_mode = self.agg_mode or "token-mean"
        tokens, seqs = counts if counts is not None else (None, None)

        def fn(b: Batch, **_: Any) -> Tensor:
            inputs = (b["vpreds"], b["values"], b["returns"], b["response_mask"])
            return value_loss(
                *inputs,
                cliprange_value=self.cliprange_value,
                agg_mode=agg_mode,
                global_tokens=tokens,
                global_seqs=seqs,
                loss_scale_factor=self.loss_scale_factor,
            )[0]

        return Evaluation("value_loss", fn, as_float64(batch), wrt=_WRT)


class _ValueTolerance:
    """How far ``fn`` may be from the float64 reference: per token, the squared differences
    carry ``16·eps·M²`` (``M = |v| + |V| + |R| + c + 1``) and the gradient ``8·eps·w·M``, with
    ``w`` the token's aggregation weight; the value sums the former with the weights, plus
    ``8·(2·eps + eps_acc·n)`` and :data:`GUARD_RTOL` relative. ``rtol``/``atol`` replace the
    relative / absolute parts."""

    def __init__(self, run: _ValueRun):
        mask, eps = run.batch["response_mask"], run.eps
        tokens, seqs = batch_counts(run.batch)
        ones = torch.ones(mask.shape, dtype=torch.float64, requires_grad=True)
        agg = aggregate_loss(
            ones,
            mask,
            run.agg_mode or "token-mean",
            global_tokens=tokens,
            global_seqs=seqs,
            loss_scale_factor=run.loss_scale_factor,
        )
        (weights,) = torch.autograd.grad(agg, ones)
        acc = accumulation_roundoff(eps)
        value_atol = float((weights * 16 * eps * run.magnitude.square()).sum()) + 1e-300
        value_rtol = 8 * (2 * eps + acc * tokens) + GUARD_RTOL
        self.value = resolve_tolerance(value_rtol, value_atol, run.rtol, run.atol)
        grad_atol = weights * 8 * eps * run.magnitude + 1e-300
        self.grad: CheckTolerance = resolve_tolerance(
            8 * eps + GUARD_RTOL, grad_atol, run.rtol, run.atol
        )
        self.judged = run.judged

    def value_close(self, a: float, b: float) -> bool:
        return not self.value.exceeded(a, b)

    def grad_off(self, a: Tensor, b: Tensor) -> Tensor:
        return self.grad.exceeded(a, b) & self.judged


def _clipped_gradient(run: _ValueRun) -> None:
    zero_atol = 8 * run.eps * float(run.grad.abs().max()) + 1e-300
    run.fail_at(
        "value_loss.clipped_gradient",
        f"tokens whose clipped prediction (value ± cliprange_value={run.cliprange_value}) is "
        "further from the return than the prediction still have a gradient: the loss takes "
        "the larger of the two terms, which is constant in vpreds there",
        run.clipped & (run.grad.abs() > zero_atol),
    )


def _gradient_sign(run: _ValueRun) -> None:
    moving = run.judged & ~run.clipped & (run.error.abs() > run.band)
    wrong = moving & ~(run.grad * run.error.sign() > 0)
    run.fail_at(
        "value_loss.gradient_sign",
        "tokens whose unclipped term counts must have a gradient with the sign of "
        "vpreds - returns (the loss pulls each prediction towards its return)",
        wrong,
    )


def _reference_agreement(run: _ValueRun) -> None:
    if run.agg_mode is None:
        return
    expected = run.reference(run.batch, batch_counts(run.batch))
    compare_losses(
        "value_loss.reference_agreement",
        f"clipped value loss with cliprange_value={run.cliprange_value}, agg_mode={run.agg_mode!r}",
        _ValueTolerance(run),
        run.result,
        expected,
        got_name="fn",
        expected_name="reference",
    )


def _padding_independence(run: _ValueRun) -> None:
    leaked = ~run.valid & (run.grad != 0)
    if bool(leaked.any()):
        fail(
            "value_loss.padding_gradient",
            "padding positions of vpreds have a non-zero gradient",
            [run.line(*p) for p in positions(leaked)],
        )
    refilled = Evaluation("value_loss", run.loss_fn, refill_padding(run.batch), wrt=_WRT)
    compare_losses(
        "value_loss.padding_independence",
        "other garbage in the padding positions",
        LossTolerance(run.batch, [run.result.dtype, refilled.dtype], run.result),
        refilled,
        run.result,
        got_name="regarbled",
        expected_name="original",
    )


def _local_normalization_hints(run: _ValueRun) -> SplitHints:
    """Name a sum of micro-batch losses that equals the reference with each micro-batch
    normalized by its own counts, summed (verl #6957) or averaged (scaled by
    ``1/n_micro_batches``)."""

    def hints(ranks: list[list[list[int]]], summed: float) -> list[str]:
        if run.agg_mode is None or len(ranks) != 1 or len(ranks[0]) < 2:
            return []
        pieces = [run.reference(parallel.select_rows(run.batch, rows), None) for rows in ranks[0]]
        local = sum(piece.value for piece in pieces)
        close = LossTolerance(run.batch, [run.result.dtype], run.result, pieces=len(pieces))
        if close.value_close(summed, local):
            return [
                "the sum matches each micro-batch normalized by its own token/sequence "
                "counts: the gradient grows with the number of micro-batches (verl #6957); "
                "normalize by the step's global_tokens / global_seqs"
            ]
        if close.value_close(summed, local / len(pieces)):
            return [
                "the sum matches the mean of per-micro-batch normalized losses (scaled by "
                "1/n_micro_batches): exact only when every micro-batch holds as many tokens; "
                "normalize by the step's global_tokens / global_seqs"
            ]
        return []

    return hints


def _micro_batch_invariance(run: _ValueRun, n_splits: int, dp_size: int) -> None:
    split = SplitRun(
        run.loss_fn,
        run.batch,
        n_splits=n_splits,
        dp_size=dp_size,
        grad_reduce="mean",
        rtol=run.rtol,
        atol=run.atol,
        name="value_loss.micro_batch_invariance",
        wrt=_WRT,
        hints=_local_normalization_hints(run),
    )
    split_invariance(split)


_INVARIANTS: tuple[Callable[[_ValueRun], None], ...] = (
    _clipped_gradient,
    _gradient_sign,
    _reference_agreement,
    _padding_independence,
)
"""The invariants of :func:`check_value_loss` on the whole batch, in the order they are judged
(``value_loss.micro_batch_invariance`` follows them)."""


def check_value_loss(
    loss_fn: Callable[..., Any],
    batch: Batch,
    *,
    cliprange_value: float | None = 0.5,
    agg_mode: AggMode | None = "token-mean",
    loss_scale_factor: float | None = None,
    n_splits: int = 2,
    dp_size: int = 1,
    rtol: float | None = None,
    atol: float | None = None,
) -> None:
    """Check a critic's value loss ``loss_fn(batch, *, global_tokens, global_seqs)``.

    ``batch`` holds ``vpreds`` (the critic's new predictions), ``values`` (the rollout
    critic's), ``returns`` and ``response_mask`` (``[B, T]``): see
    :func:`pytest_rollout_golden.strategies.critic_batches`. The checker passes a fresh leaf
    tensor as ``vpreds`` and takes gradients w.r.t. it; ``global_tokens`` / ``global_seqs``
    are the whole step's counts, and ``dp_size=`` / ``n_micro_batches=`` are passed when
    ``loss_fn`` accepts them, as in :func:`check_split_invariance`. ``cliprange_value``
    (verl's and OpenRLHF's default 0.5; ``None`` for no clip), ``agg_mode`` and
    ``loss_scale_factor`` describe what ``loss_fn`` computes.

    * ``value_loss.clipped_gradient``: where ``vpreds`` is outside
      ``values ± cliprange_value`` and the clipped prediction is further from the return,
      the gradient is zero (the loss is ``½·max((v - R)², (v_clip - R)²)``);
    * ``value_loss.gradient_sign``: every other token with ``v != R`` has a gradient of the
      sign of ``v - R``;
    * ``value_loss.reference_agreement`` (with ``agg_mode``): value and gradient equal
      :func:`pytest_rollout_golden.reference.value_loss` with the batch's counts;
    * ``value_loss.padding_independence``: other garbage in the padding changes neither
      the loss nor the gradient, and padding gets none (``….padding_gradient``);
    * ``value_loss.micro_batch_invariance``: the losses of ``n_splits`` micro-batches (per
      ``dp_size`` rank, gradients averaged over ranks) add up to the full batch's loss and
      gradient, for three ways of cutting the rows. A loss normalized per micro-batch
      (verl #6957) grows with the number of micro-batches; the message names it.

    Tokens within rounding of the clip edge, or of a tie between the two terms, are not
    judged by their gradient. Tolerances: see :class:`_ValueTolerance` (reference) and
    :func:`check_split_invariance` (micro-batches); ``rtol``/``atol`` replace either part.
    """
    require_fields(batch, _FIELDS, "check_value_loss", "critic_batches()")
    if dp_size > 1 and not accepts(loss_fn, "dp_size"):
        raise TypeError("check_value_loss with dp_size > 1 needs a loss_fn accepting dp_size=")
    run = _ValueRun(
        loss_fn,
        batch,
        cliprange_value=cliprange_value,
        agg_mode=agg_mode,
        loss_scale_factor=loss_scale_factor,
        rtol=rtol,
        atol=atol,
    )
    for invariant in _INVARIANTS:
        invariant(run)
    _micro_batch_invariance(run, n_splits, dp_size)
