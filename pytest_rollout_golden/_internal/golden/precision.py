"""The precision a golden test runs in, and the float64 oracle that certifies same math.

A test declares the precision it trains in (ini ``golden_precision``, marker
``precision=``): ``float32`` or ``bf16`` (float32 master weights, bf16 autocast). Under
``--golden-certify`` (and the certification run of ``--golden-calibrate``) the same test
body runs in float64 instead: the replayed rollout's floating tensors arrive in float64,
:func:`autocast` is switched off and torch's default dtype is float64, so a model the
test builds holds float64 weights. Reordering a float64 reduction moves a result by about
1e-15 relative, a 1e-3 bug by 1e-3: there the two cannot be confused, which no bf16
tolerance can promise.

The float64 values live in the golden's lane :data:`ORACLE_LANE` (``@lanes/float64-oracle``):
the reference records them, every ``same_math()`` variant replays them at
:data:`~..tolerance.families.CERTIFY`. A variant that passes is *certified same math*.

Torch is imported by the functions that need it, never at module load.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

from ..tolerance.families import canonical_precision as canonical

ORACLE = "float64"
ORACLE_LANE = "float64-oracle"
_COMPUTE = {"float64": "float64", "float32": "float32", "bf16": "bfloat16"}


def weight_dtype(precision: str) -> Any:
    """The torch dtype of weights and floating inputs: float64 in the oracle, else float32
    (bf16 training keeps float32 master weights and computes under :func:`autocast`)."""
    import torch

    return torch.float64 if canonical(precision) == ORACLE else torch.float32


def compute_dtype(precision: str) -> Any:
    """The torch dtype the matmuls compute in: float64, float32 or bfloat16."""
    import torch

    return getattr(torch, _COMPUTE.get(canonical(precision), "float32"))


def autocast(precision: str, device_type: str = "cpu") -> Any:
    """A context that computes in ``precision``: ``torch.autocast`` to bf16 for ``bf16``,
    else autocast switched off (so an outer autocast cannot lower the oracle's precision)."""
    import torch

    if canonical(precision) == "bf16":
        return torch.autocast(device_type, dtype=torch.bfloat16)
    return torch.autocast(device_type, enabled=False)


@contextlib.contextmanager
def default_dtype(precision: str) -> Iterator[None]:
    """torch's default floating dtype set to float64 while certifying, restored after."""
    if canonical(precision) != ORACLE:
        yield
        return
    import torch

    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def as_float64(batch: Any) -> Any:
    """``batch`` with every floating tensor (torch or numpy) cast to float64, an exact cast:
    dicts, lists and tuples rebuilt; a TensorDict or DataProto-like batch through its own
    ``batch`` / ``apply``; integers, bools and other values as they are."""
    import torch

    if isinstance(batch, torch.Tensor):
        return batch.double() if batch.is_floating_point() else batch
    if isinstance(batch, Mapping):
        cast = {k: as_float64(v) for k, v in batch.items()}
        return type(batch)(cast) if isinstance(batch, dict) else cast
    if isinstance(batch, (list, tuple)) and not hasattr(batch, "_fields"):
        return type(batch)(as_float64(v) for v in batch)
    if _is_float_array(batch):
        return batch.astype("float64")
    inner = getattr(batch, "batch", None)
    if inner is not None and hasattr(batch, "non_tensor_batch"):  # a DataProto
        batch.batch = as_float64(inner)
        return batch
    apply = getattr(batch, "apply", None)
    if callable(apply) and hasattr(batch, "batch_size"):  # a TensorDict
        return apply(lambda t: t.double() if t.is_floating_point() else t)
    return batch


def _is_float_array(value: Any) -> bool:
    dtype = getattr(value, "dtype", None)
    return getattr(dtype, "kind", None) == "f" and hasattr(value, "astype")


def lower_precision_note(dtypes: Mapping[str, str]) -> list[str]:
    """Of ``{metric: dtype}`` checked while certifying: a note naming the floating values
    below float64 (the test did not follow ``golden.dtype`` / ``golden.autocast()``)."""
    lower = sorted(
        f"{name} ({dtype})"
        for name, dtype in dtypes.items()
        if dtype.startswith(("float", "bfloat")) and dtype != "float64"
    )
    if not lower:
        return []
    return [
        f"checked below float64 in the float64 oracle: {', '.join(lower)}; build the model "
        "in golden.dtype and train under golden.autocast(), so that no cast or autocast of "
        "the test lowers the oracle's precision"
    ]
