"""Unit tests of how a batch file is read: in chunks, straight into each tensor's memory, each
chunk hashed as soon as it is read (on a helper thread for large files).

Whatever the chunking, every byte is verified before anything is returned: a damaged byte
anywhere (mid-chunk, last chunk, either side of a chunk boundary, a tensor boundary) is a
GoldenFormatError naming the file, a file cut short or shrinking while read is refused, and
every dtype comes back bit for bit. Each test runs with the checksum on the calling thread and
on the helper thread; most use a small chunk so that tensors span many chunks cheaply.
"""

from __future__ import annotations

import json
import math
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import safetensors.torch
import torch

from pytest_rollout_golden import store
from pytest_rollout_golden.errors import GoldenFormatError
from pytest_rollout_golden.store import batchfile, disk

REMEDY = "--update-golden"
SMALL_CHUNK = 4096


@pytest.fixture(params=["inline", "helper thread"])
def hashing(request, monkeypatch) -> str:
    """Checksum on the calling thread, or on the helper thread even for small files."""
    monkeypatch.setattr(batchfile, "HASH_THREAD_MIN", 1 << 62 if request.param == "inline" else 0)
    idle_cpu(monkeypatch)  # a one-core or busy CI runner still gets the thread
    return request.param


def idle_cpu(monkeypatch, idle: bool = True) -> None:
    monkeypatch.setattr(disk, "_cpus", lambda: 2)
    monkeypatch.setattr(disk, "_runnable", lambda: 1 if idle else 2)


@pytest.fixture
def small_chunks(monkeypatch) -> int:
    monkeypatch.setattr(batchfile, "READ_CHUNK", SMALL_CHUNK)
    return SMALL_CHUNK


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def random_tensor(dtype: torch.dtype, shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    nbytes = math.prod(shape) * dtype.itemsize
    raw = torch.randint(0, 256, (nbytes,), generator=g, dtype=torch.uint8)
    return raw.view(dtype).reshape(shape)


def data_start(path: Path) -> int:
    with open(path, "rb") as f:
        return 8 + int.from_bytes(f.read(8), "little")


def tensor_span(path: Path, name: str) -> tuple[int, int]:
    """File offsets ``[begin, end)`` of the bytes of tensor ``name``."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    begin, end = header[name]["data_offsets"]
    return 8 + n + begin, 8 + n + end


def flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x40
    path.write_bytes(bytes(data))


def no_helper_thread_left() -> bool:
    return not [t for t in threading.enumerate() if t.name == "prg-hash"]


def assert_refused(path: Path, match: str) -> None:
    with pytest.raises(GoldenFormatError, match=match) as exc:
        store.load_batch(path)
    assert str(path) in str(exc.value) and REMEDY in str(exc.value)
    assert no_helper_thread_left()


# --------------------------------------------------------------------------- damaged bytes


def _big_batch(path: Path, chunk: int) -> dict[str, torch.Tensor]:
    """A batch whose largest tensor spans several chunks and ends in a partial one."""
    batch = {
        "big": random_tensor(torch.float32, (5 * chunk // 4 + 3,)),  # 5 chunks and 12 bytes
        "ids": random_tensor(torch.int64, (3, 7), seed=1),
        "bf16": random_tensor(torch.bfloat16, (chunk + 1,), seed=2),
        "mask": random_tensor(torch.bool, (11,), seed=3),
    }
    store.save_batch(path, batch)
    return batch


def _where(path: Path, name: str, chunk: int, at: str) -> int:
    begin, end = tensor_span(path, name)
    return {
        "first byte": begin,
        "middle": (begin + end) // 2,
        "last byte of a chunk": begin + 2 * chunk - 1,
        "first byte of a chunk": begin + 2 * chunk,
        "last chunk": end - 5,
        "last byte": end - 1,
    }[at]


POSITIONS = [
    "first byte",
    "middle",
    "last byte of a chunk",
    "first byte of a chunk",
    "last chunk",
    "last byte",
]


@pytest.mark.parametrize("at", POSITIONS)
def test_a_damaged_byte_of_a_tensor_spanning_chunks_is_detected(
    tmp_path, hashing, small_chunks, at
):
    path = tmp_path / "batch.safetensors"
    _big_batch(path, small_chunks)
    flip_byte(path, _where(path, "big", small_chunks, at))
    assert_refused(path, "checksum does not match")


@pytest.mark.parametrize("name", ["ids", "bf16", "mask"])
def test_a_damaged_byte_of_any_other_tensor_is_detected(tmp_path, hashing, small_chunks, name):
    path = tmp_path / "batch.safetensors"
    _big_batch(path, small_chunks)
    begin, end = tensor_span(path, name)
    for offset in sorted({begin, (begin + end) // 2, end - 1}):
        damaged = tmp_path / f"damaged-{offset}.safetensors"
        damaged.write_bytes(path.read_bytes())
        flip_byte(damaged, offset)
        assert_refused(damaged, "checksum does not match")


@pytest.mark.parametrize(
    "at", ["middle", "last byte of a chunk", "first byte of a chunk", "last chunk"]
)
def test_damage_is_detected_with_the_real_chunk_size(tmp_path, hashing, at):
    """Megabyte chunks, a tensor of more than two of them."""
    chunk = disk.READ_CHUNK
    path = tmp_path / "batch.safetensors"
    store.save_batch(path, {"big": random_tensor(torch.uint8, (2 * chunk + chunk // 2,))})
    flip_byte(path, _where(path, "big", chunk, at))
    assert_refused(path, "checksum does not match")


def test_damage_is_detected_by_read_safetensors_too(tmp_path, hashing, small_chunks):
    path = tmp_path / "batch.safetensors"
    _big_batch(path, small_chunks)
    flip_byte(path, _where(path, "big", small_chunks, "middle"))
    for want in ("torch", "numpy"):
        with pytest.raises(GoldenFormatError, match="checksum does not match") as exc:
            store.read_safetensors(path, want=want)
        assert str(path) in str(exc.value)


def test_a_file_that_lost_its_checksum_is_refused(tmp_path, hashing, small_chunks):
    path = tmp_path / "batch.safetensors"
    _big_batch(path, small_chunks)
    raw = path.read_bytes()
    # Same length, so every offset stays valid: only the digest's key is damaged.
    path.write_bytes(raw.replace(b'"prg.digest"', b'"prg.digesT"', 1))
    assert_refused(path, "lost the checksum")


def test_the_manifest_digest_is_still_checked(tmp_path, hashing, small_chunks):
    path = tmp_path / "batch.safetensors"
    digest = store.save_batch(path, {"big": random_tensor(torch.float32, (3 * small_chunks,))})
    assert batchfile.read_safetensors(path, expect_digest=digest)[0]["big"].numel()
    with pytest.raises(GoldenFormatError, match="checksum mismatch") as exc:
        batchfile.read_safetensors(path, expect_digest="0" * 32)
    assert str(path) in str(exc.value)


# --------------------------------------------------------------------------- short files


@pytest.mark.parametrize("keep", ["header only", "mid chunk", "chunk boundary", "one byte short"])
def test_a_truncated_file_is_refused(tmp_path, hashing, small_chunks, keep):
    path = tmp_path / "batch.safetensors"
    _big_batch(path, small_chunks)
    raw = path.read_bytes()
    begin, _ = tensor_span(path, "big")
    size = {
        "header only": data_start(path),
        "mid chunk": begin + small_chunks // 2,
        "chunk boundary": begin + 2 * small_chunks,
        "one byte short": len(raw) - 1,
    }[keep]
    path.write_bytes(raw[:size])
    assert_refused(path, "truncated")


def test_a_file_shrinking_while_read_is_refused(tmp_path, hashing, small_chunks, monkeypatch):
    """Cut short after its size was taken: the read comes up short, never a crash or a hang."""
    path = tmp_path / "batch.safetensors"
    _big_batch(path, small_chunks)
    begin, _ = tensor_span(path, "big")
    real = batchfile.new_hasher

    def hasher_that_truncates(first: Any = b"") -> Any:
        with open(path, "r+b") as f:  # as the header is verified, before the data is read
            f.truncate(begin + small_chunks + 10)
        return real(first)

    monkeypatch.setattr(batchfile, "new_hasher", hasher_that_truncates)
    assert_refused(path, "shrank while being read")


# --------------------------------------------------------------------------- round trips


DTYPES = [
    torch.bfloat16, torch.bool, torch.int64, torch.float32, torch.float16, torch.float64,
    torch.float8_e4m3fn, torch.complex64, torch.uint8, torch.int8, torch.int32, torch.uint16,
]  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_dtype_round_trips_bit_exactly_across_chunks(tmp_path, hashing, small_chunks, dtype):
    big = random_tensor(dtype, (3, small_chunks // dtype.itemsize + 5), seed=4)
    batch = {
        "big": big,
        "non_contiguous": random_tensor(dtype, (64, 80), seed=5).t()[::3],
        "exactly_one_chunk": random_tensor(dtype, (small_chunks // dtype.itemsize,), seed=6),
        "empty": torch.empty(4, 0, dtype=dtype),
        "scalar": random_tensor(dtype, (), seed=7),
        "odd": random_tensor(torch.int8, (7,), seed=8),  # shifts every later offset
    }
    path = tmp_path / "rt.safetensors"
    store.save_batch(path, batch)
    back = store.load_batch(path)
    for key, value in batch.items():
        assert back[key].dtype == value.dtype and back[key].shape == value.shape, key
        assert back[key].is_contiguous(), key
        assert torch.equal(bits(back[key]), bits(value)), key
    assert no_helper_thread_left()


def test_a_tensor_of_several_real_chunks_round_trips(tmp_path, hashing):
    chunk = disk.READ_CHUNK
    batch = {
        "bf16": random_tensor(torch.bfloat16, (3 * chunk // 2 + 1,)),  # 3 MiB and 2 bytes
        "ids": random_tensor(torch.int64, (chunk // 8 + 3,), seed=1),
        "mask": random_tensor(torch.bool, (1001,), seed=2),
    }
    path = tmp_path / "rt.safetensors"
    store.save_batch(path, batch)
    back = store.load_batch(path)
    for key, value in batch.items():
        assert torch.equal(bits(back[key]), bits(value)), key


def test_numpy_reads_round_trip_and_are_aligned(tmp_path, hashing, small_chunks):
    batch = {
        "f64": np.random.default_rng(0).standard_normal(3 * small_chunks // 8 + 1),
        "i8": np.arange(13, dtype=np.int8),
        "u16": np.arange(small_chunks + 1, dtype=np.uint16),
    }
    path = tmp_path / "np.safetensors"
    store.save_batch(path, batch)
    arrays, _ = store.read_safetensors(path, want="numpy")
    for key, value in batch.items():
        assert arrays[key].dtype == value.dtype and np.array_equal(arrays[key], value), key
        assert arrays[key].ctypes.data % arrays[key].dtype.itemsize == 0, key
    store.save_batch(path, {key: torch.from_numpy(value) for key, value in batch.items()})
    tensors, _ = store.read_safetensors(path)
    for key, value in batch.items():
        assert torch.equal(tensors[key], torch.from_numpy(value)), key
        assert tensors[key].data_ptr() % tensors[key].element_size() == 0, key


def test_tensors_get_their_own_memory(tmp_path, hashing, small_chunks):
    """One allocation per tensor: writing to one leaves the others (and the file) alone."""
    path = tmp_path / "x.safetensors"
    store.save_batch(path, {"a": torch.zeros(small_chunks), "b": torch.ones(small_chunks)})
    back = store.load_batch(path)
    back["a"] += 1
    assert back["b"].eq(1).all() and store.load_batch(path)["a"].eq(0).all()


def test_a_large_file_from_another_tool_loads_unhashed(tmp_path, hashing, small_chunks):
    path = tmp_path / "foreign.safetensors"
    tensors = {"w": torch.randn(3, small_chunks), "b": torch.zeros(5, dtype=torch.bfloat16)}
    safetensors.torch.save_file(tensors, path)
    back = store.load_batch(path)
    assert set(back) == {"w", "b"} and all(torch.equal(back[k], tensors[k]) for k in tensors)
    assert no_helper_thread_left()


def test_streamed_digest_is_the_digest_of_the_whole_file(tmp_path, hashing, small_chunks):
    """The checksum fed chunk by chunk equals the one-shot checksum written by save_batch."""
    path = tmp_path / "batch.safetensors"
    digest = store.save_batch(path, {"a": random_tensor(torch.float32, (5 * small_chunks,))})
    _, metadata = store.read_safetensors(path)
    assert metadata["prg.digest"] == digest


# --------------------------------------------------------------------------- the hasher


@pytest.mark.parametrize("threaded", [False, True])
def test_chunk_hasher_matches_the_one_shot_checksum(monkeypatch, threaded):
    idle_cpu(monkeypatch)
    data = np.random.default_rng(1).integers(0, 256, 100_003, dtype=np.uint8)
    view = memoryview(data)
    with disk.ChunkHasher(disk.new_hasher(b"head"), threaded=threaded) as feed:
        for start in range(0, len(view), 777):
            feed.update(view[start : start + 777])
        digest = feed.hexdigest()
    assert digest == store.checksum([b"head", data])
    assert no_helper_thread_left()


def test_chunk_hasher_stops_its_thread_on_an_error(monkeypatch):
    idle_cpu(monkeypatch)
    with (
        pytest.raises(RuntimeError, match="boom"),
        disk.ChunkHasher(disk.new_hasher(), threaded=True) as feed,
    ):
        feed.update(b"x" * 10)
        raise RuntimeError("boom")
    assert no_helper_thread_left()


@pytest.mark.parametrize("cpus, runnable", [(1, 1), (2, 2), (4, 9)])
def test_no_idle_cpu_hashes_inline(monkeypatch, cpus, runnable):
    """One CPU, or every CPU busy: a helper thread would wait for a core; hash inline."""
    monkeypatch.setattr(disk, "_cpus", lambda: cpus)
    monkeypatch.setattr(disk, "_runnable", lambda: runnable)
    with disk.ChunkHasher(disk.new_hasher(), threaded=True) as feed:
        feed.update(b"abc")
        assert no_helper_thread_left()
        assert feed.hexdigest() == store.checksum([b"abc"])


def test_runnable_threads_include_this_one():
    assert disk._runnable() >= 1


def test_large_files_are_hashed_on_the_helper_thread(tmp_path, monkeypatch):
    idle_cpu(monkeypatch)
    ran_on = []
    run = disk.ChunkHasher._run

    def recording_run(self: Any, q: Any) -> None:
        ran_on.append(threading.current_thread().name)
        run(self, q)

    monkeypatch.setattr(disk.ChunkHasher, "_run", recording_run)
    path = tmp_path / "big.safetensors"
    small = tmp_path / "small.safetensors"
    batch = {"a": random_tensor(torch.uint8, (batchfile.HASH_THREAD_MIN,))}
    store.save_batch(path, batch)
    store.save_batch(small, {"a": batch["a"][: batchfile.HASH_THREAD_MIN // 2]})
    assert torch.equal(store.load_batch(small)["a"], batch["a"][: batchfile.HASH_THREAD_MIN // 2])
    assert ran_on == []
    assert torch.equal(store.load_batch(path)["a"], batch["a"])
    assert ran_on == ["prg-hash"] and no_helper_thread_left()
