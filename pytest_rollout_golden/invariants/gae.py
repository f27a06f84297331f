"""Checker for generalized advantage estimation (GAE): the λ/γ recursion, masks, bootstrap."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor

from ..reference.advantages import gae_advantages
from .comparison import (
    GUARD_RTOL,
    Batch,
    Tolerance,
    accepts,
    accumulation_roundoff,
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
    mask = batch["response_mask"]
    valid = valid_mask(batch)
    advantages, returns = _call(fn, batch)
    dtypes = [batch["token_level_rewards"].dtype, batch["values"].dtype]
    eps = unit_roundoff(*dtypes)
    acc = accumulation_roundoff(eps)
    rewards64, values64 = f64(batch["token_level_rewards"]), f64(batch["values"])
    last = f64(batch["last_values"]) if "last_values" in batch else None
    raw, expected_returns = gae_advantages(
        rewards64, values64, mask, gamma=gamma, lam=lam, last_values=last
    )
    expected = raw
    magnitude = 1.0
    if bool(valid.any()):
        magnitude += float((rewards64.abs() + values64.abs())[valid].max())
    if last is not None and last.numel():
        magnitude += float(last.abs().max())
    steps = mask.shape[-1] + 1
    rounding = 8 * (eps + acc) * steps * magnitude
    tolerance = resolve_tolerance(8 * eps + GUARD_RTOL, rounding, rtol, atol)
    returns_tolerance = tolerance
    if whiten:
        expected, _ = gae_advantages(
            rewards64,
            values64,
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
        tolerance = Tolerance(
            rtol=tolerance.rtol + 8 * acc * n, atol=2 * tolerance.atol / std + 8 * acc * n
        )

    def lines(off: Tensor, got: Tensor, reference: Tensor, what: str) -> list[str]:
        return [
            f"(b={b}, t={t}): {what} "
            + versus("fn", float(got[b, t]), "reference", float(reference[b, t]))
            + f", reward={fmt(float(rewards64[b, t]))}, value={fmt(float(values64[b, t]))}"
            for b, t in positions(off)
        ]

    off = valid & tolerance.exceeded(advantages, expected)
    if bool(off.any()):
        holes = int(
            (
                ~valid
                & valid.long().cumsum(-1).gt(0)
                & valid.flip(-1).long().cumsum(-1).flip(-1).gt(0)
            ).sum()
        )
        fail(
            "gae.reference_agreement",
            f"{int(off.sum())} of {int(valid.sum())} advantages differ from the reference "
            f"(gamma={gamma}, lam={lam}, whiten={whiten}"
            + (", bootstrap last_values" if last is not None else "")
            + (f"; {holes} masked tokens inside responses must be skipped" if holes else "")
            + ")",
            lines(off, advantages, expected, "advantage"),
        )
    off = valid & returns_tolerance.exceeded(returns, expected_returns)
    if bool(off.any()):
        fail(
            "gae.returns",
            f"{int(off.sum())} of {int(valid.sum())} returns differ from A + V (the advantages "
            "before whitening plus the values)",
            lines(off, returns, expected_returns, "return"),
        )
    again, again_returns = _call(fn, regarble(batch))
    moved = valid & (
        tolerance.exceeded(again, advantages) | returns_tolerance.exceeded(again_returns, returns)
    )
    if bool(moved.any()):
        fail(
            "gae.padding_independence",
            "changing only the garbage in padding and masked positions changed valid tokens",
            [
                f"(b={b}, t={t}): "
                + versus("regarbled", float(again[b, t]), "fn", float(advantages[b, t]))
                for b, t in positions(moved)
            ],
        )
