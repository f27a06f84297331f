"""Splitting, sharding, re-padding and packing rollout batches the way training frameworks do.

A *batch* is a dict of tensors whose first dimension is the batch dimension ``B`` (token
tensors are ``[B, T]``, per-sequence ones such as ``uid`` are ``[B]``); anything else is
carried along unchanged. Splits are lists of row indices, so the same split can be applied to
every tensor with :func:`select_rows`.

Reduction order. Computing a loss piece by piece and summing the pieces adds the same
per-token terms in a different order than one reduction over the full batch, so the results
agree to rounding (a few ulps times the number of terms) but not bitwise; only when every
partial sum is exactly representable (e.g. small integers) do they agree bitwise. Packing
changes the reduction order in the same way. Gradients of per-token terms are unaffected by
the order and usually agree bitwise.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import torch
from torch import Tensor

from ..reference.masking import as_bool_mask

Batch = dict[str, Any]
Split = list[list[int]]


def batch_size(batch: Mapping[str, Any]) -> int:
    """Number of rows, read from ``response_mask``."""
    return int(batch["response_mask"].shape[0])


def select_rows(batch: Mapping[str, Any], rows: Sequence[int]) -> Batch:
    """The sub-batch made of ``rows`` (in that order) of every tensor with a batch dimension."""
    size = batch_size(batch)
    out: Batch = {}
    for key, value in batch.items():
        if isinstance(value, Tensor) and value.dim() >= 1 and value.shape[0] == size:
            index = torch.as_tensor(list(rows), dtype=torch.long, device=value.device)
            out[key] = value.index_select(0, index)
        else:
            out[key] = value
    return out


def token_counts(response_mask: Tensor) -> list[int]:
    """Valid tokens per row."""
    return [int(n) for n in as_bool_mask(response_mask).sum(dim=-1)]


def split_by_count(size: int, n_splits: int) -> Split:
    """Contiguous micro-batches of nearly equal row counts (sizes differ by at most one).

    At most ``min(n_splits, size)`` pieces, none empty.
    """
    if n_splits < 1:
        raise ValueError(f"n_splits must be >= 1, got {n_splits}")
    pieces = torch.tensor_split(torch.arange(size), min(n_splits, max(size, 1)))
    return [piece.tolist() for piece in pieces if piece.numel()]


def split_interleaved(size: int, n_splits: int) -> Split:
    """Row ``i`` goes to micro-batch ``i % n_splits`` (a reordering split); none empty."""
    if n_splits < 1:
        raise ValueError(f"n_splits must be >= 1, got {n_splits}")
    pieces = [list(range(start, size, n_splits)) for start in range(n_splits)]
    return [piece for piece in pieces if piece]


def split_by_token_budget(response_mask: Tensor, max_tokens: int) -> Split:
    """Greedy contiguous micro-batches holding at most ``max_tokens`` valid tokens each.

    A row is never split; a row longer than the budget gets a micro-batch of its own. This
    is the dynamic-batch-size scheme: micro-batches hold different numbers of rows.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    pieces: Split = []
    current: list[int] = []
    used = 0
    for row, count in enumerate(token_counts(response_mask)):
        if current and used + count > max_tokens:
            pieces.append(current)
            current, used = [], 0
        current.append(row)
        used += count
    if current:
        pieces.append(current)
    return pieces


def dp_shards(size: int, dp_size: int) -> Split:
    """Contiguous row shards, one per data-parallel rank (exactly ``dp_size`` lists).

    Shard sizes differ by at most one; a rank may get no rows when ``size < dp_size``. Each
    rank computes its loss with the global normalizers of the whole step.
    """
    if dp_size < 1:
        raise ValueError(f"dp_size must be >= 1, got {dp_size}")
    return [piece.tolist() for piece in torch.tensor_split(torch.arange(size), dp_size)]


def token_keys(batch: Mapping[str, Any]) -> list[str]:
    """Keys of the ``[B, T]`` tensors (same shape as ``response_mask``)."""
    shape = batch["response_mask"].shape
    return [k for k, v in batch.items() if isinstance(v, Tensor) and v.shape == shape]


def padding_side(response_mask: Tensor) -> Literal["left", "right", "none", "mixed"]:
    """Where each row's padding sits: all rows right-padded, all left-padded, no padding, or mixed.

    Rows without any valid token are compatible with either side.
    """
    valid = as_bool_mask(response_mask)
    if bool(valid.all()):
        return "none"
    positions = torch.arange(valid.shape[-1], device=valid.device)
    counts = valid.sum(dim=-1)
    right = bool(((positions < counts.unsqueeze(-1)) == valid).all())
    left = bool(((positions >= valid.shape[-1] - counts.unsqueeze(-1)) == valid).all())
    if right:
        return "right"
    return "left" if left else "mixed"


def pad_columns(
    batch: Mapping[str, Any], extra: int, *, side: Literal["left", "right"], fill: float = 0.0
) -> Batch:
    """Widen every token tensor by ``extra`` padding columns on ``side``.

    New mask entries are false/zero; other token tensors get ``fill`` (pass garbage to check
    that a loss ignores padding values).
    """
    out = dict(batch)
    for key in token_keys(batch):
        value = batch[key]
        is_mask = key == "response_mask"
        pad = torch.full(
            (value.shape[0], extra),
            0 if is_mask else fill,
            dtype=value.dtype,
            device=value.device,
        )
        out[key] = torch.cat([pad, value] if side == "left" else [value, pad], dim=-1)
    return out


def pack(batch: Mapping[str, Any]) -> tuple[Batch, Tensor]:
    """Remove padding: token tensors become ``[1, N]`` (each row's valid tokens, rows in order).

    Returns the packed batch and ``cu_seqlens`` (int32 ``[B + 1]``, cumulative valid lengths;
    a row without valid tokens is an empty segment). The packed ``response_mask`` is all
    valid (ones of the original dtype); per-sequence tensors (``uid``) are unchanged.
    """
    mask = batch["response_mask"]
    valid = as_bool_mask(mask)
    out = dict(batch)
    for key in token_keys(batch):
        out[key] = batch[key][valid].unsqueeze(0)
    counts = valid.sum(dim=-1)
    cu_seqlens = torch.zeros(counts.numel() + 1, dtype=torch.int32, device=mask.device)
    cu_seqlens[1:] = counts.cumsum(0)
    return out, cu_seqlens


def unpack(
    packed: Tensor, cu_seqlens: Tensor, response_mask: Tensor, *, fill: float = 0.0
) -> Tensor:
    """Scatter packed token values (``[1, N]`` or ``[N]``) back to the padded ``[B, T]`` layout.

    Differentiable with respect to ``packed``; padding positions hold ``fill``.
    """
    valid = as_bool_mask(response_mask)
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).to(valid.device)
    if not torch.equal(lengths.long(), valid.sum(dim=-1).long()):
        raise ValueError("cu_seqlens does not match the valid lengths of response_mask")
    flat = packed.reshape(-1)
    base = torch.full(valid.shape, fill, dtype=flat.dtype, device=flat.device)
    return base.masked_scatter(valid, flat)


def micro_batch_splits(response_mask: Tensor, n_splits: int) -> dict[str, Split]:
    """The partitions the split checkers try, by name: contiguous by count, greedy by token
    budget (``ceil(tokens / n_splits)``), interleaved. Together they give micro-batches with
    different token counts whenever the rows have different lengths.
    """
    size = int(response_mask.shape[0])
    total = sum(token_counts(response_mask))
    splits = {
        "by_count": split_by_count(size, n_splits),
        "by_token_budget": split_by_token_budget(
            response_mask, max(1, math.ceil(total / n_splits))
        ),
        "interleaved": split_interleaved(size, n_splits),
    }
    return splits
