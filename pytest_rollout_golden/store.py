"""On-disk format of goldens: safetensors and JSON with checksums, written atomically.

Nothing here unpickles or executes anything read from disk.

* A batch file is a standard safetensors file. Its ``__metadata__`` holds the
  batch layout (see :mod:`.codec`) and an xxh3-128 digest of the canonical
  header plus every data byte, so a batch file verifies itself.
* Every write goes to a temporary file that is fsynced and renamed over the
  target, so a reader sees the old file or the new one, never a mix.
* A golden directory is replaced as a whole (see :class:`Transaction`): an
  interrupted update leaves the previous golden intact and loadable.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import shutil
import struct
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import xxhash

from . import codec
from .errors import REMEDY_UPDATE, GoldenError, GoldenFormatError, UnsupportedValueError

FORMAT = "pytest-rollout-golden"
SCHEMA = 1
MANIFEST = "manifest.json"
_HEADER_LIMIT = 100_000_000
MAX_JSON_DEPTH = 128  # deeper nesting in a golden file is refused (recorded batches nest far less)
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

_FOREIGN_MAGIC = [
    (b"PK\x03\x04", "a zip archive (the format of torch.save)"),
    (b"\x93NUMPY", "a numpy .npy file"),
]


# --------------------------------------------------------------------------- writing


def atomic_write(path: Path, chunks: Iterable[bytes | memoryview]) -> None:
    """Write ``chunks`` to ``path`` through a fsynced temporary file and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise GoldenError(
                f"{path}: no space left on device while writing it; nothing was committed "
                "and the previous golden is intact. Free disk space on that filesystem (or "
                "point golden_dir elsewhere) and run again."
            ) from exc
        raise


def _raw_bytes(array: Any) -> tuple[str, list[int], memoryview]:
    """(safetensors dtype, shape, little-endian bytes) of a tensor or numeric array."""
    if codec._is_torch_tensor(array):
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


def _canonical(header: Mapping[str, Any]) -> bytes:
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
    hasher = xxhash.xxh3_128(_canonical(header))
    for *_, data in entries:
        hasher.update(data)
    digest = hasher.hexdigest()
    header["__metadata__"]["prg.digest"] = digest
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-(8 + len(blob)) % 8)
    return [struct.pack("<Q", len(blob)), blob, *(e[3] for e in entries)], digest


def save_batch(path: str | os.PathLike[str], batch: Any) -> str:
    """Write ``batch`` (mapping, DataProto-like, ...) to a safetensors file; return its digest."""
    arrays, layout = codec.flatten(batch)
    if _too_deep(layout):
        raise UnsupportedValueError(
            f"the batch nests more than {MAX_JSON_DEPTH} levels deep; flatten it before recording"
        )
    chunks, digest = encode_safetensors(arrays, {"prg.layout": json.dumps(layout)})
    atomic_write(Path(path), chunks)
    return digest


# --------------------------------------------------------------------------- reading


def format_error(path: Path, what: str) -> GoldenFormatError:
    """A GoldenFormatError naming ``path``, what is wrong with it, and the remedy."""
    return GoldenFormatError(f"{path}: {what}. Nothing was loaded from it; {REMEDY_UPDATE}.")


def read_bytes(path: Path) -> bytearray:
    """The whole file in one writable buffer."""
    try:
        with open(path, "rb", buffering=0) as f:
            return _read_exact(path, f, bytearray(os.fstat(f.fileno()).st_size))
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise format_error(path, f"cannot be read ({exc})") from exc


def _read_exact(path: Path, f: Any, buf: Any) -> Any:
    """Fill the writable buffer ``buf`` from the unbuffered file ``f``; return ``buf``."""
    view, got = memoryview(buf).cast("B"), 0
    while got < len(view):
        n = f.readinto(view[got:])
        if not n:
            raise format_error(path, f"shrank while being read ({got} of {len(view)} bytes)")
        got += n
    return buf


def _sniff_foreign(path: Path, buf: bytearray) -> None:
    if buf[:1] == b"\x80" and len(buf) > 1 and 2 <= buf[1] <= 5:
        raise format_error(
            path,
            "is a pickle file, not a safetensors golden; it was not unpickled "
            "(unpickling runs code stored in the file)",
        )
    for magic, what in _FOREIGN_MAGIC:
        if buf.startswith(magic):
            raise format_error(
                path, f"is {what}, not a safetensors golden; it was not deserialized"
            )


def _parse_header(
    path: Path, size: int, head: bytes | bytearray, header_bytes: Callable[[int], bytes]
) -> tuple[int, dict[str, Any], list[tuple]]:
    """``(header length, header, entries)`` of a safetensors file of ``size`` bytes.

    ``head`` is the file's first 8 bytes (fewer if it is shorter) and
    ``header_bytes(n)`` returns the ``n`` bytes of JSON that follow them.
    """
    _sniff_foreign(path, head)
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
    metadata = header.get("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise format_error(
            path, "has a corrupted safetensors header (__metadata__ is not a str -> str map)"
        )
    return n, header, _check_entries(path, header, size - 8 - n)


def _verify(
    path: Path, header: dict[str, Any], data: Iterable[Any], expect_digest: str | None
) -> dict[str, str]:
    """Check the digest of the header and ``data`` (the data region, in order); return metadata."""
    metadata = header.get("__metadata__") or {}
    stored = metadata.get("prg.digest")
    if stored is None and "prg.format" in metadata:  # ours, but the digest's key was damaged
        raise format_error(path, "is corrupted: its header lost the checksum")
    if stored is not None:
        unsigned = {
            **header,
            "__metadata__": {k: v for k, v in metadata.items() if k != "prg.digest"},
        }
        hasher = xxhash.xxh3_128(_canonical(unsigned))
        for chunk in data:
            hasher.update(chunk)
        if hasher.hexdigest() != stored:
            raise format_error(path, "is corrupted: its checksum does not match its content")
    if expect_digest is not None and stored != expect_digest:
        raise format_error(
            path, "differs from the file listed in manifest.json (checksum mismatch)"
        )
    return metadata


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


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
            and all(_is_int(d) and d >= 0 for d in info["shape"])
            and isinstance(info.get("data_offsets"), list)
            and len(info["data_offsets"]) == 2
            and all(_is_int(o) for o in info["data_offsets"])
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


_CONTAINERS = (dict, list)
_DEVICE = re.compile(r"[a-z_]+(:[0-9]+)?")  # "cpu", "cuda:0"; "cuda:-1" would fail in .to()
_LAYOUT_KEYS = {"torch": "k", "numpy": "k", "ndarray": "dtype", "npscalar": "dtype"}


def _check_layout(path: Path, layout: Any, arrays: Mapping[str, Any], size: int) -> set[str]:
    """Validate the structure :func:`codec.unflatten` relies on; return the numpy-backed keys.

    Every numpy allocation the layout asks for is bounded by the file's size
    before anything is allocated. Tags this check does not know pass through to
    the codec, which refuses unknown ones.
    """
    numpy_keys: set[str] = set()
    budget = (1 << 20) + _ALLOC_FACTOR * size
    stack = [layout] if type(layout) in _CONTAINERS else []
    while stack:
        n = stack.pop()
        children = n.values() if type(n) is dict else n
        stack.extend([c for c in children if type(c) in _CONTAINERS])  # json.loads: exact types
        if type(n) is list:
            continue
        tag = n.get("t")
        field = _LAYOUT_KEYS.get(tag) if isinstance(tag, str) else None
        if field is None:
            if tag == "dataproto" and not isinstance(n.get("cls"), str):
                raise format_error(path, "has a corrupted layout (class name is not a string)")
            continue
        value = n.get(field)
        if not isinstance(value, str):
            raise format_error(path, f"has a corrupted layout ({tag} node without {field!r})")
        if field == "k":
            if value not in arrays:
                raise format_error(path, f"has a layout naming a missing tensor {value!r}")
            if tag == "numpy":
                numpy_keys.add(value)
            device = n.get("device", "cpu")
            if not isinstance(device, str) or not _DEVICE.fullmatch(device):
                raise format_error(path, f"has a corrupted layout (device of {value!r})")
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
    tensor straight into its own allocation, as torch.load does: a load is one
    copy from the page cache plus the checksum. A single file-sized buffer would
    be slower: past malloc's mmap threshold (32 MiB) it is fresh memory,
    page-faulted 4 KiB at a time on every load. A tensor kept alive also does not
    pin the rest of the file.
    """
    arrays, metadata, _ = _read(path, expect_digest=expect_digest, want=want)
    return arrays, metadata


def _read(
    path: Path, *, expect_digest: str | None, want: str
) -> tuple[dict[str, Any], dict[str, str], Any]:
    """:func:`read_safetensors`, plus the parsed and validated layout (``None`` if absent)."""
    import numpy as np

    try:
        with open(path, "rb", buffering=0) as f:
            size = os.fstat(f.fileno()).st_size
            head = _read_exact(path, f, bytearray(min(size, 8)))
            _, header, entries = _parse_header(
                path, size, head, lambda n: _read_exact(path, f, bytearray(n))
            )
            chunks = {
                e[0]: _read_exact(path, f, np.empty(e[4] - e[3], dtype=np.uint8))
                for e in sorted(entries, key=lambda e: e[3])
            }
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise format_error(path, f"cannot be read ({exc})") from exc
    metadata = _verify(path, header, chunks.values(), expect_digest)
    layout = metadata.get("prg.layout")
    numpy_keys: set[str] = set()
    if layout is not None:
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
) -> Any:
    """Load and verify a batch written by :func:`save_batch`.

    A plain safetensors file written by another tool loads as a dict of tensors.
    ``rebuild`` builds DataProto-like batches (called with ``batch``,
    ``non_tensor_batch`` and ``meta_info``); by default the recorded class is
    used if the process already imported it, else :class:`~.codec.RolloutBatch`.
    """
    path = Path(path)
    arrays, _, layout = _read(path, expect_digest=expect_digest, want="torch")
    if layout is None:
        return dict(arrays)
    try:
        return codec.unflatten(arrays, layout, rebuild=rebuild)
    except GoldenFormatError as exc:
        raise format_error(path, str(exc)) from None
    except (OverflowError, IndexError) as exc:  # a value that does not fit its recorded dtype
        raise format_error(path, f"layout does not match the stored arrays ({exc!r})") from None


# --------------------------------------------------------------------------- JSON


def encode_json(obj: Any) -> bytes:
    """Deterministic, diff-friendly JSON; floats round-trip exactly (non-finite are rejected)."""
    return (json.dumps(obj, indent=2, sort_keys=False, allow_nan=False) + "\n").encode()


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _too_deep(value: Any) -> bool:
    """Whether ``value`` nests lists/dicts more than :data:`MAX_JSON_DEPTH` levels deep."""
    level, depth = [value], 1
    while level:
        if depth > MAX_JSON_DEPTH:
            return True
        level = [
            c
            for v in level
            for c in (v.values() if type(v) is dict else v)
            if type(c) in _CONTAINERS
        ]
        depth += 1
    return False


def parse_json(path: Path, data: bytes | str, what: str = "is not valid JSON") -> Any:
    """Strict JSON (no NaN/Infinity) read from ``path``, at most :data:`MAX_JSON_DEPTH` deep."""
    try:
        value = json.loads(data, parse_constant=_no_constant)
        too_deep = isinstance(value, (dict, list)) and _too_deep(value)
    except RecursionError:
        too_deep = True
    except (ValueError, UnicodeDecodeError) as exc:
        raise format_error(path, f"{what} ({exc})") from None
    if too_deep:
        raise format_error(path, f"{what} (nested more than {MAX_JSON_DEPTH} levels deep)")
    return value


def read_json(path: Path, *, expect_digest: str | None = None) -> Any:
    buf = read_bytes(path)
    _sniff_foreign(path, buf)
    if expect_digest is not None and json_digest(buf) != expect_digest:
        raise format_error(
            path, "is corrupted or was edited by hand: its checksum differs from manifest.json"
        )
    return parse_json(path, bytes(buf))


def json_digest(data: bytes | bytearray) -> str:
    """Checksum of a JSON golden file, immune to line-ending conversion.

    :func:`encode_json` never writes a carriage return (JSON escapes it inside
    strings), so CRLF can only come from a checkout (``core.autocrlf``): it is
    read as LF. For a file as written the checksum is xxh3-128 of its bytes.
    """
    if b"\r" in data:
        data = bytes(data).replace(b"\r\n", b"\n")
    return xxhash.xxh3_128_hexdigest(data)


# --------------------------------------------------------------------------- directories


def read_manifest(directory: Path) -> dict[str, Any] | None:
    """The manifest of a golden directory, validated; ``None`` if there is no golden."""
    path = directory / MANIFEST
    try:
        manifest = read_json(path)
    except FileNotFoundError:
        return None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise format_error(path, "is not a pytest-rollout-golden manifest")
    if manifest.get("schema") != SCHEMA:
        raise GoldenFormatError(
            f"{path}: schema version {manifest.get('schema')!r} is not supported by this "
            f"pytest-rollout-golden (schema {SCHEMA}); upgrade the plugin, or {REMEDY_UPDATE}."
        )
    if not isinstance(manifest.get("files"), dict):
        raise format_error(path, "has no file table")
    if not isinstance(manifest.get("fingerprint", {}), (dict, type(None))):
        raise format_error(path, "has a malformed fingerprint (not an object)")
    for filename, info in manifest["files"].items():
        problem = _manifest_entry_problem(filename, info)
        if problem:
            raise format_error(path, f"has a malformed entry for {filename!r}: {problem}")
    return manifest


LOCK_TIMEOUT_ENV = "ROLLOUT_GOLDEN_LOCK_TIMEOUT"
LOCK_TIMEOUT = 1800.0  # seconds; a lock is held for a whole test, which may train for minutes


def lock_path(directory: Path) -> Path:
    """The lock file of a golden: ``.NAME.lock`` beside it, at its real (resolved) path."""
    real = directory.resolve()
    return real.parent / f".{real.name}.lock"


def _manifest_entry_problem(filename: str, info: Any) -> str | None:
    """What is wrong with one entry of a manifest's file table, or ``None``."""
    if filename in ("", ".", "..", MANIFEST) or any(c in filename for c in "/\\\0"):
        return "not a plain file name inside the golden directory"
    if not isinstance(info, dict):
        return "not an object"
    if not isinstance(info.get("digest"), str) or not info["digest"]:
        return "no digest"
    for field in ("kind", "name"):
        if not isinstance(info.get(field, ""), str):
            return f"{field} is not a string"
    if info.get("kind") in ("rollout", "tensors") and not isinstance(info.get("name"), str):
        return "no name"
    for field in ("step", "rank", "micro"):
        value = info.get(field)
        if value is None and (field != "step" or info.get("kind") not in ("rollout", "tensors")):
            continue
        if not _is_int(value) or (field == "step" and value < 0):
            return f"{field} is not an integer" + (" >= 0" if field == "step" else "")
    return None


@contextmanager
def locked(directory: Path, *, timeout: float | None = None) -> Iterator[None]:
    """Exclusive inter-process lock on a golden directory (xdist workers, shared keys).

    The lock file lives beside the golden, at its resolved path, so every process
    that reaches the golden excludes the others whatever its ``$TMPDIR``, through a
    symlink, a bind mount or a shared filesystem. A symlink planted as the lock file
    is refused, not followed. Waiting longer than ``timeout`` seconds (default
    ``$ROLLOUT_GOLDEN_LOCK_TIMEOUT`` or 1800) raises a :class:`GoldenError` naming
    the lock file and the process holding it. Where the lock file cannot be created
    (a read-only checkout) this process cannot write the golden either, and reads
    it without a lock.
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows: single-process use only
        yield
        return
    import time

    if timeout is None:
        timeout = _lock_timeout()
    path = lock_path(directory)
    created = [p for p in (path.parent, *path.parent.parents) if not p.exists()]
    deadline = time.monotonic() + timeout
    while True:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = _open_lock(path)
        except FileNotFoundError:
            if time.monotonic() < deadline:
                continue  # a releasing holder removed the empty folder it had created
            raise
        except OSError as exc:
            if exc.errno not in _READ_ONLY:
                raise
            fd = None
        if fd is None:
            yield
            return
        wait = 0.005
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = _lock_holder(fd)
                    os.close(fd)
                    raise GoldenError(
                        f"{path}: timed out after {timeout:g} s waiting for the lock of the "
                        f"golden {directory}, held by {holder}. If no run of pytest is using "
                        f"this golden, end that process; set {LOCK_TIMEOUT_ENV} to wait longer."
                    ) from None
                time.sleep(wait)
                wait = min(wait * 2, 0.2)
        try:
            st = os.stat(path, follow_symlinks=False)
            fst = os.fstat(fd)
            if (st.st_dev, st.st_ino) == (fst.st_dev, fst.st_ino):
                break  # still the live lock file: we hold the lock
        except FileNotFoundError:
            pass
        os.close(fd)  # the holder unlinked it while we waited; lock the new file instead
    with suppress(OSError):  # a read-only lock file (another user's) still locks
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {_hostname()}\n".encode(), 0)
    try:
        yield
    finally:
        with suppress(OSError):
            path.unlink()  # before unlocking, so no lock file is left behind
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
        for folder in created:  # only empty folders this lock created (nothing was recorded)
            try:
                folder.rmdir()
            except OSError:
                break


def _lock_timeout() -> float:
    raw = os.environ.get(LOCK_TIMEOUT_ENV)
    if raw is None:
        return LOCK_TIMEOUT
    try:
        return float(raw)
    except ValueError:
        raise GoldenError(f"{LOCK_TIMEOUT_ENV}={raw!r} is not a number of seconds") from None


_READ_ONLY = (errno.EROFS, errno.EACCES, errno.EPERM)


def _open_lock(path: Path) -> int | None:
    """A descriptor of the lock file, or ``None`` where it cannot be created (read-only)."""
    flags = os.O_CREAT | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
    try:
        try:
            return os.open(path, os.O_RDWR | flags, 0o644)
        except OSError as exc:
            if exc.errno not in _READ_ONLY:
                raise
            return os.open(path, os.O_RDONLY | flags)  # another user's lock file locks too
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno in _READ_ONLY and not path.is_symlink():
            return None
        what = "is a symbolic link, which is never followed" if path.is_symlink() else str(exc)
        raise GoldenError(
            f"{path}: cannot use this lock file of a golden: {what}. "
            "It holds nothing of the golden; remove it and run again."
        ) from None


def _lock_holder(fd: int) -> str:
    try:
        text = os.pread(fd, 200, 0).decode(errors="replace").strip()
    except OSError:
        text = ""
    return text or "an unknown process"


def _hostname() -> str:
    import socket

    return socket.gethostname()


def recover(directory: Path) -> None:
    """Finish or roll back an interrupted commit of ``directory`` (call under :func:`locked`)."""
    parent = directory.parent
    if not parent.is_dir():
        return
    backups, staged = [], []
    for p in parent.iterdir():
        kind = leftover_kind(directory.name, p.name)
        if kind == "old":
            backups.append(p)
        elif kind == "new":
            staged.append(p)
    backups.sort(key=lambda p: p.stat().st_mtime)
    if backups and not directory.exists():
        os.rename(backups.pop(), directory)
    for leftover in backups:
        if _return_unlisted(leftover, directory, listed_files(leftover) or {MANIFEST}):
            _discard(leftover)
    for leftover in staged:
        owned = listed_files(leftover)  # None: its manifest was never written, nothing moved in
        if owned is None or _return_unlisted(leftover, directory, owned):
            shutil.rmtree(leftover, ignore_errors=True)


def _return_unlisted(source: Path, home: Path, owned: set[str]) -> bool:
    """Move what ``source`` holds beyond ``owned`` back into ``home`` before ``source`` goes.

    A commit moves entries its golden does not own (a golden nested in this one, a user's
    file) into the staged version; a crash or a failed swap must not delete them with it.
    Returns False (keep ``source``) if something could not be put back.
    """
    returned = True
    for entry in source.iterdir():
        if entry.name in owned:
            continue
        if not home.is_dir() or (home / entry.name).exists():
            returned = False
            continue
        os.rename(entry, home / entry.name)
    return returned


def leftover_kind(name: str, sibling: str) -> str | None:
    """``"old"`` or ``"new"`` if ``sibling`` is a backup or staging directory of golden ``name``.

    The match is exact (``.NAME.old-PID``, ``.NAME.new-PID``): ``.layout.old-ref.new-7``
    is the staging directory of golden ``layout.old-ref``, not a backup of ``layout``.
    """
    parsed = leftover_name(sibling)
    return parsed[1] if parsed is not None and parsed[0] == name else None


def leftover_name(entry: str) -> tuple[str, str] | None:
    """``(golden name, "old" or "new")`` if ``entry`` is a backup or staging directory."""
    match = _LEFTOVER.fullmatch(entry)
    return (match.group(1), match.group(2)) if match else None


_LEFTOVER = re.compile(r"\.(.+)\.(old|new)-([0-9]+)")


class Transaction:
    """Stage a new version of a golden directory, then swap it in as a whole.

    Files written through the transaction land in a hidden staging directory;
    :meth:`commit` hard-links the kept files of the old version, writes the
    manifest last, and renames the staging directory into place. Until that
    rename the old golden is untouched; a crash between the two renames is
    undone by :func:`recover`.
    """

    def __init__(self, directory: Path):
        # A golden directory that is a link (inside the golden root, see
        # location.link_out_of_root) is replaced where it points; the link stays.
        self.directory = Path(os.path.realpath(directory))
        self.staging = directory.parent / f".{directory.name}.new-{os.getpid()}"
        shutil.rmtree(self.staging, ignore_errors=True)
        missing = [p for p in self.directory.parents if not p.exists()]
        self._created = missing[-1] if missing else None  # removed again by abort() if empty
        self.staging.mkdir(parents=True)
        self.files: dict[str, dict[str, Any]] = {}

    def write_batch(self, filename: str, batch: Any, **info: Any) -> None:
        digest = save_batch(self.staging / filename, batch)
        self.files[filename] = {**info, "digest": digest}

    def write_json(self, filename: str, obj: Any, **info: Any) -> None:
        data = encode_json(obj)
        atomic_write(self.staging / filename, [data])
        self.files[filename] = {**info, "digest": json_digest(data)}

    def keep(self, filename: str, info: Mapping[str, Any]) -> None:
        """Carry a file of the current version over unchanged."""
        target = self.staging / filename
        try:
            os.link(self.directory / filename, target)
        except OSError:
            shutil.copy2(self.directory / filename, target)
        self.files[filename] = dict(info)

    def commit(self, manifest: dict[str, Any]) -> None:
        """Swap the staged version in; what the old version does not list stays in place.

        Entries of the old directory that its manifest does not list (a golden nested
        inside this one, a file a user put there) are moved into the new version, so the
        swap replaces only this golden's own files.
        """
        manifest = {"format": FORMAT, "schema": SCHEMA, **manifest, "files": self.files}
        atomic_write(self.staging / MANIFEST, [encode_json(manifest)])
        _fsync_dir(self.staging)
        backup = self.directory.parent / f".{self.directory.name}.old-{os.getpid()}"
        had_old = self.directory.exists()
        if had_old:
            for entry in _unlisted(self.directory, extra=set(self.files)):
                os.rename(entry, self.staging / entry.name)
            os.rename(self.directory, backup)
        os.rename(self.staging, self.directory)
        _fsync_dir(self.directory.parent)
        if had_old:
            for entry in _unlisted(backup, extra=set(self.files)):  # arrived during the swap
                os.rename(entry, self.directory / entry.name)
            _discard(backup)

    def abort(self) -> None:
        if self.staging.is_dir() and not _return_unlisted(
            self.staging, self.directory, {*self.files, MANIFEST}
        ):
            return  # something not ours could not be put back: leave it for recover()
        shutil.rmtree(self.staging, ignore_errors=True)
        if self._created is not None:
            for folder in [self.staging.parent, *self.staging.parent.parents]:
                try:
                    folder.rmdir()  # only empty folders this transaction created
                except OSError:
                    break
                if folder == self._created:
                    break


def _discard(version: Path) -> None:
    """Delete a replaced version of a golden, its manifest last.

    A crash part-way then leaves a version whose manifest still names what is left, so
    :func:`recover` deletes the rest instead of taking it for a user's files to put back.
    """
    owned = listed_files(version) or set()
    try:
        entries = sorted(version.iterdir(), key=lambda e: (e.name in owned, e.name == MANIFEST))
        for entry in entries:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        version.rmdir()
    except OSError:
        pass  # what is left is finished by the next recover()


def listed_files(directory: Path) -> set[str] | None:
    """Names of the files the golden in ``directory`` owns (its manifest's table and the
    manifest itself); ``None`` if its manifest is missing or is not one of ours."""
    try:
        manifest = json.loads((directory / MANIFEST).read_bytes())
    except (OSError, ValueError, RecursionError):
        return None
    if not (
        isinstance(manifest, dict)
        and manifest.get("format") == FORMAT
        and type(manifest.get("schema")) is int
        and isinstance(manifest.get("files"), dict)
    ):
        return None
    names = {n for n in manifest["files"] if isinstance(n, str) and _plain_name(n)}
    return names | {MANIFEST}


def _plain_name(name: str) -> bool:
    return name not in ("", ".", "..") and "/" not in name and "\\" not in name


def _unlisted(directory: Path, *, extra: set[str]) -> list[Path]:
    """Entries of ``directory`` that neither its golden nor the new version (``extra``) lists."""
    owned = listed_files(directory)
    if owned is None:  # no readable manifest of ours: only what the new version replaces
        owned = {MANIFEST}
    owned |= extra
    return [e for e in directory.iterdir() if e.name not in owned]


def remove_golden(directory: Path, root: Path) -> list[str]:
    """Delete the golden in ``directory``: the files its manifest lists, then the manifest,
    then the directory if nothing else is in it. Returns the names of what was left.

    Refuses (raises GoldenError) a directory that is not a golden of ours, is reached
    through a symbolic link, or lies outside the golden ``root``.
    """
    real_root = Path(os.path.realpath(root))
    try:
        rel = directory.relative_to(root)
    except ValueError:
        raise GoldenError(f"{directory}: not inside the golden root {root}; not deleted") from None
    if not rel.parts or any(
        (root / Path(*rel.parts[:i])).is_symlink() for i in range(1, len(rel.parts) + 1)
    ):
        raise GoldenError(f"{directory}: reached through a symbolic link; not deleted")
    real = Path(os.path.realpath(directory))
    if real == real_root or real_root not in real.parents:
        raise GoldenError(f"{directory}: outside the golden root {root}; not deleted")
    owned = listed_files(directory)
    if owned is None:
        raise GoldenError(
            f"{directory}: {MANIFEST} is not a pytest-rollout-golden manifest; not deleted"
        )
    for name in [*sorted(owned - {MANIFEST}), MANIFEST]:
        path = directory / name
        if path.is_file() or path.is_symlink():  # a link itself, never what it points to
            path.unlink(missing_ok=True)
    left = sorted(e.name for e in directory.iterdir())
    if not left:
        directory.rmdir()
    return left


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
