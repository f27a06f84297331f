"""Rollout dumps of RL frameworks (verl, ROLL, NexRL, AReaL, NeMo-RL, slime) converted into goldens.

One module per framework layout (:mod:`.verl`, :mod:`.roll`, :mod:`.nexrl`,
:mod:`.areal`, :mod:`.nemo_rl`, :mod:`.slime`) says which files it reads and what each becomes (a
rollout, or checked tensors, at which step, rank and micro-batch); every other file
of the dump folder is reported as skipped, with the reason. :mod:`.loading` reads a
file without running code from it (unless trusted) and within a memory allowance;
:mod:`.convert` writes the golden with the writer of every golden, so it verifies and
replays like one the plugin recorded. Every error names the dump file and, where
known, its step.

The public API is :func:`flatten` (a value's numbers and tensors by name) and
:func:`checked_tensors` (exactly the names ``import`` wrote for a NexRL dump, which a
strict ``check_tensors`` expects); the other names are re-exported for the CLI (their
``as`` says so) and may change without notice.
"""

from __future__ import annotations

from .convert import LAYOUTS as LAYOUTS, convert as convert, detect as detect, entries as entries
from .entry import Entry as Entry, Imported as Imported, Skipped as Skipped
from .loading import WHY_PICKLE as WHY_PICKLE, load as load, read_jsonl as read_jsonl
from .nexrl import checked_tensors
from .values import flatten, plain as plain, split as split

PATTERNS = {layout: module.PATTERNS for layout, module in LAYOUTS.items()}

__all__ = ["checked_tensors", "flatten"]  # fmt: skip
