"""NexRL's debug dumps (``DataDumper``, ``nexrl/utils/data_dumper.py``).

``{dump_dir}/{kind}/`` holds ``step_{step:06d}.pt`` (trajectory, old_log_probs,
prepared_trajectories, datums, training_metrics), ``step_{step}_rank{r}_micro{m}.pt``
(forward_data, loss) and ``step_{step}_rank{r}.pt`` (param, gradient); ``dump_format:
jsonl`` writes the same records as one JSON line in ``.jsonl`` files. ``trajectory``
becomes rollout ``NAME``; every other kind is checked tensors ``{kind}`` at that step,
rank and micro-batch, its dict flattened into named tensors (``loss/metrics/kl``).
Bookkeeping (``step``, ``rank``, ``micro_idx``, ``*_shape``, counts, the parameter's
name, dtype and summary statistics, the batch's epoch and index) and text are not
checked: they are kept as the file's ``dump`` metadata in the manifest.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import GoldenError
from .entry import Entry, Skipped, one_record
from .values import json_safe, split

PATTERNS = (
    "trajectory/step_{step}.pt  -> rollout NAME",
    "{kind}/step_{step}_rank{rank}_micro{micro}.pt  forward_data, loss -> tensors {kind}",
    "{kind}/step_{step}_rank{rank}.pt  param, gradient -> tensors {kind}",
    "{kind}/step_{step}.pt  old_log_probs, prepared_trajectories, datums, training_metrics",
    "(dump_format jsonl: the same names ending .jsonl)",
)
KINDS = ("trajectory", "old_log_probs", "forward_data", "loss", "param", "gradient",
         "prepared_trajectories", "datums", "training_metrics")  # fmt: skip
BOOKKEEPING = ("step", "rank", "micro_idx", "shape", "dtype", "param_name", "num_trajectories",
               "num_datums", "batch_info")  # fmt: skip
_NESTED_BOOKKEEPING = {"extra_info": ("epoch", "batch_idx")}
_STATISTICS = {"param": ("norm", "mean", "std"), "gradient": ("norm", "mean", "std")}
_NAME = re.compile(r"step_(\d+)(?:_rank(\d+)(?:_micro(\d+))?)?")


def matches(files: list[Path]) -> bool:
    return any(p.parent.name in KINDS and _NAME.fullmatch(p.stem) for p in files)


def entries(source: Path, name: str) -> Iterator[Entry | Skipped]:
    for path in sorted(p for p in source.rglob("*") if p.is_file()):
        match = _NAME.fullmatch(path.stem)
        kind = path.parent.name
        if match is None or path.suffix not in (".pt", ".jsonl"):
            yield Skipped(path, "not a NexRL dump (step_{step}[_rank{r}[_micro{m}]].pt)")
            continue
        step, rank, micro = (None if g is None else int(g) for g in match.groups())
        reader = "jsonl" if path.suffix == ".jsonl" else "torch"
        if kind == "trajectory":
            yield Entry(path, "rollout", name, step, reader=reader, prepare=_record)
        else:
            yield Entry(path, "tensors", kind, step, rank, micro, reader=reader, prepare=_checked)


def _record(entry: Entry, payload: Any) -> tuple[Any, dict[str, Any]]:
    return one_record(entry, payload, "NexRL"), {}


def _checked(entry: Entry, payload: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    return _split(entry.name, one_record(entry, payload, "NexRL"))


def checked_tensors(kind: str, dump: Any) -> dict[str, Any]:
    """The tensors ``rollout-golden import`` wrote for a NexRL dump of ``kind``, by name.

    ``dump`` is the dict a ``DataDumper`` file holds (``torch.load`` of a ``.pt`` file, or
    ``json.loads`` of a ``.jsonl`` line): its numbers and tensors flattened as
    :func:`~pytest_rollout_golden.dumps.flatten` names them, less the bookkeeping import keeps
    as metadata (``step``, ``rank``, ``micro_idx``, ``*_shape``, ...). These are exactly the
    names ``golden.check_tensors(kind, ..., step=, rank=, micro=)`` expects of the golden, in
    strict mode too. ``trajectory`` is a rollout (``golden.rollout``), not checked tensors.
    """
    if kind not in KINDS or kind == "trajectory":
        checked = ", ".join(k for k in KINDS if k != "trajectory")
        where = "a rollout: replay it with golden.rollout" if kind == "trajectory" else "unknown"
        raise GoldenError(f"NexRL dump kind {kind!r}: {where}; import checks tensors of {checked}")
    return _split(kind, dump)[0]


def _split(kind: str, payload: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The tensors a test checks of a ``kind`` dump, and the rest (bookkeeping, text) as
    metadata."""
    if not isinstance(payload, dict):
        raise GoldenError(
            f"a NexRL {kind} dump holds a dict, found {type(payload).__name__}; dump that step "
            "again, or move the file out of the dump folder"
        )
    checked, metadata = dict(payload), {}
    for key in list(checked):
        if key in BOOKKEEPING or key.endswith("_shape") or key in _STATISTICS.get(kind, ()):
            metadata[key] = checked.pop(key)
    for key, inner in _NESTED_BOOKKEEPING.items():
        if isinstance(checked.get(key), dict):
            checked[key] = dict(checked[key])
            for sub in inner:
                if sub in checked[key]:
                    metadata[f"{key}/{sub}"] = checked[key].pop(sub)
    tensors, others = split(checked)
    metadata.update(others)
    return tensors, json_safe(metadata)
