"""Unit tests of codec.py: the layout of a batch, without files (see test_store.py for files)."""

from __future__ import annotations

import pytest
import torch

from pytest_rollout_golden import GoldenFormatError, RolloutBatch
from pytest_rollout_golden.store import codec
from pytest_rollout_golden.store.codec import flatten, unflatten


class NotAProto:
    """DataProto-shaped, but its constructor cannot rebuild it: never called on replay."""

    def __init__(self):
        self.batch, self.non_tensor_batch, self.meta_info = {}, {}, {}


def test_recorded_class_that_cannot_take_the_parts_is_not_called():
    arrays, layout = flatten(NotAProto())
    assert type(unflatten(arrays, layout)) is RolloutBatch


def test_layout_mismatch_is_a_format_error():
    arrays, layout = flatten({"x": torch.ones(1)})
    with pytest.raises(GoldenFormatError, match="layout does not match"):
        unflatten({}, layout)
    with pytest.raises(GoldenFormatError, match="unknown layout tag 'pickle'"):
        unflatten(arrays, {"t": "pickle", "v": "..."})


def test_value_differences_name_the_outermost_non_tensor_change_and_leave_arrays_out():
    base = {"ids": torch.arange(3), "meta": {"temperature": 1.0, "n": 1}, "tags": ["a", "b"]}
    layout = codec.flatten(base)[1]

    def differences(**changed):
        return codec.value_differences(layout, codec.flatten({**base, **changed})[1])

    assert differences() == []
    assert differences(ids=torch.zeros(5, dtype=torch.float16)) == []  # arrays: compared apart
    assert differences(meta={"temperature": 0.7, "n": 1}) == ["meta/temperature"]
    assert differences(meta={"temperature": 1.0, "n": 1.0}) == ["meta/n"]  # int vs float
    assert differences(meta={"temperature": 1.0, "n": True}) == ["meta/n"]
    assert differences(meta={"temperature": 1.0}) == ["meta/n"]  # an entry removed
    assert differences(meta=("temperature", 1.0)) == ["meta"]  # another kind: the container
    assert differences(tags=["a", "b", "c"]) == ["tags/2"]
    assert differences(ids=[0, 1, 2]) == ["ids"]  # a tensor that became a list
    assert codec.value_differences(codec.flatten({1: 0})[1], codec.flatten({"1": 0})[1]) == [
        "value"
    ]
    assert codec.value_differences(1, 2) == ["value"]
