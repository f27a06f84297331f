"""Recorded rollouts as inputs: missing-step policies, regeneration diffs, forked RNG.

A golden rollout is the *input* of a training test. This module holds what
:class:`~.replay.Golden` needs to treat it so: which step stands in for a step
never recorded (verl's SkipManager ``repeat`` rule), what changed when a
rollout is regenerated, and running ``generate`` without touching the random
streams the training code sees afterwards.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

RECORD, ERROR, REPEAT, GENERATE = "record", "error", "repeat", "generate"
MISSING_STEP_POLICIES = (RECORD, ERROR, REPEAT, GENERATE)


def check_policy(value: Any, source: str) -> str:
    """``value`` if it names a missing-step policy, else ValueError naming ``source``."""
    if value not in MISSING_STEP_POLICIES:
        raise ValueError(
            f"{source}: missing-step policy must be one of {', '.join(MISSING_STEP_POLICIES)}, "
            f"got {value!r}"
        )
    return value


def substitute_step(recorded: Iterable[int], step: int) -> int | None:
    """verl's ``repeat`` rule: the largest recorded step below ``step``, else the smallest above."""
    steps = sorted(set(recorded))
    below = [s for s in steps if s < step]
    if below:
        return below[-1]
    above = [s for s in steps if s > step]
    return above[0] if above else None


def generate_forked(generate: Callable[[], Any]) -> Any:
    """``generate()`` with the random streams restored afterwards.

    Python's ``random``, numpy's global generator (if numpy is imported), torch's
    CPU generator and every CUDA device's generator (if torch is imported):
    replay never calls ``generate``, so recording must not advance them either.
    """
    py_state = random.getstate()
    np = sys.modules.get("numpy")
    np_state = np.random.get_state() if np is not None else None
    torch = sys.modules.get("torch")
    cpu_state = cuda_states = None
    seed = 0
    if torch is not None:
        cpu_state, seed = torch.get_rng_state(), torch.initial_seed()
        if torch.cuda.is_initialized():  # never initialize CUDA just to save its state
            cuda_states = torch.cuda.get_rng_state_all()
    try:
        return generate()
    finally:
        random.setstate(py_state)
        if np_state is not None:
            np.random.set_state(np_state)
        if cpu_state is not None:
            torch.set_rng_state(cpu_state)
        if cuda_states is not None:
            torch.cuda.set_rng_state_all(cuda_states)
        elif torch is not None and torch.cuda.is_initialized():
            # generate() initialized CUDA; on replay the first CUDA use seeds every device
            # lazily with the seed of the last torch.manual_seed, which initial_seed() gives.
            torch.cuda.manual_seed_all(seed)


def batch_changes(old: Path, new: Path) -> str:
    """What differs between two rollout files: keys, shapes/dtypes, differing elements."""
    from .errors import GoldenFormatError
    from .store import read_safetensors

    try:
        before, old_meta = read_safetensors(old, want="numpy")
    except (GoldenFormatError, OSError) as exc:
        return f"the recorded file could not be read for a diff ({str(exc).splitlines()[0]})"
    after, new_meta = read_safetensors(new, want="numpy")
    parts = []
    added, removed = sorted(after.keys() - before.keys()), sorted(before.keys() - after.keys())
    if added:
        parts.append(f"keys added: {', '.join(added)}")
    if removed:
        parts.append(f"keys removed: {', '.join(removed)}")
    differing = []
    for key in sorted(before.keys() & after.keys()):
        a, b = before[key], after[key]
        was, now = (f"{x.dtype}{list(x.shape)}".removeprefix("torch.") for x in (a, b))
        if was != now:
            parts.append(f"{key}: {was} -> {now}")
            continue
        rows_a, rows_b = _element_bytes(a), _element_bytes(b)
        n = int((rows_a != rows_b).any(axis=1).sum()) if len(rows_a) else 0
        if n:
            differing.append(f"{key} {n} of {len(rows_a)}")
    if differing:
        parts.append("elements differ: " + ", ".join(differing))
    if old_meta.get("prg.layout") != new_meta.get("prg.layout") and not (added or removed):
        parts.append("non-tensor values or structure changed")
    return "; ".join(parts) if parts else "identical to the recorded one"


def _element_bytes(x: Any) -> Any:
    """A ``[elements, itemsize]`` uint8 matrix: elements compared by their bits."""
    import numpy as np

    if isinstance(x, np.ndarray):
        flat = np.ascontiguousarray(x).reshape(-1)
        return flat.view(np.uint8).reshape(flat.size, -1)
    import torch  # dtypes numpy lacks (bfloat16, float8) are read as torch tensors

    flat = x.contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().reshape(flat.numel(), -1)
