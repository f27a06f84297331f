"""Parallel training for golden tests: layouts, variants, a launcher, a reference policy.

* :mod:`.batching` -- split, shard, re-pad and pack rollout batches in one process;
* :mod:`.layout` -- :class:`Layout`, a frozen (tp, pp, dp, packing, micro_batches, cp, sp,
  ep, max_tokens);
* :mod:`.params` -- :func:`variants`, pytest params over layouts that share one golden;
* :mod:`.launcher` -- :func:`launch`, run a function on N ``torch.distributed`` ranks;
* :mod:`.policy` -- a small transformer trained with real TP / PP / DP / CP / EP / packing,
  built on :mod:`.comm` (groups, collectives), :mod:`.attention` (ring, Ulysses) and
  :mod:`.moe` (experts, router, load-balancing loss);
* :mod:`.environment` -- whether this process is a rank of a torchrun job.

Names are loaded on first use: ``from pytest_rollout_golden.parallel import variants,
Layout`` imports neither torch nor numpy (test collection stays fast).
"""

from __future__ import annotations

from .._internal.lazy import lazy_attributes
from .layout import FAULTS, Layout

_BATCHING = (
    "Batch",
    "Split",
    "batch_size",
    "dp_shards",
    "micro_batch_splits",
    "pack",
    "pad_columns",
    "padding_side",
    "select_rows",
    "split_by_count",
    "split_by_token_budget",
    "split_interleaved",
    "token_counts",
    "token_keys",
    "unpack",
)
_LAZY = {
    **dict.fromkeys(_BATCHING, "batching"),
    **dict.fromkeys(("LaunchError", "LaunchTimeout", "launch", "shutdown"), "launcher"),
    **dict.fromkeys(("LAYOUT_TOLERANCES", "layout_params", "variant", "variants"), "params"),
}
_SUBMODULES = {"attention", "batching", "comm", "launcher", "layout", "moe", "params", "policy"}

__all__ = ["FAULTS", "Layout", *_LAZY]

__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, _SUBMODULES)
