"""Turn a rollout batch into named arrays plus a JSON layout, and back, without pickle.

A batch is any nesting of mappings, lists and tuples whose leaves are torch
tensors (dense, or nested: jagged as values + offsets, strided as their
components), numpy arrays, numpy scalars, bytes or JSON scalars. TensorDicts
(with their device; nested ones too), tensordict's ``NonTensorData`` /
``NonTensorStack``, verl/ROLL ``DataProto``-like objects (``.batch``,
``.non_tensor_batch``, ``.meta_info``) and ROLL's ``BatchProxy`` (recorded as the
TensorDict or dict it wraps) are recognised by shape, without importing those
frameworks; on load they are rebuilt only with classes the process already
imported. Numeric arrays go to safetensors under a path-like
key; everything else is described by the layout, a JSON tree in which a node
is a JSON scalar, a list of nodes, or a tagged object ``{"t": ...}``.
"""

from __future__ import annotations

import base64
import dataclasses
import inspect
import math
import re
import sys
import types
from collections.abc import Callable, Mapping
from typing import Any

from ..errors import GoldenFormatError, UnsupportedValueError
from . import floatbits


@dataclasses.dataclass
class RolloutBatch:
    """A ``DataProto``-shaped batch, returned on replay when the original class is unavailable.

    ``recorded_as`` names (``module:qualname``) the class the batch was recorded
    from; recording a RolloutBatch records that name, so replay rebuilds that class
    where it is imported.
    """

    batch: Any
    non_tensor_batch: dict[str, Any]
    meta_info: dict[str, Any]
    recorded_as: str | None = dataclasses.field(default=None, kw_only=True, compare=False)

    def __len__(self) -> int:
        for value in self.batch.values():
            return int(value.shape[0])
        for value in self.non_tensor_batch.values():
            return len(value)
        return 0


def is_dataproto_like(value: Any) -> bool:
    return not isinstance(value, Mapping) and all(
        hasattr(value, attr) for attr in ("batch", "non_tensor_batch", "meta_info")
    )


def batch_proxy(value: Any) -> tuple[Any, Any, int] | None:
    """``(wrapped, remote_batch, batch_size)`` of a ROLL ``BatchProxy``, else None.

    ROLL's ``DataProto.batch`` and ``.non_tensor_batch`` return one: a view of a
    TensorDict (or dict) plus an optional ``remote_batch`` held by a remote store.
    Recognised by class name and instance attributes, never by calling its methods
    (its ``items()`` would fetch the remote part).
    """
    if type(value).__name__ != "BatchProxy" or isinstance(value, Mapping):
        return None
    own = getattr(value, "__dict__", None)
    if not isinstance(own, dict) or not {"_batch", "_remote_batch", "_batch_size"} <= own.keys():
        return None
    remote = own["_remote_batch"]
    try:
        empty = remote is not None and not remote.keys()  # every key fetched into the batch
    except Exception:  # a remote store's object: taken as holding data
        empty = False
    return own["_batch"], None if empty else remote, own["_batch_size"]


def _unproxied(value: Any) -> Any:
    """The TensorDict or dict a ROLL ``BatchProxy`` wraps; any other value itself."""
    proxy = batch_proxy(value)
    return value if proxy is None or proxy[1] is not None else proxy[0]


def class_name(cls: type) -> str:
    """``module:qualname``, the way a layout names a class."""
    return f"{cls.__module__}:{cls.__qualname__}"


def dataclasses_to_dicts(value: Any) -> Any:
    """``value`` with dataclass objects turned into dicts, recursively (``rollout-golden import``).

    A DataProto-like object (verl's is a dataclass) keeps its class: only its
    contents are converted, and if any was, it comes back as a :class:`RolloutBatch`
    that records the original class. Returns ``value`` itself when nothing
    needed converting.
    """
    import numpy as np

    if is_dataproto_like(value):
        non_tensor = _unproxied(value.non_tensor_batch)
        if batch_proxy(non_tensor) is not None:  # a remote part: flatten() refuses it by name
            return value
        non_tensor = non_tensor if non_tensor is not None else {}
        meta = value.meta_info if value.meta_info is not None else {}
        converted = {k: dataclasses_to_dicts(v) for k, v in non_tensor.items()}
        new_meta = dataclasses_to_dicts(dict(meta))
        if all(converted[k] is non_tensor[k] for k in converted) and all(
            new_meta[k] is meta[k] for k in new_meta
        ):
            return value
        spec = value.recorded_as if isinstance(value, RolloutBatch) else None
        return RolloutBatch(
            _unproxied(value.batch),
            converted,
            new_meta,
            recorded_as=spec or class_name(type(value)),
        )
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: dataclasses_to_dicts(getattr(value, f.name)) for f in dataclasses.fields(value)
        }
    if isinstance(value, dict):
        items = {k: dataclasses_to_dicts(v) for k, v in value.items()}
        return value if all(items[k] is value[k] for k in value) else items
    if isinstance(value, (list, tuple)):
        items = [dataclasses_to_dicts(v) for v in value]
        if all(a is b for a, b in zip(items, value, strict=True)):
            return value
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, np.ndarray) and value.dtype == object:
        flat = [dataclasses_to_dicts(v) for v in value.reshape(-1)]
        if all(a is b for a, b in zip(flat, value.reshape(-1), strict=True)):
            return value
        out = np.empty(len(flat), dtype=object)
        out[:] = flat
        return out.reshape(value.shape)
    return value


def is_tensordict_like(value: Any) -> bool:
    """Whether ``value`` is a tensordict TensorDict (or a subclass), without importing it."""
    module = type(value).__module__ or ""
    return module.split(".")[0] == "tensordict" and hasattr(value, "batch_size")


def _non_tensor_kind(value: Any) -> str | None:
    """``"data"`` / ``"stack"`` for tensordict's NonTensorData / NonTensorStack, else None.

    Both are tensordict-like (a stack is even a Mapping), so they are told apart by
    class name before the TensorDict branch would take them for empty TensorDicts.
    """
    if not is_tensordict_like(value):
        return None
    names = {c.__name__ for c in type(value).__mro__}
    if "NonTensorStack" in names:
        return "stack"
    if "NonTensorData" in names or "NonTensorDataBase" in names:
        return "data"
    return None


def is_torch_tensor(value: Any) -> bool:
    """Whether ``value`` is a torch tensor; never imports torch."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def _is_numpy(value: Any, kind: str) -> bool:
    np = sys.modules.get("numpy")
    return np is not None and isinstance(value, np.ndarray if kind == "array" else np.generic)


def _where(path: list[str]) -> str:
    return "".join(f"[{p!r}]" if not p.isdigit() else f"[{p}]" for p in path) or "<top>"


def flatten(value: Any) -> tuple[dict[str, Any], Any]:
    """Split ``value`` into ``(arrays, layout)``: named tensors/arrays and a JSON-able tree."""
    flattener = _Flattener()
    return flattener.arrays, flattener.node(value, [])


def value_differences(a: Any, b: Any) -> list[str]:
    """Where layouts ``a`` and ``b`` differ other than in the arrays: the paths (spelled as
    array keys are; ``value`` for the whole batch) of the non-tensor values, kinds of
    container and entries that differ, each difference at its outermost path only. Arrays
    (compared on their own) and devices are left out; ``1``, ``1.0`` and ``True`` differ."""
    left, right = _by_path(a, ()), _by_path(b, ())
    differing = {p for p in left.keys() | right.keys() if left.get(p) != right.get(p)}
    outermost = [p for p in differing if not any(p[:n] in differing for n in range(len(p)))]
    return sorted("/".join(p) or "value" for p in outermost)


def _by_path(node: Any, path: tuple[str, ...]) -> dict[tuple[str, ...], list[Any]]:
    """What :func:`value_differences` compares: per path, what the layout says there that is
    not an array (a container's kind and its own fields, or a value)."""
    out: dict[tuple[str, ...], list[Any]] = {}

    def walk(n: Any, at: tuple[str, ...]) -> None:
        tag = n.get("t") if isinstance(n, dict) else None
        if tag in ("torch", "numpy"):
            return
        here = out.setdefault(at, [])
        if isinstance(n, list):
            here.append("list")
            for i, x in enumerate(n):
                walk(x, (*at, str(i)))
        elif tag in ("dict", "tensordict"):
            ints = sorted(str(k) for k, _ in n["items"] if isinstance(k, int))
            here.append({**_fields(n, ("items", "device")), "int keys": ints})
            for k, v in n["items"]:
                walk(v, (*at, str(k)))
        elif tag == "tuple":
            here.append("tuple")
            for i, x in enumerate(n["v"]):
                walk(x, (*at, str(i)))
        elif tag in ("dataproto", "batchproxy"):
            parts = ("batch", "non_tensor_batch", "meta_info") if tag == "dataproto" else ("v",)
            here.append(_fields(n, parts))
            for part in parts:
                walk(n[part], (*at, part) if tag == "dataproto" else at)
        else:
            here.append(_strip_arrays(n) if tag else (type(n).__name__, n))

    walk(node, path)
    return out


def _fields(node: dict[str, Any], leave_out: tuple[str, ...]) -> dict[str, Any]:
    return {k: v for k, v in node.items() if k not in leave_out}


def _strip_arrays(layout: Any) -> Any:
    """The layout without array descriptors and devices: what is left are the non-tensor
    values and the structure."""
    if isinstance(layout, list):
        return [_strip_arrays(x) for x in layout]
    if isinstance(layout, dict):
        if layout.get("t") in ("torch", "numpy"):
            return {"t": "array"}
        return {k: _strip_arrays(v) for k, v in layout.items() if k != "device"}
    return layout


def _non_finite(v: float) -> dict[str, Any]:
    """The layout node of a non-finite float: its text, and its bits where the text loses
    them (:mod:`.floatbits`)."""
    bits = floatbits.python_bits(v)
    return {"t": "float", "v": repr(v), **({"bits": bits} if bits else {})}


def _check_bits(text: Any, dtype: str, path: list[str]) -> None:
    why = floatbits.problem(text, dtype)
    if why is not None:
        raise GoldenFormatError(f"value at {_where(path)}: {why}")


class _Flattener:
    """One :func:`flatten` call: the arrays found so far, and the layout node of each value.

    :meth:`node` tries the kinds of value in a fixed order, which matters: numpy scalars
    before ``str``/``float`` (``np.str_`` and ``np.float64`` subclass them), tensordict's
    non-tensor classes before TensorDicts, a ROLL ``BatchProxy`` before DataProto-likes.
    """

    def __init__(self) -> None:
        self.arrays: dict[str, Any] = {}

    def key_for(self, path: list[str]) -> str:
        """A new safetensors key for the array at ``path``; never the header's ``__metadata__``."""
        key = "/".join(path) or "value"
        unique, n = key, 1
        while unique in self.arrays or unique == "__metadata__":
            unique, n = f"{key}#{n}", n + 1
        return unique

    def node(self, v: Any, path: list[str]) -> Any:
        if _is_numpy(v, "scalar"):  # before str/float: np.str_ and np.float64 subclass them
            return self.numpy_scalar(v, path)
        if v is None or isinstance(v, (bool, int, str)):
            return v
        if isinstance(v, float):
            return v if math.isfinite(v) else _non_finite(v)
        if is_torch_tensor(v):
            return self.tensor(v, path)
        if (_is_numpy(v, "array") or _is_numpy(v, "scalar")) and v.dtype.kind == "V":
            raise UnsupportedValueError(
                f"structured numpy value at {_where(path)} (dtype {v.dtype}) cannot be replayed; "
                "record each field as its own array"
            )
        if _is_numpy(v, "array"):
            return self.numpy_array(v, path)
        if isinstance(v, bytes):
            return {"t": "bytes", "v": base64.b64encode(v).decode("ascii")}
        kind = _non_tensor_kind(v)
        if kind is not None:
            data = v.tolist() if kind == "stack" else v.data
            return {
                "t": f"nontensor{kind}",
                "batch_size": list(v.batch_size),
                "v": self.node(data, path),
            }
        if is_tensordict_like(v):
            return self.tensordict(v, path)
        proxy = batch_proxy(v)
        if proxy is not None:
            return self.batch_proxy(v, proxy, path)
        if is_dataproto_like(v):
            return self.dataproto(v, path)
        if isinstance(v, Mapping):
            return {"t": "dict", "items": _items(v.items(), path, self.node)}
        if isinstance(v, list):
            return [self.node(x, [*path, str(i)]) for i, x in enumerate(v)]
        if isinstance(v, tuple):
            return {"t": "tuple", "v": [self.node(x, [*path, str(i)]) for i, x in enumerate(v)]}
        raise UnsupportedValueError(
            f"value at {_where(path)} has type {type(v).__module__}.{type(v).__qualname__}, "
            "which cannot be stored without pickle; convert it to a torch tensor, a numpy "
            "array or a JSON-able value (str, int, float, bool, None, list, dict) before recording"
        )

    def numpy_scalar(self, v: Any, path: list[str]) -> Any:
        if v.dtype.kind in "mMOV":
            raise UnsupportedValueError(
                f"numpy scalar at {_where(path)} has dtype {v.dtype}, which cannot be "
                "recorded; convert it to a number or a str"
            )
        bits = floatbits.numpy_bits(v) if v.dtype.kind == "f" else None
        if bits is not None:  # v.item() would widen the NaN and lose its bits
            return {"t": "npscalar", "dtype": v.dtype.str, "v": _non_finite(math.nan), "bits": bits}
        return {"t": "npscalar", "dtype": v.dtype.str, "v": self.node(v.item(), path)}

    def tensor(self, v: Any, path: list[str]) -> Any:
        if v.is_nested:
            return self.nested(v, path)
        if v.is_sparse or v.is_quantized:
            raise UnsupportedValueError(
                f"tensor at {_where(path)} is sparse or quantized; "
                "store it dense (`.to_dense()`, `.dequantize()`) before recording"
            )
        key = self.key_for(path)
        self.arrays[key] = v
        return {"t": "torch", "k": key, "device": str(v.device)}

    def nested(self, t: Any, path: list[str]) -> Any:
        import torch

        if t.layout == torch.jagged:
            out = {"t": "jagged", "ragged_idx": int(t._ragged_idx), "device": str(t.device)}
            parts = [("values", t.values()), ("offsets", t.offsets()), ("lengths", t.lengths())]
            for name, part in parts:
                if part is not None:
                    out[name] = self.key_for([*path, name])
                    self.arrays[out[name]] = part
            return out
        rows = t.unbind()
        if not rows:
            raise UnsupportedValueError(
                f"nested tensor at {_where(path)} has no rows; record an empty dense tensor"
            )
        return {"t": "nested", "v": [self.node(x, [*path, str(i)]) for i, x in enumerate(rows)]}

    def numpy_array(self, v: Any, path: list[str]) -> Any:
        if v.dtype.kind in "OUS":
            return {
                "t": "ndarray",
                "dtype": v.dtype.str,
                "shape": list(v.shape),
                "v": [self.node(x, [*path, str(i)]) for i, x in enumerate(v.reshape(-1).tolist())],
            }
        key = self.key_for(path)
        self.arrays[key] = v
        return {"t": "numpy", "k": key}

    def tensordict(self, v: Any, path: list[str]) -> Any:
        out = {
            "t": "tensordict",
            "batch_size": list(v.batch_size),
            "items": _items(v.items(), path, self.node),
        }
        if getattr(v, "device", None) is not None:  # no key: a TensorDict without a device
            out["device"] = str(v.device)
        return out

    def batch_proxy(self, v: Any, proxy: tuple[Any, Any, int], path: list[str]) -> Any:
        wrapped, remote, size = proxy
        if remote is not None:
            raise UnsupportedValueError(remote_part(remote, path))
        return {
            "t": "batchproxy",
            "cls": class_name(type(v)),
            "batch_size": size,
            "v": self.node(wrapped, path),
        }

    def dataproto(self, v: Any, path: list[str]) -> Any:
        recorded_as = v.recorded_as if isinstance(v, RolloutBatch) else None
        batch, non_tensor = v.batch, v.non_tensor_batch
        for part, name in ((batch, "batch"), (non_tensor, "non_tensor_batch")):
            proxy = batch_proxy(part)
            if proxy is not None and proxy[1] is not None:
                raise UnsupportedValueError(remote_part(proxy[1], [*path, name]))
        batch, non_tensor = _unproxied(batch), _unproxied(non_tensor)
        return {
            "t": "dataproto",
            "cls": recorded_as or class_name(type(v)),
            "batch": self.node(batch, [*path, "batch"]) if batch is not None else None,
            "non_tensor_batch": self.node(dict(non_tensor), [*path, "non_tensor_batch"]),
            "meta_info": self.node(dict(v.meta_info), [*path, "meta_info"]),
        }


def remote_part(remote: Any, path: list[str]) -> str:
    """Why a ROLL batch whose ``remote_batch`` holds data cannot be recorded, and the remedy."""
    try:
        keys = ", ".join(repr(k) for k in sorted(remote.keys()))
    except Exception:  # a remote store's object: its keys are only a courtesy here
        keys = "?"
    return (
        f"the ROLL batch at {_where(path)} keeps keys {keys} in a remote_batch (on a remote "
        "store, not in the object): a golden of it would lack them. Materialize them into "
        "the local TensorDict (`dp.batch = TensorDict(dict(dp.batch.items()), "
        "batch_size=len(dp))`) first"
    )


def _items(pairs: Any, path: list[str], node: Callable[[Any, list[str]], Any]) -> list[Any]:
    out = []
    for k, v in pairs:
        if isinstance(k, bool) or not isinstance(k, (str, int)):
            raise UnsupportedValueError(
                f"mapping key {k!r} at {_where(path)} is a {type(k).__name__}; "
                "only str and int keys can be recorded"
            )
        out.append([k, node(v, [*path, str(k)])])
    return out


def unflatten(
    arrays: Mapping[str, Any],
    layout: Any,
    *,
    rebuild: Callable[..., Any] | None = None,
    on_cpu: bool = False,
) -> Any:
    """Rebuild the value described by ``layout`` from ``arrays`` (inverse of :func:`flatten`).

    Each tensor goes onto the device it was recorded on where this machine has it, or onto
    the CPU with ``on_cpu`` (a reader that compares or prints, and needs no accelerator).

    Every TensorDict's batch_size and device is checked against its entries whether or not
    tensordict is imported, so what loads without it (``rollout-golden verify``) also loads
    with it (replay). Raises :class:`~.errors.GoldenFormatError` naming the key at fault.
    """
    try:
        return _Unflattener(arrays, rebuild, on_cpu).node(layout, [])
    except (KeyError, TypeError, ValueError) as exc:
        raise GoldenFormatError(f"layout does not match the stored arrays ({exc!r})") from exc


class _Unflattener:
    """One :func:`unflatten` call: each layout node back into its value, by the method
    ``decode_<tag>`` of its tag (:data:`_DECODERS`)."""

    def __init__(
        self, arrays: Mapping[str, Any], rebuild: Callable[..., Any] | None, on_cpu: bool
    ) -> None:
        self.arrays = arrays
        self.rebuild = rebuild
        self.on_cpu = on_cpu

    def device(self, recorded: Any, path: list[str]) -> str:
        """Where a value recorded on device ``recorded`` goes (see :func:`_device_here`)."""
        here = _device_here(recorded, path)  # checks the layout's device even for the CPU
        return "cpu" if self.on_cpu else here

    def node(self, n: Any, path: list[str]) -> Any:
        if n is None or isinstance(n, (bool, int, float, str)):
            return n
        if isinstance(n, list):
            return [self.node(x, [*path, str(i)]) for i, x in enumerate(n)]
        if not isinstance(n, dict) or "t" not in n:
            raise GoldenFormatError(f"unknown layout node {str(n)[:80]!r}")
        tag = n["t"]
        decode = _DECODERS.get(tag) if isinstance(tag, str) else None
        if decode is None:
            raise GoldenFormatError(f"unknown layout tag {tag!r}")
        return decode(self, n, path)

    def decode_float(self, n: dict[str, Any], path: list[str]) -> Any:
        if "bits" in n:
            _check_bits(n["bits"], "float64", path)
            return floatbits.python_float(n["bits"])
        return float(n["v"])

    def decode_torch(self, n: dict[str, Any], path: list[str]) -> Any:
        return _to_device(self.arrays[n["k"]], self.device(n.get("device", "cpu"), path))

    def decode_numpy(self, n: dict[str, Any], path: list[str]) -> Any:
        return self.arrays[n["k"]]

    def decode_ndarray(self, n: dict[str, Any], path: list[str]) -> Any:
        import numpy as np

        out = np.empty(len(n["v"]), dtype=np.dtype(n["dtype"]))
        for i, x in enumerate(n["v"]):
            out[i] = self.node(x, path)  # scalars: no path of their own (one per row is slow)
        return out.reshape(n["shape"])

    def decode_npscalar(self, n: dict[str, Any], path: list[str]) -> Any:
        import numpy as np

        if "bits" in n:
            _check_bits(n["bits"], np.dtype(n["dtype"]).name, path)
            return floatbits.numpy_scalar(n["bits"], n["dtype"])
        return np.array(self.node(n["v"], path), dtype=np.dtype(n["dtype"]))[()]

    def decode_bytes(self, n: dict[str, Any], path: list[str]) -> Any:
        return base64.b64decode(n["v"])

    def decode_tuple(self, n: dict[str, Any], path: list[str]) -> Any:
        return tuple(self.node(x, [*path, str(i)]) for i, x in enumerate(n["v"]))

    def decode_dict(self, n: dict[str, Any], path: list[str]) -> Any:
        return {k: self.node(v, [*path, str(k)]) for k, v in n["items"]}

    def decode_tensordict(self, n: dict[str, Any], path: list[str]) -> Any:
        batch_size = _batch_size(n, path)
        device = self.device(n["device"], path) if "device" in n else None
        items = {}
        for key, child in n["items"]:
            items[key] = self.node(child, [*path, str(key)])
            _check_batch_dims(child, items[key], batch_size, path, key)
        td = sys.modules.get("tensordict")
        if td is None:
            return items
        if "device" in n:
            return td.TensorDict(items, batch_size=batch_size, device=device)
        return td.TensorDict(items, batch_size=batch_size)

    def decode_nontensordata(self, n: dict[str, Any], path: list[str]) -> Any:
        td = sys.modules.get("tensordict")
        data = self.node(n["v"], path)
        batch_size = _batch_size(n, path)
        return td.NonTensorData(data, batch_size=batch_size) if td else data

    def decode_nontensorstack(self, n: dict[str, Any], path: list[str]) -> Any:
        td = sys.modules.get("tensordict")
        data = self.node(n["v"], path)
        batch_size = _batch_size(n, path)
        if not batch_size or not _nests_as(data, batch_size):
            raise GoldenFormatError(
                f"has a corrupted layout: the non-tensor stack at {_where(path)} records "
                f"batch_size {batch_size}, which its values do not fill"
            )
        return _non_tensor_stack(td, data, len(batch_size)) if td else data

    def decode_jagged(self, n: dict[str, Any], path: list[str]) -> Any:
        import torch

        device = self.device(n["device"], path)
        parts = {p: self.arrays[n[p]] for p in ("values", "offsets", "lengths") if p in n}
        nt = torch.nested.nested_tensor_from_jagged(**parts, jagged_dim=n["ragged_idx"])
        return _to_device(nt, device)

    def decode_nested(self, n: dict[str, Any], path: list[str]) -> Any:
        import torch

        parts = [self.node(x, [*path, str(i)]) for i, x in enumerate(n["v"])]
        return torch.nested.as_nested_tensor(parts, layout=torch.strided)

    def decode_dataproto(self, n: dict[str, Any], path: list[str]) -> Any:
        parts = {p: self.node(n[p], [*path, p]) for p in ("batch", "non_tensor_batch", "meta_info")}
        factory = self.rebuild or _already_imported_class(n["cls"], _DATAPROTO_ARGS)
        return factory(**parts) if factory else RolloutBatch(**parts, recorded_as=n["cls"])

    def decode_batchproxy(self, n: dict[str, Any], path: list[str]) -> Any:
        wrapped = self.node(n["v"], [*path, "batch"])
        proxy = _already_imported_class(n["cls"], _PROXY_ARGS)
        if proxy is None:
            return wrapped
        return proxy(batch=wrapped, remote_batch=None, batch_size=n["batch_size"])


_DECODERS: dict[str, Callable[[_Unflattener, dict[str, Any], list[str]], Any]] = {
    "float": _Unflattener.decode_float,
    "torch": _Unflattener.decode_torch,
    "numpy": _Unflattener.decode_numpy,
    "ndarray": _Unflattener.decode_ndarray,
    "npscalar": _Unflattener.decode_npscalar,
    "bytes": _Unflattener.decode_bytes,
    "tuple": _Unflattener.decode_tuple,
    "dict": _Unflattener.decode_dict,
    "tensordict": _Unflattener.decode_tensordict,
    "nontensordata": _Unflattener.decode_nontensordata,
    "nontensorstack": _Unflattener.decode_nontensorstack,
    "jagged": _Unflattener.decode_jagged,
    "nested": _Unflattener.decode_nested,
    "dataproto": _Unflattener.decode_dataproto,
    "batchproxy": _Unflattener.decode_batchproxy,
}


def _batch_size(n: Mapping[str, Any], path: list[str]) -> list[int]:
    """The recorded batch_size of a TensorDict or non-tensor node, if it is a list of sizes."""
    batch_size = n["batch_size"]
    if not (
        isinstance(batch_size, list)
        and len(batch_size) <= _MAX_BATCH_DIMS
        and all(type(d) is int and d >= 0 for d in batch_size)
    ):
        raise GoldenFormatError(
            f"has a corrupted layout: the {_container(n)} at {_where(path)} records "
            f"batch_size {str(batch_size)[:80]}, which is not a list of sizes"
        )
    return batch_size


_MAX_BATCH_DIMS = 64  # numpy's limit on dimensions

# layout tags a TensorDict entry can have: what TensorDict.items() yields when recorded
_ENTRY_TAGS = frozenset(
    {"torch", "numpy", "jagged", "nested", "tensordict", "nontensordata", "nontensorstack"}
)


def _container(n: Mapping[str, Any]) -> str:
    return "TensorDict" if n.get("t") == "tensordict" else "non-tensor value"


def _check_batch_dims(
    child: Any, value: Any, batch_size: list[int], path: list[str], key: Any
) -> None:
    """GoldenFormatError unless entry ``key`` (layout ``child``, decoded ``value``) of the
    TensorDict at ``path`` has ``batch_size`` as its leading dimensions."""
    where = (
        f"the TensorDict at {_where(path)} records batch_size {batch_size}, but its entry {key!r}"
    )
    tag = child.get("t") if isinstance(child, dict) else None
    if tag not in _ENTRY_TAGS:
        raise GoldenFormatError(
            f"has a corrupted layout: {where} is a {type(value).__name__}, "
            "which a TensorDict never holds"
        )
    if tag == "nontensordata":
        return  # tensordict gives a non-tensor value the batch size of its TensorDict
    dims: list[int] | tuple[int, ...]
    if tag in ("tensordict", "nontensorstack"):
        what, dims, complete = "batch_size", list(child["batch_size"]), True
    elif tag == "nested":
        what, dims, complete = "rows", [len(child["v"])], False  # the other dims are ragged
    else:
        shape = tuple(value.shape)
        known = next((i for i, d in enumerate(shape) if type(d) is not int), len(shape))
        what, dims, complete = "shape", shape[:known], known == len(shape)  # jagged: symbolic
    short = complete and len(dims) < len(batch_size)
    if short or any(d != b for d, b in zip(dims, batch_size, strict=False)):
        raise GoldenFormatError(f"has a corrupted layout: {where} has {what} {dims}")


def _nests_as(data: Any, batch_size: list[int]) -> bool:
    """Whether ``data`` is nested lists of the sizes ``batch_size``."""
    if not batch_size:
        return True
    return (
        isinstance(data, list)
        and len(data) == batch_size[0]
        and all(_nests_as(x, batch_size[1:]) for x in data)
    )


# Device types of torch (meta excepted: it holds no data) and of its common out-of-tree
# backends; a golden may record any of them and load where that device is missing.
_DEVICE_TYPES = frozenset(
    {
        *("cpu", "cuda", "xpu", "mps", "hip", "hpu", "npu", "mtia", "xla", "maia", "ipu"),
        *("lazy", "ve", "fpga", "vulkan", "mkldnn", "opengl", "opencl", "ideep", "privateuseone"),
    }
)
_DEVICE = re.compile(r"([a-z][a-z0-9_]*)(?::([0-9]{1,4}))?")


def _device_here(device: Any, path: list[str]) -> str:
    """The recorded device if this machine has it, else the closest one it has (CPU at worst).

    Raises GoldenFormatError for anything but a device string of a known type.
    """
    match = _DEVICE.fullmatch(device) if isinstance(device, str) else None
    if match is None or match[1] not in _DEVICE_TYPES:
        why = "which holds no data" if device == "meta" else "not a device this package records"
        raise GoldenFormatError(
            f"has a corrupted layout: the value at {_where(path)} records the device "
            f"{str(device)[:40]!r}, {why}"
        )
    kind, index = match[1], match[2]
    if kind == "cpu":
        return device
    module = _device_module(kind)
    if module is None or not _call(module, "is_available", False):
        return "cpu"
    if index is not None and int(index) >= _call(module, "device_count", 0):
        return kind
    return device


def _device_module(kind: str) -> types.ModuleType | None:
    """``torch.<kind>`` (``torch.cuda``, ``torch.npu`` once torch_npu is imported), if loaded."""
    import torch

    module = vars(torch).get(kind)
    return module if isinstance(module, types.ModuleType) else None


def _call(module: types.ModuleType, name: str, default: Any) -> Any:
    function = vars(module).get(name)
    if not callable(function):
        return default
    try:
        return function()
    except Exception:  # a backend that cannot even say: it is not there
        return default


def _to_device(tensor: Any, device: str) -> Any:
    """``tensor`` (read into CPU memory) on ``device``, a device of this machine."""
    return tensor.to(device) if device != "cpu" else tensor


def _non_tensor_stack(td: Any, data: Any, ndim: int) -> Any:
    """A NonTensorStack of ``ndim`` stacked dimensions over the nested list ``data``."""
    if ndim <= 1:
        return td.NonTensorStack.from_list([td.NonTensorData(x) for x in data])
    return td.NonTensorStack.from_list([_non_tensor_stack(td, x, ndim - 1) for x in data])


_DATAPROTO_ARGS = frozenset({"batch", "non_tensor_batch", "meta_info"})
_PROXY_ARGS = frozenset({"batch", "remote_batch", "batch_size"})


def _already_imported_class(spec: str, args: frozenset[str]) -> Callable[..., Any] | None:
    """The recorded class (DataProto, BatchProxy), if the test process already imported it.

    Nothing is imported on behalf of a golden file (see :func:`_imported_object`),
    and only a class whose constructor takes the keyword arguments ``args`` is
    used, so a crafted layout cannot make us call an arbitrary callable.
    """
    obj = _imported_object(spec)
    if not isinstance(obj, type):
        return None
    try:
        params = inspect.signature(obj).parameters
    except (TypeError, ValueError):
        return None
    if not args <= params.keys():
        return None
    return obj


def _imported_object(spec: str) -> Any:
    """The object named ``module:qualname`` if it already exists in this process, else None.

    The module is looked up in ``sys.modules`` and each part of the qualname in
    the own namespace (``__dict__``) of the object before it. ``getattr`` is never
    used: a lazy module's ``__getattr__`` (torch's) would import the submodule a
    crafted name asks for, and everything behind it.
    """
    module_name, _, qualname = spec.partition(":")
    obj: Any = sys.modules.get(module_name)
    for part in qualname.split("."):
        if obj is None:
            return None
        obj = _own_namespace(obj).get(part)
    return obj


def _own_namespace(obj: Any) -> Mapping[str, Any]:
    """The ``__dict__`` of a module or class, read without running any of its code.

    A class name only walks through modules and classes; any other object gives ``{}``.
    """
    for kind in (types.ModuleType, type):
        if issubclass(type(obj), kind):
            return kind.__dict__["__dict__"].__get__(obj)
    return {}
