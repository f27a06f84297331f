"""The history folder on disk: append a run crash-safely, drop the oldest, read runs back.

Layout (docs/reference/on-disk.md)::

    DIR/runs/000042/run.json            what the run was: time, commit, lane, environment,
                                        versions, counts, and per test its series
    DIR/runs/000042/values.safetensors  every series' steps (``steps``) and values, golden
                                        values and distances (``values``, 3 rows, float64)

A run is written whole into a hidden staging folder (``runs/.stage-*``, marked as this
process's by :mod:`...store.owned`), then renamed to its number under the folder's lock: a
reader sees a run complete or not at all, and a process killed during an append loses that
run only; the staging folder it leaves is removed by the next append. Dropped runs are
renamed to a hidden name before they are deleted, so a half-deleted run is never read.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ... import store
from ...errors import GoldenError
from ...store.directory import fsync_dir
from ...store.owned import claim, remove_if_abandoned

FORMAT = "pytest-rollout-golden-history"
VERSION = 1
RUNS = "runs"
RUN = "run.json"
VALUES = "values.safetensors"
_MARKER = ".owner"
_MARKER_TEXT = "pytest-rollout-golden history staging\n"
_STAGE_PREFIX = ".stage-"
_DROP_PREFIX = ".drop-"


@dataclasses.dataclass(frozen=True)
class Limits:
    """How much the history keeps: at most ``max_runs`` runs and ``max_bytes`` bytes (the
    newest run is always kept); 0 means no bound."""

    max_runs: int = 0
    max_bytes: int = 0


@dataclasses.dataclass
class Appended:
    """What an append did: the new run's number and the runs dropped to stay in bounds."""

    run: int
    dropped: list[int] = dataclasses.field(default_factory=list)
    why: str = ""  # the bound that dropped them


def append(
    folder: Path, document: dict[str, Any], arrays: Mapping[str, Any], limits: Limits
) -> Appended:
    """Add one run (``document`` for ``run.json``, ``arrays`` for ``values.safetensors``) to
    the history ``folder``, then drop the oldest runs beyond ``limits``."""
    runs = folder / RUNS
    try:
        runs.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(prefix=_STAGE_PREFIX, dir=runs))
    except OSError as exc:
        raise GoldenError(f"--golden-history {folder}: cannot write there ({exc})") from None
    fd = claim(stage, _MARKER, _MARKER_TEXT)
    try:
        chunks, digest = store.encode_safetensors(arrays, {})
        store.atomic_write(stage / VALUES, chunks)
        with store.locked(runs):
            _sweep(runs)
            number = max(run_numbers(folder), default=0) + 1
            run = {"format": FORMAT, "version": VERSION, "run": number, **document}
            document_bytes = store.encode_json({**run, "values": digest}, indent=None)
            store.atomic_write(stage / RUN, [document_bytes])
            os.rename(stage, run_path(folder, number))
            fsync_dir(runs)
            (run_path(folder, number) / _MARKER).unlink()
            dropped, why = _drop(folder, limits)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    finally:
        if fd is not None:
            os.close(fd)
    return Appended(number, dropped, why)


def _sweep(runs: Path) -> None:
    """Remove what killed appends left: staging folders no live process owns, and runs
    renamed for deletion."""
    for entry in runs.iterdir():
        if entry.name.startswith(_STAGE_PREFIX):
            remove_if_abandoned(entry, _MARKER, _MARKER_TEXT)
        elif entry.name.startswith(_DROP_PREFIX):
            shutil.rmtree(entry, ignore_errors=True)


def run_numbers(folder: Path) -> list[int]:
    """The numbers of the runs in history ``folder``, oldest first."""
    runs = folder / RUNS
    if not runs.is_dir():
        return []
    return sorted(int(e.name) for e in runs.iterdir() if e.name.isdigit())


def is_run(folder: Path, number: int) -> bool:
    """Whether ``runs/NNNNNN`` is a run this history wrote: a real folder (not a link) whose
    ``run.json`` names the history's format. Nothing else there is ever dropped."""
    path = run_path(folder, number)
    if path.is_symlink() or not (path / RUN).is_file():
        return False
    try:
        return json.loads((path / RUN).read_bytes()).get("format") == FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def run_path(folder: Path, number: int) -> Path:
    """The folder of run ``number``."""
    return folder / RUNS / f"{number:06d}"


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file())


def _drop(folder: Path, limits: Limits) -> tuple[list[int], str]:
    """Drop the oldest runs until ``limits`` hold, keeping the newest; (dropped, why)."""
    numbers = [n for n in run_numbers(folder) if is_run(folder, n)]
    sizes = {n: _size(run_path(folder, n)) for n in numbers} if limits.max_bytes else {}
    total = sum(sizes.values())
    dropped, why = [], ""
    for number in numbers[:-1]:
        too_many = limits.max_runs and len(numbers) - len(dropped) > limits.max_runs
        too_big = limits.max_bytes and total > limits.max_bytes
        if not (too_many or too_big):
            break
        why = why or (
            f"golden_history_max_runs = {limits.max_runs}"
            if too_many
            else f"golden_history_max_bytes = {limits.max_bytes}"
        )
        doomed = folder / RUNS / f"{_DROP_PREFIX}{number:06d}"
        os.rename(run_path(folder, number), doomed)
        shutil.rmtree(doomed, ignore_errors=True)
        total -= sizes.get(number, 0)
        dropped.append(number)
    return dropped, why


def read_run(folder: Path, number: int) -> dict[str, Any]:
    """Run ``number``'s ``run.json``; :class:`GoldenError` naming the file if it is not one."""
    path = run_path(folder, number) / RUN
    document = store.read_json(path)
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise GoldenError(f"{path}: not a run of a pytest-rollout-golden history")
    if document.get("version", 0) > VERSION:
        raise GoldenError(
            f"{path}: written by a newer pytest-rollout-golden (history version "
            f"{document['version']}); upgrade to read it"
        )
    return document


def read_values(folder: Path, document: Mapping[str, Any]) -> dict[str, Any]:
    """The arrays of a run (numpy, float64), checked against the digest ``run.json`` lists."""
    path = run_path(folder, int(document["run"])) / VALUES
    arrays, _ = store.read_safetensors(path, expect_digest=document["values"], want="numpy")
    return arrays
