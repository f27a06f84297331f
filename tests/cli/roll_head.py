"""ROLL's ``DataProto`` and ``BatchProxy`` at HEAD, copied for tests (ROLL needs ray to import).

Copied from alibaba/ROLL@8eb27cc2dc34c4d1310b169d9b86d339004d811a:
``roll/distributed/scheduler/remote_protocol.py`` (``BatchProxy``, whole but for the
logger) and ``roll/distributed/scheduler/protocol.py`` (``DataProto``: its constructor,
the ``batch`` / ``non_tensor_batch`` properties and setters, ``__len__``, ``__getitem__``,
pickling and ``check_consistency``; the NPU branches dropped). ``RemoteBatch`` is reduced
to what ``BatchProxy`` calls. :func:`install` registers both modules under their real
names, so pickles of these classes name ``roll.distributed.scheduler...`` as ROLL's do.
"""

from __future__ import annotations

import sys
import types

REMOTE_PROTOCOL = '''
import numpy as np
import torch
from tensordict import TensorDict


class RemoteBatch:
    """Reduced: a batch held by a remote store (keys only)."""

    def __init__(self, keys, length):
        self._keys, self._length = set(keys), length

    def keys(self):
        return set(self._keys)

    def __contains__(self, key):
        return key in self._keys

    def __len__(self):
        return self._length

    def __delitem__(self, key):
        self._keys.remove(key)

    def clone(self, recurse=True):
        return RemoteBatch(self._keys, self._length)


class BatchProxy:
    """
    Proxy for batch that supports fallback lookup to remote_batch.
    """

    def __init__(self, batch, remote_batch, batch_size: int):
        assert batch is None or isinstance(batch, (TensorDict, dict))
        self._batch = batch
        self._remote_batch = remote_batch
        self._batch_size = batch_size

    def __getitem__(self, key: str):
        if self._batch is not None and key in self._batch:
            return self._batch[key]
        elif self._remote_batch is not None and key in self._remote_batch:
            return self._remote_batch[key]
        else:
            raise KeyError(f"Key '{key}' not found in batch or remote_batch")

    def __setitem__(self, key: str, value):
        assert isinstance(value, (torch.Tensor, np.ndarray))
        if self._remote_batch is not None and key in self._remote_batch:
            del self._remote_batch[key]
        if self._batch is not None:
            assert len(value) == self._batch_size
            self._batch[key] = value
        else:
            raise RuntimeError("Cannot set item when batch is None")

    def __delitem__(self, key: str):
        if self._batch is not None and key in self._batch:
            del self._batch[key]
        elif self._remote_batch is not None and key in self._remote_batch:
            del self._remote_batch[key]
        else:
            raise KeyError(f"Key '{key}' not found in batch or remote_batch")

    def __contains__(self, key: str) -> bool:
        in_batch = self._batch is not None and key in self._batch
        in_remote = self._remote_batch is not None and key in self._remote_batch
        return in_batch or in_remote

    def copy(self):
        batch_copy = self._batch.copy() if self._batch is not None else None
        remote_copy = (
            self._remote_batch.clone(recurse=False) if self._remote_batch is not None else None
        )
        return BatchProxy(batch_copy, remote_copy, self._batch_size)

    def get(self, key: str, default=None):
        try:
            return self[key]
        except KeyError:
            return default

    def keys(self):
        result = set()
        if self._batch is not None:
            result |= set(self._batch.keys())
        if self._remote_batch is not None:
            result |= set(self._remote_batch.keys())
        return result

    def items(self):
        if self._batch is not None:
            if isinstance(self._batch, TensorDict):
                for key in self._batch.keys():
                    yield (key, self._batch[key])
            else:
                for key, val in self._batch.items():
                    yield (key, val)
        if self._remote_batch is not None:
            self._remote_batch.materialize()
            for key in self._remote_batch.keys():
                yield (key, self._remote_batch[key])

    _POP_SENTINEL = object()

    def pop(self, key: str, default=_POP_SENTINEL):
        if key not in self:
            if default is BatchProxy._POP_SENTINEL:
                raise KeyError(f"Key '{key}' not found in batch or remote_batch")
            return default
        res = self[key]
        if self._remote_batch is not None and key in self._remote_batch:
            del self._remote_batch[key]
        if self._batch is not None and key in self._batch:
            del self._batch[key]
        return res

    def update(self, other: dict):
        assert isinstance(other, dict)
        assert self._batch is not None
        for key in other.keys():
            if self._remote_batch is not None and key in self._remote_batch:
                del self._remote_batch[key]
        self._batch.update(other)

    def __getattr__(self, name: str):
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    @property
    def batch_size(self) -> torch.Size:
        if isinstance(self._batch, TensorDict):
            return self._batch.batch_size
        if self._batch is None and self._remote_batch is not None:
            return torch.Size([len(self._remote_batch)])
        raise AttributeError(f"'{type(self).__name__}' has no attribute 'batch_size'")

    @property
    def shape(self) -> torch.Size:
        if isinstance(self._batch, TensorDict):
            return self._batch.shape
        if self._batch is None and self._remote_batch is not None:
            return torch.Size([len(self._remote_batch)])
        raise AttributeError(f"'{type(self).__name__}' has no attribute 'shape'")

    @property
    def device(self):
        if isinstance(self._batch, TensorDict):
            return self._batch.device
        if self._batch is None and self._remote_batch is not None:
            return self._remote_batch.device
        raise AttributeError(f"'{type(self).__name__}' has no attribute 'device'")
'''

PROTOCOL = """
import numpy as np
import torch
import tensordict
from tensordict import TensorDict

from roll.distributed.scheduler.remote_protocol import RemoteBatch, BatchProxy


class DataProto:
    def __init__(self, batch=None, non_tensor_batch=None, remote_batch=None, meta_info=None):
        if batch is None and remote_batch is not None:
            batch = TensorDict({}, batch_size=[len(remote_batch)])
        self._batch = batch
        self._non_tensor_batch = non_tensor_batch if non_tensor_batch is not None else {}
        self._remote_batch = remote_batch
        self.meta_info = meta_info if meta_info is not None else {}
        self.check_consistency()

    @property
    def batch(self):
        return BatchProxy(self._batch, self._remote_batch, len(self))

    @batch.setter
    def batch(self, value):
        assert isinstance(value, (TensorDict, BatchProxy))
        value = value.copy()
        if self._remote_batch is not None:
            for key in value.keys():
                if key in self._remote_batch:
                    del self._remote_batch[key]
        for key in self._non_tensor_batch.keys():
            if key in value:
                del value[key]
        if isinstance(value, BatchProxy):
            if self._remote_batch is not None:
                self._remote_batch.union(value._remote_batch)
            else:
                self._remote_batch = value._remote_batch
            self._batch = value._batch
        else:
            self._batch = value
        self.check_consistency()

    @property
    def non_tensor_batch(self):
        return BatchProxy(self._non_tensor_batch, self._remote_batch, len(self))

    @non_tensor_batch.setter
    def non_tensor_batch(self, value):
        assert isinstance(value, (dict, BatchProxy))
        value = value.copy()
        if self._remote_batch is not None:
            for key in value.keys():
                if key in self._remote_batch:
                    del self._remote_batch[key]
        for key in self._batch.keys():
            if key in value:
                del value[key]
        if isinstance(value, BatchProxy):
            if self._remote_batch is not None:
                self._remote_batch.union(value._remote_batch)
            else:
                self._remote_batch = value._remote_batch
            self._non_tensor_batch = value._batch
        else:
            self._non_tensor_batch = value
        self.check_consistency()

    def __len__(self):
        if self._batch is not None:
            return len(self._batch)
        if self._non_tensor_batch:
            return len(next(iter(self._non_tensor_batch.values())))
        if self._remote_batch is not None:
            return len(self._remote_batch)
        return 0

    def __getitem__(self, item):
        if isinstance(item, str):
            if self._batch is not None and item in self._batch.keys():
                return self._batch[item]
            elif item in self._non_tensor_batch.keys():
                return self._non_tensor_batch[item]
            elif self._remote_batch is not None and item in self._remote_batch:
                return self._remote_batch[item]
            else:
                raise KeyError(f"Key '{item}' not found in batch or remote_batch")
        raise TypeError(f"Indexing with {type(item)} is not supported")

    def __getstate__(self):
        import io

        buffer = io.BytesIO()
        if tensordict.__version__ >= "0.5.0" and self._batch is not None:
            self._batch = self._batch.contiguous()
            self._batch = self._batch.consolidate()
        torch.save(self._batch, buffer)
        return buffer, self._non_tensor_batch, self._remote_batch, self.meta_info

    def __setstate__(self, data):
        batch_deserialized, non_tensor_batch, remote_batch, meta_info = data
        batch_deserialized.seek(0)
        batch = torch.load(batch_deserialized, weights_only=False, map_location="cpu")
        self._batch = batch
        self._non_tensor_batch = non_tensor_batch
        self._remote_batch = remote_batch
        self.meta_info = meta_info

    def check_consistency(self):
        existing_keys = set()
        if self._batch is not None:
            assert len(self._batch.batch_size) == 1, "only support num_batch_dims=1"
            existing_keys.update(self._batch.keys())
        if len(self._non_tensor_batch) != 0:
            assert len(self._batch.batch_size) == 1
            assert existing_keys.isdisjoint(self._non_tensor_batch.keys())
            existing_keys.update(self._non_tensor_batch.keys())
            batch_size = self._batch.batch_size[0]
            for key, val in self._non_tensor_batch.items():
                assert isinstance(val, np.ndarray) and val.dtype == object, (
                    "data in the non_tensor_batch must be a numpy.array with dtype=object"
                )
                assert val.shape[0] == batch_size
        if self._remote_batch is not None:
            assert existing_keys.isdisjoint(self._remote_batch.keys())
            if self._batch is not None:
                assert len(self._remote_batch) == self._batch.batch_size[0]
"""

MODULES = {
    "roll.distributed.scheduler.remote_protocol": REMOTE_PROTOCOL,
    "roll.distributed.scheduler.protocol": PROTOCOL,
}


def install(setitem) -> types.ModuleType:
    """Register ``roll.distributed.scheduler.{remote_protocol,protocol}`` with ``setitem``
    (``monkeypatch.setitem`` on ``sys.modules``); return the protocol module."""
    for package in ("roll", "roll.distributed", "roll.distributed.scheduler"):
        module = types.ModuleType(package)
        module.__path__ = []
        setitem(sys.modules, package, module)
    for name, source in MODULES.items():
        module = types.ModuleType(name)
        setitem(sys.modules, name, module)
        exec(compile(source, f"<ROLL {name}>", "exec"), module.__dict__)
    return sys.modules["roll.distributed.scheduler.protocol"]
