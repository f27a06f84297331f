"""The store reads back every batch file it writes (issue 16, item 1).

A safetensors file starts with its header's length as 8 little-endian bytes.
Some lengths read like the first bytes of a pickle (``80 02`` is a 640-byte
header, the opening of a protocol-2 pickle), so a file must be recognised as
safetensors by parsing its header, and only a file that does not parse is
sniffed for pickle, zip or ``.npy`` magic.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from pytest_rollout_golden import load_batch, save_batch
from pytest_rollout_golden.errors import GoldenFormatError

REMEDY = "--update-golden"


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bytes of a tensor, so NaN payloads, -0.0 and padding compare exactly."""
    return t.contiguous().reshape(-1).view(torch.uint8)


def assert_same_batch(loaded: dict[str, torch.Tensor], batch: dict[str, torch.Tensor]) -> None:
    assert loaded.keys() == batch.keys()
    for key, expected in batch.items():
        actual = loaded[key]
        assert actual.dtype == expected.dtype, key
        assert actual.shape == expected.shape, key
        assert torch.equal(bits(actual), bits(expected)), key


def header_length(path: Path) -> int:
    (n,) = struct.unpack("<Q", path.read_bytes()[:8])
    return n


# --------------------------------------------------------------------------- key lengths


def test_every_key_length_up_to_400_round_trips(tmp_path):
    """Key lengths 123-125, 208-210, 294-295 and 379-381 once gave pickle-like headers."""
    path = tmp_path / "batch.safetensors"
    refused = []
    for length in range(1, 401):
        batch = {"k" * length: torch.zeros(2)}
        save_batch(path, batch)
        try:
            assert_same_batch(load_batch(path), batch)
        except GoldenFormatError as exc:
            refused.append((length, hex(header_length(path)), str(exc)))
    assert not refused, refused


@pytest.mark.parametrize("length", [123, 208, 294, 379])
def test_a_header_that_reads_like_a_pickle_opcode_is_safetensors(tmp_path, length):
    path = tmp_path / "batch.safetensors"
    batch = {"k" * length: torch.arange(3, dtype=torch.float32)}
    save_batch(path, batch)
    assert path.read_bytes()[0] == 0x80, "the header length no longer starts like a pickle"
    assert_same_batch(load_batch(path), batch)


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(length=st.integers(min_value=1, max_value=400))
def test_key_lengths_round_trip(tmp_path, length):
    path = tmp_path / "batch.safetensors"
    batch = {"k" * length: torch.zeros(2)}
    save_batch(path, batch)
    assert_same_batch(load_batch(path), batch)


# --------------------------------------------------------------------------- random batches

DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
]
KEYS = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=40
)


@st.composite
def tensors(draw: st.DrawFn) -> torch.Tensor:
    """A tensor of any dtype above, whose bytes (NaN payloads included) are drawn at random."""
    dtype = draw(st.sampled_from(DTYPES))
    shape = draw(st.lists(st.integers(0, 5), max_size=3))
    count = 1
    for d in shape:
        count *= d
    if dtype is torch.bool:
        return torch.tensor(draw(st.lists(st.booleans(), min_size=count, max_size=count))).reshape(
            shape
        )
    itemsize = torch.empty((), dtype=dtype).element_size()
    raw = bytearray(draw(st.binary(min_size=count * itemsize, max_size=count * itemsize)))
    if not raw:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(raw, dtype=dtype).reshape(shape).clone()


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(batch=st.dictionaries(KEYS, tensors(), min_size=1, max_size=6))
def test_random_small_batches_round_trip_bit_exactly(tmp_path, batch):
    path = tmp_path / "batch.safetensors"
    save_batch(path, batch)
    assert_same_batch(load_batch(path), batch)


def test_a_key_named_like_the_header_metadata_round_trips(tmp_path):
    """``__metadata__`` is the safetensors header's own entry; a tensor key must not take it."""
    path = tmp_path / "batch.safetensors"
    batch = {"__metadata__": torch.zeros(2), "x": torch.ones(1)}
    save_batch(path, batch)
    assert_same_batch(load_batch(path), batch)


# --------------------------------------------------------------------------- foreign files


@pytest.mark.parametrize(
    ("head", "what"),
    [
        (b"\x80\x02\x00\x00\x00\x00\x00\x00", "pickle"),
        (b"PK\x03\x04\x00\x00\x00\x00", "zip"),
    ],
)
def test_a_foreign_file_whose_magic_fits_as_a_header_length_is_still_named(tmp_path, head, what):
    """Magic bytes that are also a header length the file could hold: the header does not
    parse, so the file is named for what it is (zip's magic is a 67 MB length: a sparse file).
    ``.npy``'s magic is a length beyond the header limit, which the tests of the store cover."""
    path = tmp_path / "batch.safetensors"
    (n,) = struct.unpack("<Q", head)
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(8 + n + 16)
    with pytest.raises(GoldenFormatError) as exc:
        load_batch(path)
    message = str(exc.value)
    assert str(path) in message and REMEDY in message, message
    assert what in message, message
