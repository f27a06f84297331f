"""Summary statistics of the tensors of a batch, for ``rollout-golden show``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# Masks, by preference, whose zeros are padding; matched on the last path component.
MASKS = ("response_mask", "loss_mask", "attention_mask")


def _leaf(key: str) -> str:
    return key.rsplit("/", 1)[-1]


def _mask_for(key: str, shape: tuple[int, ...], masks: Mapping[str, Any]) -> str | None:
    """The mask key that applies to tensor ``key``: itself, else the first of equal shape."""
    if key in masks:
        return key
    for name in MASKS:
        for mask_key, mask in masks.items():
            if _leaf(mask_key) == name and tuple(mask.shape) == shape:
                return mask_key
    return None


def tensor_stats(arrays: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Per array: dtype, shape, min, max, mean, std, NaN and inf counts, padding fraction.

    Statistics are over the finite elements, in float64 (``None`` when there
    are none). ``padding`` is the fraction of zeros of the mask that applies
    (the tensor itself if it is a mask, else a mask of the same shape among
    ``response_mask``, ``loss_mask``, ``attention_mask``), ``None`` without one.
    """
    import torch

    tensors = {k: torch.as_tensor(v) for k, v in arrays.items()}
    masks = {k: t for k, t in tensors.items() if _leaf(k).endswith("mask")}
    out = {}
    for key, t in tensors.items():
        real = torch.view_as_real(t) if t.is_complex() else t
        x = real.detach().to("cpu", torch.float64).reshape(-1)
        finite = x[x.isfinite()]
        row: dict[str, Any] = {
            "dtype": str(t.dtype).removeprefix("torch."),
            "shape": list(t.shape),
            "numel": t.numel(),
            "nan": int(x.isnan().sum()),
            "inf": int(x.isinf().sum()),
        }
        if finite.numel():
            row.update(
                min=float(finite.min()),
                max=float(finite.max()),
                mean=float(finite.mean()),
                std=float(finite.std(unbiased=False)),
            )
        else:
            row.update(min=None, max=None, mean=None, std=None)
        mask_key = _mask_for(key, tuple(t.shape), masks)
        row["padding"] = None
        row["mask"] = mask_key
        if mask_key is not None and masks[mask_key].numel():
            row["padding"] = float((masks[mask_key] == 0).double().mean())
        out[key] = row
    return out
