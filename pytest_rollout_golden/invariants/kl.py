"""Checker for per-token KL-penalty estimators (k1, abs, k2, k3 / low_var_kl, ``+`` forms),
with input and output clamps and an importance weight."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal

import torch
from torch import Tensor

from ..reference.losses import K3_BOUND, KL_ESTIMATORS, kl_estimate
from .comparison import (
    F32_EPS,
    GUARD_RTOL,
    Batch,
    CheckTolerance,
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


def _base(estimator: str) -> str:
    return estimator[:-1] if estimator.endswith("+") else estimator


@dataclass(frozen=True)
class _Reading:
    """One convention a batch may follow: ``clamp(w · k(clamp(d, ±input)), ±output)``."""

    input_clamp: float | None
    output_clamp: float | None

    def describe(self) -> str:
        parts = []
        if self.input_clamp is not None:
            parts.append(f"log ratio clamped to [-{self.input_clamp:g}, {self.input_clamp:g}]")
        if self.output_clamp is not None:
            parts.append(f"clamped to [-{self.output_clamp:g}, {self.output_clamp:g}]")
        return ", ".join(parts) or "unclamped"


@dataclass(frozen=True)
class _Spec:
    """What ``fn`` is checked against: the estimator, the readings it may follow (one per
    batch), the batch field of its importance weight and whether that weight is a ratio
    ``π_θ / π_x`` differentiated with the log-prob (whose derivative is then the weight)."""

    estimator: str
    readings: tuple[_Reading, ...]
    weights: str | None
    weight_gradient: bool
    compute_dtype: torch.dtype | None
    score_function: bool = False

    def weight(self, values: Tensor | None, leaf: Tensor) -> Tensor | None:
        """The weight ``fn`` (or the reference) receives: ``values``, with the gradient of a
        ratio tied to ``leaf`` when ``weight_gradient``."""
        if values is None or not self.weight_gradient:
            return values
        return values * torch.exp(leaf - leaf.detach()).to(values.dtype)

    def reference(self, lp: Tensor, rp: Tensor, w: Tensor | None, reading: _Reading):
        """Value and gradient (w.r.t. ``lp``) of the reference, per token, in float64."""
        leaf = lp.detach().clone().requires_grad_(True)
        value = kl_estimate(
            leaf,
            rp,
            self.estimator,
            input_clamp=reading.input_clamp,
            output_clamp=reading.output_clamp,
            weights=self.weight(w, leaf),
        )
        (grad,) = torch.autograd.grad(value.sum(), leaf)
        return value.detach(), grad

    def describe(self) -> str:
        text = " or ".join(reading.describe() for reading in self.readings)
        if self.weights is not None:
            text = f"times {self.weights!r}, " + text
        if self.score_function:
            text = "times exp(logp - sg(logp)), " + text
        return text


def _slopes(estimator: str, diff: Tensor) -> tuple[Tensor, Tensor]:
    """``|dk/d logp|`` (bounded above) and ``|d²k/d logp²|`` of the estimator at
    ``diff = logp - ref``; ``+`` forms have k2's second derivative."""
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
    return slope, curvature


class _KLRun:
    """``fn``'s per-token KL value and gradient of one batch, the tolerances they are judged
    by, the tokens not judged and the reference of the first reading ``fn`` matches."""

    def __init__(
        self,
        fn: Callable[..., Any],
        batch: Batch,
        spec: _Spec,
        rtol: float | None,
        atol: float | None,
    ):
        self.fn, self.batch, self.spec, self.rtol, self.atol = fn, batch, spec, rtol, atol
        log_probs, ref_log_probs = batch["log_probs"], batch["ref_log_probs"]
        self.shape = log_probs.shape
        self.valid = valid = valid_mask(batch)
        self.value, self.grad, out_dtype = self.evaluate(batch)
        dtypes = [log_probs.dtype, ref_log_probs.dtype, out_dtype]
        if spec.compute_dtype is not None:
            dtypes.append(spec.compute_dtype)
        self.w = None
        if spec.weights is not None:
            dtypes.append(batch[spec.weights].dtype)
            self.w = f64(batch[spec.weights])
        if spec.score_function:  # a weight of ones with the gradient of a ratio
            self.w = torch.ones_like(f64(log_probs))
        self.eps = unit_roundoff(*dtypes)
        self.lp, self.rp = lp, rp = f64(log_probs), f64(ref_log_probs)
        # Before any output clamp: the weighted estimate, whose size bounds the score term.
        self.raw = kl_estimate(
            lp, rp, _base(spec.estimator), input_clamp=spec.readings[0].input_clamp
        ) * (1 if self.w is None else self.w)
        self.score = spec.weight_gradient and self.w is not None
        self.value_tol, self.grad_tol = self.tolerances(self.eps)
        self.judged = valid & ~self._near_a_kink()

    def tolerances(self, eps: float) -> tuple[CheckTolerance, CheckTolerance]:
        """Value and gradient tolerances for the unit roundoff ``eps``: the input rounding of
        ``logp - ref`` times the slope (second derivative) of the estimator and ``|w|``; the
        score term ``w·k`` of a differentiated weight adds its own rounding."""
        diff = self.lp - self.rp
        weight = torch.ones_like(diff) if self.w is None else self.w.abs()
        input_error = self.input_error(eps)
        slope, curvature = _slopes(self.spec.estimator, diff)
        value_atol = weight * input_error * (1 + slope) + 1e-300
        value_tol = resolve_tolerance(8 * eps + GUARD_RTOL, value_atol, self.rtol, self.atol)
        grad_error = curvature + (1 + slope if self.score else 0)
        grad_atol = weight * input_error * (1 + grad_error) + 1e-300
        grad_tol = resolve_tolerance(8 * eps + GUARD_RTOL, grad_atol, self.rtol, self.atol)
        return value_tol, grad_tol

    def input_error(self, eps: float) -> Tensor:
        """The rounding of ``logp - ref`` in a dtype of unit roundoff ``eps``, generously."""
        return 8 * eps * (1 + self.lp.abs() + self.rp.abs())

    def _near_a_kink(self) -> Tensor:
        """Tokens within rounding of a clamp bound (either side is right there), and ``abs``
        at ``logp = ref``."""
        diff, input_error = self.lp - self.rp, self.input_error(self.eps)
        near = torch.zeros_like(self.valid)
        if _base(self.spec.estimator) == "abs":
            near |= diff == 0
        band = self.value_tol.atol + self.value_tol.rtol * self.raw.abs()
        for reading in self.spec.readings:
            if reading.input_clamp is not None:
                near |= (diff.abs() - reading.input_clamp).abs() <= input_error
            if reading.output_clamp is not None:
                near |= (self.raw.abs() - reading.output_clamp).abs() <= band
        return near

    def evaluate(self, b: Batch) -> tuple[Tensor, Tensor, torch.dtype]:
        """``fn``'s value on ``b``, the gradient of its valid tokens' sum (float64) and the
        dtype ``fn`` returned."""
        shape, valid = self.shape, self.valid
        leaf = b["log_probs"].detach().clone().requires_grad_(True)
        args = [leaf, b["ref_log_probs"]]
        if self.spec.weights is not None:
            args.append(self.spec.weight(b[self.spec.weights].detach(), leaf))
        out = token_tensor("kl", self.fn(*args), shape, b)
        zeros = torch.zeros(shape, dtype=torch.float64)
        if not out.requires_grad:
            return f64(out), zeros, out.dtype
        picked = torch.where(valid, out, torch.zeros_like(out))
        (grad,) = torch.autograd.grad(picked.sum(), leaf, allow_unused=True)
        return f64(out), zeros if grad is None else f64(grad), out.dtype

    @cached_property
    def reference(self) -> tuple[Tensor, Tensor, Tensor | None]:
        """``(value, gradient, None)`` of the first reading whose values ``fn`` matches; when
        none does, ``(value, gradient, tokens off)`` of the first reading's values."""
        attempts = []
        for reading in self.readings:
            expected_value, expected_grad = self.spec.reference(self.lp, self.rp, self.w, reading)
            off = self.judged & self.value_tol.exceeded(self.value, expected_value)
            if not bool(off.any()):
                return expected_value, expected_grad, None
            attempts.append((off, expected_value, expected_grad))
        off, expected_value, expected_grad = attempts[0]
        return expected_value, expected_grad, off

    @cached_property
    def readings(self) -> tuple[_Reading, ...]:
        """The spec's readings, without an output clamp no valid token reaches."""
        first, *others = self.spec.readings
        largest = float(self.raw[self.valid].abs().max()) if bool(self.valid.any()) else 0.0
        kept = [r for r in others if r.output_clamp is None or largest > r.output_clamp]
        return (first, *kept)

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
        text = f", log_prob={fmt(float(self.lp[b, t]))}, ref_log_prob={fmt(float(self.rp[b, t]))}"
        if self.spec.weights is not None and self.w is not None:
            text += f", {self.spec.weights}={fmt(float(self.w[b, t]))}"
        return text


def _value(run: _KLRun) -> None:
    expected_value, _, off = run.reference
    if off is not None:
        summary = f"differ from the {run.spec.estimator} reference ({run.spec.describe()})"
        if run.eps < F32_EPS:
            float32_tol, _ = run.tolerances(F32_EPS)
            if not bool((off & float32_tol.exceeded(run.value, expected_value)).any()):
                summary += (
                    "; they agree at float32 precision: if fn computes in float32 on purpose, "
                    "pass compute_dtype=torch.float32"
                )
        run.fail_tokens("kl.value", summary, off, run.value, expected_value, "value")


def _gradient(run: _KLRun) -> None:
    _, expected_grad, _ = run.reference
    scale = expected_grad.abs() + (run.raw.abs() if run.score else 0)
    off = run.judged & run.grad_tol.exceeded(run.grad, expected_grad, scale)
    if bool(off.any()):
        plus = run.spec.estimator.endswith("+")
        what = "k2's gradient, logp - ref" if plus else "its own gradient"
        if run.spec.weight_gradient and run.spec.weights is not None:
            what += f", plus the estimate times the gradient of {run.spec.weights!r}"
        if run.spec.score_function:
            what += ", plus the estimate itself (the gradient of exp(logp - sg(logp)))"
        elif run.spec.weights is None:
            what += (
                "; if fn multiplies the estimate by exp(logp - logp.detach()) (NeMo-RL's "
                "default, use_on_policy_kl_approximation=False), pass score_function=True"
            )
        summary = f"have a gradient unlike the {run.spec.estimator} reference ({what})"
        run.fail_tokens("kl.gradient", summary, off, run.grad, expected_grad, "gradient")


def _padding_independence(run: _KLRun) -> None:
    again, _, _ = run.evaluate(refill_padding(run.batch))
    moved = run.valid & (again != run.value) & run.value_tol.exceeded(again, run.value)
    if bool(moved.any()):
        fail(
            "kl.padding_independence",
            "changing only the garbage in padding positions changed valid tokens",
            refilled_lines(moved, again, run.value),
        )


_INVARIANTS: tuple[Callable[[_KLRun], None], ...] = (_value, _gradient, _padding_independence)
"""The invariants of :func:`check_kl_penalty`, in the order they are judged."""


def _bound(name: str, value: Any, auto: bool = False) -> None:
    if value is None or (auto and value == "auto"):
        return
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not (math.isfinite(value) and value > 0)
    ):
        allowed = "a number > 0, None or 'auto'" if auto else "a number > 0 or None"
        raise ValueError(f"{name} must be {allowed}, got {value!r}")


def _spec(
    estimator: str,
    output_clamp: float | Literal["auto"] | None,
    input_clamp: float | None,
    weights: str | None,
    weight_gradient: bool,
    compute_dtype: torch.dtype | None,
    score_function: bool = False,
) -> _Spec:
    """The checked convention from the arguments of :func:`check_kl_penalty`."""
    if _base(estimator) not in KL_ESTIMATORS:
        raise ValueError(f"estimator must be one of {KL_ESTIMATORS} (with an optional '+')")
    _bound("output_clamp", output_clamp, auto=True)
    _bound("input_clamp", input_clamp)
    if output_clamp != "auto":
        readings: tuple[_Reading, ...] = (_Reading(input_clamp, output_clamp),)  # type: ignore[arg-type]
    elif _base(estimator) in _K3:
        readings = (_Reading(input_clamp, K3_BOUND), _Reading(input_clamp, None))
    else:
        readings = (_Reading(input_clamp, None),)
    if compute_dtype is not None and not (
        isinstance(compute_dtype, torch.dtype) and compute_dtype.is_floating_point
    ):
        raise ValueError(
            f"compute_dtype must be a float torch dtype or None, got {compute_dtype!r}"
        )
    if score_function and (weights is not None or not weight_gradient):
        raise ValueError(
            "score_function=True is a weight of ones with the gradient of a ratio: it takes "
            "neither weights= (a ratio from the batch, e.g. NeMo-RL's "
            "use_on_policy_kl_approximation=True: pass weights= alone) nor weight_gradient=False"
        )
    return _Spec(estimator, readings, weights, weight_gradient, compute_dtype, score_function)


def _require_fields(batch: Batch, weights: str | None) -> None:
    """A clear error, with the strategy that provides them, for fields the batch lacks."""
    needed = ["log_probs", "ref_log_probs", "response_mask"]
    if weights is not None:
        needed.append(weights)
    missing = [key for key in needed if key not in batch]
    if not missing:
        return
    strategy = "strategies.kl_batches(is_weights=True)" if weights else "strategies.kl_batches()"
    remedy = f"use {strategy}"
    if weights is not None and weights != "is_weights":
        remedy += f" and pass weights='is_weights', or put your weights under {weights!r}"
    names = ", ".join(repr(key) for key in missing)
    raise ValueError(
        f"check_kl_penalty needs {names} in the batch (it has {sorted(batch)}): {remedy}"
    )


def check_kl_penalty(
    fn: Callable[..., Any],
    batch: Batch,
    *,
    estimator: str,
    output_clamp: float | Literal["auto"] | None = "auto",
    input_clamp: float | None = None,
    weights: str | None = None,
    weight_gradient: bool = True,
    compute_dtype: torch.dtype | None = None,
    score_function: bool = False,
    rtol: float | None = None,
    atol: float | None = None,
) -> None:
    """Check ``fn(log_prob, ref_log_prob) -> kl [B, T]``, a per-token KL estimate, in value
    and in its gradient with respect to ``log_prob``.

    ``batch`` holds ``log_probs``, ``ref_log_probs`` and ``response_mask`` (see
    :func:`pytest_rollout_golden.strategies.kl_batches`). ``estimator`` is one of ``k1``/``kl``
    (``logp - ref``), ``abs``, ``k2``/``mse`` (``½(logp - ref)²``), ``k3``/``low_var_kl``
    (``e^d - d - 1`` with ``d = ref - logp``), each optionally with a ``+`` suffix: the value of
    the estimator with the gradient of k2 (straight-through).

    The reference is ``clamp(w · k(clamp(d, ±input_clamp)), ±output_clamp)``:

    * ``output_clamp``: the bound of the two-sided clamp of the (weighted) estimate, e.g.
      ``10.0`` for NeMo-RL's ``kl_output_clamp_value``, AReaL's ``apply_clamp=True`` or
      OpenRLHF (every estimator), slime's ``low_var_kl``; ``None``: no clamp. ``"auto"``
      (default): k3 clamped to ``[-10, 10]`` (verl, OpenRLHF) or exact (TRL, slime's ``k3``),
      where the exact k3 exceeds 10 the whole batch must agree with one of the two; the other
      estimators unclamped.
    * ``input_clamp``: the bound of the clamp of ``d`` (NeMo-RL's ``kl_input_clamp_value=20``);
      where it is active the weight passes no gradient (NeMo-RL detaches it there).
    * ``weights``: the batch field of a per-token importance weight ``w``
      (``strategies.kl_batches(is_weights=True)`` draws ``is_weights``), passed to ``fn`` as a
      third argument, ``fn(log_prob, ref_log_prob, w)`` (NeMo-RL's
      ``importance_sampling_weights``, slime's ``importance_ratio``, TRL's ``coef_1`` under
      ``use_bias_correction_kl``). With ``weight_gradient`` (default) ``w`` is a ratio
      ``π_θ / π_x`` that ``fn`` differentiates with ``log_prob``: it arrives with the
      gradient ``dw/d log_prob = w``; ``weight_gradient=False`` for a detached weight.
    * ``score_function``: ``fn`` multiplies the estimate by ``exp(logp - logp.detach())``, a
      weight of value 1 whose gradient adds the estimate itself (the score-function term):
      NeMo-RL's default, ``use_on_policy_kl_approximation=False``, where its input clamp
      detaches that weight as it does any other. ``fn`` takes two arguments.

    Only valid tokens are judged; padding may hold any finite value (a non-finite one is
    reported, since masking by multiplication turns it into nan).

    * ``kl.value``: the per-token value equals the reference;
    * ``kl.gradient``: the per-token gradient equals the reference's (k2's for ``+`` forms;
      zero where a clamp is active). Tokens within rounding of a clamp bound, and ``abs`` at
      ``logp = ref``, are not judged;
    * ``kl.padding_independence``: other garbage on padding leaves valid tokens unchanged.

    Tolerance per token, from the unit roundoff ``eps`` of the lowest precision among the
    inputs, the weight, ``fn``'s output (AReaL and slime return float32 for float64 inputs)
    and ``compute_dtype``, a precision the output's dtype hides (slime's float32 estimate
    times a float64 weight comes back as float64): the input rounding of ``logp - ref``
    (``8·eps·(1 + |logp| + |ref|)``) times the slope of the estimator (its second derivative
    for the gradient) and ``|w|``, plus ``8·eps`` relative and :data:`GUARD_RTOL`;
    ``rtol``/``atol`` replace either part.
    """
    spec = _spec(
        estimator,
        output_clamp,
        input_clamp,
        weights,
        weight_gradient,
        compute_dtype,
        score_function,
    )
    _require_fields(batch, weights)
    run = _KLRun(fn, batch, spec, rtol, atol)
    for invariant in _INVARIANTS:
        invariant(run)
