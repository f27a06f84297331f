"""Batch files: standard safetensors files that verify themselves.

A batch file's ``__metadata__`` holds the batch layout (see :mod:`.codec`) and an
xxh3-128 digest of the canonical header plus every data byte. Reading validates the
header, every offset and the layout before anything is allocated from them.
"""

from __future__ import annotations

import json
import math
import os
import struct
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..errors import GoldenFormatError, UnsupportedValueError
from . import codec
from .disk import (
    FORMAT,
    HASH_THREAD_MIN,
    LFS_POINTER,
    READ_CHUNK,
    SCHEMA,
    TORCH_SAVE_HEAD,
    ChunkHasher,
    atomic_write,
    checksum,
    foreign_format,
    format_error,
    new_hasher,
    read_exact,
    refuse_lfs_pointer,
)
from .jsonfile import CONTAINERS, MAX_JSON_DEPTH, is_json_int, parse_json, too_deep
from .location import MANIFEST

NO_LAYOUT: Any = object()  # a batch file without ``prg.layout`` (written by another tool)
_HEADER_LIMIT = 100_000_000
_MAX_NDIM = 64  # numpy's limit
_ALLOC_FACTOR = 64  # a layout may make the loader allocate at most 1 MiB + 64x the file's size

# safetensors dtype code -> (torch dtype name, numpy dtype name or None, itemsize)
DTYPES: dict[str, tuple[str, str | None, int]] = {
    "F64": ("float64", "float64", 8),
    "F32": ("float32", "float32", 4),
    "F16": ("float16", "float16", 2),
    "BF16": ("bfloat16", None, 2),
    "F8_E4M3": ("float8_e4m3fn", None, 1),
    "F8_E5M2": ("float8_e5m2", None, 1),
    "C64": ("complex64", "complex64", 8),
    "I64": ("int64", "int64", 8),
    "I32": ("int32", "int32", 4),
    "I16": ("int16", "int16", 2),
    "I8": ("int8", "int8", 1),
    "U64": ("uint64", "uint64", 8),
    "U32": ("uint32", "uint32", 4),
    "U16": ("uint16", "uint16", 2),
    "U8": ("uint8", "uint8", 1),
    "BOOL": ("bool", "bool", 1),
}
_BY_TORCH = {t: code for code, (t, _, _) in DTYPES.items()}
_BY_NUMPY = {n: code for code, (_, n, _) in DTYPES.items() if n}


def _raw_bytes(array: Any) -> tuple[str, list[int], memoryview]:
    """(safetensors dtype, shape, little-endian bytes) of a tensor or numeric array."""
    if codec.is_torch_tensor(array):
        import torch

        t = array.detach()
        if t.is_meta:
            raise UnsupportedValueError("a tensor on the meta device has no data to record")
        code = _BY_TORCH.get(str(t.dtype).removeprefix("torch."))
        if code is None:
            raise UnsupportedValueError(f"torch dtype {t.dtype} has no safetensors encoding")
        shape = list(t.shape)
        flat = t.to("cpu").contiguous().reshape(-1)
        if flat.dtype.is_complex:
            flat = torch.view_as_real(flat).reshape(-1)
        data = flat.view(torch.uint8).numpy()
    else:
        import numpy as np

        code = _BY_NUMPY.get(array.dtype.name)
        if code is None:
            raise UnsupportedValueError(f"numpy dtype {array.dtype} has no safetensors encoding")
        shape = list(array.shape)
        a = np.ascontiguousarray(array).reshape(-1)
        if a.dtype.byteorder == ">":
            a = a.astype(a.dtype.newbyteorder("<"))
        data = a.view(np.uint8)
    if sys.byteorder != "little":  # pragma: no cover - no big-endian CI
        raise UnsupportedValueError("goldens are little-endian; big-endian hosts are unsupported")
    return code, shape, memoryview(data).cast("B")


def canonical_header(header: Mapping[str, Any]) -> bytes:
    """The bytes of a safetensors header that the file's digest covers."""
    return json.dumps(header, sort_keys=True, separators=(",", ":")).encode()


def encode_safetensors(
    arrays: Mapping[str, Any], metadata: Mapping[str, str]
) -> tuple[list[bytes | memoryview], str]:
    """Chunks of a safetensors file holding ``arrays`` and its self-describing digest."""
    entries = []
    for name, array in arrays.items():
        try:
            entries.append((name, *_raw_bytes(array)))
        except UnsupportedValueError as exc:
            raise UnsupportedValueError(f"cannot record {name!r}: {exc}") from None
    # Largest items first keeps every tensor aligned to its item size without holes.
    entries.sort(key=lambda e: (-DTYPES[e[1]][2], e[0]))
    header: dict[str, Any] = {"__metadata__": {**metadata, "prg.format": f"{FORMAT}/{SCHEMA}"}}
    offset = 0
    for name, code, shape, data in entries:
        header[name] = {"dtype": code, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    digest = checksum([canonical_header(header), *(e[3] for e in entries)])
    header["__metadata__"]["prg.digest"] = digest
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-(8 + len(blob)) % 8)
    return [struct.pack("<Q", len(blob)), blob, *(e[3] for e in entries)], digest


def save_batch(path: str | os.PathLike[str], batch: Any) -> str:
    """Write ``batch`` (mapping, DataProto-like, ...) to a safetensors file; return its digest."""
    arrays, layout = codec.flatten(batch)
    if too_deep(layout):
        raise UnsupportedValueError(
            f"the batch nests more than {MAX_JSON_DEPTH} levels deep; flatten it before recording"
        )
    chunks, digest = encode_safetensors(arrays, {"prg.layout": json.dumps(layout)})
    atomic_write(Path(path), chunks)
    return digest


def _parse_header(
    path: Path,
    size: int,
    head: bytes | bytearray,
    header_bytes: Callable[[int], bytes],
    first_bytes: Callable[[int], bytes | bytearray] | None = None,
) -> tuple[int, dict[str, Any], list[tuple]]:
    """``(header length, header, entries)`` of a safetensors file of ``size`` bytes.

    ``head`` is the file's first 8 bytes (fewer if it is shorter) and
    ``header_bytes(n)`` returns the ``n`` bytes of JSON that follow them. The file
    is taken for safetensors if its header parses; only if it does not is it
    sniffed for a pickle, zip, legacy ``torch.save`` or ``.npy`` file, whose magic
    bytes can also be the length of a valid header. ``first_bytes(n)`` returns the
    file's first ``n`` bytes for that (``head`` if not given).
    """
    try:
        n, header = _header_object(path, size, head, header_bytes)
    except GoldenFormatError:
        foreign = foreign_format(first_bytes(TORCH_SAVE_HEAD) if first_bytes else head)
        if foreign is None:
            raise
        raise format_error(path, foreign) from None
    metadata = header.get("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise format_error(
            path, "has a corrupted safetensors header (__metadata__ is not a str -> str map)"
        )
    return n, header, _check_entries(path, header, size - 8 - n)


def _header_object(
    path: Path, size: int, head: bytes | bytearray, header_bytes: Callable[[int], bytes]
) -> tuple[int, dict[str, Any]]:
    """``(n, header)``: the u64 length ``n`` that starts the file and the JSON object after it.

    Raises GoldenFormatError if the length does not fit the file or what follows
    is not a JSON object.
    """
    if size < 8:
        raise format_error(path, f"is truncated ({size} bytes, no safetensors header)")
    (n,) = struct.unpack_from("<Q", head)
    if n > _HEADER_LIMIT or 8 + n > size:
        if bytes(head).isascii() and bytes(head[:1]) in b"(c]}IFLNSVdlt":
            raise format_error(
                path,
                "is not a safetensors file: it starts like a text pickle "
                "(protocol 0 or 1); it was not unpickled",
            )
        raise format_error(
            path, f"is truncated or not safetensors (header length {n}, file {size} B)"
        )
    header = parse_json(path, header_bytes(n), "has a corrupted safetensors header")
    if not isinstance(header, dict):
        raise format_error(path, "has a corrupted safetensors header (not a JSON object)")
    return n, header


def _signature(path: Path, header: dict[str, Any]) -> Any:
    """A hasher fed with the canonical header, to be fed the data region next.

    None for a file without a digest that is not ours (written by another tool):
    there is nothing to check. Ours without its digest is refused.
    """
    metadata = header.get("__metadata__") or {}
    stored = metadata.get("prg.digest")
    if stored is None and "prg.format" in metadata:  # ours, but the digest's key was damaged
        raise format_error(path, "is corrupted: its header lost the checksum")
    if stored is None:
        return None
    unsigned = {**header, "__metadata__": {k: v for k, v in metadata.items() if k != "prg.digest"}}
    return new_hasher(canonical_header(unsigned))


def _verify(
    path: Path, header: dict[str, Any], digest: str | None, expect_digest: str | None
) -> dict[str, str]:
    """Check ``digest`` (of the header and data as read) against the file's; return metadata."""
    metadata = header.get("__metadata__") or {}
    stored = metadata.get("prg.digest")
    if stored is not None and digest != stored:
        raise format_error(path, "is corrupted: its checksum does not match its content")
    if expect_digest is not None and stored != expect_digest:
        raise format_error(path, f"differs from the file listed in {MANIFEST} (checksum mismatch)")
    return metadata


def _check_entries(path: Path, header: dict[str, Any], data_len: int) -> list[tuple]:
    entries = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        well_formed = (
            isinstance(info, dict)
            and isinstance(info.get("dtype"), str)
            and info["dtype"] in DTYPES
            and isinstance(info.get("shape"), list)
            and len(info["shape"]) <= _MAX_NDIM
            and all(is_json_int(d) and d >= 0 for d in info["shape"])
            and isinstance(info.get("data_offsets"), list)
            and len(info["data_offsets"]) == 2
            and all(is_json_int(o) for o in info["data_offsets"])
        )
        if not well_formed:
            raise format_error(path, f"has a malformed entry for tensor {name!r}")
        code, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
        itemsize = DTYPES[code][2]
        count = math.prod(shape)
        extent = math.prod(max(d, 1) for d in shape) * itemsize  # what strides must address
        ok = 0 <= begin <= end and extent < 2**60
        if not ok or end - begin != count * itemsize:
            raise format_error(path, f"has inconsistent shape/offsets for tensor {name!r}")
        if end > data_len:
            raise format_error(
                path, f"is truncated: tensor {name!r} ends at byte {end} of {data_len}"
            )
        entries.append((name, code, shape, begin, end))
    covered = sorted((b, e) for *_, b, e in entries)
    pos = 0
    for b, e in covered:
        if b != pos:
            raise format_error(path, "has overlapping or missing tensor data")
        pos = e
    if pos != data_len:
        raise format_error(path, f"has {data_len - pos} trailing bytes after the last tensor")
    return entries


_LAYOUT_KEYS = {"torch": "k", "numpy": "k", "ndarray": "dtype", "npscalar": "dtype"}


def _check_layout(path: Path, layout: Any, arrays: Mapping[str, Any], size: int) -> set[str]:
    """Validate the structure :func:`codec.unflatten` relies on; return the numpy-backed keys.

    Every numpy allocation the layout asks for is bounded by the file's size
    before anything is allocated. Tags this check does not know pass through to
    the codec, which refuses unknown ones.
    """
    numpy_keys: set[str] = set()
    budget = (1 << 20) + _ALLOC_FACTOR * size
    stack = [layout] if type(layout) in CONTAINERS else []
    while stack:
        n = stack.pop()
        children = n.values() if type(n) is dict else n
        stack.extend([c for c in children if type(c) in CONTAINERS])  # json.loads: exact types
        if type(n) is list:
            continue
        tag = n.get("t")
        field = _LAYOUT_KEYS.get(tag) if isinstance(tag, str) else None
        if field is None:
            if tag in ("dataproto", "batchproxy") and not isinstance(n.get("cls"), str):
                raise format_error(path, "has a corrupted layout (class name is not a string)")
            if tag == "batchproxy" and not is_json_int(n.get("batch_size")):
                raise format_error(path, "has a corrupted layout (batch size is not an integer)")
            continue
        value = n.get(field)
        if not isinstance(value, str):
            raise format_error(path, f"has a corrupted layout ({tag} node without {field!r})")
        if field == "k":
            if value not in arrays:
                raise format_error(path, f"has a layout naming a missing tensor {value!r}")
            if tag == "numpy":
                numpy_keys.add(value)
            continue
        import numpy as np

        try:
            itemsize = np.dtype(value).itemsize
        except (TypeError, ValueError, OverflowError):
            raise format_error(
                path, f"has a layout with an unknown numpy dtype {value!r}"
            ) from None
        count = len(n["v"]) if tag == "ndarray" and isinstance(n.get("v"), list) else 1
        budget -= count * itemsize
        if budget < 0:
            raise format_error(
                path,
                f"has a layout whose numpy dtype {value!r} would need more memory than a "
                f"{size}-byte file can describe",
            )
    return numpy_keys


def _view(buf: bytearray, offset: int, nbytes: int, code: str, shape: list[int], as_numpy: bool):
    torch_name, numpy_name, _ = DTYPES[code]
    if as_numpy and numpy_name:
        import numpy as np

        return np.frombuffer(
            buf,
            dtype=np.dtype(numpy_name).newbyteorder("<"),
            count=nbytes // np.dtype(numpy_name).itemsize,
            offset=offset,
        ).reshape(shape)
    import torch

    dtype = getattr(torch, torch_name)
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(
        buf, dtype=dtype, count=nbytes // dtype.itemsize, offset=offset
    ).reshape(shape)


def read_safetensors(
    path: Path, *, expect_digest: str | None = None, want: str = "torch"
) -> tuple[dict[str, Any], dict[str, str]]:
    """Read and verify one safetensors file; return ``(arrays, metadata)``.

    Arrays are torch tensors, or numpy arrays for ``want="numpy"`` and for the
    entries the layout records as numpy. The header is read first, then every
    tensor straight into its own allocation, as torch.load does, and each
    :data:`~.disk.READ_CHUNK` of it is hashed as soon as it is read, while it is
    in cache: a load is one copy from the page cache, plus the checksum of bytes
    still in cache (on a helper thread for large files). Nothing is returned
    before every byte is verified. A single file-sized buffer would be slower:
    past malloc's mmap threshold (32 MiB) it is fresh memory, page-faulted 4 KiB
    at a time on every load. A tensor kept alive also does not pin the rest of
    the file.
    """
    arrays, metadata, _ = _read(path, expect_digest=expect_digest, want=want)
    return arrays, metadata


def _read_data(path: Path, f: Any, entries: list[tuple], hasher: Any) -> dict[str, Any]:
    """Each entry's bytes, from the data region that ``f`` is positioned at, in a fresh buffer.

    Every chunk read is passed to ``hasher.update`` (if given) right away.
    """
    import numpy as np

    buffers = {}
    for name, _, _, begin, end in sorted(entries, key=lambda e: e[3]):
        buf = np.empty(end - begin, dtype=np.uint8)  # numpy aligns it for every dtype (16 B)
        view = memoryview(buf)
        for start in range(0, end - begin, READ_CHUNK):
            chunk = read_exact(path, f, view[start : start + READ_CHUNK])
            if hasher is not None:
                hasher.update(chunk)
        buffers[name] = buf
    return buffers


def _read(
    path: Path, *, expect_digest: str | None, want: str
) -> tuple[dict[str, Any], dict[str, str], Any]:
    """:func:`read_safetensors`, plus the parsed and validated layout (:data:`NO_LAYOUT` if absent).

    A layout that is JSON ``null`` is the batch ``None``, not an absent layout.
    """
    try:
        with open(path, "rb", buffering=0) as f:
            size = os.fstat(f.fileno()).st_size
            head = read_exact(path, f, bytearray(min(size, 8)))
            if head == LFS_POINTER[:8]:
                refuse_lfs_pointer(path, head + read_exact(path, f, bytearray(min(size, 64) - 8)))
                f.seek(8)

            def first_bytes(n: int) -> bytearray:
                f.seek(0)
                return read_exact(path, f, bytearray(min(size, n)))

            n, header, entries = _parse_header(
                path, size, head, lambda n: read_exact(path, f, bytearray(n)), first_bytes
            )
            hasher = _signature(path, header)
            digest = None
            if hasher is None:
                chunks = _read_data(path, f, entries, None)
            else:
                with ChunkHasher(hasher, threaded=size - 8 - n >= HASH_THREAD_MIN) as feed:
                    chunks = _read_data(path, f, entries, feed)
                    digest = feed.hexdigest()
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise format_error(path, f"cannot be read ({exc})") from exc
    metadata = _verify(path, header, digest, expect_digest)
    layout: Any = metadata.get("prg.layout", NO_LAYOUT)
    numpy_keys: set[str] = set()
    if layout is not NO_LAYOUT:
        layout = parse_json(path, layout, "has a corrupted layout")
        numpy_keys = _check_layout(path, layout, chunks, size)
    arrays = {}
    for name, code, shape, begin, end in entries:
        as_numpy = want == "numpy" or name in numpy_keys
        arrays[name] = _view(chunks[name], 0, end - begin, code, shape, as_numpy)
    return arrays, metadata, layout


def load_batch(
    path: str | os.PathLike[str],
    *,
    rebuild: Callable[..., Any] | None = None,
    expect_digest: str | None = None,
    on_cpu: bool = False,
) -> Any:
    """Load and verify a batch written by :func:`save_batch`.

    A plain safetensors file written by another tool loads as a dict of tensors.
    ``rebuild`` builds DataProto-like batches (called with ``batch``,
    ``non_tensor_batch`` and ``meta_info``); by default the recorded class is
    used if the process already imported it, else :class:`~.codec.RolloutBatch`.
    Each tensor goes onto the device it was recorded on where this machine has it
    (else the CPU), or onto the CPU whatever it was recorded on with ``on_cpu``.
    """
    path = Path(path)
    arrays, _, layout = _read(path, expect_digest=expect_digest, want="torch")
    if layout is NO_LAYOUT:
        return dict(arrays)
    try:
        return codec.unflatten(arrays, layout, rebuild=rebuild, on_cpu=on_cpu)
    except GoldenFormatError as exc:
        raise format_error(path, str(exc)) from None
    except (OverflowError, IndexError) as exc:  # a value that does not fit its recorded dtype
        raise format_error(path, f"layout does not match the stored arrays ({exc!r})") from None
