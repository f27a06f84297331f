"""Record and replay of a realistic rollout batch: this project's store against pickle and torch.

Every format is written a few times per size (interleaved, fsynced), then loaded
warm from the page cache: one untimed load per candidate, then interleaved timed
rounds, median reported. Raw copies of the same number of bytes are timed in the
same rounds; the fastest of them is the floor a loader is held against.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from harness import Samples, Section, Target, interleaved, ms, table

from pytest_rollout_golden.store import load_batch, save_batch

FULL_SIZES = [(128, 4096), (128, 8192)]
QUICK_SIZES = [(16, 1024)]
TARGET_SPEEDUP = 5.0
TARGET_FLOOR_RATIO = 2.0

OURS, PICKLE, TORCH = "pytest-rollout-golden", "pickle (DataProto-like)", "torch.save / torch.load"
SUFFIX = {OURS: "safetensors", PICKLE: "pkl", TORCH: "pt"}
MEMCPY = "memcpy"  # prefix of the raw-copy rows


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
    """Ways to copy ``nbytes`` in memory: into fresh memory, and into memory already mapped."""
    src = bytearray(os.urandom(nbytes))
    flat = torch.frombuffer(src, dtype=torch.uint8)
    warm = bytearray(nbytes)

    def copy_into_warm() -> None:
        memoryview(warm)[:] = src

    return {
        f"{MEMCPY}: bytearray copy": lambda: bytearray(src),
        f"{MEMCPY}: torch clone": flat.clone,
        f"{MEMCPY} into an existing buffer": copy_into_warm,
    }


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

    def floor(self) -> str:
        return min((k for k in self.replay if k.startswith(MEMCPY)), key=self.seconds)

    def seconds(self, name: str) -> float:
        return self.replay[name].median


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
        PICKLE: lambda: pickle.loads(paths[PICKLE].read_bytes()),
        TORCH: lambda: torch.load(paths[TORCH], weights_only=True),
    }
    _check(dp, {name: load() for name, load in loaders.items()})
    nbytes = sum(v.numel() * v.element_size() for v in dp.batch.values())
    replay = interleaved({**loaders, **_raw_copies(nbytes)}, rounds)
    sizes = {name: p.stat().st_size for name, p in paths.items()}
    return SizeResult(b, t, nbytes, sizes, record, replay)


def run(quick: bool) -> Section:
    rounds = 3 if quick else 9
    with tempfile.TemporaryDirectory(prefix="prg-bench-io-") as tmp:
        results = [
            bench_size(b, t, Path(tmp), rounds) for b, t in (QUICK_SIZES if quick else FULL_SIZES)
        ]

    rows = []
    for res in results:
        ours = res.seconds(OURS)
        for name, samples in res.replay.items():
            size = res.file_bytes.get(name, res.nbytes)
            record = res.record.get(name)
            rows.append(
                [
                    f"{res.b}×{res.t}",
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
        " includes the xxh3-128 check of every byte and rebuilds the DataProto-like class."
        " `pickle` is `pickle.loads` of the file's bytes (default protocol, as ROLL does);"
        " `torch.load` uses `weights_only=True` (uids as a list of str, since it refuses numpy"
        " object arrays). memcpy rows copy the tensor payload's size; `page faults` are minor"
        " faults per call: fresh memory from the kernel is paid per 4 KiB page."
    )
    return Section("Record and replay of a rollout batch", body, _targets(results[-1], quick))


def _targets(res: SizeResult, quick: bool) -> list[Target]:
    ours = res.seconds(OURS)
    where = f"B×T = {res.b}×{res.t}" + (" (--quick)" if quick else "")
    targets = [
        Target(
            f"replay ≥ {TARGET_SPEEDUP:g}× faster than {label}, {where}",
            f"{res.seconds(name) / ours:.2f}× ({ms(res.seconds(name))} vs {ms(ours)} ms)",
            res.seconds(name) / ours >= TARGET_SPEEDUP,
        )
        for label, name in (("pickle", PICKLE), ("torch.load", TORCH))
    ]
    floor = res.floor()
    targets.append(
        Target(
            f"replay within {TARGET_FLOOR_RATIO:g}× of a raw memory copy, {where}",
            f"{ours / res.seconds(floor):.2f}× ({ms(ours)} vs {ms(res.seconds(floor))} ms,"
            f" fastest copy: {floor})",
            ours / res.seconds(floor) <= TARGET_FLOOR_RATIO,
        )
    )
    return targets
