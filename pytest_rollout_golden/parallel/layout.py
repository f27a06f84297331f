"""A parallel layout: how one training step is split over ranks and micro-batches.

Torch-free, so that test collection (``variants()``) imports nothing heavy.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

FAULTS = (
    "no-tp-allreduce",
    "micro-mean",
    "dp-double-norm",
    "packing-leak",
    "ring-no-causal",
    "ulysses-head-split",
    "ep-local-aux",
    "critic-micro-norm",
)
"""Deliberate bugs the reference policy can inject, to prove that the gate catches them:

* ``no-tp-allreduce``: the row-parallel linear layers skip their all-reduce (partial sums);
* ``micro-mean``: each micro-batch is normalized by its own token count and weighted by
  ``1 / len(micro_batches)`` (with ``max_tokens``: the dynamic-batch-size weighting bug);
* ``dp-double-norm``: the loss is divided by the global token count *and* the gradients are
  averaged over data-parallel ranks (a ``1/dp`` error);
* ``packing-leak``: packed sequences attend across sequence boundaries (plain causal mask);
* ``ring-no-causal``: ring attention applies the mask within a rank's own chunks only, so
  queries see every key of the chunks passed around the ring, future ones included;
* ``ulysses-head-split``: Ulysses scatters ``[head_dim, heads]`` instead of ``[heads,
  head_dim]`` in its all-to-all, so every "head" mixes dimensions of several heads;
* ``ep-local-aux``: the router's load statistics and the auxiliary loss are computed per
  expert-parallel rank and averaged, instead of over every token of the step;
* ``critic-micro-norm`` (needs the value head, ``PolicyConfig(critic=True)``): each
  micro-batch's value loss is normalized by its own token count and the pieces are summed
  (verl #6957), so the critic's gradient grows with the micro-batches and DP ranks.
"""

CRITIC_FAULTS = ("critic-micro-norm",)
"""The faults of :data:`FAULTS` planted in the value head's loss."""


class Place(NamedTuple):
    """Coordinates of one rank, slowest-varying first (``seq``: its rank in the ``cp`` or
    ``sp`` group); ``tp`` varies fastest."""

    dp: int
    pp: int
    ep: int
    seq: int
    tp: int


@dataclasses.dataclass(frozen=True)
class Layout:
    """Parallel sizes, sequence packing and micro-batching of one training step.

    * ``tp``, ``pp``, ``dp``: tensor, pipeline and data parallel sizes;
    * ``cp``: context parallelism by ring attention (each rank holds two of ``2 * cp``
      chunks of every sequence, the load-balanced causal split of Megatron-LM);
    * ``sp``: Ulysses sequence parallelism (each rank holds ``1 / sp`` of every sequence and
      attends over all of it for ``1 / sp`` of the heads); at most one of ``cp`` and ``sp``;
    * ``ep``: expert parallelism; the experts of every MoE layer are split over ``ep`` ranks,
      which are data-parallel for everything else (rows are sharded over ``dp * ep``);
    * ``micro_batches`` per data rank, or ``max_tokens``: dynamic batch size, micro-batches
      holding at most that many response tokens each (a row is never split).

    Ranks are numbered with TP fastest, then the sequence split, EP, PP and DP:
    ``rank = (((dp * pp + pp_rank) * ep + ep_rank) * seq + seq_rank) * tp + tp_rank``.
    """

    tp: int = 1
    pp: int = 1
    dp: int = 1
    packing: bool = False
    micro_batches: int = 1
    fault: str | None = None
    cp: int = 1
    sp: int = 1
    ep: int = 1
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "dp", "micro_batches", "cp", "sp", "ep"):
            _require_positive(name, getattr(self, name))
        if self.max_tokens is not None:
            _require_positive("max_tokens", self.max_tokens)
            if self.micro_batches != 1:
                raise ValueError(
                    "Layout: max_tokens sets the micro-batches by token budget; "
                    f"leave micro_batches at 1 (got {self.micro_batches})"
                )
        if self.cp > 1 and self.sp > 1:
            raise ValueError("Layout: ring (cp) and Ulysses (sp) cannot be combined; pick one")
        if self.fault is not None and self.fault not in FAULTS:
            raise ValueError(f"unknown fault {self.fault!r}; expected one of {FAULTS}")

    @property
    def seq(self) -> int:
        """Ranks sharing each sequence: ``cp`` or ``sp``."""
        return self.cp * self.sp

    @property
    def data_ranks(self) -> int:
        """Ranks with rows of their own: ``dp * ep``."""
        return self.dp * self.ep

    @property
    def world_size(self) -> int:
        return self.tp * self.seq * self.ep * self.pp * self.dp

    def sizes(self) -> Place:
        return Place(self.dp, self.pp, self.ep, self.seq, self.tp)

    @property
    def id(self) -> str:
        """``tp2-pp1-dp1-packed-mb4`` then ``-cp2``/``-sp2``/``-ep2`` where above 1 (``dyn64``
        in place of ``mb4`` with ``max_tokens=64``), then ``-<fault>`` for a wrong variant."""
        packing = "packed" if self.packing else "padded"
        micro = f"mb{self.micro_batches}" if self.max_tokens is None else f"dyn{self.max_tokens}"
        text = f"tp{self.tp}-pp{self.pp}-dp{self.dp}-{packing}-{micro}"
        for name in ("cp", "sp", "ep"):
            if getattr(self, name) > 1:
                text += f"-{name}{getattr(self, name)}"
        return text if self.fault is None else f"{text}-{self.fault}"

    def place(self, rank: int) -> Place:
        """Every coordinate of global ``rank``."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} outside world size {self.world_size} of {self.id}")
        coords = []
        for size in reversed(self.sizes()):
            coords.append(rank % size)
            rank //= size
        return Place(*reversed(coords))

    def rank_at(self, place: Place) -> int:
        rank = 0
        for coord, size in zip(place, self.sizes(), strict=True):
            rank = rank * size + coord
        return rank

    def coords(self, rank: int) -> tuple[int, int, int]:
        """``(dp_rank, pp_rank, tp_rank)`` of global ``rank``."""
        place = self.place(rank)
        return place.dp, place.pp, place.tp

    def rank_of(self, dp: int, pp: int, tp: int, *, ep: int = 0, seq: int = 0) -> int:
        return self.rank_at(Place(dp, pp, ep, seq, tp))

    def __str__(self) -> str:
        return self.id


def _require_positive(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"Layout.{name} must be an int >= 1, got {value!r}")
