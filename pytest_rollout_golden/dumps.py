"""Rollout dumps of RL frameworks (verl, ROLL, NexRL, AReaL, slime) converted into goldens.

Those dumps are pickles or ``torch.save`` files. Each file is first loaded with
``torch.load(weights_only=True)``, which runs no code from the file; only if
that is refused (pickled classes such as DataProto, TensorDict, dataclasses) and
the caller passed ``trust_pickle=True`` is it fully unpickled, which runs
whatever code the file names. The converted golden is written by the same
writer as every golden (:class:`~.store.Transaction`), so it verifies and
replays like one the plugin recorded.

Layouts (the step comes from the file or folder name):

* ``verl``: ``<dir>/<step>/gen_batch.dp`` or ``<dir>/<step>/tq_batch.pt``
  (SkipManager), also ``genstep_<step>/gen_batch.dp`` (RolloutSkip).
* ``roll``: ``<dir>/[train|val/]step_<step>.pkl``; ``val`` becomes rollout ``val``.
* ``nexrl``: ``<dir>/trajectory/step_<step>.pt`` (the rollout) and
  ``<dir>/<kind>/step_<step>[_rank<r>_micro<m>].pt`` (forward data, loss, ...:
  tensors ``<kind>``, per rank and micro-batch).
* ``areal``: ``<dir>/step_<step>.pt`` and ``step_<step>_dp_<rank>.pt`` (rollout
  ``rollout_dp<rank>``).
* ``slime``: ``<dir>/*.pt`` holding ``{"rollout_id", "samples"}``; the step is
  ``rollout_id`` (else the last number of the file name).

A dump can make the import allocate at most ``EXPAND_FACTOR`` times its size on
disk plus ``EXPAND_FREE`` bytes: a ``torch.save`` archive whose members inflate
beyond that is refused before ``torch.load`` reads it, and a loaded payload that
expands beyond it (a stride-0 or expanded tensor view copied out to its full size,
a list shared or nested in itself) is refused before anything is converted.
Every error names the dump file and, where known, its step.
"""

from __future__ import annotations

import dataclasses
import pickle
import re
import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from .codec import is_dataproto_like, is_tensordict_like
from .errors import GoldenError

LAYOUTS = ("verl", "roll", "nexrl", "areal", "slime")
WHY_PICKLE = (
    "unpickling runs code named in the file (any import and call), so a dump from an "
    "untrusted source can take over this process"
)
_STEP = re.compile(r"step_(\d+)$")
_NEXREL_RANK = re.compile(r"step_(\d+)_rank(\d+)_micro(\d+)$")
_AREAL_DP = re.compile(r"step_(\d+)_dp_(\d+)$")
_VERL_STEP = re.compile(r"(?:genstep_)?(\d+)$")
EXPAND_FACTOR = 64  # a dump may make the import allocate 64x its size on disk...
EXPAND_FREE = 64 << 20  # ...plus 64 MiB, and no more
_NODE_COST = 64  # bytes charged for each dict, list, number, ... of a payload
_DATAPROTO = ("batch", "non_tensor_batch", "meta_info")


@dataclasses.dataclass
class Entry:
    """One dump file and where it goes in the golden."""

    path: Path
    kind: str  # "rollout" | "tensors"
    name: str
    step: int | None  # None: taken from the payload (slime's rollout_id)
    rank: int | None = None
    micro: int | None = None


def detect(source: Path) -> str:
    """The layout of the dump folder ``source``."""
    files = [p for p in source.rglob("*") if p.is_file()]
    names = {p.name for p in files}
    if names & {"gen_batch.dp", "tq_batch.pt"}:
        return "verl"
    if any(p.suffix == ".pkl" and _STEP.match(p.stem) for p in files):
        return "roll"
    if any(_NEXREL_RANK.match(p.stem) for p in files) or (source / "trajectory").is_dir():
        return "nexrl"
    if any(p.suffix == ".pt" and (_STEP.match(p.stem) or _AREAL_DP.match(p.stem)) for p in files):
        return "areal"
    if any(p.suffix == ".pt" for p in files):
        return "slime"
    raise GoldenError(
        f"{source}: no dump of a known layout found ({', '.join(LAYOUTS)}); give --layout"
    )


def entries(source: Path, layout: str, name: str = "rollout") -> list[Entry]:
    """The files of a dump folder in ``layout``, each mapped to a golden file."""
    out = list(_ENTRIES[layout](source, name))
    if not out:
        raise GoldenError(
            f"{source}: no {layout} dump files found (see `rollout-golden import -h`)"
        )
    return out


def _verl(source: Path, name: str) -> Iterator[Entry]:
    for path in sorted(source.rglob("*")):
        if path.name in ("gen_batch.dp", "tq_batch.pt"):
            match = _VERL_STEP.search(path.parent.name)
            if match is None:
                raise GoldenError(f"{path}: its folder name is not a step number")
            yield Entry(path, "rollout", name, int(match.group(1)))


def _roll(source: Path, name: str) -> Iterator[Entry]:
    for path in sorted(source.rglob("step_*.pkl")):
        match = _STEP.match(path.stem)
        if match:
            split = "val" if path.parent.name == "val" else name
            yield Entry(path, "rollout", split, int(match.group(1)))


def _nexrl(source: Path, name: str) -> Iterator[Entry]:
    for path in sorted(source.rglob("step_*.pt")):
        kind = path.parent.name
        ranked, plain = _NEXREL_RANK.match(path.stem), _STEP.match(path.stem)
        if kind == "trajectory" and plain:
            yield Entry(path, "rollout", name, int(plain.group(1)))
        elif ranked:
            step, rank, micro = (int(g) for g in ranked.groups())
            yield Entry(path, "tensors", kind, step, rank, micro)
        elif plain:
            yield Entry(path, "tensors", kind, int(plain.group(1)))


def _areal(source: Path, name: str) -> Iterator[Entry]:
    for path in sorted(source.glob("step_*.pt")):
        dp, plain = _AREAL_DP.match(path.stem), _STEP.match(path.stem)
        if dp:
            yield Entry(path, "rollout", f"{name}_dp{dp.group(2)}", int(dp.group(1)))
        elif plain:
            yield Entry(path, "rollout", name, int(plain.group(1)))


def _slime(source: Path, name: str) -> Iterator[Entry]:
    for path in sorted(source.glob("*.pt")):
        yield Entry(path, "rollout", name, None)


_ENTRIES = {"verl": _verl, "roll": _roll, "nexrl": _nexrl, "areal": _areal, "slime": _slime}


def load(path: Path, *, trust_pickle: bool) -> Any:
    """The object in a dump file: ``weights_only`` first, full unpickling only if trusted.

    Refuses a file that would make the import allocate more than its allowance
    (see the module's docstring) before that memory is asked for.
    """
    try:
        payload = _load(path, trust_pickle=trust_pickle)
        _check_expansion(path, payload)
        return payload
    except (GoldenError, OSError):  # OSError: the file's own name and reason say it all
        raise
    except (ImportError, AttributeError) as exc:  # a class the pickle names is not here
        raise GoldenError(
            f"{path}: cannot be loaded ({type(exc).__name__}: {str(exc)[:300]}). A pickled "
            "dump needs the classes it names to be importable (verl for its DataProto, "
            "tensordict for TensorDict, ...) in this environment"
        ) from None
    except Exception as exc:  # anything else a foreign or damaged file can raise
        raise GoldenError(
            f"{path}: cannot be loaded ({type(exc).__name__}: {str(exc)[:300]}); the file is "
            "truncated, corrupted or not a dump of this layout: dump that step again, or move "
            "the file out of the dump folder"
        ) from None


def _load(path: Path, *, trust_pickle: bool) -> Any:
    import torch

    from .store import TORCH_SAVE_HEAD, torch_save_format  # h-codec, issue 17 item 6

    with open(path, "rb") as f:
        saved = torch_save_format(f.read(TORCH_SAVE_HEAD))  # zip, legacy, or a raw pickle
    if saved:
        if saved == "zip":
            _check_archive(path)
        try:
            return torch.load(path, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as exc:
            refusal = _refusal(str(exc))
            if not trust_pickle:
                why = f"torch.load(weights_only=True): {refusal}"
                raise GoldenError(_needs_trust(path, why)) from None
        return torch.load(path, map_location="cpu", weights_only=False)  # trusted by the caller
    if not trust_pickle:
        raise GoldenError(_needs_trust(path, "it is a raw pickle, not a torch.save archive"))
    with open(path, "rb") as f:
        return pickle.load(f)  # the caller passed --trust-pickle for this file


def _allowance(path: Path) -> int:
    """The bytes importing ``path`` may allocate: what its size on disk can describe."""
    return EXPAND_FACTOR * path.stat().st_size + EXPAND_FREE


def _check_archive(path: Path) -> None:
    """Refuse a zip whose members inflate beyond the allowance, before any is read.

    torch.save stores its members uncompressed; a compressed one that inflates more
    than ``EXPAND_FACTOR``-fold (past ``EXPAND_FREE``) is a decompression bomb, and
    torch.load would allocate its full inflated size before reading it.
    """
    remedy = "re-save the dump with torch.save if it is genuine"
    try:
        with zipfile.ZipFile(path) as archive:
            members = archive.infolist()
    except (zipfile.BadZipFile, ValueError) as exc:
        raise GoldenError(
            f"{path}: is not a readable torch.save archive ({exc}); it is truncated or "
            "corrupted: dump that step again, or move the file out of the dump folder"
        ) from None
    for member in members:
        if member.file_size > max(EXPAND_FACTOR * member.compress_size, EXPAND_FREE):
            raise GoldenError(
                f"{path}: member {member.filename} inflates from {member.compress_size:,} to "
                f"{member.file_size:,} bytes, more than {EXPAND_FACTOR}x; refused as a "
                f"decompression bomb before reading it ({remedy})"
            )
    total, allowance = sum(m.file_size for m in members), _allowance(path)
    if total > allowance:
        raise GoldenError(
            f"{path}: its members inflate to {total:,} bytes, more than the {allowance:,} a "
            f"file of its size may ({EXPAND_FACTOR}x its size + {EXPAND_FREE >> 20} MiB); "
            f"refused as a decompression bomb before reading it ({remedy})"
        )


def _check_expansion(path: Path, payload: Any) -> None:
    """Refuse a payload that would expand beyond the allowance once converted.

    The converter copies every tensor out to its logical size and writes every
    shared object once per reference: a stride-0 view such as
    ``torch.zeros(1).expand(2**33)`` takes 4 bytes in the file and 32 GiB once
    copied, and a list holding itself never ends. Each tensor is charged its
    logical size, each string its length, every other object ``_NODE_COST``,
    once per path that reaches it; the walk stops when the allowance is spent.
    A path is kept as ``(parent, label)`` links and spelled out only in an error.
    """
    import numpy as np
    import torch

    allowance = _allowance(path)
    left = allowance
    stack: list[tuple[Any, Any]] = [(payload, None)]
    while stack:
        value, where = stack.pop()
        parts: Any = ()
        tensor = isinstance(value, torch.Tensor)
        if tensor and value.is_nested:
            cost, parts = _NODE_COST, [(row, f"[{i}]") for i, row in enumerate(value.unbind())]
        elif tensor and value.layout == torch.strided and not value.is_meta:
            cost = value.numel() * value.element_size()
            held = value.untyped_storage().nbytes()
            if cost > held and cost > left:
                raise GoldenError(
                    f"{path}: the tensor at {_spelled(where)} (shape {list(value.shape)}, "
                    f"strides {list(value.stride())}) views {held:,} bytes of storage as "
                    f"{cost:,} bytes (a stride-0, expanded or overlapping view); converting "
                    "it would allocate that much, more than the file can describe. Refused: "
                    "if the dump is genuine, save `t.contiguous()` in it"
                )
        elif isinstance(value, np.ndarray) and value.dtype != object:
            cost = value.nbytes
        elif isinstance(value, (str, bytes)):
            cost = len(value)
        elif isinstance(value, (int, float)) or value is None:
            cost = _NODE_COST
        else:
            cost, parts = _NODE_COST, _parts(value)
        left -= cost
        if left < 0:
            raise GoldenError(
                f"{path}: its payload expands past {allowance:,} bytes (reached at "
                f"{_spelled(where)}), more than a file of its size may ({EXPAND_FACTOR}x its "
                f"size + {EXPAND_FREE >> 20} MiB): an object shared many times, or holding "
                "itself. Refused: if the dump is genuine, dump it without shared references"
            )
        stack += [(child, (where, label)) for child, label in parts]


def _parts(value: Any) -> list[tuple[Any, str]]:
    """The (child, label) pairs the converter visits below ``value``."""
    import numpy as np

    if isinstance(value, (list, tuple, set, frozenset)):
        return [(v, f"[{i}]") for i, v in enumerate(value)]
    if isinstance(value, (dict, Mapping)) or is_tensordict_like(value):
        return [(v, f"[{k!r}]") for k, v in value.items()]
    if isinstance(value, np.ndarray) and value.dtype == object:
        return [(v, f"[{i}]") for i, v in enumerate(value.reshape(-1))]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [(getattr(value, f.name), f".{f.name}") for f in dataclasses.fields(value)]
    if is_dataproto_like(value):
        return [(getattr(value, name), f".{name}") for name in _DATAPROTO]
    return []


def _spelled(where: Any, shown: int = 8) -> str:
    """A ``(parent, label)`` path as ``['batch'][0]``, its first ``shown`` labels if deep."""
    labels = []
    while where is not None:
        where, label = where
        labels.append(label)
    labels.reverse()
    if len(labels) > shown:
        return "".join(labels[:shown]) + f"... ({len(labels)} levels deep)"
    return "".join(labels) or "the top level"


def _refusal(message: str) -> str:
    """The line of torch's weights_only refusal that names what it refused."""
    match = re.search(r"Unsupported global: GLOBAL (\S+)", message)
    if match:
        return f"it names {match.group(1)}, which is not an allowed type"
    return message.strip().splitlines()[0][:200]


def _needs_trust(path: Path, why: str) -> str:
    return (
        f"{path}: cannot be loaded without full unpickling ({why}). Nothing was loaded from it. "
        f"Pass --trust-pickle if you trust where this dump came from: {WHY_PICKLE}."
    )


def plain(value: Any, where: str = "") -> Any:
    """``value`` with dataclass objects turned into dicts, recursively, for the codec.

    DataProto-like batches (verl's is a dataclass) keep their class; see
    :func:`.codec.dataclasses_to_dicts` (h-codec, issue 17 item 1).
    """
    from .codec import dataclasses_to_dicts

    return dataclasses_to_dicts(value)


def convert(
    source: Path,
    target: Path,
    *,
    layout: str | None = None,
    name: str = "rollout",
    trust_pickle: bool = False,
    test_id: str = "",
) -> list[tuple[Entry, str]]:
    """Write the golden ``target`` from the dump folder ``source``; return what went where.

    Refuses to overwrite an existing golden. Nothing is written if any file fails.
    """
    from . import store
    from .location import MANIFEST

    if not source.is_dir():
        raise GoldenError(f"{source}: not a folder of dumps")
    layout = layout or detect(source)
    found = entries(source, layout, name)
    with store.locked(target):
        store.recover(target)
        if (target / MANIFEST).exists():
            raise GoldenError(f"{target}: a golden exists already; remove it or choose another")
        tx = store.Transaction(target)
        done = []
        try:
            for entry in found:
                try:
                    filename = _import(tx, entry, trust_pickle=trust_pickle)
                except Exception as exc:
                    raise _naming(entry, exc) from exc
                done.append((entry, filename))
            tx.commit(
                {
                    "test": test_id,
                    "fingerprint": None,
                    "imported": {"layout": layout, "source": str(source)},
                }
            )
        except BaseException:
            tx.abort()
            raise
    return done


def _import(tx: Any, entry: Entry, *, trust_pickle: bool) -> str:
    """Load the dump ``entry`` and write it into the transaction ``tx``; return its file name."""
    from .location import rollout_filename, tensors_filename

    payload = load(entry.path, trust_pickle=trust_pickle)
    if entry.step is None:
        entry.step = _slime_step(entry.path, payload)
    if entry.kind == "rollout":
        filename = rollout_filename(entry.name, entry.step)
        info: dict[str, Any] = {"kind": "rollout", "name": entry.name}
    else:
        filename = tensors_filename(entry.name, entry.step, entry.rank, entry.micro)
        info = {"kind": "tensors", "name": entry.name, "rank": entry.rank, "micro": entry.micro}
        if not isinstance(payload, dict):
            raise GoldenError(
                f"{entry.path}: a {entry.name} dump must hold a dict of tensors, "
                f"found {type(payload).__name__}; dump that step again, or move the file "
                "out of the dump folder"
            )
    if filename in tx.files:
        raise GoldenError(
            f"{entry.path}: a second dump for {filename}; keep one of the two in the dump folder"
        )
    tx.write_batch(filename, plain(payload), step=entry.step, **info)
    return filename


def _naming(entry: Entry, exc: Exception) -> GoldenError:
    """``exc`` as an error that starts with the step and the file it happened in.

    Errors this module raises already say what went wrong and what to do; any
    other (the codec's, torch's, a converter's) is named by its type and message.
    """
    if isinstance(exc, GoldenError):
        what = str(exc).removeprefix(f"{entry.path}: ")
    elif isinstance(exc, OSError):
        what = f"{type(exc).__name__}: {exc}"
    else:
        what = (
            f"cannot be converted ({type(exc).__name__}: {str(exc)[:300]}); fix or re-dump "
            "that step, or move the file out of the dump folder"
        )
    step = f"step {entry.step}, " if entry.step is not None else ""
    return GoldenError(f"{step}{entry.path}: {what}")


def _slime_step(path: Path, payload: Any) -> int:
    if isinstance(payload, dict) and isinstance(payload.get("rollout_id"), int):
        return payload["rollout_id"]
    numbers = re.findall(r"\d+", path.stem)
    if not numbers:
        raise GoldenError(
            f"{path}: no rollout_id in it and no number in its name to use as step; "
            "rename it with its step in the name (rollout_7.pt)"
        )
    return int(numbers[-1])
