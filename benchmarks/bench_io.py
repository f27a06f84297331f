"""Record and replay of a realistic rollout batch: this project's store against pickle and torch.

Every format is written a few times per size (interleaved, fsynced), then loaded
warm from the page cache: one untimed load per candidate, then interleaved timed
rounds, median reported. Raw copies of the same number of bytes are timed in the
same rounds. Replay is held against ``torch.load`` and against a copy of the
payload into a buffer that already exists, as the median of the per-round ratios
(both candidates of a ratio ran in the same round).
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import statistics
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from harness import Samples, Section, Target, interleaved, ms, table

from pytest_rollout_golden.store import batchfile, load_batch, save_batch

FULL_SIZES = [(128, 4096), (128, 8192)]
QUICK_SIZES = [(16, 1024)]
TARGET_VS_PICKLE = 5.0  # replay at least this many times faster than pickle
TARGET_VS_TORCH_LOAD = 1.0  # replay time / torch.load time at most this
TARGET_VS_COPY = 1.25  # replay time / copy into an existing buffer at most this

OURS, PICKLE, TORCH = "pytest-rollout-golden", "pickle (DataProto-like)", "torch.save / torch.load"
OURS_INLINE = "pytest-rollout-golden, checksum on the calling thread"
SUFFIX = {OURS: "safetensors", PICKLE: "pkl", TORCH: "pt"}
MEMCPY = "memcpy"  # prefix of the raw-copy rows
COPY = f"{MEMCPY} into an existing buffer"
COPY_CHUNKED = f"{MEMCPY} into an existing buffer, 1 MiB at a time"
READ = "read() of our file into an existing buffer, no check"
SHORT = {  # names in the ratio table
    OURS: "replay",
    OURS_INLINE: "replay, checksum on the calling thread",
    TORCH: "torch.load",
    COPY: "copy into an existing buffer",
    COPY_CHUNKED: "same copy, 1 MiB at a time",
    READ: "read() of the file, no check",
}


@dataclasses.dataclass
class DataProtoLike:
    """What verl and ROLL hand around, and what ROLL pickles."""

    batch: dict[str, torch.Tensor]
    non_tensor_batch: dict[str, np.ndarray]
    meta_info: dict[str, Any]


def make_batch(b: int, t: int, seed: int = 0) -> DataProtoLike:
    """A verl-shaped PPO batch of ``b`` sequences of ``t`` tokens, second half response."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(t // 2 + 1, t + 1, (b, 1), generator=g)
    attention_mask = (torch.arange(t) < lengths).to(torch.int64)
    response_mask = attention_mask.clone()
    response_mask[:, : t // 2] = 0

    def normal() -> torch.Tensor:
        return torch.randn(b, t, generator=g)

    old_log_probs = -normal().abs() * response_mask
    rewards = torch.zeros(b, t)
    rewards[torch.arange(b), lengths.squeeze(1) - 1] = torch.rand(b, generator=g)
    batch = {
        "input_ids": torch.randint(0, 151_936, (b, t), generator=g) * attention_mask,
        "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
        "response_mask": response_mask,
        "old_log_probs": old_log_probs,
        "ref_log_prob": old_log_probs + 0.01 * normal(),
        "rollout_log_probs": old_log_probs + 0.001 * normal(),
        "advantages": normal() * response_mask,
        "token_level_rewards": rewards,
        "entropys_bf16": normal().abs().to(torch.bfloat16),
    }
    uids = np.array([f"uid-{seed}-{i // 8}" for i in range(b)], dtype=object)
    meta = {"global_steps": 7, "temperature": 1.0, "eos_token_id": [151643, 151645]}
    return DataProtoLike(batch, {"uid": uids}, meta)


def _write_fsynced(path: Path, write: Any) -> None:
    with open(path, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())


def _torch_payload(dp: DataProtoLike) -> dict[str, Any]:
    # weights_only=True refuses numpy object arrays: the uids travel as a list of str.
    return {
        "batch": dp.batch,
        "non_tensor_batch": {k: v.tolist() for k, v in dp.non_tensor_batch.items()},
        "meta_info": dp.meta_info,
    }


def _raw_copies(nbytes: int) -> dict[str, Any]:
    """Ways to copy ``nbytes`` in memory: into fresh memory, and into memory already mapped.

    One large copy into existing memory streams past the caches (glibc's memcpy uses
    non-temporal stores past a few MiB); the same copy 1 MiB at a time keeps each
    piece in cache for whoever reads it next, as a loader that checks what it copied
    must.
    """
    src = bytearray(os.urandom(nbytes))
    flat = torch.frombuffer(src, dtype=torch.uint8)
    warm = bytearray(nbytes)

    def copy_into_warm() -> None:
        memoryview(warm)[:] = src

    def copy_into_warm_chunked() -> None:
        to, of = memoryview(warm), memoryview(src)
        for start in range(0, nbytes, 1 << 20):
            to[start : start + (1 << 20)] = of[start : start + (1 << 20)]

    return {
        f"{MEMCPY}: bytearray copy": lambda: bytearray(src),
        f"{MEMCPY}: torch clone": flat.clone,
        COPY: copy_into_warm,
        COPY_CHUNKED: copy_into_warm_chunked,
    }


def _read_into_warm(path: Path) -> Any:
    """A read of the whole file into memory already mapped, 1 MiB at a time, nothing checked:
    the kernel's copy from the page cache, which any loader that reads the file pays."""
    warm = bytearray(path.stat().st_size)

    def read() -> None:
        view = memoryview(warm)
        with open(path, "rb", buffering=0) as f:
            for start in range(0, len(view), 1 << 20):
                f.readinto(view[start : start + (1 << 20)])

    return read


@contextmanager
def _checksum_inline() -> Iterator[None]:
    """Load with the checksum on the calling thread, as small files are: one core in all."""
    saved = batchfile.HASH_THREAD_MIN
    batchfile.HASH_THREAD_MIN = 1 << 62
    try:
        yield
    finally:
        batchfile.HASH_THREAD_MIN = saved


def _load_inline(path: Path) -> Any:
    with _checksum_inline():
        return load_batch(path)


def _check(dp: DataProtoLike, loaded: dict[str, Any]) -> None:
    """Refuse to time a loader that does not give the batch back."""
    assert type(loaded[OURS]) is DataProtoLike
    assert list(loaded[OURS].non_tensor_batch["uid"]) == list(dp.non_tensor_batch["uid"])
    for key, value in dp.batch.items():
        got = [loaded[OURS].batch[key], loaded[PICKLE].batch[key], loaded[TORCH]["batch"][key]]
        assert all(torch.equal(g, value) for g in got), key


@dataclasses.dataclass
class SizeResult:
    b: int
    t: int
    nbytes: int  # tensor payload
    file_bytes: dict[str, int]
    record: dict[str, Samples]
    replay: dict[str, Samples]

    def seconds(self, name: str) -> float:
        return self.replay[name].median

    def ratio(self, name: str, other: str) -> float:
        """Median over rounds of ``name``'s time / ``other``'s time in the same round."""
        pairs = zip(self.replay[name].seconds, self.replay[other].seconds, strict=True)
        return statistics.median(a / b for a, b in pairs)

    @property
    def label(self) -> str:
        return f"{self.b}×{self.t}"


def bench_size(b: int, t: int, tmp: Path, rounds: int) -> SizeResult:
    dp = make_batch(b, t)
    paths = {name: tmp / f"{b}x{t}.{suffix}" for name, suffix in SUFFIX.items()}
    writers = {
        OURS: lambda: save_batch(paths[OURS], dp),
        PICKLE: lambda: _write_fsynced(paths[PICKLE], lambda f: f.write(pickle.dumps(dp))),
        TORCH: lambda: _write_fsynced(paths[TORCH], lambda f: torch.save(_torch_payload(dp), f)),
    }
    record = interleaved(writers, max(2, rounds // 3), warmup=0)
    loaders = {
        OURS: lambda: load_batch(paths[OURS]),
        OURS_INLINE: lambda: _load_inline(paths[OURS]),
        PICKLE: lambda: pickle.loads(paths[PICKLE].read_bytes()),
        TORCH: lambda: torch.load(paths[TORCH], weights_only=True),
    }
    _check(dp, {name: load() for name, load in loaders.items()})
    with _checksum_inline():
        _check(dp, {name: load() for name, load in loaders.items()})
    nbytes = sum(v.numel() * v.element_size() for v in dp.batch.values())
    others = {**_raw_copies(nbytes), READ: _read_into_warm(paths[OURS])}
    replay = interleaved({**loaders, **others}, rounds)
    sizes = {name: p.stat().st_size for name, p in paths.items()}
    return SizeResult(b, t, nbytes, sizes, record, replay)


def run(quick: bool) -> Section:
    rounds = 3 if quick else 15
    with tempfile.TemporaryDirectory(prefix="prg-bench-io-") as tmp:
        results = [
            bench_size(b, t, Path(tmp), rounds) for b, t in (QUICK_SIZES if quick else FULL_SIZES)
        ]

    rows = []
    for res in results:
        ours = res.seconds(OURS)
        for name, samples in res.replay.items():
            size = res.file_bytes.get(name, res.file_bytes[OURS] if name == READ else res.nbytes)
            record = res.record.get(name)
            rows.append(
                [
                    res.label,
                    name,
                    f"{size / 1e6:.1f}",
                    ms(record.median) if record else "",
                    ms(samples.median),
                    f"{size / samples.median / 1e9:.2f}",
                    f"{samples.median / ours:.2f}",
                    samples.median_faults,
                ]
            )
    header = [
        "B×T",
        "format",
        "MB",
        "record ms",
        "replay ms",
        "replay GB/s",
        "replay time / ours",
        "page faults",
    ]
    body = table(header, rows) + (
        f"\n\nWarm page cache: every file is written, then loaded once untimed; {rounds}"
        f" interleaved rounds follow, medians shown (records: {max(2, rounds // 3)} rounds)."
        " Every record fsyncs its file (ours also renames it into place). Replay of ours"
        " includes the xxh3-128 check of every byte and rebuilds the DataProto-like class; it"
        " reads 1 MiB at a time straight into each tensor and hashes each piece as soon as it"
        " is read, on a helper thread for files of 8 MiB or more (the second row: the same on"
        " the calling thread alone). `pickle` is `pickle.loads` of the file's bytes (default"
        " protocol, as ROLL does); `torch.load` uses `weights_only=True` (uids as a list of str,"
        " since it refuses numpy object arrays). memcpy rows copy the tensor payload's size;"
        " the read() row reads our file into a buffer that exists, checking nothing; `page"
        " faults` are minor faults per call: fresh memory from the kernel is paid per 4 KiB"
        " page."
    )
    body += "\n\n" + _ratio_table(results, quick)
    return Section("Record and replay of a rollout batch", body, _targets(results, quick))


def _ratio_rows(res: SizeResult) -> list[tuple[str, str, float, float | None]]:
    """(what, of what, ratio, target or None) of one size."""
    return [
        (OURS, TORCH, res.ratio(OURS, TORCH), TARGET_VS_TORCH_LOAD),
        (OURS, COPY, res.ratio(OURS, COPY), TARGET_VS_COPY),
        (OURS_INLINE, TORCH, res.ratio(OURS_INLINE, TORCH), None),
        (OURS_INLINE, COPY, res.ratio(OURS_INLINE, COPY), None),
        (READ, COPY, res.ratio(READ, COPY), None),
        (COPY_CHUNKED, COPY, res.ratio(COPY_CHUNKED, COPY), None),
    ]


def _ratio_table(results: list[SizeResult], quick: bool) -> str:
    rows = []
    for res in results:
        for name, other, ratio, target in _ratio_rows(res):
            verdict = "" if target is None else ("pass" if ratio <= target else "**FAIL**")
            limit = "" if target is None else f"≤ {target:g}"
            rows.append(
                [res.label, f"{SHORT[name]} / {SHORT[other]}", f"{ratio:.2f}", limit, verdict]
            )
    note = (
        "Each ratio is the median over the rounds of the two times measured in the same round."
        " The targets: replay never slower than `torch.load`, and within"
        f" {TARGET_VS_COPY:g}× of a copy of the payload into a buffer that already exists,"
        " every byte verified. The rows without a target say where the time goes: the"
        " kernel's copy out of the page cache (`read()`, nothing checked) and a copy made 1 MiB"
        " at a time, in cache for a check, against one streaming copy."
    )
    return table(["B×T", "ratio of times", "measured", "target", "verdict"], rows) + f"\n\n{note}"


def _targets(results: list[SizeResult], quick: bool) -> list[Target]:
    targets = []
    last = results[-1]
    where = f"B×T = {last.label}" + (" (--quick)" if quick else "")
    ours = last.seconds(OURS)
    targets.append(
        Target(
            f"replay ≥ {TARGET_VS_PICKLE:g}× faster than pickle, {where}",
            f"{last.seconds(PICKLE) / ours:.2f}× ({ms(last.seconds(PICKLE))} vs {ms(ours)} ms)",
            last.seconds(PICKLE) / ours >= TARGET_VS_PICKLE,
        )
    )
    for res in results:
        where = f"B×T = {res.label}" + (" (--quick)" if quick else "")
        for other, limit, label in (
            (TORCH, TARGET_VS_TORCH_LOAD, "torch.load"),
            (COPY, TARGET_VS_COPY, "a copy into an existing buffer"),
        ):
            ratio = res.ratio(OURS, other)
            targets.append(
                Target(
                    f"replay time ≤ {limit:g}× {label}, {where}",
                    f"{ratio:.2f}× ({ms(res.seconds(OURS))} vs {ms(res.seconds(other))} ms)",
                    ratio <= limit,
                )
            )
    return targets
