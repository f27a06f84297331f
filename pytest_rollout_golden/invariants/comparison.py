"""What every checker shares: failure reports, dtype roundoff, the tolerance rule, batch helpers."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn

import torch
from torch import Tensor

from ..reference.masking import as_bool_mask

Batch = Mapping[str, Any]
MAX_SHOWN = 8
F32_EPS = torch.finfo(torch.float32).eps
F64_EPS = torch.finfo(torch.float64).eps
TOKEN_FLOATS = ("old_log_probs", "rollout_log_probs", "log_probs", "advantages")


# --------------------------------------------------------------------------- failure reports


def fail(invariant: str, summary: str, details: Sequence[str] = ()) -> NoReturn:
    lines = [f"[{invariant}] {summary}"]
    lines += [f"  {line}" for line in details[:MAX_SHOWN]]
    if len(details) > MAX_SHOWN:
        lines.append(f"  ... and {len(details) - MAX_SHOWN} more")
    raise AssertionError("\n".join(lines))


def fmt(value: float) -> str:
    return f"{value:.6g}"


def positions(bad: Tensor) -> list[tuple[int, ...]]:
    return [tuple(int(i) for i in index) for index in bad.nonzero()]


# --------------------------------------------------------------------------- small helpers


def f64(values: Tensor) -> Tensor:
    return values.detach().to(torch.float64)


def unit_roundoff(*dtypes: torch.dtype) -> float:
    floats = [torch.finfo(d).eps for d in dtypes if d.is_floating_point]
    return max(floats) if floats else F64_EPS


def accumulation_roundoff(eps: float) -> float:
    return eps if eps < F32_EPS else F32_EPS


def first_item(output: Any) -> Any:
    return output[0] if isinstance(output, tuple | list) else output


def accepts(fn: Callable[..., Any], name: str) -> bool:
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(
        (p.name == name and p.kind != p.POSITIONAL_ONLY) or p.kind == p.VAR_KEYWORD
        for p in parameters
    )


def valid_mask(batch: Batch) -> Tensor:
    return as_bool_mask(batch["response_mask"])


def batch_counts(batch: Batch) -> tuple[int, int]:
    valid = valid_mask(batch)
    return int(valid.sum()), int(valid.any(dim=-1).sum())


def replace_valid(values: Tensor, valid: Tensor, new: Tensor) -> Tensor:
    return torch.where(valid, new.to(values.dtype), values)


def regarble(batch: Batch) -> dict[str, Any]:
    """The batch with different (still finite) garbage in every padding position."""
    valid = valid_mask(batch)
    out = dict(batch)
    for key in TOKEN_FLOATS:
        if key in batch:
            values = batch[key]
            out[key] = torch.where(valid, values, values + 37.0 + values.abs())
    return out


def token_tensor(name: str, output: Any, shape: torch.Size) -> Tensor:
    output = first_item(output)
    if not isinstance(output, Tensor):
        fail(f"{name}.shape", f"expected a tensor, got {type(output).__name__}")
    if output.shape != shape:
        fail(f"{name}.shape", f"expected shape {tuple(shape)}, got {tuple(output.shape)}")
    if output.is_floating_point() and not bool(torch.isfinite(output).all()):
        bad = ~torch.isfinite(output)
        fail(
            f"{name}.finite",
            f"{int(bad.sum())} non-finite entries",
            [f"(b={b}, t={t}): {fmt(float(output[b, t]))}" for b, t in positions(bad)],
        )
    return output
