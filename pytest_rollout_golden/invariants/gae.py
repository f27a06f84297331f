"""Checker for generalized advantage estimation (GAE): the λ/γ recursion, masks, bootstrap."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor

from ..reference.advantages import gae_advantages
from .comparison import (
    GUARD_RTOL,
    Batch,
    CheckTolerance,
    accepts,
    accumulation_roundoff,
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

__all__ = ["check_gae"]


def _call(fn: Callable[..., Any], batch: Batch) -> tuple[Tensor, Tensor]:
    mask = batch["response_mask"]
    kwargs = {}
    if "last_values" in batch:
        if not accepts(fn, "last_values"):
            raise TypeError("the batch has last_values: fn must accept a last_values= keyword")
        kwargs["last_values"] = batch["last_values"]
    output = fn(batch["token_level_rewards"], batch["values"], mask, **kwargs)
    if not isinstance(output, tuple | list) or len(output) < 2:
        fail("gae.shape", f"expected (advantages, returns), got {type(output).__name__}")
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
        rtol: float | None,
        atol: float | None,
    ):
        self.fn, self.batch, self.gamma, self.lam, self.whiten = fn, batch, gamma, lam, whiten
        self.mask = mask = batch["response_mask"]
        self.valid = valid = valid_mask(batch)
        self.advantages, self.returns = _call(fn, batch)
        eps = unit_roundoff(batch["token_level_rewards"].dtype, batch["values"].dtype)
        acc = accumulation_roundoff(eps)
        self.rewards64, self.values64 = f64(batch["token_level_rewards"]), f64(batch["values"])
        self.last = last = f64(batch["last_values"]) if "last_values" in batch else None
        raw, self.expected_returns = gae_advantages(
            self.rewards64, self.values64, mask, gamma=gamma, lam=lam, last_values=last
        )
        self.expected = raw
        magnitude = 1.0
        if bool(valid.any()):
            magnitude += float((self.rewards64.abs() + self.values64.abs())[valid].max())
        if last is not None and last.numel():
            magnitude += float(last.abs().max())
        steps = mask.shape[-1] + 1
        rounding = 8 * (eps + acc) * steps * magnitude
        self.tolerance = resolve_tolerance(8 * eps + GUARD_RTOL, rounding, rtol, atol)
        self.returns_tolerance = self.tolerance
        if whiten:
            self.expected, _ = gae_advantages(
                self.rewards64,
                self.values64,
                mask,
                gamma=gamma,
                lam=lam,
                last_values=last,
                whiten=True,
                epsilon=epsilon,
            )
            n = int(valid.sum())
            spread = raw[valid] - raw[valid].mean() if n else raw[valid]
            std = (float(spread.square().sum()) / max(n - 1, 1) + epsilon) ** 0.5
            # The mean and the variance are reductions over n tokens, each carrying the error.
            self.tolerance = CheckTolerance(
                rtol=self.tolerance.rtol + 8 * acc * n,
                atol=2 * self.tolerance.atol / std + 8 * acc * n,
            )

    def lines(self, off: Tensor, got: Tensor, reference: Tensor, what: str) -> list[str]:
        return reference_lines(off, got, reference, what, self.inputs)

    def inputs(self, b: int, t: int) -> str:
        reward, value = float(self.rewards64[b, t]), float(self.values64[b, t])
        return f", reward={fmt(reward)}, value={fmt(value)}"


def _holes(valid: Tensor) -> int:
    """Masked tokens between a row's first and last valid token."""
    inside = valid.long().cumsum(-1).gt(0) & valid.flip(-1).long().cumsum(-1).flip(-1).gt(0)
    return int((~valid & inside).sum())


def _reference_agreement(run: _GAERun) -> None:
    valid = run.valid
    off = valid & run.tolerance.exceeded(run.advantages, run.expected)
    if bool(off.any()):
        holes = _holes(valid)
        fail(
            "gae.reference_agreement",
            f"{int(off.sum())} of {int(valid.sum())} advantages differ from the reference "
            f"(gamma={run.gamma}, lam={run.lam}, whiten={run.whiten}"
            + (", bootstrap last_values" if run.last is not None else "")
            + (f"; {holes} masked tokens inside responses must be skipped" if holes else "")
            + ")",
            run.lines(off, run.advantages, run.expected, "advantage"),
        )


def _returns(run: _GAERun) -> None:
    off = run.valid & run.returns_tolerance.exceeded(run.returns, run.expected_returns)
    if bool(off.any()):
        fail(
            "gae.returns",
            f"{int(off.sum())} of {int(run.valid.sum())} returns differ from A + V (the "
            "advantages before whitening plus the values)",
            run.lines(off, run.returns, run.expected_returns, "return"),
        )


def _padding_independence(run: _GAERun) -> None:
    again, again_returns = _call(run.fn, refill_padding(run.batch))
    moved = run.valid & (
        run.tolerance.exceeded(again, run.advantages)
        | run.returns_tolerance.exceeded(again_returns, run.returns)
    )
    if bool(moved.any()):
        fail(
            "gae.padding_independence",
            "changing only the garbage in padding and masked positions changed valid tokens",
            refilled_lines(moved, again, run.advantages),
        )


_INVARIANTS: tuple[Callable[[_GAERun], None], ...] = (
    _reference_agreement,
    _returns,
    _padding_independence,
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
    rtol: float | None = None,
    atol: float | None = None,
) -> None:
    """Check ``fn(token_level_rewards, values, response_mask) -> (advantages, returns)``.

    ``batch`` holds ``token_level_rewards``, ``values`` and ``response_mask`` (``[B, T]``), and
    optionally ``last_values`` (``[B]``, bootstrap values, passed as ``last_values=``): see
    :func:`pytest_rollout_golden.strategies.value_batches`. ``gamma``/``lam`` and ``whiten``
    (advantages whitened over the batch's valid tokens with ``sqrt(var + epsilon)``, as verl
    does) describe what ``fn`` computes. Only valid tokens are judged.

    * ``gae.reference_agreement``: the advantages equal the reference
      (:func:`pytest_rollout_golden.reference.gae_advantages`): ``δ_t = r_t + γ·V_next - V_t``,
      ``A_t = δ_t + γλ·A_next`` over valid tokens, masked tokens skipped, ``V_next`` after the
      last valid token the bootstrap value (0 without one);
    * ``gae.returns``: ``returns = A + V`` with the advantages before whitening;
    * ``gae.padding_independence``: other garbage on padding and masked tokens changes no
      valid advantage or return.

    Tolerance: absolute, ``8·(eps + eps_acc)·T`` times the largest ``|r| + |V|`` (an error in
    one δ reaches every earlier token with weight ≤ 1), over the std when whitened; relative,
    ``8·eps`` plus :data:`GUARD_RTOL`. ``rtol``/``atol`` replace either part.
    """
    run = _GAERun(
        fn,
        batch,
        gamma=gamma,
        lam=lam,
        whiten=whiten,
        epsilon=epsilon,
        rtol=rtol,
        atol=atol,
    )
    for invariant in _INVARIANTS:
        invariant(run)
