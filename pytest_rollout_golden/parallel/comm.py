"""Process groups of a layout and the collectives the reference policy differentiates through.

* :func:`make_groups` -- this rank's :class:`Groups` (one ``dist.new_group`` per set of ranks
  that differ only in the named coordinates);
* :func:`copy_to_tp` / :func:`reduce_from_tp` -- Megatron's ``f`` and ``g`` around
  column- and row-parallel layers;
* :func:`ring_pass` -- send a tensor to the next rank of the sequence group, receive the
  previous rank's (backward: the reverse);
* :func:`all_to_all` -- exchange chunks within a group, equal or given sizes (backward: the
  inverse exchange).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from .layout import Layout, Place


@dataclass
class Groups:
    """This rank's coordinates and process groups (``None`` where a group has one rank).

    ``data``: the ranks holding the same dense parameters (over dp, the sequence split and
    ep), whose gradients are summed; ``expert_data``: the same for expert parameters (over
    dp and the sequence split).
    """

    layout: Layout
    rank: int
    place: Place
    tp: Any = None
    seq: Any = None
    ep: Any = None
    data: Any = None
    expert_data: Any = None
    stage_ranks: list[int] = field(default_factory=list)  # global rank of each pp stage
    seq_ranks: list[int] = field(default_factory=list)  # global rank of each seq rank
    ep_ranks: list[int] = field(default_factory=list)  # global rank of each ep rank

    @property
    def stage(self) -> int:
        return self.place.pp

    @property
    def tp_rank(self) -> int:
        return self.place.tp

    @property
    def data_rank(self) -> int:
        """Index of this rank's row shard: ``dp_rank * ep + ep_rank``."""
        return self.place.dp * self.layout.ep + self.place.ep


_GROUPS: dict[tuple[Place, tuple[str, ...]], dict[Place, Any]] = {}


def _along(layout: Layout, rank: int, dims: tuple[str, ...]) -> list[int]:
    """Global ranks that differ from ``rank`` only in ``dims``, in rank order."""
    place = layout.place(rank)
    sizes = layout.sizes()._asdict()
    ranks = []
    for values in itertools.product(*(range(sizes[d]) for d in dims)):
        ranks.append(layout.rank_at(place._replace(**dict(zip(dims, values, strict=True)))))
    return sorted(ranks)


def _group(layout: Layout, rank: int, dims: tuple[str, ...]) -> Any:
    """The process group over ``dims`` that holds ``rank``; created collectively (every rank
    creates every such group, in the same order) on first use per process."""
    key = (layout.sizes(), dims)
    if key not in _GROUPS:
        made: dict[Place, Any] = {}
        for other in range(layout.world_size):
            members = _along(layout, other, dims)
            if other != members[0]:
                continue
            group = dist.new_group(members) if len(members) > 1 else None
            for member in members:
                made[layout.place(member)] = group
        _GROUPS[key] = made
    return _GROUPS[key][layout.place(rank)]


def make_groups(layout: Layout, rank: int) -> Groups:
    """Process groups of ``layout``; every rank must call this with the same layout."""
    g = Groups(layout, rank, layout.place(rank))
    g.stage_ranks = _along(layout, rank, ("pp",))
    g.seq_ranks = _along(layout, rank, ("seq",))
    g.ep_ranks = _along(layout, rank, ("ep",))
    if layout.world_size == 1:
        return g
    g.tp = _group(layout, rank, ("tp",))
    g.seq = _group(layout, rank, ("seq",))
    g.ep = _group(layout, rank, ("ep",))
    g.data = _group(layout, rank, ("dp", "ep", "seq"))
    g.expert_data = _group(layout, rank, ("dp", "seq"))
    return g


def all_reduce(x: Tensor, group: Any, op: Any = None) -> Tensor:
    """In-place all-reduce (sum by default); a no-op without a group."""
    if group is not None:
        dist.all_reduce(x, op=op or dist.ReduceOp.SUM, group=group)
    return x


def world_sum(x: Tensor, layout: Layout) -> Tensor:
    """In-place sum over every rank (a no-op in one process)."""
    if layout.world_size > 1:
        dist.all_reduce(x)
    return x


class _CopyToTP(torch.autograd.Function):
    """In front of a column-parallel layer: identity forward, all-reduce of the grad backward.

    Each TP rank's slice contributes part of the input's gradient; the sum is the gradient.
    """

    @staticmethod
    def forward(ctx: Any, x: Tensor, group: Any) -> Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return all_reduce(grad.contiguous().clone(), ctx.group), None


class _ReduceFromTP(torch.autograd.Function):
    """Behind a row-parallel layer: all-reduce of the partial sums forward, identity backward."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, group: Any) -> Tensor:
        return all_reduce(x.contiguous().clone(), group)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return grad, None


def copy_to_tp(x: Tensor, g: Groups) -> Tensor:
    return x if g.tp is None else _CopyToTP.apply(x, g.tp)


def reduce_from_tp(x: Tensor, g: Groups) -> Tensor:
    return x if g.tp is None else _ReduceFromTP.apply(x, g.tp)


def _exchange(x: Tensor, send_to: int, recv_from: int) -> Tensor:
    out = torch.empty_like(x)
    requests = [dist.isend(x.contiguous(), send_to), dist.irecv(out, recv_from)]
    for request in requests:
        request.wait()
    return out


class _RingPass(torch.autograd.Function):
    """Forward: send to the next rank of the ring, receive from the previous one."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, ring: list[int], me: int) -> Tensor:
        ctx.ring, ctx.me = ring, me
        n = len(ring)
        return _exchange(x, ring[(me + 1) % n], ring[(me - 1) % n])

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        n = len(ctx.ring)
        return _exchange(grad, ctx.ring[(ctx.me - 1) % n], ctx.ring[(ctx.me + 1) % n]), None, None


def ring_pass(x: Tensor, g: Groups) -> Tensor:
    """What the previous rank of the sequence group holds (differentiable)."""
    return _RingPass.apply(x, g.seq_ranks, g.place.seq)


class _AllToAll(torch.autograd.Function):
    """Rows ``send[i]`` go to rank ``i`` of the group; rows ``recv[i]`` come from it."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, group: Any, send: list[int], recv: list[int]) -> Tensor:
        ctx.group, ctx.send, ctx.recv = group, send, recv
        out = x.new_empty((sum(recv), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), recv, send, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None, None]:
        out = grad.new_empty((sum(ctx.send), *grad.shape[1:]))
        dist.all_to_all_single(out, grad.contiguous(), ctx.send, ctx.recv, group=ctx.group)
        return out, None, None, None


def all_to_all(x: Tensor, group: Any, send: list[int], recv: list[int]) -> Tensor:
    """Differentiable all-to-all of the rows of ``x`` (``send``/``recv``: rows per rank)."""
    if group is None:
        return x
    return _AllToAll.apply(x, group, list(send), list(recv))


def exchange_counts(counts: Tensor, group: Any) -> Tensor:
    """``counts[i]``: what this rank sends rank ``i``; returns what each rank sends here."""
    if group is None:
        return counts
    out = torch.empty_like(counts)
    dist.all_to_all_single(out, counts.contiguous(), group=group)
    return out
