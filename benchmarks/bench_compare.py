"""Comparison throughput on a large tensor set, on one core: this project against assert_close.

The set is 1 GiB of float32 (32 tensors of 32 MiB) against a bit-equal copy,
then against a copy with a few perturbed elements in a few tensors, compared
tensor by tensor with the tolerance of a per-token metric, as replay does.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch
from harness import Section, Target, interleaved, ms, table

from pytest_rollout_golden._internal.tolerance.spec import Tolerance

FULL_BYTES, QUICK_BYTES = 1 << 30, 64 << 20
TENSORS = 32
TOL = Tolerance(rtol=1e-5, atol=1e-6)
TARGET_S_PER_GB = 1.0
ROUNDS, ROUNDS_QUICK = 2, 1  # each call goes through the whole set: the noise averages out


def _ours() -> Callable[[Any, Any], bool] | str:
    """``(expected, actual) -> passed`` with this project's comparison, or why it is missing."""
    try:
        compare = importlib.import_module("pytest_rollout_golden._internal.tolerance.compare")
    except ImportError as exc:
        return f"pytest_rollout_golden._internal.tolerance.compare is not importable ({exc})"
    if hasattr(compare, "compare_values"):
        return lambda e, a: compare.compare_values(e, a, TOL, check_dtype=True).ok
    if hasattr(compare, "compare"):
        return lambda e, a: not compare.compare("bench", e, a, TOL).failed
    return (
        "pytest_rollout_golden._internal.tolerance.compare has neither compare_values nor compare"
    )


def _assert_close(expected: Any, actual: Any) -> bool:
    try:
        torch.testing.assert_close(actual, expected, rtol=TOL.rtol, atol=TOL.atol)
    except AssertionError:
        return False
    return True


def _tensor_set(nbytes: int) -> tuple[list[Any], list[Any], list[Any]]:
    """(expected, bit-equal copy, copy with 3 elements off by 1e-3 relative in 4 tensors)."""
    g = torch.Generator().manual_seed(0)
    numel = nbytes // 4 // TENSORS
    base = torch.randn(numel, generator=g)
    expected = [base * (1 + i / TENSORS) for i in range(TENSORS)]
    equal = [t.clone() for t in expected]
    drifted = [t.clone() for t in expected]
    for t in drifted[:: TENSORS // 4]:
        idx = torch.randint(0, numel, (3,), generator=g)
        t[idx] = t[idx] * (1 + 1e-3) + 1e-3
    return expected, equal, drifted


def _run_set(check: Callable[[Any, Any], bool], expected: list[Any], actual: list[Any]) -> int:
    """Number of tensors that failed."""
    return sum(not check(e, a) for e, a in zip(expected, actual, strict=True))


def run(quick: bool) -> Section:
    nbytes = QUICK_BYTES if quick else FULL_BYTES
    ours = _ours()
    checkers: dict[str, Callable[[Any, Any], bool]] = {"torch.testing.assert_close": _assert_close}
    if not isinstance(ours, str):
        checkers = {"pytest_rollout_golden._internal.tolerance.compare": ours, **checkers}

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        expected, equal, drifted = _tensor_set(nbytes)
        cases = {"bit-equal": equal, "12 elements drifted in 4 tensors": drifted}
        failures: dict[tuple[str, str], int] = {}

        def candidate(key: tuple[str, str], check: Any, actual: list[Any]) -> Callable[[], None]:
            return lambda: failures.__setitem__(key, _run_set(check, expected, actual))

        candidates = {
            (case, name): candidate((case, name), check, actual)
            for case, actual in cases.items()
            for name, check in checkers.items()
        }
        samples = interleaved(candidates, ROUNDS_QUICK if quick else ROUNDS, warmup=0)
    finally:
        torch.set_num_threads(threads)

    gb = TENSORS * expected[0].numel() * 4 / 1e9
    rows = []
    for (case, name), s in samples.items():
        rows.append(
            [
                case,
                name,
                f"{failures[case, name]} / {TENSORS}",
                ms(s.median),
                f"{s.median / gb:.3f}",
                f"{gb / s.median:.2f}",
            ]
        )
    body = table(["case", "comparison", "tensors failed", "ms", "s / GB", "GB/s"], rows)
    body += (
        f"\n\n{TENSORS} float32 tensors, {gb:.2f} GB in all, compared one by one against a"
        f" second copy (tolerance {TOL.describe()}), `torch.set_num_threads(1)`; median of"
        f" {ROUNDS_QUICK if quick else ROUNDS} interleaved round(s)."
    )
    if isinstance(ours, str):
        body += f"\n\nRow for this project skipped: {ours}."
    return Section(
        "Comparing large tensor sets (one core)", body, _targets(samples, gb, ours, quick)
    )


def _targets(samples: dict[Any, Any], gb: float, ours: Any, quick: bool) -> list[Target]:
    what = f"comparing 1 GB < {TARGET_S_PER_GB:g} s on one core" + (" (--quick)" if quick else "")
    if isinstance(ours, str):
        return [Target(what, ours, None)]
    return [
        Target(
            f"{what}, {case}",
            f"{s.median / gb:.3f} s/GB",
            s.median / gb < TARGET_S_PER_GB,
        )
        for (case, name), s in samples.items()
        if name == "pytest_rollout_golden._internal.tolerance.compare"
    ]
