"""pytest params over parallel layouts that all gate against the golden of one reference layout.

The reference layout records the golden; every other layout (a *variant*) only replays it,
with the cross-layout tolerance lane (:data:`LAYOUT_TOLERANCES`) in place of the
same-layout defaults. Variants never record: a missing reference golden fails, naming the
reference and the command that records it.

Everything here is read by the plugin through ``@pytest.mark.golden`` options, so the
plugin itself never imports this module (nor torch)::

    golden(variant="tp2-pp1-dp1-padded-mb1", reference="tp1-pp1-dp1-padded-mb1",
           layout_tolerances={...})
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pytest

from .layout import Layout

# Cross-layout lane, by compute dtype. Measured by `benchmarks/bench_parallel.py --seeds 5`:
# the largest relative spread of each metric over the 31 variants of the full matrix, 5
# seeds and 3 steps against the single-process run (float32: pg_loss 6.2e-6, kl 1.7e-6,
# entropy 2.3e-7, grad_norm 3.1e-7, log_probs 6.7e-7 relative / 1.4e-6 absolute), times 10,
# rounded up to 1-2-5 and never below the same-layout default (rtol 1e-5), which covers
# replaying on another machine. The MoE matrix over ring / Ulysses sequence splits, EP and
# dynamic batch size (`--matrix round2`, 47 variants) stays inside the same rows (pg_loss
# 8.6e-6, log_probs 1.9e-6 absolute) and adds aux_loss (9.2e-8). The wrong layouts of
# docs/guide/parallel.md move them by >= 3e-3 (aux_loss under ep-local-aux: 6.4e-2). The
# value head's (`--critic --seeds 3`, same rule): vf_loss 8.0e-7, vf_clipfrac 1.4e-16 (no
# token crossed the clip edge), vpred_mean 9.7e-7 relative / 7.0e-7 absolute (a mean that
# may cross 0, so its atol is 10x the absolute spread), grad_norm 4.7e-7, values 2.5e-6
# absolute (atol 10x, rounded up, as log_probs'); its fault moves them by >= 1.
LAYOUT_TOLERANCES: dict[str, dict[str, dict[str, float]]] = {
    "float64": {"*": {"rtol": 1e-12, "atol": 1e-14}},
    "float32": {
        "pg_loss": {"rtol": 1e-4, "atol": 1e-7},
        "kl": {"rtol": 2e-5, "atol": 1e-8},
        "entropy": {"rtol": 1e-5, "atol": 1e-7},
        "grad_norm": {"rtol": 1e-5, "atol": 1e-7},
        "aux_loss": {"rtol": 1e-5, "atol": 1e-7},
        "log_probs": {"rtol": 1e-5, "atol": 2e-5},
        "critic/vf_loss": {"rtol": 1e-5, "atol": 1e-7},
        "critic/vf_clipfrac": {"rtol": 1e-5, "atol": 1e-7},
        "critic/vpred_mean": {"rtol": 1e-5, "atol": 1e-5},
        "critic/grad_norm": {"rtol": 1e-5, "atol": 1e-7},
        "values": {"rtol": 1e-5, "atol": 5e-5},
    },
}


def variant(
    layout: Layout,
    *,
    reference: Layout | None = None,
    dtype: str = "float32",
    tolerances: Mapping[str, Any] | None = None,
    marks: Sequence[Any] = (),
) -> Any:
    """One ``pytest.param(layout, id=layout.id)``: the recording reference or a replay-only variant.

    ``tolerances`` replaces the lane of ``dtype`` for this variant (marker ``tolerances=``
    still take precedence over both).
    """
    reference = reference or Layout()
    options: dict[str, Any] = {"variant": layout.id, "reference": reference.id}
    if layout != reference:
        if dtype not in LAYOUT_TOLERANCES and tolerances is None:
            raise ValueError(f"no measured layout tolerances for {dtype!r}; pass tolerances=")
        lane = LAYOUT_TOLERANCES[dtype] if tolerances is None else tolerances
        options["layout_tolerances"] = dict(lane)
    return pytest.param(layout, id=layout.id, marks=[pytest.mark.golden(**options), *marks])


def layout_params(
    layouts: Iterable[Layout],
    *,
    reference: Layout | None = None,
    dtype: str = "float32",
    tolerances: Mapping[str, Any] | None = None,
) -> list[Any]:
    """Params of the reference (first: it records the golden), then of ``layouts``.

    Duplicates and the reference's own layout are dropped from ``layouts``.
    """
    reference = reference or Layout()
    ordered = list(dict.fromkeys([reference, *layouts]))
    return [
        variant(layout, reference=reference, dtype=dtype, tolerances=tolerances)
        for layout in ordered
    ]


STANDARD_MATRIX: dict[str, tuple[Any, ...]] = {
    "tp": (1, 2),
    "pp": (1, 2),
    "dp": (1, 2),
    "packing": (False, True),
    "micro_batches": (1, 4),
}
"""What ``variants()`` sweeps when no dimension is named: 32 layouts, world size <= 8."""


def variants(
    tp: Iterable[int] | None = None,
    pp: Iterable[int] | None = None,
    dp: Iterable[int] | None = None,
    packing: Iterable[bool] | None = None,
    micro_batches: Iterable[int] | None = None,
    *,
    cp: Iterable[int] | None = None,
    sp: Iterable[int] | None = None,
    ep: Iterable[int] | None = None,
    max_tokens: Iterable[int | None] | None = None,
    reference: Layout | None = None,
    dtype: str = "float32",
    tolerances: Mapping[str, Any] | None = None,
) -> list[Any]:
    """Params over the product of the given sizes, reference first (it records the golden).

    With no dimension named, the :data:`STANDARD_MATRIX` of TP, PP, DP, packing and
    micro-batches. Otherwise the named dimensions are swept and every other one stays at the
    reference's value: ``variants(cp=[1, 2], ep=[1, 2])`` gives four layouts. Combinations
    a layout cannot have are left out: ``cp`` and ``sp`` both above 1, or a token budget
    (``max_tokens``) with ``micro_batches`` above 1.

    The reference (default: everything 1, padded) is included even when it lies outside
    the product. Ids read ``tp2-pp1-dp1-packed-mb4`` (``-cp2``, ``-sp2``, ``-ep2`` appended
    where above 1; ``dyn64`` in place of ``mb4`` for a token budget). Share the golden
    across test files with ``@pytest.mark.golden(shared="name")`` on each test function.
    """
    reference = reference or Layout()
    named = {
        "tp": tp,
        "pp": pp,
        "dp": dp,
        "packing": packing,
        "micro_batches": micro_batches,
        "cp": cp,
        "sp": sp,
        "ep": ep,
        "max_tokens": max_tokens,
    }
    if all(values is None for values in named.values()):
        sweep: dict[str, tuple[Any, ...]] = dict(STANDARD_MATRIX)
    else:
        sweep = {k: tuple(v) for k, v in named.items() if v is not None}
    dims = {name: sweep.get(name, (getattr(reference, name),)) for name in named}
    layouts = []
    for values in itertools.product(*dims.values()):
        fields = dict(zip(dims, values, strict=True))
        if fields["cp"] > 1 and fields["sp"] > 1:
            continue
        if fields["max_tokens"] is not None and fields["micro_batches"] != 1:
            continue
        layouts.append(Layout(**fields))
    return layout_params(layouts, reference=reference, dtype=dtype, tolerances=tolerances)
