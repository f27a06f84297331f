"""Recorded rollouts as inputs: replayed, kept, regenerated or stood in for.

A golden rollout is the *input* of a training test. This module holds what
:class:`~.golden.Golden` needs to treat it so: :class:`RolloutInputs` (a test's
rollouts, as the mode policy decides), which step stands in for a step never
recorded (verl's SkipManager ``repeat`` rule), what changed when a rollout is
regenerated, and running ``generate`` on a random stream of its own per step, without
touching the streams the training code sees afterwards.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import GoldenFormatError
from ...store.location import rollout_filename
from ..wording import listed, step_ranges
from . import keyed
from .messages import kept_lines
from .modes import ERROR, GENERATE, KEEP, RECORD, REFUSE, REPEAT, REPLAY, ModePolicy

if TYPE_CHECKING:
    from ...errors import GoldenMissingError
    from .golden_files import GoldenFiles

_DAMAGED = object()  # sentinel: the recorded rollout is unreadable; regenerate it


def substitute_step(recorded: Iterable[int], step: int) -> int | None:
    """verl's ``repeat`` rule: the largest recorded step below ``step``, else the smallest above."""
    steps = sorted(set(recorded))
    below = [s for s in steps if s < step]
    if below:
        return below[-1]
    above = [s for s in steps if s > step]
    return above[0] if above else None


def stand_in_marks(
    recorded: Mapping[str, Mapping[str, int]],
    stood_in: Mapping[str, Mapping[str, int]],
    written: Iterable[str],
    *,
    replace: bool,
) -> dict[str, dict[str, int]]:
    """The ``stand_ins`` a commit writes (``{step: {rollout name: step standing in}}``):
    this run's stand-ins at the steps whose values it ``written``, added to the
    ``recorded`` ones, or (``replace``, a re-recording) alone."""
    marks = {} if replace else {step: dict(names) for step, names in recorded.items()}
    for step in written:
        if step in stood_in:
            marks.setdefault(step, {}).update(stood_in[step])
    return marks


def step_seed(seed: int, name: str, step: int) -> int:
    """The seed of rollout ``name``'s stream at ``step``, derived from the session's ``seed``."""
    import xxhash

    return xxhash.xxh64_intdigest(f"{seed}/{name}/{step}".encode()) & 0xFFFF_FFFF


def generate_forked(generate: Callable[[], Any], *, name: str, step: int) -> Any:
    """``generate()`` on a random stream of its own, the outer streams restored afterwards.

    Python's ``random``, numpy's global generator (if numpy is imported), torch's CPU
    generator and every initialized CUDA device's generator are seeded with
    :func:`step_seed` of the current torch seed, ``name`` and ``step``: each step's rollout
    draws its own numbers even when the training code draws none, and the same on every
    recording. Afterwards every stream is as it was: replay never calls ``generate``, so
    recording must not advance them either.
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
    own = step_seed(seed, name, step)
    random.seed(own)
    if np is not None:
        np.random.seed(own)
    if torch is not None:
        torch.default_generator.manual_seed(own)  # the CPU stream only: CUDA seeds lazily
        if cuda_states is not None:
            torch.cuda.manual_seed_all(own)
    try:
        return generate()
    finally:
        random.setstate(py_state)
        if np_state is not None:
            np.random.set_state(np_state)
        if cpu_state is not None:
            torch.set_rng_state(cpu_state)  # the seed too: initial_seed() is as before
        if cuda_states is not None:
            torch.cuda.set_rng_state_all(cuda_states)
        elif torch is not None and torch.cuda.is_initialized():
            # generate() initialized CUDA; on replay the first CUDA use seeds every device
            # lazily with the seed of the last torch.manual_seed, which initial_seed() gives.
            torch.cuda.manual_seed_all(seed)


def batch_changes(old: Path, new: Path) -> str:
    """What differs between two rollout files: keys, shapes/dtypes, differing elements,
    non-tensor values; keyed samples by key (:func:`.keyed.by_key`)."""
    from ...store import codec, load_batch

    try:
        before, old_layout = codec.flatten(keyed.by_key(load_batch(old, on_cpu=True)))
    except (GoldenFormatError, OSError) as exc:
        return f"the recorded file could not be read for a diff ({str(exc).splitlines()[0]})"
    after, new_layout = codec.flatten(keyed.by_key(load_batch(new, on_cpu=True)))
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
    changed = codec.value_differences(old_layout, new_layout)
    if changed:
        parts.append(f"non-tensor values or structure changed: {listed(changed)}")
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


class RolloutInputs:
    """The rollouts of one test, as its inputs: replayed, kept, regenerated or stood in for.

    What happens to each is the mode policy's decision (:mod:`.modes`); what happened is
    told in ``notes`` (the outcome's rollout lines).
    """

    def __init__(
        self,
        files: GoldenFiles,
        *,
        notes: list[str],
        touched: set[str],
        missing: Callable[..., GoldenMissingError],
        missing_step_source: str,
    ):
        """``touched``: the golden files this test used (shared with its checks);
        ``missing``: builds the error for a rollout step not in the golden."""
        self._files = files
        self.notes = notes
        self._touched = touched
        self._missing = missing
        self._missing_step_source = missing_step_source
        self._requested: set[tuple[str, int]] = set()  # (rollout name, step) asked for
        self._kept: dict[str, set[int]] = {}  # rollout name -> steps kept under --update-golden
        self._damaged: set[str] = set()  # rollout files regenerated because unreadable
        self.not_recorded: dict[str, str] = {}  # step -> why its checks are not compared
        # step -> {rollout name: the recorded step that stood in for it} (missing_step=repeat)
        self.stood_in: dict[str, dict[str, int]] = {}

    def get(self, policy: ModePolicy, generate: Callable[[], Any], name: str, step: int) -> Any:
        """Rollout ``name`` at ``step`` (see :meth:`Golden.rollout`)."""
        filename = rollout_filename(name, step)
        if (name, step) in self._requested:  # not _touched: a stand-in step touches another file
            raise ValueError(
                f"golden.rollout(name={name!r}, step={step}) was already called in this test: "
                "in a loop, pass the loop's step (`golden.rollout(generate, step=step)`), or give "
                "each batch of one step its own `name=`"
            )
        self._requested.add((name, step))
        self._touched.add(filename)
        if self._files.staged(filename):
            return self._files.load_staged(filename)
        info = self._files.recorded.get(filename)
        if info is not None:
            action = policy.recorded_rollout()
            if action == REPLAY:
                return self._files.load(filename)
            if action == KEEP:
                kept = self._keep(filename, name, step)
                if kept is not _DAMAGED:
                    return kept
        else:
            recorded = self._files.steps("rollout", name)
            action = policy.missing_rollout_step(steps_recorded=bool(recorded))
            if action == REFUSE:
                raise self._missing(f"rollout {name!r}", step, recorded)
            if action != RECORD:
                return self._missing_step(action, generate, name, step)
        batch = generate_forked(generate, name=name, step=step)
        self._files.stage_batch(filename, batch, kind="rollout", name=name, step=step)
        if info is not None and info.get("kind") == "rollout":
            self._note_regenerated(filename, name, step)
        # What replay will return, not the object generate() built (requires_grad, views, ...)
        return self._files.load_staged(filename)

    def requested(self, name: str, step: int) -> bool:
        """Whether this test asked for rollout ``name`` at ``step``."""
        return (name, step) in self._requested

    def kept_notes(self) -> list[str]:
        """One line per rollout whose recorded steps were kept (``--update-golden``)."""
        return kept_lines(self._kept)

    def _keep(self, filename: str, name: str, step: int) -> Any:
        """``--update-golden``: replay the recorded rollout (the test's input) and keep its file."""
        try:
            batch = self._files.load(filename)
        except GoldenFormatError as exc:
            first = str(exc).splitlines()[0]
            self.notes.append(
                f"rollout {name!r} step {step}: recorded file damaged ({first}); regenerated"
            )
            self._damaged.add(filename)
            return _DAMAGED
        self._kept.setdefault(name, set()).add(step)
        return batch

    def _note_regenerated(self, filename: str, name: str, step: int) -> None:
        if filename in self._damaged:
            return  # already said, and there is nothing to diff against
        changes = batch_changes(self._files.directory / filename, self._files.staged_path(filename))
        self.notes.append(f"rollout {name!r} step {step}: regenerated, {changes}")

    def _missing_step(self, action: str, generate: Callable[[], Any], name: str, step: int) -> Any:
        """A rollout step never recorded, under the missing-step policy's ``action``."""
        recorded = self._files.steps("rollout", name)
        if action == ERROR:
            raise self._missing(
                f"rollout {name!r}",
                step,
                recorded,
                why=f"A step beyond the recording is an error here ({self._missing_step_source}"
                f"{action!r}; 'repeat' or 'generate' would replay past it)",
            )
        if action == REPEAT:
            substitute = substitute_step(recorded, step)
            assert substitute is not None
            sub_file = rollout_filename(name, substitute)
            self._touched.add(sub_file)
            self.stood_in.setdefault(str(step), {})[name] = substitute
            self.notes.append(
                f"rollout {name!r} step {step}: step {substitute} stood in for it "
                f"(missing_step='repeat'; recorded steps {step_ranges(recorded)})"
            )
            return self._files.load(sub_file)
        assert action == GENERATE
        self.notes.append(
            f"rollout {name!r} step {step}: generated, not recorded "
            "(missing_step='generate'); its metrics and tensors are not compared"
        )
        self.not_recorded[str(step)] = "missing_step='generate': rollout not recorded"
        return generate_forked(generate, name=name, step=step)
