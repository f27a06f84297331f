"""Unit tests of metrics.py (metrics.json values) and codec.py + save_batch/load_batch (batches)."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from pytest_rollout_golden import (
    GoldenFormatError,
    RolloutBatch,
    UnsupportedValueError,
    load_batch,
    save_batch,
)
from pytest_rollout_golden import metrics as metric_codec
from pytest_rollout_golden.codec import flatten, unflatten

# ----------------------------------------------------------------- metrics.json values


def round_trip(value):
    node = metric_codec.encode(value, where="metric 'm' at step 0")
    text = json.dumps(node, allow_nan=False)  # what metrics.json holds: strict JSON
    return json.loads(text), metric_codec.decode(json.loads(text), where="metric 'm'")


@pytest.mark.parametrize(
    "value", [0.1, math.nextafter(1.0, 2.0), 1e-310, -0.0, 5e300, 2**62, -(2**63), True, 0]
)
def test_python_numbers_are_bare_json_and_exact(value):
    node, decoded = round_trip(value)
    assert node == value and type(node) is type(value)
    assert decoded.item() == value
    assert math.copysign(1, decoded.item()) == math.copysign(1, value)


@pytest.mark.parametrize(
    ("value", "text"), [(math.nan, "nan"), (math.inf, "inf"), (-math.inf, "-inf")]
)
def test_non_finite_values_are_explicit_strings(value, text):
    node, decoded = round_trip(value)
    assert node == text
    assert repr(decoded.item()) == repr(value)
    assert repr(metric_codec.scalar(node)) == repr(value)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_tensor_metrics_keep_dtype_shape_and_bits(dtype):
    g = torch.Generator().manual_seed(0)
    values = torch.randn(2, 3, generator=g).to(dtype)
    values[0, 0], values[0, 1], values[0, 2] = math.nan, -math.inf, -0.0
    node, decoded = round_trip(values)
    assert node["dtype"] == str(dtype).removeprefix("torch.") and node["shape"] == [2, 3]
    assert decoded.dtype == dtype and decoded.shape == values.shape
    assert torch.equal(decoded.view(-1).view(torch.uint8), values.view(-1).view(torch.uint8))
    scalar_node, scalar = round_trip(values[1, 1])
    assert scalar.dim() == 0 and scalar.dtype == dtype
    assert metric_codec.scalar(scalar_node) == values[1, 1].item()


@pytest.mark.parametrize(
    "value",
    [np.float32(0.1), np.int32(-7), np.bool_(True), np.array([[1, 2]], dtype=np.uint8),
     np.float16(65504.0), torch.tensor([True, False]), torch.tensor(3, dtype=torch.int8)],
)  # fmt: skip
def test_numpy_values_and_integer_tensors(value):
    _, decoded = round_trip(value)
    assert str(decoded.dtype).removeprefix("torch.") == np.asarray(value).dtype.name or (
        isinstance(value, torch.Tensor) and decoded.dtype == value.dtype
    )
    assert np.array_equal(decoded.numpy(), np.asarray(value))


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("0.5", "got str"),
        ([0.5], "got list"),
        (None, "got NoneType"),
        (2**70, "int64"),
        (torch.tensor([1j]), "complex64 tensor"),
        (np.array(["a"]), "numpy dtype <U1"),
    ],
)
def test_unsupported_metrics_name_the_metric(value, words):
    with pytest.raises(UnsupportedValueError, match=r"metric 'loss' at step 3: ") as info:
        metric_codec.encode(value, where="metric 'loss' at step 3")
    assert words in str(info.value)


def test_unreadable_metric_node_is_a_clear_error():
    with pytest.raises(ValueError, match="metric 'm': unreadable metric value"):
        metric_codec.decode({"dtype": "no_such_dtype", "value": 1}, where="metric 'm'")
    with pytest.raises(ValueError, match="unreadable"):
        metric_codec.decode("infinity", where="metric 'm'")


# ----------------------------------------------------------------- batches


@dataclasses.dataclass
class DataProto:
    batch: dict
    non_tensor_batch: dict
    meta_info: dict


class NotAProto:
    """DataProto-shaped, but its constructor cannot rebuild it: never called on replay."""

    def __init__(self):
        self.batch, self.non_tensor_batch, self.meta_info = {}, {}, {}


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(-1).view(torch.uint8)


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
    digest = save_batch(path, batch)
    assert len(digest) == 32
    loaded = load_batch(path)
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


def test_dataproto_comes_back_as_its_class_or_a_rolloutbatch():
    proto = DataProto({"x": torch.ones(2)}, {"uid": np.array(["u"], dtype=object)}, {"t": 1})
    arrays, layout = flatten(proto)
    again = unflatten(arrays, layout)
    assert type(again) is DataProto and again.meta_info == {"t": 1}

    layout["cls"] = "some_framework.protocol:DataProto"  # never imported on our behalf
    fallback = unflatten(arrays, layout)
    assert type(fallback) is RolloutBatch and len(fallback) == 2
    rebuilt = unflatten(arrays, layout, rebuild=lambda **parts: ("custom", sorted(parts)))
    assert rebuilt == ("custom", ["batch", "meta_info", "non_tensor_batch"])


def test_recorded_class_that_cannot_take_the_parts_is_not_called():
    arrays, layout = flatten(NotAProto())
    assert type(unflatten(arrays, layout)) is RolloutBatch


@pytest.mark.parametrize(
    ("batch", "where"),
    [
        ({"a": {"b": object()}}, "['a']['b']"),
        ({"a": [0, {1, 2}]}, "['a'][1]"),
        (DataProto({}, {}, {"fn": len}), "['meta_info']['fn']"),
        ({(1, 2): 0}, "mapping key (1, 2) at <top>"),
        ({"sparse": torch.eye(2).to_sparse()}, "['sparse'] is sparse"),
        (
            {"rec": np.zeros(2, dtype=[("a", "i4"), ("b", "f8")])},
            "at ['rec']",
        ),
        ({"r": [np.zeros(1, dtype=[("a", "i4")])[0]]}, "at ['r'][0]"),
    ],
)
def test_unsupported_values_are_refused_with_their_path(tmp_path, batch, where):
    path = tmp_path / "b.safetensors"
    with pytest.raises(UnsupportedValueError) as info:
        save_batch(path, batch)
    assert where in str(info.value)
    assert not path.exists() and list(tmp_path.iterdir()) == []


def test_unencodable_dtype_is_refused_naming_the_tensor(tmp_path):
    with pytest.raises(UnsupportedValueError, match=r"cannot record 'z'.*complex128"):
        save_batch(tmp_path / "b.safetensors", {"z": torch.zeros(2, dtype=torch.complex128)})


def test_plain_safetensors_file_loads_as_a_dict(tmp_path):
    path = tmp_path / "plain.safetensors"
    save_file({"w": torch.arange(4.0)}, str(path))
    loaded = load_batch(path)
    assert list(loaded) == ["w"] and torch.equal(loaded["w"], torch.arange(4.0))


def test_saved_file_is_standard_safetensors(tmp_path):
    from safetensors.torch import load_file

    path = tmp_path / "b.safetensors"
    save_batch(path, {"a": torch.ones(2, dtype=torch.bfloat16), "b": {"c": torch.arange(3)}})
    assert set(load_file(str(path))) == {"a", "b/c"}


def test_layout_mismatch_is_a_format_error():
    arrays, layout = flatten({"x": torch.ones(1)})
    with pytest.raises(GoldenFormatError, match="layout does not match"):
        unflatten({}, layout)
    with pytest.raises(GoldenFormatError, match="unknown layout tag 'pickle'"):
        unflatten(arrays, {"t": "pickle", "v": "..."})
