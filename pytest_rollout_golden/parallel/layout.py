"""A parallel layout: how one training step is split over ranks and micro-batches.

Torch-free, so that test collection (``variants()``) imports nothing heavy.
"""

from __future__ import annotations

import dataclasses

FAULTS = ("no-tp-allreduce", "micro-mean", "dp-double-norm", "packing-leak")
"""Deliberate bugs the reference policy can inject, to prove that the gate catches them:

* ``no-tp-allreduce``: the row-parallel linear layers skip their all-reduce (partial sums);
* ``micro-mean``: each micro-batch is normalized by its own token count, then averaged;
* ``dp-double-norm``: the loss is divided by the global token count *and* the gradients are
  averaged over data-parallel ranks (a ``1/dp`` error);
* ``packing-leak``: packed sequences attend across sequence boundaries (plain causal mask).
"""


@dataclasses.dataclass(frozen=True)
class Layout:
    """Tensor, pipeline and data parallel sizes, sequence packing and micro-batches per rank.

    Ranks are numbered with TP fastest, then PP, then DP (as in Megatron-LM):
    ``rank = (dp_rank * pp + pp_rank) * tp + tp_rank``.
    """

    tp: int = 1
    pp: int = 1
    dp: int = 1
    packing: bool = False
    micro_batches: int = 1
    fault: str | None = None

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "dp", "micro_batches"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Layout.{name} must be an int >= 1, got {value!r}")
        if self.fault is not None and self.fault not in FAULTS:
            raise ValueError(f"unknown fault {self.fault!r}; expected one of {FAULTS}")

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def id(self) -> str:
        """``tp2-pp1-dp1-packed-mb4`` (plus ``-<fault>`` for a deliberately wrong variant)."""
        packing = "packed" if self.packing else "padded"
        text = f"tp{self.tp}-pp{self.pp}-dp{self.dp}-{packing}-mb{self.micro_batches}"
        return text if self.fault is None else f"{text}-{self.fault}"

    def coords(self, rank: int) -> tuple[int, int, int]:
        """``(dp_rank, pp_rank, tp_rank)`` of global ``rank``."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} outside world size {self.world_size} of {self.id}")
        return rank // (self.tp * self.pp), (rank // self.tp) % self.pp, rank % self.tp

    def rank_of(self, dp: int, pp: int, tp: int) -> int:
        return (dp * self.pp + pp) * self.tp + tp

    def __str__(self) -> str:
        return self.id
