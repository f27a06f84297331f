"""Record and replay of a realistic rollout batch: this project's store against pickle and torch.

Every format is written once per size (timed over a few rounds), then loaded
warm from the page cache: one untimed load per candidate, then interleaved timed
rounds, median reported. The floor is a copy of the same number of bytes into a
fresh buffer, which is what any loader that hands out its own memory must pay.
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
from harness import Section, Target, interleaved, median, ms, table

from pytest_rollout_golden.store import load_batch, save_batch

FULL_SIZES = [(128, 4096), (128, 8192)]
QUICK_SIZES = [(16, 1024)]
TARGET_SPEEDUP = 5.0
TARGET_FLOOR_RATIO = 2.0


@dataclasses.dataclass
class DataProtoLike:
    """What verl and ROLL hand around, and what ROLL pickles."""

    batch: dict[str, torch.Tensor]
    non_tensor_batch: dict[str, np.ndarray]
    meta_info: dict[str, Any]


def make_batch(b: int, t: int, seed: int = 0) -> DataProtoLike:
    """A verl-shaped PPO batch of ``b`` sequences of ``t`` tokens, right half response."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(t // 4, t + 1, (b, 1), generator=g)
    attention_mask = (torch.arange(t) < lengths).to(torch.int64)
    response_mask = attention_mask.clone()
    response_mask[:, : t // 2] = 0

    def normal() -> torch.Tensor:
        return torch.randn(b, t, generator=g)

    old_log_probs = -normal().abs()
    batch = {
        "input_ids": torch.randint(0, 151_936, (b, t), generator=g) * attention_mask,
        "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
        "response_mask": response_mask,
        "old_log_probs": old_log_probs,
        "ref_log_prob": old_log_probs + 0.01 * normal(),
        "rollout_log_probs": old_log_probs + 0.001 * normal(),
        "advantages": normal() * response_mask,
        "token_level_rewards": torch.zeros(b, t).index_put_(
            (torch.arange(b), (lengths.squeeze(1) - 1)), torch.rand(b, generator=g)
        ),
        "hidden_states_bf16": normal().to(torch.bfloat16),
    }
    uids = np.array([f"uid-{seed}-{i // 8}" for i in range(b)], dtype=object)
    meta = {"global_steps": 7, "temperature": 1.0, "eos_token_id": [151643, 151645]}
    return DataProtoLike(batch, {"uid": uids}, meta)


def _fsynced_write(path: Path, write: Any) -> None:
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


def _fresh_copy_floors(nbytes: int) -> dict[str, Any]:
    src = bytearray(os.urandom(1 << 20) * (nbytes >> 20) + os.urandom(nbytes & ((1 << 20) - 1)))
    flat = torch.frombuffer(src, dtype=torch.uint8)
    warm = bytearray(nbytes)
    return {
        "memcpy: bytearray copy": lambda: bytearray(src),
        "memcpy: torch clone": flat.clone,
        "memcpy into a warm buffer (no page faults)": lambda: memoryview(warm).__setitem__(
            slice(None), src
        ),
    }


def _check_roundtrip(dp: DataProtoLike, ours: Any, pickled: Any, torched: Any) -> None:
    """Refuse to time a loader that does not give the batch back."""
    for key, value in dp.batch.items():
        for got in (ours.batch[key], pickled.batch[key], torched["batch"][key]):
            assert torch.equal(got, value), key
    assert list(ours.non_tensor_batch["uid"]) == list(dp.non_tensor_batch["uid"])
    assert type(ours) is DataProtoLike


def bench_size(b: int, t: int, tmp: Path, rounds: int) -> dict[str, Any]:
    dp = make_batch(b, t)
    paths = {name: tmp / f"{b}x{t}.{name}" for name in ("safetensors", "pkl", "pt")}
    record = {
        "pytest-rollout-golden": lambda: save_batch(paths["safetensors"], dp),
        "pickle (DataProto-like)": lambda: _fsynced_write(
            paths["pkl"], lambda f: f.write(pickle.dumps(dp))
        ),
        "torch.save": lambda: _fsynced_write(
            paths["pt"], lambda f: torch.save(_torch_payload(dp), f)
        ),
    }
    record_times = interleaved(record, max(2, rounds // 2), warmup=0)

    replay = {
        "pytest-rollout-golden": lambda: load_batch(paths["safetensors"]),
        "pickle (DataProto-like)": lambda: pickle.loads(paths["pkl"].read_bytes()),
        "torch.save": lambda: torch.load(paths["pt"], weights_only=True),
    }
    _check_roundtrip(dp, *(replay[name]() for name in replay))
    nbytes = sum(v.numel() * v.element_size() for v in dp.batch.values())
    floors = _fresh_copy_floors(nbytes)
    replay_times = interleaved({**replay, **floors}, rounds)
    return {
        "b": b,
        "t": t,
        "nbytes": nbytes,
        "sizes": {name: p.stat().st_size for name, p in paths.items()},
        "record": {k: median(v) for k, v in record_times.items()},
        "replay": {k: median(v) for k, v in replay_times.items()},
        "floors": list(floors),
    }


def run(quick: bool) -> Section:
    sizes = QUICK_SIZES if quick else FULL_SIZES
    rounds = 3 if quick else 9
    with tempfile.TemporaryDirectory(prefix="prg-bench-io-") as tmp:
        results = [bench_size(b, t, Path(tmp), rounds) for b, t in sizes]

    rows = []
    for res in results:
        files = dict(zip(res["record"], res["sizes"].values(), strict=True))
        ours = res["replay"]["pytest-rollout-golden"]
        for name, seconds in res["replay"].items():
            size = files.get(name, res["nbytes"])
            record = res["record"].get(name)
            rows.append([
                f"{res['b']}×{res['t']}",
                name,
                f"{size / 1e6:.1f}",
                ms(record) if record is not None else "",
                ms(seconds),
                f"{size / seconds / 1e9:.2f}",
                f"{seconds / ours:.2f}×",
            ])
    body = table(
        ["B×T", "format", "MB", "record ms", "replay ms", "replay GB/s", "time / ours"], rows
    )
    body += (
        f"\n\nWarm page cache: each file is written once, loaded once untimed, then {rounds}"
        " interleaved rounds; medians. Every record fsyncs its file (ours also renames it into"
        " place). Replay of ours includes the xxh3-128 integrity check of every byte."
        " `pickle` is `pickle.loads(file bytes)` of a DataProto-like dataclass (default protocol,"
        " as ROLL does); `torch.save` is `torch.load(weights_only=True)`."
    )
    return Section("Record and replay of a rollout batch", body, _targets(results[-1], quick))


def _targets(res: dict[str, Any], quick: bool) -> list[Target]:
    replay = res["replay"]
    ours = replay["pytest-rollout-golden"]
    floor_name = min(res["floors"][:2], key=replay.__getitem__)
    where = f"B×T = {res['b']}×{res['t']}" + (" (--quick)" if quick else "")
    targets = [
        Target(
            f"replay ≥ {TARGET_SPEEDUP:g}× faster than {name}, {where}",
            f"{replay[key] / ours:.2f}× ({ms(replay[key])} ms vs {ms(ours)} ms)",
            replay[key] / ours >= TARGET_SPEEDUP,
        )
        for name, key in (("pickle", "pickle (DataProto-like)"), ("torch.load", "torch.save"))
    ]
    targets.append(
        Target(
            f"replay within {TARGET_FLOOR_RATIO:g}× of a raw memory copy, {where}",
            f"{ours / replay[floor_name]:.2f}× ({ms(ours)} ms vs {ms(replay[floor_name])} ms,"
            f" {floor_name})",
            ours / replay[floor_name] <= TARGET_FLOOR_RATIO,
        )
    )
    return targets
