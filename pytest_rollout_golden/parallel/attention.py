"""Masked attention three ways: in one piece, by ring (context parallel) and by Ulysses.

Every function takes ``q, k, v`` as ``[rows, local positions, heads, head_dim]`` and the
boolean mask ``allowed[rows or 1, L, L]`` over the micro-batch's *whole* (padded) sequence,
and returns ``[rows, local positions, heads * head_dim]``. ``local`` lists the sequence
positions this rank holds (all of them without a sequence split).

* :func:`ring_attention` -- the keys and values of every rank of the sequence group pass
  around the ring; each block is folded into an online softmax (a running maximum, which
  carries no gradient, a numerator and a denominator), so the result is the softmax over
  every allowed key up to the order of the sums.
* :func:`ulysses_attention` -- an all-to-all trades the sequence split for a head split,
  every rank attends over the whole sequence for ``heads / sp`` heads, and a second
  all-to-all trades back.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .comm import Groups, all_to_all, ring_pass


def dense_attention(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor) -> Tensor:
    """``softmax(q kᵀ / √d, masked) v`` for ``[rows, L, heads, d]``; ``allowed[rows|1, L, L]``."""
    rows, length, heads, head_dim = q.shape
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(head_dim)
    scores = scores.masked_fill(~allowed.unsqueeze(1), float("-inf"))
    return (scores.softmax(-1) @ v).transpose(1, 2).reshape(rows, length, heads * head_dim)


def ring_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    allowed: Tensor,
    holds: list[Tensor],
    g: Groups,
    *,
    causal_across_chunks: bool = True,
) -> Tensor:
    """Attention of this rank's queries over the keys of every rank of the ring.

    ``holds[r]``: the positions rank ``r`` of the sequence group holds. Step ``s`` attends
    to the block of rank ``me - s``, received from the previous rank. The first block is
    this rank's own, where every query sees at least itself, so the running maximum is
    finite from then on. ``causal_across_chunks=False`` is the bug of masking only within
    one's own chunks (fault ``ring-no-causal``).
    """
    rows, length, heads, head_dim = q.shape
    me, n = g.place.seq, len(holds)
    q = q.transpose(1, 2)
    kv = torch.stack([k, v])
    queries = allowed[:, holds[me].to(allowed.device)]
    maximum = numerator = denominator = None
    for step in range(n):
        if step:
            kv = ring_pass(kv, g)
        source = (me - step) % n
        keys, values = (t.transpose(1, 2) for t in kv)
        block = queries[:, :, holds[source].to(allowed.device)]
        if not causal_across_chunks and source != me:
            block = torch.ones_like(block)
        scores = (q @ keys.transpose(-1, -2)) / math.sqrt(head_dim)
        scores = scores.masked_fill(~block.unsqueeze(1), float("-inf"))
        block_max = scores.detach().amax(-1, keepdim=True)
        if maximum is None:
            maximum = block_max
            weights = (scores - maximum).exp()
            numerator, denominator = weights @ values, weights.sum(-1, keepdim=True)
            continue
        new_max = torch.maximum(maximum, block_max)
        rescale = (maximum - new_max).exp()
        weights = (scores - new_max).exp()
        numerator = numerator * rescale + weights @ values
        denominator = denominator * rescale + weights.sum(-1, keepdim=True)
        maximum = new_max
    out = numerator / denominator
    return out.transpose(1, 2).reshape(rows, length, heads * head_dim)


def _heads_to_front(t: Tensor, sp: int, wrong_split: bool) -> Tensor:
    """``[rows, Ls, H, d]`` -> ``[sp, rows, Ls, H / sp, d]``: chunk ``j`` for rank ``j``."""
    rows, local, heads, head_dim = t.shape
    if wrong_split:  # reads [head_dim, heads] where [heads, head_dim] is stored
        t = t.reshape(rows, local, head_dim, heads).transpose(2, 3)
    return t.reshape(rows, local, sp, heads // sp, head_dim).permute(2, 0, 1, 3, 4)


def ulysses_attention(
    q: Tensor, k: Tensor, v: Tensor, allowed: Tensor, g: Groups, *, wrong_split: bool = False
) -> Tensor:
    """Sequence-split in, sequence-split out; whole sequences for ``1 / sp`` of the heads
    in between. Rank ``j`` holds positions ``[j * L / sp, (j + 1) * L / sp)``."""
    rows, local, heads, head_dim = q.shape
    sp = g.layout.sp
    if heads % sp:
        raise ValueError(f"Ulysses needs heads per TP rank ({heads}) divisible by sp={sp}")
    rows_each = rows * local * (heads // sp) * head_dim
    split = [rows_each] * sp

    def scatter_heads(t: Tensor) -> Tensor:
        chunks = _heads_to_front(t, sp, wrong_split).reshape(-1)
        gathered = all_to_all(chunks, g.seq, split, split)
        parts = gathered.view(sp, rows, local, heads // sp, head_dim)
        return parts.permute(1, 0, 2, 3, 4).reshape(rows, sp * local, heads // sp, head_dim)

    full = dense_attention(*(scatter_heads(t) for t in (q, k, v)), allowed)
    full = full.view(rows, sp, local, heads // sp, head_dim).permute(1, 0, 2, 3, 4)
    back = all_to_all(full.reshape(-1), g.seq, split, split)
    out = back.view(sp, rows, local, heads // sp, head_dim).permute(1, 2, 0, 3, 4)
    out = out.reshape(rows, local, heads, head_dim)
    if wrong_split:
        out = out.transpose(2, 3).reshape(rows, local, heads, head_dim)
    return out.reshape(rows, local, heads * head_dim)
