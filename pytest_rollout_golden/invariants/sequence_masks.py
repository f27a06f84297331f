"""Checker for an Off-Policy Sequence Mask (OPSM: slime ``compute_opsm_mask``, TRL
``get_off_policy_mask``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ..reference.masking import masked_mean
from ..reference.sequence_masks import opsm_keep_mask
from .comparison import Batch, f64, fail, fmt, positions, refill_padding, unit_roundoff, valid_mask

__all__ = ["check_opsm_mask"]

_STRADDLE = 0.25
"""How far (nats) the checker moves each row's mean ``old - logp`` to either side of
``delta``: 4 grid steps, far beyond the rounding of a mean of log-probs in bf16."""


def _keep(fn: Callable[..., Any], batch: Batch) -> Tensor:
    """``fn``'s keep mask as bool ``[B, T]`` (a ``[B, 1]`` mask, as TRL returns, broadcast)."""
    args = (batch["log_probs"], batch["old_log_probs"], batch["advantages"])
    out = torch.as_tensor(fn(*args, batch["response_mask"]))
    return (out != 0).expand(batch["log_probs"].shape)


def _straddled(batch: Batch, delta: float) -> dict[str, Any]:
    """The batch with each row's ``mean_valid(old - logp)`` moved, cycling over the rows, to
    ``delta - 0.25``, ``delta + 0.25`` and ``delta - |delta|/2`` (below ``delta``, while the
    row's sum over two or more tokens may be above it), by shifting the row's valid old
    log-probs (which may then exceed 0: the mask does not care)."""
    valid = valid_mask(batch)
    lp, old = f64(batch["log_probs"]), f64(batch["old_log_probs"])
    seq_kl = masked_mean(old - lp, batch["response_mask"], dim=-1)
    offsets = (-_STRADDLE, _STRADDLE, -abs(delta) / 2)
    target = torch.tensor([delta + offsets[b % 3] for b in range(lp.shape[0])])
    shift = (target - seq_kl).unsqueeze(-1)
    moved = torch.where(valid, old + shift, old).to(batch["old_log_probs"].dtype)
    return {**batch, "old_log_probs": moved}


def _judge(fn: Callable[..., Any], batch: Batch, delta: float, what: str) -> Tensor:
    """``fn``'s mask on ``batch`` against the reference on valid tokens, rows whose mean is
    within rounding of ``delta`` not judged. Returns ``fn``'s mask."""
    valid = valid_mask(batch)
    lp, old, adv = (f64(batch[k]) for k in ("log_probs", "old_log_probs", "advantages"))
    got = _keep(fn, batch)
    expected = opsm_keep_mask(lp, old, adv, batch["response_mask"], delta=delta)
    seq_kl = masked_mean(old - lp, batch["response_mask"], dim=-1)
    eps = unit_roundoff(batch["log_probs"].dtype)
    scale = masked_mean(lp.abs() + old.abs(), batch["response_mask"], dim=-1)
    near = (seq_kl - delta).abs() <= 16 * eps * (1 + scale) + 1e-12
    off = valid & (got != expected) & ~near.unsqueeze(-1)
    if bool(off.any()):
        fail(
            "opsm.reference_agreement",
            f"{what}: the mask differs from 'drop where A < 0 and the row's mean "
            f"(old - logp) > {delta!r}'",
            [
                f"(b={b}, t={t}): A={fmt(float(adv[b, t]))}, row mean(old - logp)="
                f"{fmt(float(seq_kl[b]))}, kept={bool(got[b, t])}, expected "
                f"{bool(expected[b, t])}"
                for b, t in positions(off)
            ],
        )
    return got


def check_opsm_mask(fn: Callable[..., Any], batch: Batch, *, delta: float = 1e-4) -> None:
    """Check an OPSM keep mask ``fn(log_probs, old_log_probs, advantages, response_mask)``
    (non-zero = keep, ``[B, T]`` or ``[B, 1]``) against :func:`~.reference.opsm_keep_mask`:
    a token is dropped when ``A < 0`` and its row's mean of
    ``old - logp`` over valid tokens exceeds ``delta`` (slime's ``--opsm-delta``, TRL's
    ``off_policy_mask_threshold``).

    * ``opsm.reference_agreement``: on the batch as drawn, and on the batch with every row's
      mean moved to either side of ``delta`` (``delta ± 0.25``, and ``delta - |delta|/2``,
      where a sum in place of the mean crosses ``delta``), so both sides of the threshold are
      seen whatever ``delta`` is;
    * ``opsm.padding_independence``: other padding leaves the mask of valid tokens unchanged.

    Rows whose mean lies within rounding of ``delta`` are not judged.
    """
    got = _judge(fn, batch, delta, "on the batch as drawn")
    _judge(fn, _straddled(batch, delta), delta, "with row means moved to either side of delta")
    valid = valid_mask(batch)
    again = _keep(fn, refill_padding(batch))
    moved = valid & (again != got)
    if bool(moved.any()):
        fail(
            "opsm.padding_independence",
            "other padding changes the mask of valid tokens (padding enters the row's mean)",
            [f"(b={b}, t={t})" for b, t in positions(moved)],
        )
