"""Comparison throughput on a large tensor set, on one core: this project against assert_close.

The set is 1 GiB of float32 (32 tensors of 32 MiB) against a bit-equal copy,
then against a copy with a few perturbed elements in a few tensors, compared
tensor by tensor with the tolerance of a per-token metric, as replay does. The speed-up
over assert_close is the median of per-round ratios: both times of a ratio come from
the same round.
"""

from __future__ import annotations

import importlib
import statistics
from collections.abc import Callable
from typing import Any

import torch
from harness import Section, Target, interleaved, ms, table

from pytest_rollout_golden._internal.tolerance.spec import Tolerance

FULL_BYTES, QUICK_BYTES = 1 << 30, 64 << 20
TENSORS = 32
TOL = Tolerance(rtol=1e-5, atol=1e-6)
TARGET_S_PER_GB = 1.0
TARGET_SPEEDUP = 20.0  # times faster than torch.testing.assert_close
ROUNDS, ROUNDS_QUICK = 3, 1  # each call goes through the whole set: the noise averages out
OURS, THEIRS = "pytest_rollout_golden._internal.tolerance.compare", "torch.testing.assert_close"


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
    checkers: dict[str, Callable[[Any, Any], bool]] = {THEIRS: _assert_close}
    if not isinstance(ours, str):
        checkers = {OURS: ours, **checkers}

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
    speedups = _speedups(samples)
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
                f"{speedups[case]:.1f}" if name == OURS else "",
            ]
        )
    header = ["case", "comparison", "tensors failed", "ms", "s / GB", "GB/s", "× assert_close"]
    body = table(header, rows)
    body += (
        f"\n\n{TENSORS} float32 tensors, {gb:.2f} GB in all, compared one by one against a"
        f" second copy (tolerance {TOL.describe()}), `torch.set_num_threads(1)`; median of"
        f" {ROUNDS_QUICK if quick else ROUNDS} interleaved round(s); × assert_close: the"
        " median of the rounds' ratios."
    )
    if isinstance(ours, str):
        body += f"\n\nRow for this project skipped: {ours}."
    return Section(
        "Comparing large tensor sets (one core)", body, _targets(samples, gb, ours, quick)
    )


def _speedups(samples: dict[Any, Any]) -> dict[str, float]:
    """Per case: the median over rounds of assert_close's time over ours in that round."""
    return {
        case: statistics.median(
            theirs / mine
            for mine, theirs in zip(s.seconds, samples[case, THEIRS].seconds, strict=True)
        )
        for (case, name), s in samples.items()
        if name == OURS
    }


def _targets(samples: dict[Any, Any], gb: float, ours: Any, quick: bool) -> list[Target]:
    quick_note = " (--quick)" if quick else ""
    what = f"comparing 1 GB < {TARGET_S_PER_GB:g} s on one core{quick_note}"
    faster = f"comparing ≥ {TARGET_SPEEDUP:g}× faster than assert_close{quick_note}"
    if isinstance(ours, str):
        return [Target(what, ours, None), Target(faster, ours, None)]
    speedups = _speedups(samples)
    return [
        target
        for (case, name), s in samples.items()
        if name == OURS
        for target in (
            Target(f"{what}, {case}", f"{s.median / gb:.3f} s/GB", s.median / gb < TARGET_S_PER_GB),
            Target(f"{faster}, {case}", f"{speedups[case]:.1f}×", speedups[case] >= TARGET_SPEEDUP),
        )
    ]
