"""Bytes on disk: the one writer, whole-file reading, the one checksum (in one call, or
fed chunk by chunk as a file is read, on a helper thread if a CPU is idle), and the error
that names a bad file.

Every write goes to a temporary file that is fsynced and renamed over the target, so a
reader sees the old file or the new one, never a mix. Nothing here unpickles or executes
anything read from disk: a pickle, zip (``torch.save``) or ``.npy`` file found where a
golden file should be is refused, and named by its first bytes.
"""

from __future__ import annotations

import errno
import os
import queue
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import xxhash

from ..errors import REMEDY_UPDATE, GoldenError, GoldenFormatError, GoldenNotFetchedError
from .location import temp_file

# What a manifest and a batch file's metadata say they are.
FORMAT = "pytest-rollout-golden"
SCHEMA = 1

_FOREIGN_MAGIC = [
    (b"PK\x03\x04", "a zip archive (the format of torch.save)"),
    (b"\x93NUMPY", "a numpy .npy file"),
]


def atomic_write(path: Path, chunks: Iterable[bytes | memoryview]) -> None:
    """Write ``chunks`` to ``path`` through a fsynced temporary file and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_file(path)
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


# errno of a write refused by the filesystem or its permissions (a read-only checkout)
READ_ONLY_ERRNOS = (errno.EROFS, errno.EACCES, errno.EPERM)


def unwritable_error(directory: Path, exc: OSError) -> GoldenError:
    """A GoldenError saying the golden ``directory`` cannot be recorded (``exc`` refused a
    write there, or creating it), and the remedy."""
    what = "is not writable" if exc.errno in READ_ONLY_ERRNOS else "cannot be created"
    where = f": {exc.filename}" if exc.filename else ""
    return GoldenError(
        f"{directory}: cannot record this golden: the golden directory {what} "
        f"({exc.strerror or exc}{where}). Nothing was written. Make it writable, or set the "
        "`golden_dir` ini option to a writable directory; on a read-only checkout, run "
        "without --update-golden, as replay only reads goldens (it needs them recorded)."
    )


def new_hasher(first: Any = b"") -> Any:
    """The one checksum as a stream: ``update(buffer)``, then ``hexdigest()``; xxh3-128."""
    return xxhash.xxh3_128(first)


def checksum(chunks: Iterable[Any]) -> str:
    """The checksum of a golden file's content given in pieces (buffers): xxh3-128, hex."""
    hasher = new_hasher()
    for chunk in chunks:
        hasher.update(chunk)
    return hasher.hexdigest()


# A read of this many bytes is hashed right after it lands, while it is still in the
# CPU's caches (1 MiB: within L2 or L3 of any server core), not in a second pass over
# memory. Hashing after the whole file is read costs a trip to DRAM for every byte.
READ_CHUNK = 1 << 20
# Data regions at least this large are hashed on a helper thread, chunk by chunk in
# file order, while the next chunk is read: the hash (xxh3 releases the GIL) overlaps
# the kernel's copy from the page cache instead of following it. The helper lags
# one chunk or a few, which still sit in the shared L3 cache.
HASH_THREAD_MIN = 8 << 20


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - macOS, Windows
        return os.cpu_count() or 1


def _runnable() -> int:
    """Threads running or ready to run on the machine now (Linux), this one included; 1 if
    unknown. A helper thread only pays off on an idle CPU: on a busy machine it waits for
    one, and the load takes longer than hashing on the calling thread."""
    try:
        with open("/proc/loadavg", "rb") as f:
            return int(f.read().split()[3].split(b"/")[0])
    except (OSError, ValueError, IndexError):  # pragma: no cover - not Linux
        return 1


class ChunkHasher:
    """Feeds buffers to ``hasher`` in the order given, on a helper thread if ``threaded``
    and a CPU is idle.

    ``update`` takes a buffer that must stay unchanged until :meth:`hexdigest`
    (the caller's freshly read memory). Use as a context manager: leaving it
    stops the helper thread, also on an error.
    """

    def __init__(self, hasher: Any, *, threaded: bool) -> None:
        self._hasher = hasher
        self._queue: queue.SimpleQueue[Any] | None = None
        self._error: BaseException | None = None
        if threaded and _runnable() < _cpus():
            q: queue.SimpleQueue[Any] = queue.SimpleQueue()
            thread = threading.Thread(target=self._run, args=(q,), name="prg-hash", daemon=True)
            try:
                thread.start()
            except RuntimeError:  # pragma: no cover - no thread to be had: hash inline
                return
            self._queue, self._thread = q, thread

    def _run(self, q: queue.SimpleQueue[Any]) -> None:
        update = self._hasher.update
        try:
            while (chunk := q.get()) is not None:
                update(chunk)
        except BaseException as exc:  # pragma: no cover - xxhash raises on no buffer
            self._error = exc
            while q.get() is not None:  # drain, so that close() returns
                pass

    def update(self, chunk: Any) -> None:
        if self._queue is not None:
            self._queue.put(chunk)
        else:
            self._hasher.update(chunk)

    def close(self) -> None:
        if self._queue is not None:
            self._queue.put(None)
            self._thread.join()
            self._queue = None

    def hexdigest(self) -> str:
        self.close()
        if self._error is not None:  # pragma: no cover
            raise self._error
        return self._hasher.hexdigest()

    def __enter__(self) -> ChunkHasher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def format_error(path: Path, what: str) -> GoldenFormatError:
    """A GoldenFormatError naming ``path``, what is wrong with it, and the remedy."""
    return GoldenFormatError(f"{path}: {what}. Nothing was loaded from it; {REMEDY_UPDATE}.")


def read_bytes(path: Path) -> bytearray:
    """The whole file in one writable buffer."""
    try:
        with open(path, "rb", buffering=0) as f:
            return read_exact(path, f, bytearray(os.fstat(f.fileno()).st_size))
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise format_error(path, f"cannot be read ({exc})") from exc


def read_exact(path: Path, f: Any, buf: Any) -> Any:
    """Fill the writable buffer ``buf`` from the unbuffered file ``f``; return ``buf``."""
    view, got = memoryview(buf).cast("B"), 0
    while got < len(view):
        n = f.readinto(view[got:])
        if not n:
            raise format_error(path, f"shrank while being read ({got} of {len(view)} bytes)")
        got += n
    return buf


LFS_POINTER = b"version https://git-lfs.github.com/spec/"


def refuse_lfs_pointer(path: Path, buf: bytes | bytearray) -> None:
    """Raise :class:`GoldenNotFetchedError` if ``buf`` (a file's first bytes, at least
    ``len(LFS_POINTER)`` of them) is a Git LFS pointer standing in for the file."""
    if bytes(buf[: len(LFS_POINTER)]) == LFS_POINTER:
        raise GoldenNotFetchedError(
            f"{path}: is a Git LFS pointer, not the file it stands for: this clone has not "
            "fetched the golden's LFS objects. Nothing was loaded from it; run `git lfs pull` "
            "(not `pytest --update-golden`, which would record over the real golden)"
        )


ZIP_MAGIC = b"PK\x03\x04"
# torch.save's legacy (non-zip) format: a pickle of this number starts the file.
_TORCH_LEGACY_MAGIC = b"\x8a\x0a" + (0x1950A86A20F9469CFC6C).to_bytes(10, "little") + b"."
TORCH_SAVE_HEAD = 24  # bytes :func:`torch_save_format` needs to tell the formats apart


def torch_save_format(buf: bytes | bytearray) -> str | None:
    """``"zip"`` or ``"legacy"`` if a file starting with ``buf`` is a torch.save file, else None.

    ``torch.save(..., _use_new_zipfile_serialization=False)`` writes a pickle
    stream whose first pickle is torch's magic number; ``torch.load`` reads both.
    """
    buf = bytes(buf[:TORCH_SAVE_HEAD])
    if buf.startswith(ZIP_MAGIC):
        return "zip"
    if not is_pickle(buf):
        return None
    body = buf[2:]
    if body[:1] == b"\x95":  # protocol 4+: a FRAME opcode and its 8-byte length first
        body = body[9:]
    return "legacy" if body.startswith(_TORCH_LEGACY_MAGIC) else None


def is_pickle(buf: bytes | bytearray) -> bool:
    """Whether a file starting with ``buf`` begins as a pickle of protocol 2 to 5 does."""
    return buf[:1] == b"\x80" and len(buf) > 1 and 2 <= buf[1] <= 5


def foreign_format(buf: bytes | bytearray) -> str | None:
    """What a file starting with ``buf`` is if a pickle, zip, legacy torch.save or .npy, else None.

    The answer is worded to follow the file's name in an error. Magic bytes can
    also begin a valid file (a safetensors header of 640 bytes starts ``80 02``,
    like a protocol-2 pickle), so a reader that can parse its own format asks
    this only about a file that did not parse.
    """
    if torch_save_format(buf) == "legacy":
        return "is a legacy torch.save file, not a safetensors golden; it was not deserialized"
    if is_pickle(buf):
        return (
            "is a pickle file, not a safetensors golden; it was not unpickled "
            "(unpickling runs code stored in the file)"
        )
    for magic, what in _FOREIGN_MAGIC:
        if buf.startswith(magic):
            return f"is {what}, not a safetensors golden; it was not deserialized"
    return None


def sniff_foreign(path: Path, buf: bytearray) -> None:
    """Refuse, by its first bytes, a pickle, zip or ``.npy`` file; it is never deserialized."""
    what = foreign_format(buf)
    if what is not None:
        raise format_error(path, what)
