"""Scalars round-trip bit for bit, NaN payloads and signs included: Python floats and numpy
scalars in batches (meta_info, non-tensor fields), and metrics of every float dtype; goldens
written before the bits were kept still load."""

from __future__ import annotations

import json
import math
import struct

import numpy as np
import pytest
import torch

from pytest_rollout_golden import load_batch, save_batch
from pytest_rollout_golden._internal.golden import metric_codec
from pytest_rollout_golden.store import floatbits


def f64(bits: int) -> float:
    return struct.unpack("<d", struct.pack("<Q", bits))[0]


def bits_of(value: float) -> int:
    return struct.unpack("<Q", struct.pack("<d", value))[0]


PY_NANS = [0x7FF8000000000123, 0xFFF8000000000000, 0x7FF0000000000001, 0xFFFFFFFFFFFFFFFF]
NP_NANS = [
    (np.float32, np.uint32, 0x7FC00042),
    (np.float32, np.uint32, 0xFFC00000),
    (np.float16, np.uint16, 0x7E01),
    (np.float64, np.uint64, 0x7FF8000000000123),
]


def np_nan(dtype, uint, bits):
    return np.array(bits, dtype=uint).view(dtype)[()]


@pytest.mark.parametrize("bits", PY_NANS, ids=hex)
def test_a_python_nan_keeps_its_payload_and_sign_in_a_batch(tmp_path, bits):
    batch = {"meta_info": {"x": f64(bits)}, "rows": [f64(bits), 1.5]}
    save_batch(tmp_path / "b.safetensors", batch)
    back = load_batch(tmp_path / "b.safetensors")
    assert bits_of(back["meta_info"]["x"]) == bits
    assert bits_of(back["rows"][0]) == bits and back["rows"][1] == 1.5


@pytest.mark.parametrize(("dtype", "uint", "bits"), NP_NANS, ids=lambda x: str(x))
def test_a_numpy_nan_scalar_keeps_its_dtype_and_bits_in_a_batch(tmp_path, dtype, uint, bits):
    value = np_nan(dtype, uint, bits)
    save_batch(tmp_path / "b.safetensors", {"v": value, "o": np.array([value, 1], dtype=object)})
    back = load_batch(tmp_path / "b.safetensors")
    for got in (back["v"], back["o"][0]):
        assert type(got) is dtype
        assert int(np.array(got).view(uint)) == bits


def test_canonical_nans_keep_the_layout_older_goldens_have(tmp_path):
    # float("nan") and np.float32("nan") are written as before, so older files read alike
    save_batch(tmp_path / "b.safetensors", {"x": math.nan, "y": np.float32("nan")})
    back = load_batch(tmp_path / "b.safetensors")
    assert bits_of(back["x"]) == bits_of(math.nan)
    assert int(np.array(back["y"]).view(np.uint32)) == 0x7FC00000
    assert floatbits.python_bits(math.nan) is None
    assert floatbits.python_bits(1.0) is None and floatbits.python_bits(-0.0) is None


@pytest.mark.parametrize("bits", PY_NANS, ids=hex)
def test_a_python_nan_metric_keeps_its_bits(bits):
    node = metric_codec.encode(f64(bits), where="m")
    assert metric_codec.problem(json.loads(json.dumps(node))) is None
    back = metric_codec.decode(json.loads(json.dumps(node)), where="m")
    assert back.dtype == torch.float64 and bits_of(back.item()) == bits


@pytest.mark.parametrize(
    ("dtype", "bits"),
    [
        (torch.float32, 0x7FC00042),
        (torch.bfloat16, 0x7FC1),
        (torch.float16, 0xFE00),
        (torch.float64, 0x7FF8000000000123),
    ],
    ids=str,
)
def test_a_tensor_or_numpy_nan_metric_keeps_its_dtype_and_bits(dtype, bits):
    width = dtype.itemsize * 8
    signed = bits - (1 << width) if bits >= 1 << (width - 1) else bits
    value = torch.tensor(signed, dtype=getattr(torch, f"int{width}")).view(dtype)
    values = [value]
    if dtype != torch.bfloat16:
        values.append(value.numpy()[()])
    for v in values:
        node = json.loads(json.dumps(metric_codec.encode(v, where="m")))
        assert node["bits"] == f"0x{bits:0{width // 4}x}"
        assert metric_codec.problem(node) is None
        back = metric_codec.decode(node, where="m")
        assert back.dtype == dtype
        assert int(back.view(getattr(torch, f"int{width}")).item()) % (1 << width) == bits


@pytest.mark.parametrize(
    ("node", "words"),
    [
        ({"dtype": "float32", "value": "nan", "bits": "0x3f800000"}, "not a NaN"),
        ({"dtype": "float32", "value": "nan", "bits": "0x7fc0000042"}, "8 hex digits"),
        ({"dtype": "float32", "value": 1.0, "bits": "0x7fc00042"}, "'nan'"),
        ({"dtype": "int32", "value": "nan", "bits": "0x7fc00042"}, "float dtype"),
        ({"dtype": "float64", "value": "nan", "bits": "nan"}, "hex digits"),
    ],
)
def test_metric_bits_that_could_not_have_been_written_are_refused(node, words):
    assert words in (metric_codec.problem(node) or ""), metric_codec.problem(node)


def test_older_metric_nodes_still_decode():
    assert math.isnan(metric_codec.decode("nan", where="m").item())
    old = metric_codec.decode({"dtype": "float32", "value": "nan"}, where="m")
    assert old.dtype == torch.float32 and math.isnan(old.item())


def test_golden_exact_replays_a_nan_payload_metric_and_fails_another(project):
    project.write(
        """
        import struct

        def test_nan(golden, values):
            bits = values.get("bits", 0x7FF8000000000123)
            nan = struct.unpack("<d", struct.pack("<Q", bits))[0]
            golden.check({"m": nan, "ok": 1.0})
        """
    )
    project.set_values()
    project.run().assert_outcomes(passed=1)
    project.run("--golden-exact").assert_outcomes(passed=1)
    project.set_values(bits=0x7FF8000000000000)
    result = project.run("--golden-exact")
    assert "nan:0x7ff8000000000123" in project.mismatch_row(result, "m")["expected"]
    project.run("--golden-tolerance", "m:equal_nan=true").assert_outcomes(passed=1)
