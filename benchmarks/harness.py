"""Shared helpers of the benchmarks: interleaved timing, Markdown tables, target verdicts.

Every figure the suite reports comes from measurements taken side by side in
one run: callables under comparison are timed in alternating order, round after
round, so a slow phase of a noisy machine hits all of them alike, and a figure
is the median of its rounds.
"""

from __future__ import annotations

import dataclasses
import gc
import resource
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any


@dataclasses.dataclass
class Samples:
    """Wall time (s) and minor page faults of each timed call of one candidate."""

    seconds: list[float] = dataclasses.field(default_factory=list)
    faults: list[int] = dataclasses.field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def median_faults(self) -> int:
        return round(statistics.median(self.faults))


def _minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def interleaved(
    candidates: Mapping[str, Callable[[], Any]], rounds: int, *, warmup: int = 1
) -> dict[str, Samples]:
    """Time each candidate: ``warmup`` untimed rounds, then ``rounds`` timed ones.

    The order of the candidates rotates from round to round. Results are dropped
    and garbage collected outside the timed region.
    """
    names = list(candidates)
    samples = {name: Samples() for name in names}
    for r in range(warmup + rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            gc.collect()
            faults = _minor_faults()
            start = time.perf_counter()
            result = candidates[name]()
            elapsed = time.perf_counter() - start
            faults = _minor_faults() - faults
            del result
            if r >= warmup:
                samples[name].seconds.append(elapsed)
                samples[name].faults.append(faults)
    gc.collect()
    return samples


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f}"


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table (first column left-aligned, the rest right-aligned)."""
    align = [":--"] + ["--:"] * (len(header) - 1)
    lines = [header, align, *rows]
    return "\n".join("| " + " | ".join(str(c) for c in line) + " |" for line in lines)


@dataclasses.dataclass
class Target:
    """One promise of the project, the figure measured for it and whether it holds."""

    name: str
    measured: str
    met: bool | None  # None: not measured in this run (the reason is in ``measured``)

    def row(self) -> list[str]:
        verdict = {True: "met", False: "**NOT met**", None: "not measured"}[self.met]
        return [self.name, self.measured, verdict]


@dataclasses.dataclass
class Section:
    """What one benchmark contributes to the report."""

    title: str
    body: str
    targets: list[Target] = dataclasses.field(default_factory=list)
