"""Masked reductions over ``[B, T]`` token tensors and packed ``[1, N]`` segments.

Every reference function reduces through these helpers, so padding handling is
defined in one place: positions where the mask is false never contribute,
whatever value they hold (real batches carry garbage there, not zeros).
"""

from __future__ import annotations

import torch
from torch import Tensor


def as_bool_mask(mask: Tensor) -> Tensor:
    """The mask as a bool tensor (any non-zero entry is a valid position)."""
    return mask if mask.dtype == torch.bool else mask != 0


def masked_fill_zero(values: Tensor, mask: Tensor) -> Tensor:
    """``values`` with every masked-out position replaced by an exact zero."""
    return torch.where(as_bool_mask(mask), values, torch.zeros_like(values))


def masked_sum(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of the valid entries (over everything, or along ``dim``)."""
    kept = masked_fill_zero(values, mask)
    return kept.sum() if dim is None else kept.sum(dim=dim)


def masked_count(mask: Tensor, dim: int | None = None) -> Tensor:
    """Number of valid entries (int64)."""
    valid = as_bool_mask(mask)
    return valid.sum() if dim is None else valid.sum(dim=dim)


def masked_mean(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of the valid entries; 0 where there is none."""
    count = masked_count(mask, dim).to(values.dtype)
    return masked_sum(values, mask, dim) / count.clamp(min=1)


def masked_max(values: Tensor, mask: Tensor, dim: int = -1) -> Tensor:
    """Max of the valid entries along ``dim``; 0 for a row without any."""
    valid = as_bool_mask(mask)
    lowest = torch.full_like(values, float("-inf"))
    best = torch.where(valid, values, lowest).amax(dim=dim)
    return torch.where(valid.any(dim=dim), best, torch.zeros_like(best))


def valid_rows(mask: Tensor) -> Tensor:
    """Bool ``[B]``: rows (sequences) with at least one valid token."""
    return as_bool_mask(mask).any(dim=-1)


def segment_ids(cu_seqlens: Tensor) -> Tensor:
    """Sequence index of each packed token, from cumulative lengths ``[S + 1]``."""
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    rows = torch.arange(lengths.numel(), device=cu_seqlens.device)
    return torch.repeat_interleave(rows, lengths)


def segment_sum(values: Tensor, cu_seqlens: Tensor) -> Tensor:
    """Per-sequence sums ``[S]`` of packed token values ``[N]`` (or ``[1, N]``)."""
    flat = values.reshape(-1)
    out = torch.zeros(cu_seqlens.numel() - 1, dtype=flat.dtype, device=flat.device)
    return out.index_add(0, segment_ids(cu_seqlens), flat)
