"""What every checker shares: failure reports, dtype roundoff, the tolerance rule, batch helpers."""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import torch
from torch import Tensor

from ..reference.correction import SAFETY_BOUND
from ..reference.masking import as_bool_mask

Batch = Mapping[str, Any]
MAX_SHOWN = 8
F32_EPS = torch.finfo(torch.float32).eps
F64_EPS = torch.finfo(torch.float64).eps
TOKEN_FLOATS = (
    "old_log_probs",
    "rollout_log_probs",
    "log_probs",
    "ref_log_probs",
    "advantages",
    "token_level_rewards",
    "values",
    "is_weights",
    "vpreds",
    "returns",
)

GUARD_RTOL = 4e-6
"""Relative allowance for epsilon guards: ``x / (n + δ)`` with ``δ ≤ 1e-6`` and ``n ≥ 1``
differs from ``x / n`` by at most ``1e-6`` relative; a value may pass through two guarded
quotients (a per-sequence mean inside a global mean, weights divided by a guarded mean
weight), and the reference rounds too, hence ``4e-6``. The bugs the checkers exist for are
errors of ``1e-3`` and more, 250 times larger."""


# --------------------------------------------------------------------------- failure reports


def fail(invariant: str, summary: str, details: Sequence[str] = ()) -> NoReturn:
    lines = [f"[{invariant}] {summary}"]
    lines += [f"  {line}" for line in details[:MAX_SHOWN]]
    if len(details) > MAX_SHOWN:
        lines.append(f"  ... and {len(details) - MAX_SHOWN} more")
    raise AssertionError("\n".join(lines))


def fmt(value: float, digits: int = 6) -> str:
    return f"{value:.{digits}g}"


def positions(bad: Tensor) -> list[tuple[int, ...]]:
    return [tuple(int(i) for i in index) for index in bad.nonzero()]


def unequal_coefficients(
    coefficient: Tensor, judged: Tensor, slack: Tensor, *, per_row: bool
) -> list[tuple[int, int, int]]:
    """``(b, t, t0)`` for each judged token whose coefficient differs by more than the two
    tokens' slacks from that of the first judged token ``t0`` of its row (``per_row``) or of
    the batch."""
    found: list[tuple[int, int, int]] = []
    groups = (
        [[(b, t) for t in judged[b].nonzero().flatten().tolist()] for b in range(judged.shape[0])]
        if per_row
        else [[tuple(p) for p in positions(judged)]]
    )
    for group in groups:
        if len(group) < 2:
            continue
        b0, t0 = group[0]
        reference = float(coefficient[b0, t0])
        for b, t in group[1:]:
            allowed = float(slack[b0, t0] + slack[b, t]) * abs(reference)
            if abs(float(coefficient[b, t]) - reference) > allowed:
                found.append((b, t, t0))
    return found


def digits_to_separate(a: float, b: float) -> int:
    """Significant digits that print ``a`` and ``b`` differently (6 at least, 17 at most)."""
    difference, scale = abs(a - b), max(abs(a), abs(b))
    if not (math.isfinite(difference) and difference > 0 and scale > 0):
        return 6
    return min(17, max(6, math.ceil(-math.log10(difference / scale)) + 2))


def versus(got_name: str, got: float, expected_name: str, expected: float) -> str:
    """``fn=1.00000001, reference=1 (difference 1e-08, relative 1e-08)``."""
    digits = digits_to_separate(got, expected)
    text = f"{got_name}={fmt(got, digits)}, {expected_name}={fmt(expected, digits)}"
    difference = got - expected
    if difference != 0 and math.isfinite(difference):
        relative = abs(difference) / abs(expected) if expected else math.inf
        text += f" (difference {difference:.3g}, relative {relative:.3g})"
    return text


# --------------------------------------------------------------------------- tolerances


@dataclass(frozen=True)
class CheckTolerance:
    """The allowance a checker grants: ``|got - expected| <= atol + rtol · scale`` (``scale``
    defaults to ``|expected|``). ``rtol``/``atol`` may be tensors, one allowance per element."""

    rtol: float | Tensor
    atol: float | Tensor

    def exceeded(self, got: Any, expected: Any, scale: Any = None) -> Any:
        """Where the difference is beyond the tolerance (bool, or a bool tensor)."""
        size = abs(expected) if scale is None else scale
        return abs(got - expected) > self.atol + self.rtol * size


def resolve_tolerance(
    default_rtol: float | Tensor,
    default_atol: float | Tensor,
    rtol: float | None = None,
    atol: float | None = None,
) -> CheckTolerance:
    """The checker's default rule, with the user's ``rtol``/``atol`` replacing either part."""
    for name, value in (("rtol", rtol), ("atol", atol)):
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return CheckTolerance(
        rtol=default_rtol if rtol is None else rtol, atol=default_atol if atol is None else atol
    )


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


def accepts(fn: Callable[..., Any], name: str, *, by_name: bool = False) -> bool:
    """Whether ``fn`` takes keyword ``name``: a parameter of that name, or (unless
    ``by_name``) a ``**kwargs``."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(
        (p.name == name and p.kind != p.POSITIONAL_ONLY)
        or (p.kind == p.VAR_KEYWORD and not by_name)
        for p in parameters
    )


def require_fields(batch: Batch, fields: Sequence[str], checker: str, strategy: str) -> None:
    """Stop with a message naming the missing fields and the strategy that draws them, rather
    than a bare ``KeyError`` from deep inside a checker."""
    if not callable(getattr(batch, "keys", None)):
        raise TypeError(
            f"{checker} takes a batch of named tensors (a dict or a TensorDict), got "
            f"{type(batch).__name__}: draw one from pytest_rollout_golden.strategies.{strategy}"
        )
    keys = [str(key) for key in batch.keys()]  # noqa: SIM118 (a TensorDict iterates over rows)
    missing = [name for name in fields if name not in keys]
    if missing:
        raise ValueError(
            f"{checker} needs batch fields {missing} (it reads {list(fields)}; the batch has "
            f"{sorted(keys)}): draw batches from "
            f"pytest_rollout_golden.strategies.{strategy} or add the fields"
        )


def single_token_whitening(name: str, output: Any, valid: Tensor) -> None:
    """Name a non-finite whitening of a batch with one valid token (an unbiased variance
    divides by ``n - 1 = 0``) before the generic finiteness check reports it."""
    output = first_item(output)
    if int(valid.sum()) != 1 or not isinstance(output, Tensor):
        return
    if output.is_floating_point() and not bool(torch.isfinite(output[valid]).all()):
        fail(
            f"{name}.whiten_single_token",
            "NaN from whitening a single valid token: the unbiased variance divides by "
            "n - 1 = 0; the reference whitens one token to 0 (x - mean = 0); guard the "
            "divisor (e.g. max(n - 1, 1)) or skip the variance for n = 1",
            [f"(b={b}, t={t}): {fmt(float(output.detach()[b, t]))}" for b, t in positions(valid)],
        )


def valid_mask(batch: Batch) -> Tensor:
    return as_bool_mask(batch["response_mask"])


def batch_counts(batch: Batch) -> tuple[int, int]:
    valid = valid_mask(batch)
    return int(valid.sum()), int(valid.any(dim=-1).sum())


def replace_valid(values: Tensor, valid: Tensor, new: Tensor) -> Tensor:
    return torch.where(valid, new.to(values.dtype), values)


def holds_garbage(values: Tensor, valid: Tensor) -> bool:
    """Whether a token tensor holds anything but zeros on its padding positions."""
    return bool((values.detach()[~valid] != 0).any())


def holds_log_probs(key: str, values: Tensor, valid: Tensor) -> bool:
    """Whether ``values`` is a log-prob field whose padding holds log-probs (finite, ≤ 0): what
    a model leaves there, which the checkers keep realistic when they vary it."""
    return key.endswith("log_probs") and bool((values.detach()[~valid] <= 0).all())


def refill_padding(batch: Batch) -> dict[str, Any]:
    """The batch with different (still finite) padding in every token field that holds
    something there. A log-prob field whose padding holds log-probs gets other log-probs,
    ``1.5·x - 1`` (≤ 0, different from every ``x ≤ 0``, and changing the difference of two
    such fields); any other field gets garbage, ``x + 37 + |x|``. A field whose padding is all
    zeros (a batch drawn with ``garbage=False`` for that field) keeps its zeros: the batch
    promised none there."""
    valid = valid_mask(batch)
    out = dict(batch)
    for key in TOKEN_FLOATS:
        if key in batch and holds_garbage(batch[key], valid):
            values = batch[key]
            if holds_log_probs(key, values, valid):
                other = 1.5 * values - 1.0
            else:
                other = values + 37.0 + values.abs()
            out[key] = torch.where(valid, values, other)
    return out


def column_fill(key: str, values: Tensor, valid: Tensor) -> float:
    """What the padding columns a checker adds to ``values`` hold: zeros where its padding is
    all zeros, a log-prob (``-5.75``) where it holds log-probs, garbage (``57.5``) elsewhere."""
    if not holds_garbage(values, valid):
        return 0.0
    return -5.75 if holds_log_probs(key, values, valid) else 57.5


def garbage_padding(values: Tensor, valid: Tensor) -> Tensor:
    """``values`` with non-zero garbage (±1 to ±3) on padding positions where it holds none:
    for fields that are only ever multiplied (advantages), so that a loss ignoring its mask
    shows even on a batch drawn with ``garbage=False``. Log-prob fields are never given any
    (code that exponentiates before masking is correct on zero padding)."""
    if holds_garbage(values, valid):
        return values
    index = torch.arange(values.numel(), device=values.device).reshape(values.shape)
    junk = ((index % 5).to(values.dtype) - 2.0).where(index % 5 != 2, values.new_tensor(3.0))
    return torch.where(valid, values, junk)


def reference_lines(
    off: Tensor, got: Tensor, expected: Tensor, what: str, context: Callable[[int, int], str]
) -> list[str]:
    """One line per token of ``off``: ``what`` of ``fn`` against the reference, then the
    token's ``context(b, t)``."""
    return [
        f"(b={b}, t={t}): {what} "
        + versus("fn", float(got[b, t]), "reference", float(expected[b, t]))
        + context(b, t)
        for b, t in positions(off)
    ]


def refilled_lines(moved: Tensor, again: Tensor, got: Tensor) -> list[str]:
    """One line per token of ``moved``: its value with the padding refilled (``again``,
    printed as ``regarbled``) against the value ``got`` before."""
    return [
        f"(b={b}, t={t}): " + versus("regarbled", float(again[b, t]), "fn", float(got[b, t]))
        for b, t in positions(moved)
    ]


def padding_hint(batch: Batch) -> str:
    """Name the likely cause of a non-finite result when the padding holds large garbage."""
    valid = valid_mask(batch)
    keys = [k for k in TOKEN_FLOATS if k in batch and k.endswith("log_probs")]
    if not keys or bool(valid.all()):
        return ""
    largest = max(float(f64(batch[k])[~valid].abs().max()) for k in keys)
    if largest <= SAFETY_BOUND:
        return ""
    return (
        f"; likely cause: exp of unmasked padding (padding holds values up to {largest:.3g}, "
        "and inf · 0 is nan) — mask with torch.where before exp, or clamp the log ratio to "
        "±20 as verl does"
    )


def token_tensor(name: str, output: Any, shape: torch.Size, batch: Batch | None = None) -> Tensor:
    output = first_item(output)
    if not isinstance(output, Tensor):
        fail(f"{name}.shape", f"expected a tensor, got {type(output).__name__}")
    if output.shape != shape:
        fail(f"{name}.shape", f"expected shape {tuple(shape)}, got {tuple(output.shape)}")
    if output.is_floating_point() and not bool(torch.isfinite(output).all()):
        bad = ~torch.isfinite(output)
        fail(
            f"{name}.finite",
            f"{int(bad.sum())} non-finite entries" + (padding_hint(batch) if batch else ""),
            [f"(b={b}, t={t}): {fmt(float(output.detach()[b, t]))}" for b, t in positions(bad)],
        )
    return output
