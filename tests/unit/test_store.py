"""Unit tests of the store package: hostile files, corruption, round trips of every value a
batch holds, refused values, DataProto-like batches, crashes mid-commit.

A golden gate must never run code from a file, never load a damaged file
silently, say which file is wrong and what to do, give back exactly what was
recorded, and never lose the previous golden when a commit is interrupted.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import os
import pickle
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import safetensors.numpy
import safetensors.torch
import torch

from pytest_rollout_golden import store
from pytest_rollout_golden.errors import GoldenFormatError, UnsupportedValueError
from pytest_rollout_golden.store import codec, location

REMEDY = "--update-golden"


def assert_names_file_and_remedy(exc: pytest.ExceptionInfo[BaseException], path: Path) -> None:
    message = str(exc.value)
    assert str(path) in message, message
    assert REMEDY in message, message


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bytes of a tensor, so NaN payloads, -0.0 and padding compare exactly."""
    return t.contiguous().reshape(-1).view(torch.uint8)


# --------------------------------------------------------------------------- code execution


class Payload:
    """Unpickling this creates ``marker``: the proof that a loader ran code from a file."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.marker, "w"))


def _torch_save(obj: Any, *, zip_format: bool) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf, _use_new_zipfile_serialization=zip_format)
    return buf.getvalue()


def _np_save(obj: Any) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.array([obj], dtype=object), allow_pickle=True)
    return buf.getvalue()


HOSTILE = {
    **{
        f"pickle-protocol-{p}": lambda m, p=p: pickle.dumps(Payload(m), protocol=p)
        for p in range(pickle.HIGHEST_PROTOCOL + 1)
    },
    "torch.save-zip": lambda m: _torch_save(Payload(m), zip_format=True),
    "torch.save-legacy": lambda m: _torch_save(Payload(m), zip_format=False),
    "numpy-object-npy": lambda m: _np_save(Payload(m)),
}


@pytest.mark.parametrize("kind", HOSTILE)
def test_hostile_file_in_place_of_a_batch_is_refused_without_running_it(tmp_path, kind):
    marker = tmp_path / "pwned"
    golden = tmp_path / "golden" / "rollout-rollout-step000000.safetensors"
    golden.parent.mkdir()
    golden.write_bytes(HOSTILE[kind](marker))

    with pytest.raises(GoldenFormatError) as exc:
        store.load_batch(golden)
    assert_names_file_and_remedy(exc, golden)
    assert not marker.exists(), "loading a golden ran code from the file"


@pytest.mark.parametrize("kind", ["pickle-protocol-2", "pickle-protocol-5", "torch.save-zip"])
def test_hostile_payloads_are_live(tmp_path, kind):
    """Control: the payloads above do run code when a trusting loader opens them."""
    marker = tmp_path / "pwned"
    data = HOSTILE[kind](marker)
    if kind.startswith("pickle"):
        pickle.loads(data)
    else:
        torch.load(io.BytesIO(data), weights_only=False)
    assert marker.exists()


@pytest.mark.parametrize("kind", ["pickle-protocol-4", "torch.save-zip", "numpy-object-npy"])
@pytest.mark.parametrize("filename", ["manifest.json", "metrics.json"])
def test_hostile_file_in_place_of_json_is_refused(tmp_path, kind, filename):
    marker = tmp_path / "pwned"
    (tmp_path / filename).write_bytes(HOSTILE[kind](marker))
    with pytest.raises(GoldenFormatError) as exc:
        if filename == "manifest.json":
            store.read_manifest(tmp_path)
        else:
            store.read_json(tmp_path / filename)
    assert_names_file_and_remedy(exc, tmp_path / filename)
    assert "not" in str(exc.value)  # "is a pickle file, not ...", "is a zip archive ..."
    assert not marker.exists()


# --------------------------------------------------------------------------- corruption


@pytest.fixture
def small_golden(tmp_path) -> Path:
    path = tmp_path / "batch.safetensors"
    store.save_batch(
        path,
        {
            "log_probs": torch.linspace(-3, 0, 8),
            "ids": torch.arange(4, dtype=torch.int64),
            "meta": {"step": 3, "uid": ["a", "b"]},
        },
    )
    return path


def _header_end(data: bytes) -> int:
    return 8 + int.from_bytes(data[:8], "little")


def _flip(path: Path, original: bytes, bit: int) -> None:
    data = bytearray(original)
    data[bit // 8] ^= 1 << (bit % 8)
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("region", ["length prefix", "header", "data"])
def test_every_single_bit_flip_is_detected(small_golden, region):
    original = small_golden.read_bytes()
    end = _header_end(original)
    span = {"length prefix": (0, 8), "header": (8, end), "data": (end, len(original))}[region]
    damaged = small_golden.with_name("damaged.safetensors")
    loaded_anyway = []
    for bit in range(span[0] * 8, span[1] * 8):
        _flip(damaged, original, bit)
        try:
            store.load_batch(damaged)
        except GoldenFormatError as exc:
            message = str(exc)
            assert str(damaged) in message and REMEDY in message, message
        else:
            loaded_anyway.append(bit)
    assert not loaded_anyway, f"bit flips at bits {loaded_anyway[:10]} loaded without an error"


def test_every_truncation_is_detected(small_golden):
    original = small_golden.read_bytes()
    cut = small_golden.with_name("cut.safetensors")
    for size in range(len(original)):
        cut.write_bytes(original[:size])
        with pytest.raises(GoldenFormatError) as exc:
            store.load_batch(cut)
        assert_names_file_and_remedy(exc, cut)
    assert "truncated" in str(exc.value)


def test_trailing_garbage_is_detected(small_golden):
    small_golden.write_bytes(small_golden.read_bytes() + b"\0" * 8)
    with pytest.raises(GoldenFormatError, match="trailing bytes") as exc:
        store.load_batch(small_golden)
    assert_names_file_and_remedy(exc, small_golden)


def test_empty_and_tiny_files(tmp_path):
    for content in (b"", b"\x00", b"{}", b"\x08\x00\x00\x00\x00\x00\x00\x00{}      "):
        path = tmp_path / "x.safetensors"
        path.write_bytes(content)
        if content.endswith(b"      "):  # a valid, empty safetensors file: no tensors at all
            assert store.load_batch(path) == {}
            continue
        with pytest.raises(GoldenFormatError) as exc:
            store.load_batch(path)
        assert_names_file_and_remedy(exc, path)


def test_header_claiming_huge_tensor_fails_before_allocating(tmp_path):
    header = {"x": {"dtype": "F32", "shape": [1 << 40], "data_offsets": [0, 1 << 42]}}
    blob = json.dumps(header).encode()
    path = tmp_path / "huge.safetensors"
    path.write_bytes(len(blob).to_bytes(8, "little") + blob + b"\0" * 16)
    with pytest.raises(GoldenFormatError, match="truncated") as exc:
        store.load_batch(path)
    assert_names_file_and_remedy(exc, path)


def test_digest_listed_in_manifest_must_match(small_golden):
    digest = store.save_batch(small_golden, {"x": torch.ones(2)})
    assert store.load_batch(small_golden, expect_digest=digest)["x"].tolist() == [1.0, 1.0]
    with pytest.raises(GoldenFormatError, match=r"manifest\.json") as exc:
        store.load_batch(small_golden, expect_digest="0" * 32)
    assert_names_file_and_remedy(exc, small_golden)


def test_self_consistent_rewrite_is_caught_by_the_manifest(tmp_path):
    """Someone re-saves a batch file by hand: its own checksum is fine, the manifest's is not."""
    path = tmp_path / "batch.safetensors"
    recorded = store.save_batch(path, {"x": torch.zeros(3)})
    store.save_batch(path, {"x": torch.ones(3)})
    with pytest.raises(GoldenFormatError, match="differs from the file listed") as exc:
        store.load_batch(path, expect_digest=recorded)
    assert_names_file_and_remedy(exc, path)


def test_json_edited_by_hand_is_caught(tmp_path):
    path = tmp_path / "metrics.json"
    data = store.encode_json({"steps": {"0": {"pg_loss": 0.5}}})
    path.write_bytes(data)
    digest = store.json_digest(data)
    assert store.read_json(path, expect_digest=digest) == {"steps": {"0": {"pg_loss": 0.5}}}
    path.write_bytes(data.replace(b"0.5", b"0.6"))
    with pytest.raises(GoldenFormatError, match="checksum") as exc:
        store.read_json(path, expect_digest=digest)
    assert_names_file_and_remedy(exc, path)


def _write_manifest(directory: Path, content: Any) -> Path:
    path = directory / location.MANIFEST
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ({"files": {}}, "not a pytest-rollout-golden manifest"),
        ([1, 2, 3], "not a pytest-rollout-golden manifest"),
        ({"format": "something-else", "schema": 1, "files": {}}, "not a pytest-rollout-golden"),
        ({"format": store.FORMAT, "schema": store.SCHEMA}, "no file table"),
        ({"format": store.FORMAT, "schema": store.SCHEMA, "files": []}, "no file table"),
        ('{"format": "pytest-rollout-golden", ', "not valid JSON"),
        ("\udcff".encode("utf-8", "surrogatepass").decode("latin-1"), "not valid JSON"),
    ],
)
def test_manifest_that_is_not_ours(tmp_path, content, match):
    path = _write_manifest(tmp_path, content)
    with pytest.raises(GoldenFormatError, match=match) as exc:
        store.read_manifest(tmp_path)
    assert_names_file_and_remedy(exc, path)


@pytest.mark.parametrize("schema", [0, store.SCHEMA + 1, "1", None])
def test_manifest_of_unknown_schema(tmp_path, schema):
    path = _write_manifest(tmp_path, {"format": store.FORMAT, "schema": schema, "files": {}})
    with pytest.raises(GoldenFormatError, match="schema version") as exc:
        store.read_manifest(tmp_path)
    assert_names_file_and_remedy(exc, path)
    assert "upgrade" in str(exc.value)


def test_missing_manifest_means_no_golden(tmp_path):
    assert store.read_manifest(tmp_path) is None


# --------------------------------------------------------------------------- round trips

RANDOM_BYTES_DTYPES = [
    torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn,
    torch.float8_e5m2, torch.complex64, torch.int64, torch.int32, torch.int16, torch.int8,
    torch.uint8, torch.uint16, torch.uint32, torch.uint64,
]  # fmt: skip


def _random_tensor(dtype: torch.dtype, shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    """Every bit pattern is fair game: NaN payloads, -0.0, infinities, subnormals."""
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    nbytes = math.prod(shape) * dtype.itemsize
    return (
        torch.randint(0, 256, (nbytes,), generator=g, dtype=torch.uint8).view(dtype).reshape(shape)
    )


def roundtrip(tmp_path: Path, value: Any) -> Any:
    path = tmp_path / "rt.safetensors"
    store.save_batch(path, value)
    return store.load_batch(path)


def test_store_covers_every_safetensors_dtype():
    """The list above is the store's whole dtype table (bool is tested on its own)."""
    names = {f"torch.{torch_name}" for torch_name, _, _ in store.DTYPES.values()}
    assert names == {str(d) for d in RANDOM_BYTES_DTYPES} | {"torch.bool"}


@pytest.mark.parametrize("dtype", [*RANDOM_BYTES_DTYPES, torch.bool], ids=str)
@pytest.mark.parametrize("shape", [(3, 5), (), (0,), (4, 0), (2, 3, 4)], ids=str)
def test_tensors_roundtrip_bit_exactly(tmp_path, dtype, shape):
    tensor = _random_tensor(dtype, shape)
    back = roundtrip(tmp_path, {"t": tensor})["t"]
    assert isinstance(back, torch.Tensor)
    assert back.dtype == dtype and back.shape == tensor.shape
    assert torch.equal(bits(back), bits(tensor))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e5m2, torch.complex64, torch.int64])
def test_non_contiguous_tensors_roundtrip(tmp_path, dtype):
    base = _random_tensor(dtype, (6, 8), seed=1)
    views = {"transposed": base.t(), "strided": base[::2, 1::3], "expanded": base[:1].expand(4, 8)}
    back = roundtrip(tmp_path, views)
    for key, view in views.items():
        assert back[key].shape == view.shape and back[key].is_contiguous()
        assert torch.equal(bits(back[key]), bits(view)), key


def test_special_float_values_keep_their_bits(tmp_path):
    specials = torch.tensor(
        [0.0, -0.0, math.inf, -math.inf, math.nan, 5e-45, -1.0e38], dtype=torch.float32
    )
    payload_nan = torch.tensor([0x7FC00001, -0x00400001], dtype=torch.int32).view(torch.float32)
    bf16_nan = torch.tensor([0x7FC1, -0x0001], dtype=torch.int16).view(torch.bfloat16)
    batch = {"f32": specials, "nan_payload": payload_nan, "bf16_nan": bf16_nan}
    back = roundtrip(tmp_path, batch)
    for key, value in batch.items():
        assert torch.equal(bits(back[key]), bits(value)), key


def test_zero_length_responses(tmp_path):
    batch = {
        "responses": torch.empty(8, 0, dtype=torch.int64),
        "response_mask": torch.empty(8, 0, dtype=torch.bool),
        "old_log_probs": torch.empty(8, 0),
        "prompts": torch.ones(8, 4, dtype=torch.int64),
    }
    back = roundtrip(tmp_path, batch)
    for key, value in batch.items():
        assert back[key].shape == value.shape and back[key].dtype == value.dtype, key
    assert torch.equal(back["prompts"], batch["prompts"])


def test_zero_dim_tensors_and_scalars(tmp_path):
    batch = {"loss": torch.tensor(0.25), "count": torch.tensor(7), "flag": torch.tensor(True)}
    back = roundtrip(tmp_path, batch)
    for key, value in batch.items():
        assert back[key].dim() == 0 and back[key].dtype == value.dtype
        assert back[key].item() == value.item()


NUMPY_DTYPES = sorted({numpy_name for _, numpy_name, _ in store.DTYPES.values() if numpy_name})


@pytest.mark.parametrize("dtype", NUMPY_DTYPES)
def test_numpy_arrays_of_every_supported_dtype(tmp_path, dtype):
    rng = np.random.default_rng(0)
    if dtype == "bool":
        array = rng.integers(0, 2, (3, 4)).astype(bool)
    else:
        array = rng.integers(0, 256, 3 * 4 * np.dtype(dtype).itemsize, dtype=np.uint8)
        array = array.view(dtype).reshape(3, 4)
    back = roundtrip(tmp_path, {"a": array, "strided": array[:, ::2], "scalar": array[0, 0:1]})
    for key, value in {"a": array, "strided": array[:, ::2]}.items():
        assert isinstance(back[key], np.ndarray) and back[key].dtype == value.dtype
        assert back[key].shape == value.shape
        assert back[key].tobytes() == np.ascontiguousarray(value).tobytes(), key


def test_big_endian_numpy_arrays_keep_their_values(tmp_path):
    array = np.arange(6, dtype=">f8").reshape(2, 3) / 7
    back = roundtrip(tmp_path, {"a": array})["a"]
    assert back.shape == (2, 3) and back.dtype.kind == "f" and back.dtype.itemsize == 8
    assert np.array_equal(back, array)


def test_non_tensor_batch_like_verl(tmp_path):
    raw_prompt = np.empty(3, dtype=object)
    raw_prompt[:] = [
        [{"role": "user", "content": "2+2?"}],
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        [],
    ]
    non_tensor = {
        "uid": np.array(["9f1c", "9f1c", "a7e2"], dtype=object),
        "raw_prompt": raw_prompt,
        "data_source": np.array(["gsm8k", "gsm8k", "math"]),
        "tokens": np.array([b"\x00\x01", b"\xff", b""]),
        "grid": np.array([["a", None], ["b", 1.5]], dtype=object),
    }
    back = roundtrip(tmp_path, {"non_tensor_batch": non_tensor})["non_tensor_batch"]
    for key, value in non_tensor.items():
        assert back[key].dtype == value.dtype and back[key].shape == value.shape, key
        assert back[key].tolist() == value.tolist(), key


def test_meta_info_values(tmp_path):
    meta = {
        "nested": {"a": {"b": [1, 2.5, None, True, "s"]}},
        "nan": math.nan,
        "inf": math.inf,
        "-inf": -math.inf,
        "neg_zero": -0.0,
        "big_int": 2**80,
        "tuple": (1, ("x", 2.0)),
        "bytes": b"\x00\xffbin",
        "np_float32": np.float32(1.5),
        "np_int64": np.int64(-3),
        "np_bool": np.bool_(True),
        7: "int key",
    }
    back = roundtrip(tmp_path, {"meta_info": meta})["meta_info"]
    assert math.isnan(back["nan"]) and back["inf"] == math.inf and back["-inf"] == -math.inf
    assert math.copysign(1.0, back["neg_zero"]) == -1.0
    assert back["tuple"] == (1, ("x", 2.0)) and isinstance(back["tuple"][1], tuple)
    assert back["bytes"] == b"\x00\xffbin" and isinstance(back["bytes"], bytes)
    for key in ("np_float32", "np_int64", "np_bool"):
        assert type(back[key]) is type(meta[key]) and back[key] == meta[key], key
    assert back["nested"] == meta["nested"] and back["big_int"] == 2**80 and back[7] == "int key"


def test_nested_batch_round_trips_through_a_file(tmp_path):
    g = torch.Generator().manual_seed(1)
    names = np.empty(2, dtype=object)
    names[0], names[1] = "a", {"nested": [1, None]}
    batch = {
        "bf16": torch.randn(3, 4, generator=g).to(torch.bfloat16),
        "strided": torch.arange(12.0).reshape(3, 4).t(),
        "empty": torch.zeros(0, 5, dtype=torch.int32),
        "numpy": np.arange(6, dtype=np.float16).reshape(2, 3),
        "object": names,
        "unicode": np.array(["ab", "c"]),
        "scalar": np.int64(7),
        "list": [1, 2.5, "x", None, True, float("nan")],
        "tuple": (torch.ones(1), "y"),
        "bytes": b"\x00\xff",
        3: "int key",
    }
    path = tmp_path / "b.safetensors"
    digest = store.save_batch(path, batch)
    assert len(digest) == 32
    loaded = store.load_batch(path)
    assert list(loaded) == list(batch)
    assert torch.equal(bits(loaded["bf16"]), bits(batch["bf16"]))
    assert torch.equal(loaded["strided"], batch["strided"])
    assert loaded["empty"].shape == (0, 5) and loaded["empty"].dtype == torch.int32
    assert isinstance(loaded["numpy"], np.ndarray) and loaded["numpy"].dtype == np.float16
    assert np.array_equal(loaded["numpy"], batch["numpy"])
    assert loaded["object"].dtype == object and loaded["object"].tolist() == names.tolist()
    assert loaded["unicode"].dtype == batch["unicode"].dtype
    assert loaded["scalar"] == 7 and loaded["scalar"].dtype == np.int64
    assert loaded["list"][:5] == batch["list"][:5] and math.isnan(loaded["list"][5])
    assert type(loaded["tuple"]) is tuple and torch.equal(loaded["tuple"][0], torch.ones(1))
    assert loaded["bytes"] == b"\x00\xff" and loaded[3] == "int key"


UNSUPPORTED = {
    "set": ({"meta_info": {"tags": {"a", "b"}}}, "['meta_info']['tags']"),
    "custom object": ({"meta_info": {"tok": object()}}, "['meta_info']['tok']"),
    "object in object array": ({"uid": np.array(["a", object()], dtype=object)}, "['uid'][1]"),
    "datetime64 array": ({"when": np.array(["2024-01-01"], dtype="datetime64[D]")}, "when"),
    "timedelta64 array": ({"dt": np.array([1], dtype="timedelta64[s]")}, "dt"),
    "sparse tensor": ({"batch": {"adj": torch.eye(3).to_sparse()}}, "['batch']['adj']"),
    "complex128 tensor": (
        {"batch": {"z": torch.zeros(2, dtype=torch.complex128)}},
        "cannot record 'batch/z': torch dtype torch.complex128",
    ),
    "meta tensor": ({"batch": {"lp": torch.empty(2, device="meta")}}, "batch/lp"),
    "tuple key": ({"meta_info": {(1, 2): 3}}, "['meta_info']"),
    "bool key": ({"meta_info": {True: 3}}, "['meta_info']"),
    "tuple key at the top": ({(1, 2): 0}, "mapping key (1, 2) at <top>"),
    "set in a list": ({"a": [0, {1, 2}]}, "['a'][1]"),
    "function in DataProto meta_info": (
        codec.RolloutBatch({}, {}, {"fn": len}),
        "['meta_info']['fn']",
    ),
    "sparse tensor at the top": ({"sparse": torch.eye(2).to_sparse()}, "['sparse'] is sparse"),
    "structured array": ({"rec": np.zeros(2, dtype=[("a", "i4"), ("b", "f8")])}, "at ['rec']"),
    "structured scalar in a list": ({"r": [np.zeros(1, dtype=[("a", "i4")])[0]]}, "at ['r'][0]"),
}


@pytest.mark.parametrize("case", UNSUPPORTED)
def test_unsupported_values_are_refused_with_their_key_path(tmp_path, case):
    batch, where = UNSUPPORTED[case]
    path = tmp_path / "x.safetensors"
    with pytest.raises(UnsupportedValueError) as exc:
        store.save_batch(path, batch)
    assert where in str(exc.value)
    assert not path.exists() and not list(tmp_path.iterdir()), "a refused batch left a file"


def test_files_open_with_the_official_safetensors_reader(tmp_path):
    batch = {
        "input_ids": torch.arange(12).reshape(3, 4),
        "log_probs": torch.randn(3, 4),
        "hidden": torch.randn(3, 4).to(torch.bfloat16),
        "fp8": torch.randn(5).to(torch.float8_e4m3fn),
        "mask": torch.ones(3, 4, dtype=torch.bool),
        "meta": {"step": 1},
    }
    path = tmp_path / "batch.safetensors"
    store.save_batch(path, batch)
    official = safetensors.torch.load_file(path)
    assert set(official) == {"input_ids", "log_probs", "hidden", "fp8", "mask"}
    for key, value in official.items():
        assert value.dtype == batch[key].dtype and torch.equal(bits(value), bits(batch[key]))
    with safetensors.safe_open(path, "pt") as f:
        metadata = f.metadata()
    assert metadata["prg.format"] == f"{store.FORMAT}/{store.SCHEMA}" and "prg.digest" in metadata
    store.save_batch(path, {"a": torch.ones(2, dtype=torch.bfloat16), "b": {"c": torch.arange(3)}})
    assert set(safetensors.torch.load_file(path)) == {"a", "b/c"}


def test_numpy_entries_open_with_the_official_numpy_reader(tmp_path):
    path = tmp_path / "np.safetensors"
    array = np.arange(10, dtype=np.int32)
    store.save_batch(path, {"a": array})
    assert np.array_equal(safetensors.numpy.load_file(path)["a"], array)


def test_plain_safetensors_from_another_tool_loads_as_a_dict(tmp_path):
    path = tmp_path / "foreign.safetensors"
    tensors = {"w": torch.randn(4, 4), "b": torch.zeros(4, dtype=torch.bfloat16)}
    safetensors.torch.save_file(tensors, path, metadata={"producer": "someone else"})
    back = store.load_batch(path)
    assert set(back) == {"w", "b"} and all(torch.equal(back[k], tensors[k]) for k in tensors)


def test_loaded_tensors_are_writable_and_independent_of_the_file(tmp_path):
    path = tmp_path / "x.safetensors"
    store.save_batch(path, {"a": torch.zeros(4), "b": torch.ones(4)})
    back = store.load_batch(path)
    back["a"] += 1  # no warning about non-writable buffers, no effect on the file
    assert back["a"].tolist() == [1.0] * 4 and back["b"].tolist() == [1.0] * 4
    assert store.load_batch(path)["a"].tolist() == [0.0] * 4


# --------------------------------------------------------------------------- DataProto-like


@dataclasses.dataclass
class MyDataProto:
    batch: dict[str, torch.Tensor]
    non_tensor_batch: dict[str, np.ndarray]
    meta_info: dict[str, Any]


def _dataproto(cls: type = MyDataProto) -> Any:
    return cls(
        batch={"responses": torch.arange(6).reshape(2, 3)},
        non_tensor_batch={"uid": np.array(["u0", "u1"], dtype=object)},
        meta_info={"temperature": 1.0},
    )


def _assert_same_parts(back: Any, original: Any) -> None:
    assert torch.equal(back.batch["responses"], original.batch["responses"])
    assert back.non_tensor_batch["uid"].tolist() == ["u0", "u1"]
    assert back.meta_info == {"temperature": 1.0}


def test_dataproto_comes_back_as_its_class_when_imported(tmp_path):
    original = _dataproto()
    back = roundtrip(tmp_path, original)
    assert type(back) is MyDataProto
    _assert_same_parts(back, original)


def test_dataproto_of_a_module_not_imported_comes_back_as_rollout_batch(tmp_path):
    cls = dataclasses.make_dataclass(
        "DataProto", [("batch", dict), ("non_tensor_batch", dict), ("meta_info", dict)]
    )
    cls.__module__ = "not_imported_rl_framework.protocol"
    original = _dataproto(cls)
    back = roundtrip(tmp_path, original)
    assert type(back) is codec.RolloutBatch
    _assert_same_parts(back, original)
    assert len(back) == 2
    assert "not_imported_rl_framework" not in sys.modules, "a golden made us import a module"


def test_dataproto_rebuild_factory(tmp_path):
    path = tmp_path / "dp.safetensors"
    store.save_batch(path, _dataproto())
    calls = []
    back = store.load_batch(path, rebuild=lambda **parts: calls.append(parts) or "rebuilt")
    assert back == "rebuilt"
    assert [sorted(c) for c in calls] == [["batch", "meta_info", "non_tensor_batch"]]


class SpyPopen(subprocess.Popen):
    calls: list[Any] = []  # noqa: RUF012 - a spy shared on purpose

    def __init__(self, *args: Any, **kwargs: Any):
        SpyPopen.calls.append((args, kwargs))
        raise AssertionError("Popen was called on behalf of a golden file")


@pytest.mark.parametrize(
    "spec",
    [
        "subprocess:Popen",
        "os:system",
        "builtins:eval",
        "builtins:exec",
        "builtins:__import__",
        "builtins:dict",
        "types:SimpleNamespace",
        "pathlib:Path",
        "pytest_rollout_golden.store.codec:RolloutBatch.__init__",
        "not_imported_rl_framework:DataProto",
    ],
)
def test_crafted_class_in_layout_is_never_called(tmp_path, monkeypatch, spec):
    called = []
    monkeypatch.setattr(subprocess, "Popen", SpyPopen)
    monkeypatch.setattr(os, "system", lambda *a: called.append(("system", a)))
    monkeypatch.setattr("builtins.eval", lambda *a, **k: called.append(("eval", a)))
    monkeypatch.setattr("builtins.exec", lambda *a, **k: called.append(("exec", a)))
    original = _dataproto()
    arrays, layout = codec.flatten(original)
    layout["cls"] = spec
    chunks, _ = store.encode_safetensors(arrays, {"prg.layout": json.dumps(layout)})
    path = tmp_path / "crafted.safetensors"
    store.atomic_write(path, chunks)  # a well-formed file with a valid checksum

    back = store.load_batch(path)
    assert type(back) is codec.RolloutBatch
    _assert_same_parts(back, original)
    assert called == [] and SpyPopen.calls == []
    assert "not_imported_rl_framework" not in sys.modules


# --------------------------------------------------------------------------- crash safety

WRITER = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path

    import numpy as np

    from pytest_rollout_golden import store
    from pytest_rollout_golden.store import location

    directory, pause = Path(sys.argv[1]), sys.argv[4]
    version, numel = int(sys.argv[2]), int(sys.argv[3])

    def pausing(real, name, when):
        def wrapper(src, dst, *args, **kwargs):
            real(src, dst, *args, **kwargs)
            if when(Path(src), Path(dst)):
                print("paused", flush=True)
                time.sleep(600)
        setattr(os, name, wrapper)

    staged = lambda dst: dst.parent != directory  # noqa: E731
    if pause == "before-staged-manifest":  # every file staged, the manifest not yet
        pausing(os.replace, "replace", lambda src, dst: dst.name == "metrics.json" and staged(dst))
    elif pause == "after-staged-manifest":  # the commit point: nothing moved in yet
        pausing(
            os.replace, "replace", lambda src, dst: dst.name == location.MANIFEST and staged(dst)
        )
    elif pause == "after-first-file-moved":  # the new batch beside the old manifest
        pausing(os.replace, "replace", lambda src, dst: dst.parent == directory)

    print("start", flush=True)
    with store.locked(directory):
        store.recover(directory)
        tx = store.Transaction(directory)
        tx.write_batch("batch.safetensors", {"v": np.full(numel, version, dtype=np.int64)})
        tx.write_json("metrics.json", {"version": version})
        tx.commit({"version": version})
    print("done", flush=True)
    """
)
BIG = 1 << 21  # 16 MiB of int64: long enough to be killed in the middle


def _start_writer(directory: Path, version: int, pause: str = "none") -> subprocess.Popen:
    cmd = [sys.executable, "-c", WRITER, str(directory), str(version), str(BIG), pause]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "start"
    return proc


def _kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.stdout is not None
    proc.stdout.close()


def _write_golden(directory: Path, version: int) -> float:
    """Run a writer to completion; the seconds it took after its start-up."""
    proc = _start_writer(directory, version)
    start = time.perf_counter()
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0 and out.strip() == "done"
    return time.perf_counter() - start


def _intact_version(directory: Path) -> int:
    """Recover like a reader does; check every file against the manifest; the version."""
    with store.locked(directory):
        store.recover(directory)
    manifest = store.read_manifest(directory)
    assert manifest is not None, "the golden is gone"
    version, files = manifest["version"], manifest["files"]
    assert sorted(files) == ["batch.safetensors", "metrics.json"]
    batch = store.load_batch(
        directory / "batch.safetensors", expect_digest=files["batch.safetensors"]["digest"]
    )
    assert batch["v"].shape == (BIG,) and bool((batch["v"] == version).all())
    metrics = store.read_json(
        directory / "metrics.json", expect_digest=files["metrics.json"]["digest"]
    )
    assert metrics == {"version": version}
    leftovers = [p.name for p in directory.parent.iterdir() if p != directory]
    assert leftovers == [], f"recover left {leftovers}"
    return version


@pytest.mark.parametrize(
    ("pause", "survivor"),
    [
        ("before-staged-manifest", "old"),
        ("after-staged-manifest", "new"),  # the staged manifest is the commit point
        ("after-first-file-moved", "new"),
    ],
)
def test_sigkill_at_each_step_of_a_commit(tmp_path, pause, survivor):
    directory = tmp_path / "golden" / "test_x"
    _write_golden(directory, 1)
    proc = _start_writer(directory, 2, pause)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "paused"
    _kill(proc)
    if pause == "after-first-file-moved":
        manifest = json.loads((directory / "manifest.json").read_text())
        assert manifest["version"] == 1, "the pause point was not where this test thinks it is"
    assert _intact_version(directory) == {"old": 1, "new": 2}[survivor]


def test_sigkill_at_random_points_of_rerecording(tmp_path):
    directory = tmp_path / "golden" / "test_x"
    duration = _write_golden(directory, 1)
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    version = 1
    for attempt in range(2, 8):
        proc = _start_writer(directory, attempt)
        delay = rng.uniform(0, duration)
        time.sleep(delay)
        _kill(proc)
        survivor = _intact_version(directory)
        assert survivor in (version, attempt), f"seed {seed}, kill after {delay:.3f}s"
        version = survivor
