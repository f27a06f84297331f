"""Unit tests of codec.py: the layout of a batch, without files (see test_store.py for files)."""

from __future__ import annotations

import pytest
import torch

from pytest_rollout_golden import GoldenFormatError, RolloutBatch
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
