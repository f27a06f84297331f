"""verl's rollout dumps (``verl/utils/skip/rollout_skip.py``, verl 0.9.1).

``RolloutTqSkip`` (V1 trainer) saves ``{step}/{inner_idx}/tq_batch.pt``: one inner folder
per ``ReplayBuffer.sample`` call of a step (``parameter_sync_step`` of them, 1 when
synchronous). The step is the outer folder; inner folder 0 becomes rollout ``NAME`` and
inner folder ``i`` > 0 rollout ``NAME_inner{i}``. ``RolloutSkip`` (V0) saves
``{step}/gen_batch.dp`` (``DataProto.save_to_disk``, a pickle); forks name the folder
``genstep_{step}``. Each folder's ``meta.json`` repeats the step and is not imported.

``trainer.rollout_data_dir`` (and ``validation_data_dir``) get ``{step}.jsonl``, one JSON
line per sample (``RayPPOTrainer._log_rollout_data`` -> ``_write_generations``,
``verl/trainer/ppo/ray_trainer.py``): rollout ``NAME``, the list of its records, read with
``json`` only. A ``{number}.jsonl`` in a folder named by a number is AReaL's, not verl's.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from ..errors import GoldenError
from .entry import Entry, Skipped

PATTERNS = (
    "{step}/{inner_idx}/tq_batch.pt  RolloutTqSkip (V1): inner 0 -> rollout NAME, "
    "inner i -> NAME_inner{i}",
    "{step}/gen_batch.dp  RolloutSkip (V0), a DataProto pickle (needs --trust-pickle)",
    "genstep_{step}/gen_batch.dp",
    "{step}.jsonl  trainer.rollout_data_dir: one JSON line per sample -> rollout NAME",
)
TQ_BATCH, GEN_BATCH, META = "tq_batch.pt", "gen_batch.dp", "meta.json"
_GEN_STEP = re.compile(r"(?:genstep_)?(\d+)")


def matches(files: list[Path]) -> bool:
    return any(p.name in (TQ_BATCH, GEN_BATCH) or _generations(p) for p in files)


def _generations(path: Path) -> bool:
    """Whether ``path`` is a ``{step}.jsonl`` that ``_write_generations`` writes."""
    return path.suffix == ".jsonl" and path.stem.isdecimal() and not path.parent.name.isdecimal()


def entries(source: Path, name: str) -> Iterator[Entry | Skipped]:
    for path in sorted(p for p in source.rglob("*") if p.is_file()):
        if path.name == TQ_BATCH:
            inner, step = path.parent.name, path.parent.parent.name
            if not (inner.isdecimal() and step.isdecimal()):
                raise GoldenError(
                    f"{path}: verl's RolloutTqSkip writes {{step}}/{{inner_idx}}/tq_batch.pt, "
                    f"and this file's folders ({step}/{inner}) are not two numbers; move it "
                    "into that layout, or out of the dump folder"
                )
            rollout = name if int(inner) == 0 else f"{name}_inner{int(inner)}"
            yield Entry(path, "rollout", rollout, int(step))
        elif path.name == GEN_BATCH:
            match = _GEN_STEP.fullmatch(path.parent.name)
            if match is None:
                raise GoldenError(
                    f"{path}: its folder name is not a step number (verl's RolloutSkip writes "
                    "{step}/gen_batch.dp)"
                )
            yield Entry(path, "rollout", name, int(match.group(1)))
        elif _generations(path):
            yield Entry(path, "rollout", name, int(path.stem), reader="jsonl")
        elif path.name == META and {TQ_BATCH, GEN_BATCH} & {p.name for p in path.parent.iterdir()}:
            yield Skipped(path, "verl's step record; the step is read from the folder names")
        else:
            yield Skipped(path, "not a verl dump (tq_batch.pt, gen_batch.dp or {step}.jsonl)")
