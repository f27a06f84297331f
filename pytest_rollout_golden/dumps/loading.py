"""Reading one dump file without running code from it, within a memory allowance.

A ``torch.save`` file is loaded with ``torch.load(weights_only=True)``, which runs no
code from the file; only if torch refuses (pickled classes such as DataProto,
TensorDict, dataclasses) and the caller passed ``trust_pickle=True`` is it fully
unpickled, which runs whatever code the file names. JSON-lines files are read with
``json`` only.

A dump can make the import allocate at most ``EXPAND_FACTOR`` times its size on
disk plus ``EXPAND_FREE`` bytes: a ``torch.save`` archive whose members inflate
beyond that is refused before ``torch.load`` reads it, and a loaded payload that
expands beyond it (a stride-0 or expanded tensor view copied out to its full size,
a list shared or nested in itself) is refused before anything is converted.
"""

from __future__ import annotations

import codecs
import dataclasses
import json
import pickle
import re
import sys
import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from ..errors import GoldenError
from ..store.codec import is_dataproto_like, is_tensordict_like, is_torch_tensor

WHY_PICKLE = (
    "unpickling runs code named in the file (any import and call), so a dump from an "
    "untrusted source can take over this process"
)
EXPAND_FACTOR = 64  # a dump may make the import allocate 64x its size on disk...
EXPAND_FREE = 64 << 20  # ...plus 64 MiB, and no more
# Bytes charged per value of a payload, as measured converting JSON lines of each kind
# (a number or string: <= 62 + its length; [] 140; {} 447, and 221 more per entry).
_NODE_COST = 64
_LIST_COST = 192
_CONTAINER_COST = 512  # a dict, tuple, dataclass, ...: an object of the layout, and a list
_ENTRY_COST = 256  # a dict's entry: a [key, value] pair of the layout
_DATAPROTO = ("batch", "non_tensor_batch", "meta_info")
_HEAD = 64  # bytes read to tell a file's format (torch.save's needs 24)
_LONGEST = 500  # characters of a foreign error message shown, cut at a sentence's end


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
            f"{path}: cannot be loaded ({type(exc).__name__}: {whole_sentences(str(exc))}). "
            "A pickled dump needs the classes it names to be importable (verl for its DataProto, "
            "tensordict for TensorDict, ...) in this environment"
        ) from None
    except Exception as exc:  # anything else a foreign or damaged file can raise
        raise GoldenError(
            f"{path}: cannot be loaded ({type(exc).__name__}: {whole_sentences(str(exc))}); "
            "the file is truncated, corrupted or not a dump of this layout: dump that step "
            "again, or move the file out of the dump folder"
        ) from None


def _load(path: Path, *, trust_pickle: bool) -> Any:
    import torch

    from ..store import is_pickle, torch_save_format

    with open(path, "rb") as f:
        head = f.read(_HEAD)
    saved = torch_save_format(head)  # zip, legacy, or not torch.save's
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
        if is_pickle(head):
            raise GoldenError(_needs_trust(path, "it is a raw pickle, not a torch.save archive"))
        raise _not_a_pickle(path, head, trusted=False)
    try:
        with open(path, "rb") as f:
            return pickle.load(f)  # the caller passed --trust-pickle for this file
    except Exception:
        if is_pickle(head):
            raise  # a damaged pickle: load() names what pickle found wrong
        # pickle's own words on JSON or text ("invalid load key") say nothing of the file
        raise _not_a_pickle(path, head, trusted=True) from None


def _not_a_pickle(path: Path, head: bytes, *, trusted: bool) -> GoldenError:
    """The error for a file that is neither torch.save's nor (``trusted``: loadable as) a
    pickle, saying what it is instead."""
    kind, what = sniffed(head)
    if kind == "empty":
        remedy = "dump that step again, or move it out of the dump folder"
    elif trusted or kind in ("json", "format"):
        remedy = "move it out of the dump folder"
    else:  # text or unknown bytes: what a pickle of protocol 0 or 1 looks like
        remedy = (
            "if it is a pickle of protocol 0 or 1, pass --trust-pickle; else move it out of "
            "the dump folder"
        )
    start = "not a pickle" if trusted else "neither a torch.save archive nor a pickle"
    return GoldenError(f"{path}: {start}: {what}; nothing was loaded from it: {remedy}")


def sniffed(head: bytes) -> tuple[str, str]:
    """``(kind, clause)``: what a file starting with ``head`` is, ``kind`` one of ``empty``,
    ``format`` (a binary format named in the clause), ``json``, ``text`` or ``binary``, and
    the clause for an error (``it is JSON text (it starts '{"a": 1}')``)."""
    from ..store.disk import ZIP_MAGIC, is_pickle, torch_save_format

    if not head:
        return "empty", "it is empty"
    formats = (
        (head.startswith(ZIP_MAGIC), "a zip archive (torch.save's format)"),
        (torch_save_format(head) == "legacy", "a legacy torch.save file"),
        (is_pickle(head), "a pickle"),
        (head.startswith(b"\x93NUMPY"), "a numpy .npy file"),
        (head[8:9] == b"{" and int.from_bytes(head[:8], "little") < 1 << 30, "a safetensors file"),
    )
    for found, what in formats:
        if found:
            return "format", f"it is {what}"
    text = codecs.getincrementaldecoder("utf-8")("replace").decode(head)
    if "\ufffd" not in text and all(c.isprintable() or c in "\t\n\r" for c in text):
        if text.lstrip().startswith(("{", "[")):
            return "json", f"it is JSON text (it starts {text[:24]!r})"
        return "text", f"it is text (it starts {text[:24]!r})"
    return "binary", f"it is binary data of an unknown format (it starts with {head[:12]!r})"


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
    if not any(m.filename.endswith("/data.pkl") for m in members):
        held = ", ".join(m.filename for m in members[:5]) + (", ..." if len(members) > 5 else "")
        raise GoldenError(
            f"{path}: a zip archive but not a torch.save archive (it has no data.pkl record; "
            f"it holds {held or 'nothing'}): if it packs dumps, unpack it into the dump folder; "
            "else move it out of the dump folder"
        )
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


def _check_expansion(path: Path, payload: Any, *, left: int | None = None, line: int = 0) -> int:
    """Refuse a payload that would expand beyond the allowance once converted; return what
    is left of the allowance (``left``: what an earlier line of the file left of it).

    The converter copies every tensor out to its logical size, writes every shared
    object once per reference, and describes every container in its JSON layout: a
    stride-0 view such as ``torch.zeros(1).expand(2**33)`` takes 4 bytes in the file
    and 32 GiB once copied, a list holding itself never ends, and ``{}`` takes 3 bytes
    of JSON and some 450 of memory. Each tensor is charged its logical size, each
    string its length, each container what its layout costs (:func:`_cost`), once per
    path that reaches it; the walk stops when the allowance is spent. A path is kept
    as ``(parent, label)`` links and spelled out only in an error.
    """
    allowance = _allowance(path)
    left = allowance if left is None else left
    stack: list[tuple[Any, Iterator[tuple[Any, str]]]] = [(None, iter([(payload, "")]))]
    while stack:
        parent, children = stack[-1]
        child = next(children, None)
        if child is None:
            stack.pop()
            continue
        value, label = child
        where = (parent, label) if label else parent
        cost, parts = _cost(path, value, where, left)
        left -= cost
        if left < 0:
            at = f"line {line}, {_spelled(where)}" if line else _spelled(where)
            raise GoldenError(
                f"{path}: its payload expands past {allowance:,} bytes (reached at {at}), "
                f"more than a file of its size may ({EXPAND_FACTOR}x its size + "
                f"{EXPAND_FREE >> 20} MiB): very many small containers, an object shared many "
                "times, or holding itself. Refused: if the dump is genuine, dump it without "
                "shared references, or in several files"
            )
        if parts is not None:
            stack.append((where, parts))
    return left


def _cost(path: Path, value: Any, where: Any, left: int) -> tuple[int, Any]:
    """``(bytes, children)``: what converting ``value`` itself costs, and an iterator over
    its ``(child, label)`` pairs (``None`` for a leaf). Imports neither torch nor numpy."""
    if isinstance(value, (str, bytes)):
        return _NODE_COST + len(value), None
    if value is None or isinstance(value, (int, float)):
        return _NODE_COST, None
    if isinstance(value, list):
        return _LIST_COST, ((v, f"[{i}]") for i, v in enumerate(value))
    if isinstance(value, Mapping) or is_tensordict_like(value):
        cost = _CONTAINER_COST + _ENTRY_COST * len(value)
        return cost, ((v, f"[{k!r}]") for k, v in value.items())
    if is_torch_tensor(value):
        return _tensor_cost(path, value, where, left)
    np = sys.modules.get("numpy")
    if np is not None and isinstance(value, np.ndarray):
        if value.dtype != object:
            return value.nbytes, None
        return _CONTAINER_COST, ((v, f"[{i}]") for i, v in enumerate(value.reshape(-1)))
    return _CONTAINER_COST, _parts(value)


def _tensor_cost(path: Path, value: Any, where: Any, left: int) -> tuple[int, Any]:
    """:func:`_cost` of a tensor: its logical size, or its rows if nested."""
    import torch

    if value.is_nested:
        return _NODE_COST, ((row, f"[{i}]") for i, row in enumerate(value.unbind()))
    if value.layout != torch.strided or value.is_meta:
        return _NODE_COST, None  # the converter refuses it, naming it
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
    return cost, None


def _parts(value: Any) -> Iterator[tuple[Any, str]]:
    """The (child, label) pairs the converter visits below any other ``value``."""
    if isinstance(value, (tuple, set, frozenset)):
        return ((v, f"[{i}]") for i, v in enumerate(value))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = dataclasses.fields(value)
        return ((getattr(value, f.name), f".{f.name}") for f in fields)
    if is_dataproto_like(value):
        return ((getattr(value, name), f".{name}") for name in _DATAPROTO)
    return iter(())


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
    """What torch's weights_only refusal ``message`` refused, as one whole sentence."""
    found = re.search(r"unsupported GLOBAL (\S+) whose module (\S+) is blocked", message)
    if found:
        return (
            f"it names {found.group(1)}, whose module {found.group(2)} torch blocks outright "
            "(a module that runs commands or code)"
        )
    found = re.search(r"Unsupported global: GLOBAL (\S+)", message)
    if found:
        return f"it names {found.group(1)}, which is not an allowed type"
    found = re.search(r"Trying to call reduce for unrecognized function (.+)", message)
    if found:
        return f"it calls {found.group(1).strip()}, which is not an allowed function"
    found = re.search(r"Can only create new object .* but got (.+)", message)
    if found:
        return f"it creates an object of {found.group(1).strip()}, which is not an allowed type"
    found = re.search(r"WeightsUnpickler error:\s*(.+?)(?:\n\s*\n|\Z)", message, re.S)
    text = found.group(1) if found else message.split("Check the documentation")[0]
    return whole_sentences(" ".join(text.split()))


def whole_sentences(text: str, longest: int = _LONGEST) -> str:
    """``text`` cut after its last sentence that ends within ``longest`` characters."""
    if len(text) <= longest:
        return text
    end = text.rfind(". ", 0, longest)
    return text[: end + 1] if end > 0 else text[:longest] + " [...]"


def _needs_trust(path: Path, why: str) -> str:
    return (
        f"{path}: cannot be loaded without full unpickling ({why}). Nothing was loaded from it. "
        f"Pass --trust-pickle if you trust where this dump came from: {WHY_PICKLE}."
    )


def read_jsonl(path: Path) -> list[Any]:
    """The JSON value of each non-empty line of ``path``; no code from the file runs.

    Parsing a line allocates less than the allowance would for its size; what the
    values then cost to convert is charged, line by line, against the file's allowance.
    """
    out, left = [], _allowance(path)
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                out.append(json.loads(raw.decode("utf-8")))
            except ValueError as exc:  # UnicodeDecodeError is one
                raise _not_json(path, number, exc) from None
            left = _check_expansion(path, out[-1], left=left, line=number)
    return out


def _not_json(path: Path, number: int, exc: ValueError) -> GoldenError:
    """The error for line ``number`` of ``path``, which is not JSON (``exc`` says why); the
    whole file by what it is if that line is the first and the file is not text."""
    with open(path, "rb") as f:
        kind, what = sniffed(f.read(_HEAD))
    if number == 1 and kind in ("format", "binary"):
        return GoldenError(
            f"{path}: not JSON lines: {what}; nothing was loaded from it: move it out of the "
            "dump folder"
        )
    if isinstance(exc, UnicodeDecodeError):
        why = f"is not UTF-8 text ({exc.reason} at byte {exc.start} of the line)"
    else:
        why = f"is not JSON ({exc})"
    return GoldenError(
        f"{path}: line {number} {why}; the file was cut while it was written, or is not a "
        "dump: dump that step again, or move the file out of the dump folder"
    )
