"""TensorDict batches, recognised by shape: a stand-in ``tensordict`` module plays the library.

tensordict is not a dependency; the codec only looks at the class's module name and
``batch_size``, and rebuilds a TensorDict when the test process has imported tensordict.
The real package is tested in ``test_real_batches.py``; these stand-in tests remain for
what it cannot show: the codec with no tensordict installed at all, and a layout written
without a TensorDict device (the goldens recorded before devices were kept).
"""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest
import torch

from pytest_rollout_golden import RolloutBatch, load_batch, save_batch


class TensorDict(dict):
    """Just enough of tensordict.TensorDict: a mapping with a batch size."""

    __module__ = "tensordict"

    def __init__(self, source, batch_size):
        super().__init__(source)
        self.batch_size = torch.Size(batch_size)


@pytest.fixture
def fake_tensordict(monkeypatch):
    module = types.ModuleType("tensordict")
    module.TensorDict = TensorDict
    monkeypatch.setitem(sys.modules, "tensordict", module)
    return module


def make_batch():
    td = TensorDict(
        {"input_ids": torch.arange(8).view(2, 4), "log_probs": -torch.rand(2, 4).bfloat16()},
        batch_size=[2],
    )
    return types.SimpleNamespace(
        batch=td,
        non_tensor_batch={"uid": np.array(["a", "b"], dtype=object)},
        meta_info={"temperature": 1.0},
    )


def test_tensordict_comes_back_as_tensordict_with_its_batch_size(tmp_path, fake_tensordict):
    original = make_batch()
    save_batch(tmp_path / "b.safetensors", original)
    loaded = load_batch(tmp_path / "b.safetensors")

    assert isinstance(loaded, RolloutBatch)  # SimpleNamespace takes no batch/... keywords
    assert type(loaded.batch) is fake_tensordict.TensorDict
    assert loaded.batch.batch_size == torch.Size([2])
    for key, value in original.batch.items():
        assert loaded.batch[key].dtype == value.dtype
        assert torch.equal(loaded.batch[key].view(torch.uint8), value.view(torch.uint8))
    assert loaded.non_tensor_batch["uid"].tolist() == ["a", "b"]
    assert loaded.meta_info == {"temperature": 1.0}


def test_without_tensordict_imported_the_batch_is_a_plain_dict(tmp_path, fake_tensordict):
    save_batch(tmp_path / "b.safetensors", make_batch())
    del sys.modules["tensordict"]
    loaded = load_batch(tmp_path / "b.safetensors")
    assert type(loaded.batch) is dict
    assert set(loaded.batch) == {"input_ids", "log_probs"}
