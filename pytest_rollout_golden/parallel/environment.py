"""Whether this process is one rank of a job that torchrun (or a similar launcher) started.

Torch-free: the plugin asks it at start-up.
"""

from __future__ import annotations

import os

TORCHRUN_VARS = ("WORLD_SIZE", "RANK", "MASTER_ADDR")


def torchrun_rank() -> int | None:
    """This process's rank when ``WORLD_SIZE``, ``RANK`` and ``MASTER_ADDR`` are all set."""
    if not all(os.environ.get(name) for name in TORCHRUN_VARS):
        return None
    try:
        return int(os.environ["RANK"])
    except ValueError:
        return None
