"""Checker for per-token KL-penalty estimators (k1, abs, k2, k3 / low_var_kl, ``+`` forms)."""

from __future__ import annotations

from collections.abc import Callable
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
    positions,
    regarble,
    resolve_tolerance,
    token_tensor,
    unit_roundoff,
    valid_mask,
    versus,
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
    log_probs, ref_log_probs = batch["log_probs"], batch["ref_log_probs"]
    shape = log_probs.shape
    valid = valid_mask(batch)

    def evaluate(b: Batch) -> tuple[Tensor, Tensor]:
        leaf = b["log_probs"].detach().clone().requires_grad_(True)
        out = token_tensor("kl", fn(leaf, b["ref_log_probs"]), shape, b)
        if not out.requires_grad:
            return f64(out), torch.zeros(shape, dtype=torch.float64)
        picked = torch.where(valid, out, torch.zeros_like(out))
        (grad,) = torch.autograd.grad(picked.sum(), leaf, allow_unused=True)
        return f64(out), torch.zeros(shape, dtype=torch.float64) if grad is None else f64(grad)

    value, grad = evaluate(batch)
    eps = unit_roundoff(log_probs.dtype, ref_log_probs.dtype)
    lp, rp = f64(log_probs), f64(ref_log_probs)
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
    value_tol = resolve_tolerance(
        8 * eps + GUARD_RTOL, input_error * (1 + slope) + 1e-300, rtol, atol
    )
    grad_rtol = 8 * eps + GUARD_RTOL
    grad_tol = resolve_tolerance(grad_rtol, input_error * (1 + curvature) + 1e-300, rtol, atol)

    not_judged = torch.zeros_like(valid)
    if base == "abs":
        not_judged |= diff == 0
    candidates = [True]
    if base in _K3:
        exact = torch.expm1(-diff) + diff
        band = value_tol.atol + value_tol.rtol * exact.abs()
        not_judged |= (exact - _K3_BOUND).abs() <= band
        if bool((valid & (exact > _K3_BOUND)).any()):
            candidates.append(False)

    def line(b: int, t: int, got: Tensor, expected: Tensor, what: str) -> str:
        return (
            f"(b={b}, t={t}): {what} "
            + versus("fn", float(got[b, t]), "reference", float(expected[b, t]))
            + f", log_prob={fmt(float(lp[b, t]))}, ref_log_prob={fmt(float(rp[b, t]))}"
        )

    judged = valid & ~not_judged
    attempts = []
    for clamp in candidates:
        expected_value, expected_grad = _reference(lp, rp, estimator, clamp)
        off = judged & value_tol.exceeded(value, expected_value)
        if not bool(off.any()):
            break
        attempts.append((off, expected_value))
    else:
        off, expected_value = attempts[0]
        note = " (k3 clamped to [-10, 10], or exact)" if len(candidates) > 1 else ""
        fail(
            "kl.value",
            f"{int(off.sum())} of {int(valid.sum())} valid tokens differ from the {estimator} "
            f"reference{note}",
            [line(b, t, value, expected_value, "value") for b, t in positions(off)],
        )
    off = judged & grad_tol.exceeded(grad, expected_grad)
    if bool(off.any()):
        what = "k2's gradient, logp - ref" if estimator.endswith("+") else "its own gradient"
        fail(
            "kl.gradient",
            f"{int(off.sum())} of {int(valid.sum())} valid tokens have a gradient unlike the "
            f"{estimator} reference ({what})",
            [line(b, t, grad, expected_grad, "gradient") for b, t in positions(off)],
        )
    again, _ = evaluate(regarble(batch))
    moved = valid & (again != value) & value_tol.exceeded(again, value)
    if bool(moved.any()):
        fail(
            "kl.padding_independence",
            "changing only the garbage in padding positions changed valid tokens",
            [
                f"(b={b}, t={t}): "
                + versus("regarbled", float(again[b, t]), "fn", float(value[b, t]))
                for b, t in positions(moved)
            ],
        )
