"""Checker for generalized advantage estimation (GAE): the λ/γ recursion, masks, bootstrap."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ..reference.advantages import GAEMaskedTokens, gae_advantages, response_span
from .comparison import (
    GUARD_RTOL,
    Batch,
    CheckTolerance,
    accepts,
    accumulation_roundoff,
    f64,
    fail,
    fmt,
    garbage_padding,
    holds_garbage,
    positions,
    reference_lines,
    refill_padding,
    refilled_lines,
    require_fields,
    resolve_tolerance,
    single_token_whitening,
    token_tensor,
    unit_roundoff,
    valid_mask,
    versus,
)

__all__ = ["check_gae"]


_FIELDS = ("token_level_rewards", "values", "response_mask")


def _call(fn: Callable[..., Any], batch: Batch, whiten: bool) -> tuple[Tensor, Tensor]:
    mask = batch["response_mask"]
    kwargs = {}
    if "last_values" in batch:
        if not accepts(fn, "last_values"):
            raise TypeError("the batch has last_values: fn must accept a last_values= keyword")
        kwargs["last_values"] = batch["last_values"]
    output = fn(batch["token_level_rewards"], batch["values"], mask, **kwargs)
    if not isinstance(output, tuple | list) or len(output) < 2:
        fail("gae.shape", f"expected (advantages, returns), got {type(output).__name__}")
    if whiten:
        single_token_whitening("gae", output[0], valid_mask(batch))
    advantages = f64(token_tensor("gae", output[0], mask.shape, batch))
    returns = f64(token_tensor("gae", output[1], mask.shape, batch))
    return advantages, returns


class _GAERun:
    """``fn``'s advantages and returns of one batch, the float64 reference and the
    tolerances they are judged by."""

    def __init__(
        self,
        fn: Callable[..., Any],
        batch: Batch,
        *,
        gamma: float,
        lam: float,
        whiten: bool,
        epsilon: float,
        masked_tokens: GAEMaskedTokens,
        rtol: float | None,
        atol: float | None,
    ):
        self.fn, self.batch, self.gamma, self.lam, self.whiten = fn, batch, gamma, lam, whiten
        self.masked_tokens = masked_tokens
        self.mask = mask = batch["response_mask"]
        self.valid = valid = valid_mask(batch)
        # Masked tokens that are steps of the recursion are judged (and kept fixed) too.
        self.steps = response_span(valid) if masked_tokens == "step" else valid
        self.advantages, self.returns = _call(fn, batch, whiten)
        eps = unit_roundoff(batch["token_level_rewards"].dtype, batch["values"].dtype)
        acc = accumulation_roundoff(eps)
        self.rewards64, self.values64 = f64(batch["token_level_rewards"]), f64(batch["values"])
        self.last = last = f64(batch["last_values"]) if "last_values" in batch else None
        options = {"gamma": gamma, "lam": lam, "last_values": last, "masked_tokens": masked_tokens}
        raw, self.expected_returns = gae_advantages(self.rewards64, self.values64, mask, **options)
        self.expected = raw
        magnitude = 1.0
        if bool(self.steps.any()):
            magnitude += float((self.rewards64.abs() + self.values64.abs())[self.steps].max())
        if last is not None and last.numel():
            magnitude += float(last.abs().max())
        steps = mask.shape[-1] + 1
        rounding = 8 * (eps + acc) * steps * magnitude
        self.tolerance = resolve_tolerance(8 * eps + GUARD_RTOL, rounding, rtol, atol)
        self.returns_tolerance = self.tolerance
        if whiten:
            self.expected, _ = gae_advantages(
                self.rewards64, self.values64, mask, whiten=True, epsilon=epsilon, **options
            )
            self.tolerance = _whitened_tolerance(raw[valid], self.tolerance, acc, epsilon)

    def lines(self, off: Tensor, got: Tensor, reference: Tensor, what: str) -> list[str]:
        return reference_lines(off, got, reference, what, self.inputs)

    def inputs(self, b: int, t: int) -> str:
        reward, value = float(self.rewards64[b, t]), float(self.values64[b, t])
        return f", reward={fmt(reward)}, value={fmt(value)}"


def _whitened_tolerance(
    raw: Tensor, tolerance: CheckTolerance, acc: float, epsilon: float
) -> CheckTolerance:
    """The tolerance of ``(A - μ) / sqrt(v + ε)`` given that of the raw advantages ``A``.

    The mean and the variance are reductions over ``n`` tokens, each carrying the error. An
    epsilon guard on the token count (``Σ A·m / (n + δ)``, NeMo-RL's ``+1e-8``) moves ``μ``
    by up to ``δ/n ≤ 1e-6`` of ``|μ|``, and whitening divides that by the std: when every
    advantage is equal (``v = 0``) by ``sqrt(ε) = 1e-4``, so a correct guarded mean of
    advantages 0.5 over 10 tokens whitens to 5e-6 where the reference gives 0.
    ``GUARD_RTOL·|μ|/std`` covers it; with a spread of advantages (std of order 1) it adds
    ``4e-6·|μ|``, far below the errors of a wrong mean or variance (a biased variance is off
    by ``1/(2n)`` relative).
    """
    n = raw.numel()
    mean = float(raw.mean()) if n else 0.0
    spread = raw - mean
    std = (float(spread.square().sum()) / max(n - 1, 1) + epsilon) ** 0.5
    return CheckTolerance(
        rtol=tolerance.rtol + 8 * acc * n,
        atol=(2 * tolerance.atol + GUARD_RTOL * abs(mean)) / std + 8 * acc * n,
    )


def _holes(valid: Tensor) -> int:
    """Masked tokens between a row's first and last valid token."""
    return int((~valid & response_span(valid)).sum())


def _unmasked_values_hint(run: _GAERun, off: Tensor) -> str:
    """Explain a disagreement that reading the critic's values unmasked reproduces: the
    recursion over every position, ``V_next`` taken at the next column even when that is
    padding (ROLL passes its unmasked values to ``compute_gae_advantage_return``)."""
    if run.whiten or run.last is not None:
        return ""
    width = run.valid.shape[-1]
    rewards = torch.where(run.steps, run.rewards64, torch.zeros_like(run.rewards64))
    unmasked, _ = gae_advantages(
        rewards, run.values64, torch.ones_like(run.valid), gamma=run.gamma, lam=run.lam
    )
    if width < 2 or run.tolerance.exceeded(run.advantages, unmasked)[off].any():
        return ""
    return (
        " — every disagreement matches bootstrapping the critic's value at the padding "
        "position after the last valid token (values passed to the recursion unmasked, as "
        "ROLL's compute_gae_advantage_return gets them): mask the values first"
    )


def _reference_agreement(run: _GAERun) -> None:
    steps = run.steps
    off = steps & run.tolerance.exceeded(run.advantages, run.expected)
    if bool(off.any()):
        holes = _holes(run.valid)
        treated = "skipped" if run.masked_tokens == "skip" else "ordinary steps"
        fail(
            "gae.reference_agreement",
            f"{int(off.sum())} of {int(steps.sum())} advantages differ from the reference "
            f"(gamma={run.gamma}, lam={run.lam}, whiten={run.whiten}"
            + (", bootstrap last_values" if run.last is not None else "")
            + (f"; {holes} masked tokens inside responses are {treated}" if holes else "")
            + ")"
            + _unmasked_values_hint(run, off),
            run.lines(off, run.advantages, run.expected, "advantage"),
        )


def _returns(run: _GAERun) -> None:
    off = run.steps & run.returns_tolerance.exceeded(run.returns, run.expected_returns)
    if bool(off.any()):
        fail(
            "gae.returns",
            f"{int(off.sum())} of {int(run.steps.sum())} returns differ from A + V (the "
            "advantages before whitening plus the values)",
            run.lines(off, run.returns, run.expected_returns, "return"),
        )


def _padding_independence(run: _GAERun) -> None:
    # Refill around the positions the recursion reads; the function still gets the batch's mask.
    refilled = refill_padding({**run.batch, "response_mask": run.steps})
    refilled["response_mask"] = run.mask
    again, again_returns = _call(run.fn, refilled, run.whiten)
    moved = run.steps & (
        run.tolerance.exceeded(again, run.advantages)
        | run.returns_tolerance.exceeded(again_returns, run.returns)
    )
    if bool(moved.any()):
        where = "padding and masked" if run.masked_tokens == "skip" else "padding"
        fail(
            "gae.padding_independence",
            f"changing only the garbage in {where} positions changed valid tokens",
            refilled_lines(moved, again, run.advantages),
        )


def _unmasked_values(run: _GAERun) -> None:
    """A critic outputs a value at every position, so a batch whose values are zero off the
    steps (values masked when stored) hides a GAE that reads them unmasked: give those
    positions values and require the same advantages and returns."""
    values = run.batch["values"]
    if holds_garbage(values, run.steps):
        return  # the padding already holds values: reference agreement judged them
    probe = {**run.batch, "values": garbage_padding(values, run.steps)}
    again, again_returns = _call(run.fn, probe, run.whiten)
    advantage_moved = run.tolerance.exceeded(again, run.advantages)
    moved = run.steps & (
        advantage_moved | run.returns_tolerance.exceeded(again_returns, run.returns)
    )
    lines = []
    for b, t in positions(moved):
        what, got, before = (
            ("advantage", again, run.advantages)
            if advantage_moved[b, t]
            else ("return", again_returns, run.returns)
        )
        pair = versus("with padding values", float(got[b, t]), "with zeros", float(before[b, t]))
        lines.append(f"(b={b}, t={t}): {what} {pair}")
    if lines:
        fail(
            "gae.unmasked_values",
            "giving the critic's values on padding (zero in this batch; a critic outputs a "
            "value at every position) changed valid advantages or returns: the values reach "
            "the recursion unmasked and the value after the last valid token is bootstrapped "
            "from padding (as ROLL's compute_gae_advantage_return gets them): mask the values "
            "first",
            lines,
        )


_INVARIANTS: tuple[Callable[[_GAERun], None], ...] = (
    _reference_agreement,
    _returns,
    _padding_independence,
    _unmasked_values,
)
"""The invariants of :func:`check_gae`, in the order they are judged."""


def check_gae(
    fn: Callable[..., Any],
    batch: Batch,
    *,
    gamma: float,
    lam: float,
    whiten: bool = False,
    epsilon: float = 1e-8,
    masked_tokens: GAEMaskedTokens = "skip",
    rtol: float | None = None,
    atol: float | None = None,
) -> None:
    """Check ``fn(token_level_rewards, values, response_mask) -> (advantages, returns)``.

    ``batch`` holds ``token_level_rewards``, ``values`` and ``response_mask`` (``[B, T]``), and
    optionally ``last_values`` (``[B]``, bootstrap values, passed as ``last_values=``): see
    :func:`pytest_rollout_golden.strategies.value_batches`. ``gamma``/``lam`` and ``whiten``
    (advantages whitened over the batch's valid tokens with ``sqrt(var + epsilon)``, as verl
    does) describe what ``fn`` computes. ``masked_tokens="step"``: masked tokens inside a
    response are ordinary steps (slime and ROLL, whose GAE takes no mask; draw batches with
    ``value_batches(hole_values=True)``). Only valid tokens (and, as steps, the masked tokens
    between them) are judged.

    * ``gae.reference_agreement``: the advantages equal the reference
      (:func:`pytest_rollout_golden.reference.gae_advantages`): ``δ_t = r_t + γ·V_next - V_t``,
      ``A_t = δ_t + γλ·A_next`` over valid tokens, masked tokens skipped, ``V_next`` after the
      last valid token the bootstrap value (0 without one); a disagreement that reading the
      values unmasked reproduces (ROLL) is pointed out;
    * ``gae.returns``: ``returns = A + V`` with the advantages before whitening;
    * ``gae.padding_independence``: other garbage on padding and masked tokens changes no
      valid advantage or return;
    * ``gae.unmasked_values``: when the batch's values are zero on padding (and masked
      tokens), values put there change no valid advantage or return: a critic outputs a
      value at every position, and a GAE fed them unmasked (ROLL) bootstraps the padding
      value into the last valid token;
    * ``gae.whiten_single_token``: whitening a batch with one valid token gives a finite
      value (NeMo-RL's unbiased variance divides by ``n - 1 = 0``).

    Tolerance: absolute, ``8·(eps + eps_acc)·T`` times the largest ``|r| + |V|`` (an error in
    one δ reaches every earlier token with weight ≤ 1), over the std when whitened, plus
    ``GUARD_RTOL·|μ|/std`` for an epsilon guard in the whitening mean; relative,
    ``8·eps`` plus :data:`GUARD_RTOL`. ``rtol``/``atol`` replace either part.
    """
    require_fields(batch, _FIELDS, "check_gae", "value_batches()")
    run = _GAERun(
        fn,
        batch,
        gamma=gamma,
        lam=lam,
        whiten=whiten,
        epsilon=epsilon,
        masked_tokens=masked_tokens,
        rtol=rtol,
        atol=atol,
    )
    for invariant in _INVARIANTS:
        invariant(run)
