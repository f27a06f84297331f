"""Unit tests of metrics.py: metric values in metrics.json, exact on a round trip."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from pytest_rollout_golden import UnsupportedValueError
from pytest_rollout_golden._internal.golden import metric_codec


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
