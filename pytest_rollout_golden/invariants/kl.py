"""Checker for per-token KL-penalty estimators (k1, abs, k2, k3 / low_var_kl, ``+`` forms)."""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property
from typing import Any

import torch
from torch import Tensor

from ..reference.losses import KL_ESTIMATORS, kl_penalty
from .comparison import (
    GUARD_RTOL,
    Batch,
    f64,
    fail,
    fmt,
    reference_lines,
    refill_padding,
    refilled_lines,
    resolve_tolerance,
    token_tensor,
    unit_roundoff,
    valid_mask,
)

__all__ = ["check_kl_penalty"]

_K3 = ("k3", "low_var_kl")
_K3_BOUND = 10.0


def _base(estimator: str) -> str:
    return estimator[:-1] if estimator.endswith("+") else estimator


def _reference(log_probs: Tensor, ref_log_probs: Tensor, estimator: str, clamp: bool):
    """Value and gradient (w.r.t. ``log_probs``) of the reference, per token, in float64."""
    leaf = log_probs.detach().clone().requires_grad_(True)
    value = kl_penalty(leaf, ref_log_probs, estimator, clamp=clamp)
    (grad,) = torch.autograd.grad(value.sum(), leaf)
    return value.detach(), grad


class _KLRun:
    """``fn``'s per-token KL value and gradient of one batch, the tolerances they are judged
    by, the tokens not judged and the reference's clamp readings (clamped k3, or exact)."""

    def __init__(
        self,
        fn: Callable[..., Any],
        batch: Batch,
        *,
        estimator: str,
        rtol: float | None,
        atol: float | None,
    ):
        self.fn, self.batch, self.estimator = fn, batch, estimator
        log_probs, ref_log_probs = batch["log_probs"], batch["ref_log_probs"]
        self.shape = log_probs.shape
        self.valid = valid = valid_mask(batch)
        self.value, self.grad = self.evaluate(batch)
        eps = unit_roundoff(log_probs.dtype, ref_log_probs.dtype)
        self.lp, self.rp = lp, rp = f64(log_probs), f64(ref_log_probs)
        diff = lp - rp
        input_error = 8 * eps * (1 + lp.abs() + rp.abs())
        base = _base(estimator)
        if base in _K3:
            slope = (torch.expm1(-diff).abs() + 1).clamp(max=1e300)
            curvature = torch.exp(-diff).clamp(max=1e300)
        elif base in ("k2", "mse"):
            slope, curvature = diff.abs(), torch.ones_like(diff)
        else:
            slope, curvature = torch.ones_like(diff), torch.zeros_like(diff)
        if estimator.endswith("+"):
            curvature = torch.ones_like(diff)
        self.value_tol = resolve_tolerance(
            8 * eps + GUARD_RTOL, input_error * (1 + slope) + 1e-300, rtol, atol
        )
        grad_rtol = 8 * eps + GUARD_RTOL
        self.grad_tol = resolve_tolerance(
            grad_rtol, input_error * (1 + curvature) + 1e-300, rtol, atol
        )
        not_judged = torch.zeros_like(valid)
        if base == "abs":
            not_judged |= diff == 0
        self.clamps = [True]
        if base in _K3:
            exact = torch.expm1(-diff) + diff
            band = self.value_tol.atol + self.value_tol.rtol * exact.abs()
            not_judged |= (exact - _K3_BOUND).abs() <= band
            if bool((valid & (exact > _K3_BOUND)).any()):
                self.clamps.append(False)
        self.judged = valid & ~not_judged

    def evaluate(self, b: Batch) -> tuple[Tensor, Tensor]:
        """``fn``'s value on ``b`` and the gradient of its valid tokens' sum, in float64."""
        shape, valid = self.shape, self.valid
        leaf = b["log_probs"].detach().clone().requires_grad_(True)
        out = token_tensor("kl", self.fn(leaf, b["ref_log_probs"]), shape, b)
        if not out.requires_grad:
            return f64(out), torch.zeros(shape, dtype=torch.float64)
        picked = torch.where(valid, out, torch.zeros_like(out))
        (grad,) = torch.autograd.grad(picked.sum(), leaf, allow_unused=True)
        return f64(out), torch.zeros(shape, dtype=torch.float64) if grad is None else f64(grad)

    @cached_property
    def reference(self) -> tuple[Tensor, Tensor, Tensor | None]:
        """``(value, gradient, None)`` of the first clamp reading whose values ``fn`` matches;
        when none does, ``(value, gradient, tokens off)`` of the first reading's values."""
        attempts = []
        for clamp in self.clamps:
            expected_value, expected_grad = _reference(self.lp, self.rp, self.estimator, clamp)
            off = self.judged & self.value_tol.exceeded(self.value, expected_value)
            if not bool(off.any()):
                return expected_value, expected_grad, None
            attempts.append((off, expected_value, expected_grad))
        off, expected_value, expected_grad = attempts[0]
        return expected_value, expected_grad, off

    def fail_tokens(
        self, invariant: str, summary: str, off: Tensor, got: Tensor, expected: Tensor, what: str
    ) -> None:
        """Fail ``invariant``: the tokens ``off`` of the valid ones ``summary``."""
        fail(
            invariant,
            f"{int(off.sum())} of {int(self.valid.sum())} valid tokens {summary}",
            reference_lines(off, got, expected, what, self.inputs),
        )

    def inputs(self, b: int, t: int) -> str:
        return f", log_prob={fmt(float(self.lp[b, t]))}, ref_log_prob={fmt(float(self.rp[b, t]))}"


def _value(run: _KLRun) -> None:
    expected_value, _, off = run.reference
    if off is not None:
        note = " (k3 clamped to [-10, 10], or exact)" if len(run.clamps) > 1 else ""
        summary = f"differ from the {run.estimator} reference{note}"
        run.fail_tokens("kl.value", summary, off, run.value, expected_value, "value")


def _gradient(run: _KLRun) -> None:
    _, expected_grad, _ = run.reference
    off = run.judged & run.grad_tol.exceeded(run.grad, expected_grad)
    if bool(off.any()):
        plus = run.estimator.endswith("+")
        what = "k2's gradient, logp - ref" if plus else "its own gradient"
        summary = f"have a gradient unlike the {run.estimator} reference ({what})"
        run.fail_tokens("kl.gradient", summary, off, run.grad, expected_grad, "gradient")


def _padding_independence(run: _KLRun) -> None:
    again, _ = run.evaluate(refill_padding(run.batch))
    moved = run.valid & (again != run.value) & run.value_tol.exceeded(again, run.value)
    if bool(moved.any()):
        fail(
            "kl.padding_independence",
            "changing only the garbage in padding positions changed valid tokens",
            refilled_lines(moved, again, run.value),
        )


_INVARIANTS: tuple[Callable[[_KLRun], None], ...] = (_value, _gradient, _padding_independence)
"""The invariants of :func:`check_kl_penalty`, in the order they are judged."""


def check_kl_penalty(
    fn: Callable[..., Any],
    batch: Batch,
    *,
    estimator: str,
    rtol: float | None = None,
    atol: float | None = None,
) -> None:
    """Check ``fn(log_prob, ref_log_prob) -> kl [B, T]``, a per-token KL estimate, in value
    and in its gradient with respect to ``log_prob``.

    ``batch`` holds ``log_probs``, ``ref_log_probs`` and ``response_mask`` (see
    :func:`pytest_rollout_golden.strategies.kl_batches`). ``estimator`` is one of ``k1``/``kl``
    (``logp - ref``), ``abs``, ``k2``/``mse`` (``½(logp - ref)²``), ``k3``/``low_var_kl``
    (``e^d - d - 1`` with ``d = ref - logp``), each optionally with a ``+`` suffix: the value of
    the estimator with the gradient of k2 (straight-through). k3 may be clamped to
    ``[-10, 10]`` (verl, OpenRLHF) or exact (TRL): where the exact k3 exceeds 10, the whole
    batch must agree with one of the two. Only valid tokens are judged; padding may hold any
    finite value (a non-finite one is reported, since masking by multiplication turns it
    into nan).

    * ``kl.value``: the per-token value equals the reference;
    * ``kl.gradient``: the per-token gradient equals the reference's (k2's for ``+`` forms;
      zero where the k3 clamp is active). Tokens within rounding of the k3 clamp, and ``abs``
      at ``logp = ref``, are not judged;
    * ``kl.padding_independence``: other garbage on padding leaves valid tokens unchanged.

    Tolerance per token: the input rounding of ``logp - ref`` (``8·eps·(1 + |logp| + |ref|)``)
    times the slope of the estimator (its second derivative for the gradient), plus
    ``8·eps`` relative and :data:`GUARD_RTOL`; ``rtol``/``atol`` replace either part.
    """
    if _base(estimator) not in KL_ESTIMATORS:
        raise ValueError(f"estimator must be one of {KL_ESTIMATORS} (with an optional '+')")
    run = _KLRun(fn, batch, estimator=estimator, rtol=rtol, atol=atol)
    for invariant in _INVARIANTS:
        invariant(run)
