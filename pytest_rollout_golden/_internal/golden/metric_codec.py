"""Metric values in ``metrics.json``: readable in a PR diff, exact on a round trip.

A Python float is written as a bare JSON number (``repr`` round-trips every
float64 exactly); a Python int or bool as itself. Anything with another dtype
or a shape keeps both: ``{"dtype": "float32", "value": 0.25}`` or
``{"dtype": "float32", "shape": [2], "values": [0.25, 0.5]}``. Every value of
float16/bfloat16/float32 is exactly representable as a float64, so nothing is
lost. NaN and infinities are the strings ``"nan"``, ``"inf"`` and ``"-inf"``; a scalar NaN
other than the dtype's default one also keeps its bits (payload and sign):
``{"dtype": "float32", "value": "nan", "bits": "0x7fc00042"}`` (:mod:`~...store.floatbits`).

Metrics as verl logs them: a ``verl.utils.metric.Metric`` (values plus an
aggregation) is recorded as the number verl reports for it, its
``aggregate()``. A plain list (verl's ``append_to_dict`` keeps one value per
micro-batch) is refused with the reduction to write, because verl picks the
reduction from the metric's name (mean, or max/min for names containing them)
and a list could as well be meant as an array to gate value by value.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Mapping
from typing import Any

from ...errors import UnsupportedValueError
from ...store import floatbits
from ..results import from_json_number, json_number

_SPECIAL = ("nan", "inf", "-inf")  # how JSON holds non-finite floats (results.json_number)


def _is_verl_metric(value: Any) -> bool:
    cls = type(value)
    return (
        (cls.__module__ or "").split(".")[0] == "verl"
        and cls.__name__ == "Metric"
        and hasattr(value, "aggregate")
        and hasattr(value, "values")
    )


def _list_refusal(value: list | tuple, where: str) -> UnsupportedValueError:
    return UnsupportedValueError(
        f"{where}: got {type(value).__name__} of {len(value)} values (verl's append_to_dict "
        "logs one per micro-batch); record the number verl reports, as "
        "`verl.utils.metric.reduce_metrics(metrics)` computes it: `float(np.mean(values))`, "
        "or `np.max(values)` / `np.min(values)` for a name containing 'max' / 'min'; "
        "to gate every value instead, pass `torch.tensor(values)`"
    )


def encode(value: Any, *, where: str) -> Any:
    """JSON node of one metric value (Python number, numpy scalar/array, tensor).

    A verl ``Metric`` is recorded as its ``aggregate()``; a list or tuple is refused
    with the reduction to write (see the module docstring).
    """
    if _is_verl_metric(value):
        if not value.values:
            raise UnsupportedValueError(f"{where}: the verl Metric holds no values")
        return encode(value.aggregate(), where=where)
    if isinstance(value, (list, tuple)):
        raise _list_refusal(value, where)
    if isinstance(value, bool) or (isinstance(value, int) and -(2**63) <= value < 2**63):
        return value
    if isinstance(value, float):
        bits = floatbits.python_bits(value)
        return json_number(value) if bits is None else _nan_node("float64", bits)
    if isinstance(value, int):
        raise UnsupportedValueError(f"{where}: the integer {value} does not fit in int64")
    torch, np = sys.modules.get("torch"), sys.modules.get("numpy")
    if torch is not None and isinstance(value, torch.Tensor):
        t = value.detach()
        if t.is_complex() or t.device.type == "meta":
            raise UnsupportedValueError(
                f"{where}: a {t.dtype} tensor on {t.device} is not a metric"
            )
        if t.layout != torch.strided or t.is_quantized or t.is_nested:
            raise UnsupportedValueError(
                f"{where}: a sparse, quantized or nested tensor is not a metric; "
                "pass `.to_dense()` / `.dequantize()` of it"
            )
        dtype, shape = str(t.dtype).removeprefix("torch."), list(t.shape)
        flat = t.to("cpu").reshape(-1)
        values = (flat.double() if flat.is_floating_point() else flat).tolist()
        bits = floatbits.tensor_bits(flat[0]) if not shape and flat.is_floating_point() else None
    elif np is not None and isinstance(value, (np.ndarray, np.generic)):
        if value.dtype.kind not in "biuf" or value.dtype.itemsize > 8:  # e.g. np.longdouble
            raise UnsupportedValueError(f"{where}: numpy dtype {value.dtype} is not a metric")
        dtype, shape = value.dtype.name, list(np.shape(value))
        values = np.asarray(value).reshape(-1).tolist()
        bits = floatbits.numpy_bits(np.asarray(value)[()]) if not shape else None
    else:
        raise UnsupportedValueError(
            f"{where}: a metric must be a number, a numpy scalar/array or a tensor, "
            f"got {type(value).__name__}"
        )
    if not shape:
        if bits is not None:
            return _nan_node(dtype, bits)
        if dtype in ("float64", "int64"):  # indistinguishable from a Python float / int
            return json_number(values[0])
        return {"dtype": dtype, "value": json_number(values[0])}
    return {"dtype": dtype, "shape": shape, "values": [json_number(v) for v in values]}


def _nan_node(dtype: str, bits: str) -> dict[str, Any]:
    """A NaN whose bits ``"nan"`` would lose (:mod:`~...store.floatbits`)."""
    return {"dtype": dtype, "value": "nan", "bits": bits}


def decode(node: Any, *, where: str) -> Any:
    """The metric as a torch tensor of its recorded dtype and shape (0-d for scalars)."""
    import torch

    try:
        if isinstance(node, bool):
            return torch.tensor(node)
        if isinstance(node, int):
            return torch.tensor(node, dtype=torch.int64)
        if isinstance(node, (float, str)):
            return torch.tensor(float(from_json_number(node)), dtype=torch.float64)
        if "bits" in node:
            return floatbits.tensor(node["bits"], node["dtype"])
        dtype = getattr(torch, node["dtype"])
        via = torch.float64 if dtype.is_floating_point else dtype
        if "value" in node:
            return torch.tensor(from_json_number(node["value"]), dtype=via).to(dtype)
        flat = torch.tensor([from_json_number(v) for v in node["values"]], dtype=via)
        return flat.to(dtype).reshape(node["shape"])
    except (KeyError, TypeError, ValueError, AttributeError, RuntimeError) as exc:
        raise ValueError(f"{where}: unreadable metric value {str(node)[:80]!r} ({exc})") from None


def scalar(node: Any) -> Any:
    """A readable scalar for messages and reports, or ``None`` for arrays."""
    if isinstance(node, dict):
        if "bits" in node:
            return float(floatbits.tensor(node["bits"], node["dtype"]).item())
        return from_json_number(node["value"]) if "value" in node else None
    return from_json_number(node)


def numbers(steps: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, tuple[Any, str]]]:
    """The scalar numbers among metric nodes ``{step: {name: node}}``, as
    ``{step: {name: (value, dtype)}}`` (what calibration measures)."""
    out: dict[str, dict[str, tuple[Any, str]]] = {}
    for step, names in steps.items():
        for name, node in names.items():
            value = scalar(node)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                dtype = node["dtype"] if isinstance(node, dict) else "float64"
                out.setdefault(step, {})[name] = (value, dtype)
    return out


_STEP_KEY = re.compile(r"0|[1-9][0-9]*")
_DTYPES = re.compile(r"bool|u?int(8|16|32|64)|float(16|32|64)|bfloat16|float8_e\w+")


def _int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _plain(x: Any) -> bool:
    if isinstance(x, bool) or (isinstance(x, int) and -(2**63) <= x < 2**64):
        return True
    return (isinstance(x, float) and math.isfinite(x)) or (isinstance(x, str) and x in _SPECIAL)


def problem(node: Any) -> str | None:
    """Why ``node`` is not a metric value :func:`encode` writes, or ``None`` if it is one."""
    if _plain(node):
        return "an integer beyond int64 needs a dtype" if _int(node) and node >= 2**63 else None
    if not isinstance(node, dict):
        return f"{str(node)[:40]!r} is not a number, 'nan', 'inf', '-inf' or a typed value"
    dtype = node.get("dtype")
    if not isinstance(dtype, str) or not _DTYPES.fullmatch(dtype):
        return f"unknown dtype {str(dtype)[:40]!r}"
    if node.keys() == {"dtype", "value", "bits"}:
        if node["value"] != "nan":
            return f"a value with bits must be 'nan', got {str(node['value'])[:40]!r}"
        return floatbits.problem(node["bits"], dtype)
    if node.keys() == {"dtype", "value"}:
        values = [node["value"]]
    elif node.keys() == {"dtype", "shape", "values"}:
        shape, values = node["shape"], node["values"]
        if not isinstance(shape, list) or not all(_int(d) and d >= 0 for d in shape):
            return "its shape is not a list of sizes"
        if not isinstance(values, list) or len(values) != math.prod(shape):
            return f"it does not hold the {math.prod(shape)} values its shape {shape} needs"
    else:
        return f"unexpected fields {sorted(node)}"
    if not all(_plain(v) for v in values):
        return "a value is not a number, 'nan', 'inf' or '-inf'"
    try:
        decode(node, where="")
    except ValueError as exc:
        return str(exc).removeprefix(": ")
    return None


def document_problem(document: Any) -> str | None:
    """Why ``document`` is not a ``metrics.json`` we write (naming step and metric), or ``None``."""
    if not isinstance(document, dict) or not isinstance(document.get("steps"), dict):
        return "is not a metrics file of ours (no step table)"
    for step, names in document["steps"].items():
        if not _STEP_KEY.fullmatch(step):
            return f"has a step key {step[:40]!r} that is not an integer >= 0"
        if not isinstance(names, dict):
            return f"step {step}: not a table of metrics"
        for name, node in names.items():
            why = problem(node)
            if why is not None:
                return f"step {step}, metric {name[:80]!r}: {why}"
    return None
