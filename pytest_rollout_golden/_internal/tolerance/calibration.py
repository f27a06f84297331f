"""Calibrated tolerances: measured from repeated runs, stored in the golden they belong to.

``pytest --golden-calibrate N`` runs each selected golden test N times under
perturbations that change the order of floating-point reductions but not the
math (CPU thread counts; on GPU optionally non-deterministic algorithms and
TF32). Each metric's spread over those runs becomes its tolerance, measured the way the
tolerance below it measures. Under ``scale="recorded"`` (the built-in families)::

    rtol = max(MARGIN * max spread / the metric's largest magnitude, DTYPE_FLOOR * eps(dtype))

keeping the scale; without a scale::

    rtol = max(MARGIN * max relative spread, DTYPE_FLOOR * eps(dtype))
    atol = max(MARGIN * max absolute spread at steps whose value is ~0, lower layers' atol)

where a step whose values touch 0, or lie 100x below the metric's largest magnitude over
the steps, adds to ``atol`` only: there a relative spread is meaningless (0 against
1e-7 is 100%) and would disarm the gate at the steps where the metric is large. A value
the tolerances below do not compare gets no entry.

A metric whose every recorded value lies below ``ROUNDING_LEVEL`` (1e-6, the rounding of
float32 terms of order 1: a loss that cancels to 0, as TRL RLOO's does) has no magnitude to
be relative to; its spread is absolute::

    atol = max(MARGIN * max absolute spread, lower layers' atol)   (rtol, scale: the layers')

Calibration writes nothing it could not defend, and says why in the summary: an rtol beyond
``MAX_RTOL`` (0.05), an atol at rounding level beyond ``MAX_ATOL`` (1e-5: 10x the rounding
level, 100x below a loss that stops cancelling), an atol around 0 beyond ``MAX_RTOL`` x the
metric's largest magnitude: a check that cannot fail is a defect, not a tolerance. Whoever
wrote the file, the run, ``verify`` and calibration bound every entry alike
(:func:`entry_problem`).

Calibration rewrites only the lanes it measured: the golden's own lane from the runs of the
tests that record it (never a variant that replays it), the variant lane from two variants or
more; a lane not measured is kept as the file holds it.

A metric whose runs agree bit for bit gets no entry: it keeps the tight
default; nor does one whose measured tolerance equals the default. The result is
``tolerances.json`` inside the golden directory, listed in its manifest (so an update's
commit keeps it), readable in review: each entry carries the spread it was
derived from. A golden where every value keeps its default gets no file, and loses the one
an earlier calibration wrote: the defaults are what the measurement says.

Variants that gate against one golden (``same_math()``, ``parallel.variants()``) are
also measured *across* variants, each on its own first: per value, its distance to the
reference is the largest ``|mean of its runs - mean of the reference's runs|`` over steps,
measured as the tolerance measures (over the reference's largest magnitude under
``scale="recorded"``; absolute at rounding level; a tensor's distance to the golden). A
variant is an **outlier** for a value, and left out of that value's lane, when::

    distance > OUTLIER * max(median distance of the other variants, same-layout spread)

with ``OUTLIER = 10``, at least 2 other variants or a same-layout spread to compare against
(with one variant, the same-layout spread alone; with neither, nothing is excluded), and
the baseline at least the dtype floor (``ROUNDING_LEVEL / OUTLIER`` at rounding level), so
rounding is never an outlier. Why: true same-math variants reorder the same sums, so their
distances are of one order (the project's parallel matrices, float32, 3 runs: of 31 policy
and 47 MoE layouts, the farthest is 2.6x the median of the others); a bug of 1e-3 is >= 60x
beyond float32 same-math noise (<= 1.6e-5 of the largest value on verl and TRL; in bf16
grad_norm's noise is within 10x of it, and such a bug stays in that value's lane).
Pooling every variant instead let one bug widen the lane to itself (a loss x1.001 variant
made the lane rtol 2e-3, and then passed), or push it over ``MAX_RTOL`` so that nothing was
written (a dropped accumulation scale, spread 0.5). The spread over the runs of the
reference and the variants kept becomes the golden's calibrated variant lane
(``layout_tolerances``), which variants use in place of the built-in defaults or the shipped
layout lane: measured on the user's code. ``tolerances.json`` keeps every variant's
distances, what was excluded and why, and the values that failed against the golden during
calibration (``variants``); the summary names the excluded and the failed.

Tensors (``check_tensors``) are measured by their distance to the golden: per run, the
greatest ``|actual - recorded|`` relative to the tensor's recorded magnitude (or to
each element, under a tolerance without ``scale``)::

    rtol = max(MARGIN * greatest distance over the runs, DTYPE_FLOOR * eps(dtype))
"""

from __future__ import annotations

import dataclasses
import functools
import math
import statistics
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ...errors import GoldenError, GoldenFormatError
from ...store.location import ENVELOPE, TOLERANCES
from .spec import IGNORE, RECORDED, Layer, Tolerance, is_glob
from .stack import Resolver

FORMAT = "pytest-rollout-golden-tolerances"
# The largest spread seen in N runs underestimates the spread of the next run
# (with N = 3 by a lot): 2x leaves room without reaching a bug's 1e-3.
MARGIN = 2.0
# The smallest rtol written: a few units in the last place of the metric's dtype.
DTYPE_FLOOR = 4.0
EPS = {"float16": 2**-10, "bfloat16": 2**-7, "float32": 2**-23, "float64": 2**-52}
SOURCE = "calibrated (tolerances.json)"
LAYOUT_SOURCE = "calibrated variant lane (tolerances.json)"
# The two lanes of tolerances.json and their sections: a calibration rewrites only the lanes it
# measured, and keeps the others as the file holds them.
SAME, ACROSS = "same layout", "across variants"
LANES = {
    SAME: ("tolerances", "spreads"),
    ACROSS: ("layout_tolerances", "layout_spreads", "variants"),
}
VARIANT_ALONE = (
    "only a variant that replays this golden ran: its runs measure neither the reference's "
    "lane nor a variant lane; select the reference too (or two variants or more)"
)
# The largest rtol calibration writes: runs of correct code that differ by more than 5% differ
# by more than the order of their sums (a non-deterministic op, sampling left on).
MAX_RTOL = 0.05
_WRITTEN = ("rtol", "atol", "scale", "equal_nan")  # the fields calibration writes
# The rounding level of float32 terms of order 1 (8 ulps; golden.messages.ROUNDING_LEVEL, the
# failure notes' own): a metric whose every recorded value lies below it (TRL RLOO's loss, a
# mean of centred advantages: |loss| <= 3.7e-8) holds no value of its own, only the rounding
# of terms that cancel. Its spread is taken as absolute: relative to ~1e-8, rounding reads as
# 100% (RLOO's 1.33 under --golden-calibrate 3) and would be refused over MAX_RTOL.
ROUNDING_LEVEL = 1e-6
# The largest atol calibration writes for such a metric: 10x the rounding level. Rounding of
# terms of order 1 moves a cancelling value by <= 1e-6 (RLOO: <= 9.7e-8 under a same-math
# change), so MARGIN x its spread stays below; a value that stops cancelling (dapo's loss,
# ~1e-3; a loss summed over padding, 0.076) is 100x beyond. A wider atol would be a check that
# cannot fail: beyond it calibration writes nothing and says why.
MAX_ATOL = 1e-5
# A variant whose distance to the reference, for a value, exceeds OUTLIER x the larger of the
# median distance of the other variants and the same-layout spread is no same-math variant
# of that value: it is left out of the variant lane it would widen. True same-math variants
# reorder the same sums, so their distances are of one order (the project's parallel
# matrices: of 31 policy and 47 MoE layouts the farthest is 2.6x the others' median);
# a bug of 1e-3 is >= 60x beyond float32 same-math noise (<= 1.6e-5, tolerance/families.py).
OUTLIER = 10.0
# What the float64 oracle (--golden-calibrate's certification run, golden/precision.py) said
# of a variant: the verdict of its certificate in tolerances.json's "variants".
CERTIFIED, NOT_SAME_MATH, UNCERTIFIED = "certified", "not the same math", "not certified"


Magnitude = Callable[[str], float | None]  # a metric's largest recorded |value|, if any


def _unknown(name: str) -> float | None:
    return None


def calibrated_layer(document: Any, path: Path, magnitude: Magnitude = _unknown) -> Layer:
    """The resolution layer of a ``tolerances.json`` document."""
    return calibrated_layers(document, path, magnitude=magnitude)[0]


def calibrated_layers(
    document: Any, path: Path, *, layout_variant: bool = False, magnitude: Magnitude = _unknown
) -> tuple[Layer, Layer | None]:
    """The layers of a ``tolerances.json`` document: calibrated, and calibrated variant lane.

    Only a ``layout_variant`` (a variant replaying another's golden) gets the lane
    measured across variants, when the document has one. Every entry of both is bounded
    (:func:`entry_problem`; ``magnitude``: the golden's recorded magnitude of a metric);
    a file holding one beyond is refused whole.
    """
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise GoldenFormatError(
            f"{path}: is not a calibrated-tolerances file of ours; re-run "
            "`pytest --golden-calibrate N` for this test, or `pytest --update-golden` to drop it"
        )
    for key in ("tolerances", "layout_tolerances"):
        problem = _unwritable(document.get(key, {}), key, magnitude)
        if problem:
            raise GoldenFormatError(
                f"{path}: {problem}: calibration never writes that, so this file was edited; "
                "re-run `pytest --golden-calibrate N` for this test, or `pytest --update-golden` "
                "to drop it"
            )
    same_layout = Layer(SOURCE, document.get("tolerances", {}))
    lane = None
    if layout_variant and document.get("layout_tolerances"):
        lane = Layer(LAYOUT_SOURCE, document["layout_tolerances"])
    return same_layout, lane


def _unwritable(entries: Any, key: str, magnitude: Magnitude) -> str:
    """What in ``entries`` (a section of tolerances.json) calibration could not have written
    ("" when nothing): :func:`entry_problem` of each entry."""
    if not isinstance(entries, dict):
        return f"{key} must be an object of metric name -> tolerance"
    for name, entry in entries.items():
        problem = entry_problem(entry, name, magnitude(name))
        if problem:
            return f"{key} entry {name!r}: {problem}"
    return ""


def entry_problem(entry: Any, name: str, magnitude: float | None) -> str:
    """Why one entry of ``tolerances.json`` may not be there ("" when it may): only the
    fields calibration writes, finite numbers >= 0, no exclusion, ``rtol`` within
    :data:`MAX_RTOL`, and an absolute allowance (``atol``, plus ``rtol x scale`` for a
    numeric scale) within :func:`allowance_cap` of the metric's recorded ``magnitude``
    (none for a pattern, which may match other values than ``name``).

    The one validator of the file: the run, ``rollout-golden verify``, ``diff`` and
    calibration itself (before it writes) all apply it.
    """
    if not isinstance(entry, dict):
        return f"must be an object of {', '.join(_WRITTEN)}"
    for field in entry:
        if field not in _WRITTEN:
            return f"{field!r} is not something calibration writes"
    for field in ("rtol", "atol"):
        value = entry.get(field, 0.0)
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not number or not math.isfinite(value) or value < 0:
            return f"{field} must be a finite number >= 0, got {value!r}"
    rtol, atol, scale = entry.get("rtol", 0.0), entry.get("atol", 0.0), entry.get("scale", 0.0)
    if rtol > MAX_RTOL:
        return f"rtol {rtol:g} is beyond what calibration writes ({MAX_RTOL})"
    numeric = isinstance(scale, (int, float)) and not isinstance(scale, bool)
    if scale != RECORDED and not (numeric and math.isfinite(scale) and scale >= 0):
        return f"scale must be 'recorded' or a finite number >= 0, got {scale!r}"
    if not isinstance(entry.get("equal_nan", False), bool):
        return "equal_nan must be true or false"
    pattern = is_glob(name)
    cap, why = allowance_cap(name, None if pattern else magnitude)
    if atol > cap:
        return f"atol {atol:g} is beyond what tolerances.json may hold ({cap:g}: {why})"
    floor = rtol * scale if numeric else 0.0
    if atol + floor > cap:
        return (
            f"scale {scale:g} gives rtol x scale = {floor:g} (plus atol {atol:g}), beyond what "
            f"tolerances.json may hold ({cap:g}: {why})"
        )
    return ""


def allowance_cap(name: str, magnitude: float | None) -> tuple[float, str]:
    """The largest absolute allowance an entry of ``tolerances.json`` may hold, and why:
    :data:`MAX_RTOL` x the metric's largest recorded magnitude (what calibration writes
    around 0), at least :data:`MAX_ATOL` (what it writes at rounding level, torch.testing's
    atol of every float dtype); :data:`MAX_ATOL` alone where no recorded value gives a
    magnitude (a pattern, a tensor, a name never recorded)."""
    if magnitude is None or not math.isfinite(magnitude):
        return MAX_ATOL, "no recorded value of it gives a magnitude"
    if MAX_RTOL * magnitude <= MAX_ATOL:
        return MAX_ATOL, f"the rounding level cap, as |{name}| <= {magnitude:.3g}"
    return MAX_RTOL * magnitude, f"{MAX_RTOL} x the largest recorded |{name}|, {magnitude:.3g}"


# --------------------------------------------------------------------------- perturbations

PERTURBATIONS = ("threads", "nondeterministic", "tf32")


def thread_counts(base: int) -> list[int]:
    """Intra-op thread counts to cycle through, starting with the current one."""
    wanted = [base, 1, 2 * base, max(1, base // 2), base + 1, 3, 4 * base]
    return list(dict.fromkeys(n for n in wanted if n >= 1))


# The fingerprint fields perturbed() changes on purpose.
PERTURBED = ("cpu_threads", "deterministic_algorithms", "cudnn_deterministic", "tf32_matmul")


def unperturbed(changes: Sequence[str]) -> list[str]:
    """The environment changes (``"field: ..."``) other than those a perturbation makes."""
    return [c for c in changes if c.split(":")[0] not in PERTURBED]


@contextmanager
def perturbed(run: int, kinds: Sequence[str]) -> Iterator[str]:
    """Run number ``run`` of a calibration: reduction order changed, math unchanged.

    ``threads`` cycles ``torch.set_num_threads`` through :func:`thread_counts`;
    ``nondeterministic`` allows non-deterministic algorithms (and cuDNN
    benchmarking) on odd runs; ``tf32`` switches TF32 matmuls and convolutions on
    on odd runs. Yields a description such as ``"threads=1, tf32"``; everything is
    restored on exit.
    """
    import torch

    saved = (
        torch.get_num_threads(),
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
    )
    parts = []
    try:
        if "threads" in kinds:
            n = thread_counts(saved[0])[run % len(thread_counts(saved[0]))]
            torch.set_num_threads(n)
            parts.append(f"threads={n}")
        odd = run % 2 == 1
        if "nondeterministic" in kinds and odd:
            torch._C._set_deterministic_algorithms(False, warn_only=False)
            torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = False, True
            parts.append("nondeterministic")
        if "tf32" in kinds:
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = odd
            parts.append(f"tf32={'on' if odd else 'off'}")
        yield ", ".join(parts)
    finally:
        torch.set_num_threads(saved[0])
        torch._C._set_deterministic_algorithms(saved[1], warn_only=saved[2])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved[3:5]
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[5:7]


# --------------------------------------------------------------------------- spreads


# A step whose values are this far below the metric's largest magnitude (over all steps) counts
# as "near 0": kl is ~1e-6 at step 0 (policy = reference) and ~1e-3 later; a relative spread
# taken at step 0 (5% there) would let every later kl drift pass.
NEAR_ZERO = 1e-2


@dataclasses.dataclass
class Spread:
    """The largest disagreement between runs of one metric over all steps."""

    rel: float = 0.0
    abs: float = 0.0
    step: int | None = None  # where the relative spread is largest
    near_zero: bool = False  # some step's values touch 0 or lie far below the metric's scale
    dtype: str = "float64"
    near_zero_abs: float = 0.0  # the largest absolute spread at such steps
    scaled: bool = False  # a tensor's distance, relative to its recorded magnitude
    of_magnitude: float = 0.0  # a metric's largest spread over its largest magnitude
    magnitude: float = math.inf  # the largest |value| recorded (inf: not known, a tensor)

    def merge(self, other: Spread) -> Spread:
        """The larger of two spreads (of two steps, or two tests sharing a golden)."""
        best = self if (self.rel, self.abs) >= (other.rel, other.abs) else other
        return dataclasses.replace(
            best,
            abs=max(self.abs, other.abs),
            near_zero=self.near_zero or other.near_zero,
            near_zero_abs=max(self.near_zero_abs, other.near_zero_abs),
            of_magnitude=max(self.of_magnitude, other.of_magnitude),
            magnitude=max(self.magnitude, other.magnitude),
        )


def at_rounding_level(spread: Spread) -> bool:
    """Whether every recorded value of a metric lies below :data:`ROUNDING_LEVEL`."""
    return not spread.scaled and spread.magnitude < ROUNDING_LEVEL


def spreads(
    runs: Sequence[Mapping[str, Mapping[str, Any]]], recorded: int | None = None
) -> dict[str, Spread]:
    """Per metric, the spread over ``runs`` (each ``{step: {name: (value, dtype)}}``).

    Only steps every run checked count; NaN or infinite values are skipped. A step
    whose values touch 0 or lie below ``NEAR_ZERO`` times the metric's largest
    magnitude adds to the absolute spread only: relative to ~0 any noise is "100%".
    ``recorded``: the first ``recorded`` runs are those of the test that recorded the golden
    (the reference), whose magnitude the tolerance measures against; default all.
    """
    out: dict[str, Spread] = {}
    if len(runs) < 2:
        return out
    steps = sorted(set.intersection(*(set(r) for r in runs)), key=int)
    table: dict[str, list[tuple[int, list[float], str]]] = {}
    for step in steps:
        for name in sorted(set.intersection(*(set(r[step]) for r in runs))):
            values = [float(r[step][name][0]) for r in runs]
            if all(math.isfinite(v) for v in values):
                table.setdefault(name, []).append((int(step), values, runs[0][step][name][1]))
    for name, rows in table.items():
        magnitude = max(abs(v) for _, values, _ in rows for v in values[:recorded])
        for step, values, dtype in rows:
            width, scale = max(values) - min(values), max(abs(v) for v in values)
            small = min(abs(v) for v in values) <= width or scale < NEAR_ZERO * magnitude
            rel = width / scale if scale and not small else 0.0
            of_magnitude = width / magnitude if magnitude else 0.0
            spread = Spread(rel, width, step, small, dtype, width if small else 0.0)
            spread.of_magnitude, spread.magnitude = of_magnitude, magnitude
            out[name] = spread if name not in out else out[name].merge(spread)
    return out


def tensor_distances(comparisons: Sequence[Any]) -> dict[str, list[Any]]:
    """Per tensor of one run: ``[greatest distance to the golden, dtype, scaled]``, the
    distance relative to the recorded magnitude when ``scaled`` (the tolerance had a
    scale), else to each element (over steps, ranks and micro-batches)."""
    out: dict[str, list[Any]] = {}
    for c in comparisons:
        if c.kind != "tensor" or c.abs_diff is None or not math.isfinite(c.abs_diff):
            continue
        dtype = (c.expected or {}).get("dtype", "float32")
        if c.scale:
            distance, scaled = c.abs_diff / c.scale, True
        else:
            distance, scaled = (c.rel_diff if c.rel_diff is not None else math.inf), False
        if not math.isfinite(distance):
            continue
        old = out.get(c.name)
        out[c.name] = [max(distance, old[0]) if old else distance, dtype, scaled]
    return out


def tensor_spreads(runs: Sequence[Mapping[str, Sequence[Any]]]) -> dict[str, Spread]:
    """Per tensor, the greatest distance to the golden over ``runs`` (each
    :func:`tensor_distances`), as a :class:`Spread` whose ``rel`` is that distance."""
    out: dict[str, Spread] = {}
    for run in runs:
        for name, (distance, dtype, scaled) in run.items():
            spread = Spread(rel=distance, abs=distance, dtype=dtype, scaled=bool(scaled))
            out[name] = spread if name not in out else out[name].merge(spread)
    return out


def tolerance_for(spread: Spread, base: Tolerance) -> Tolerance | None:
    """The calibrated tolerance of a metric, or ``None`` to keep ``base`` (zero spread or a
    value ``base`` does not compare).

    Under a ``base`` measured against the recorded magnitude (``scale="recorded"``), so is
    the spread: ``rtol = MARGIN * largest spread / largest magnitude``, keeping that scale.
    A metric at rounding level (:func:`at_rounding_level`) keeps ``base``'s rtol and scale
    and gets ``atol = MARGIN * its absolute spread`` (bounded by :data:`MAX_ATOL` in
    :func:`refusal`).
    """
    if spread.abs == 0 or base.ignore:
        return None
    if at_rounding_level(spread):
        atol = max(base.atol, MARGIN * spread.abs)
        return Tolerance(rtol=base.rtol, atol=atol, equal_nan=base.equal_nan, scale=base.scale)
    floor = DTYPE_FLOOR * EPS.get(spread.dtype, EPS["float64"])
    if base.scale == RECORDED and not spread.scaled:
        rtol = max(MARGIN * spread.of_magnitude, floor)
        return Tolerance(rtol=rtol, atol=base.atol, equal_nan=base.equal_nan, scale=RECORDED)
    atol = base.atol
    if spread.near_zero:  # a relative spread means little around 0
        atol = max(atol, MARGIN * spread.near_zero_abs)
    # Runs that moved only around 0 say nothing about the relative noise: keep base's rtol.
    rtol = max(MARGIN * spread.rel, floor) if spread.rel else base.rtol
    scale = base.scale if spread.scaled else None
    return Tolerance(rtol=rtol, atol=atol, equal_nan=base.equal_nan, scale=scale)


def refusal(tol: Tolerance, base: Tolerance, spread: Spread) -> str:
    """Why calibration does not write ``tol`` (measured from ``spread`` over ``base``), or
    "": its rtol beyond :data:`MAX_RTOL`, or an atol it raised beyond :data:`MAX_ATOL` (at
    rounding level) or beyond ``MAX_RTOL`` x the metric's largest magnitude (around 0)."""
    if tol.rtol > MAX_RTOL:
        return (
            f"rtol {tol.rtol:.3g} is beyond what calibration writes ({MAX_RTOL}): the runs "
            "differ by more than the order of their sums"
        )
    if tol.atol <= base.atol:
        return ""
    if at_rounding_level(spread):
        if tol.atol > MAX_ATOL:
            return (
                f"atol {tol.atol:.2g} is beyond what calibration writes at rounding level "
                f"({MAX_ATOL:g}): the runs differ by more than the rounding of terms of order 1"
            )
    elif math.isfinite(spread.magnitude) and tol.atol > MAX_RTOL * spread.magnitude:
        return (
            f"atol {tol.atol:.2g} is beyond what calibration writes ({MAX_RTOL} x the largest "
            f"magnitude, {spread.magnitude:.3g}): the runs differ by more than the order of "
            "their sums"
        )
    return ""


def _section(
    found: Mapping[str, Spread], base: Callable[[str, str], Tolerance], magnitude: Magnitude
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Tolerances derived from ``found`` spreads, and the table of spreads they come from;
    an entry the file may not hold (:func:`entry_problem`) is refused."""
    tolerances, table = {}, {}
    for name, spread in sorted(found.items()):
        below = base(name, spread.dtype)
        tol = tolerance_for(spread, below)
        table[name] = entry = _spread_entry(spread, below)
        if below.ignore:
            entry["kept"] = entry["why"] = "not compared"
            continue
        if tol is None:
            entry["kept"], entry["why"] = "spread 0: the default tolerance applies", "spread 0"
            continue
        if _same(tol, below):
            entry["kept"] = "the measured tolerance is the default"
            entry["why"] = "= measured"
            continue
        written = {"rtol": tol.rtol, "atol": tol.atol}
        if tol.scale:
            written["scale"] = tol.scale
        if tol.equal_nan:
            written["equal_nan"] = True
        refused = refusal(tol, below, spread) or entry_problem(written, name, magnitude(name))
        if refused:
            entry["kept"] = f"{refused}; the default tolerance applies"
            entry["why"], entry["refused"] = "over the cap", refused
            continue
        tolerances[name] = written
    return tolerances, table


def _spread_entry(spread: Spread, below: Tolerance) -> dict[str, Any]:
    """A spread as ``tolerances.json`` lists it, measured as the tolerance ``below`` does."""
    measured = below.scale == RECORDED and not spread.scaled
    entry = {
        "rel_spread": spread.of_magnitude if measured else spread.rel,
        "abs_spread": spread.abs,
        "at_step": spread.step if spread.abs else None,
        "dtype": spread.dtype,
    }
    if spread.scaled:
        entry["distance"] = "to the golden, relative to the recorded magnitude"
    elif at_rounding_level(spread) and spread.abs:
        entry["at_rounding_level"] = True
        entry["largest_magnitude"] = spread.magnitude
    elif measured:
        entry["relative_to"] = "the largest recorded magnitude"
    return entry


def _same(tol: Tolerance, base: Tolerance) -> bool:
    """Whether ``tol`` allows what ``base`` allows, field by field that calibration writes."""
    return all(getattr(tol, field) == getattr(base, field) for field in _WRITTEN)


def document(
    found: Mapping[str, Spread],
    base: Callable[[str, str], Tolerance],
    *,
    runs: int,
    perturbations: Sequence[str],
    tests: Sequence[str],
    across_layouts: Mapping[str, Spread] | None = None,
    layouts: Sequence[str] = (),
    across_base: Callable[[str, str], Tolerance] | None = None,
    variants: Mapping[str, Any] | None = None,
    magnitude: Magnitude = _unknown,
) -> dict[str, Any]:
    """The content of ``tolerances.json``: tolerances, and the spreads they come from.

    ``across_layouts``: spreads over the runs of the reference and the variants of
    ``layouts`` the lane kept, which become the calibrated variant lane, over
    ``across_base`` (default ``base``): the tolerances a variant has below that lane;
    ``variants``: per variant test, its distances to the reference and what was excluded
    (:func:`variant_lane`); ``magnitude``: each metric's recorded magnitude, which bounds
    what the file may hold (:func:`entry_problem`).
    """
    tolerances, table = _section(found, base, magnitude)
    content: dict[str, Any] = {
        "format": FORMAT,
        "version": 1,
        "how": {
            "runs": runs,
            "perturbations": list(perturbations),
            "margin": MARGIN,
            "floor": f"{DTYPE_FLOOR:g} x dtype epsilon",
            "tests": list(tests),
        },
        "tolerances": tolerances,
        "spreads": table,
    }
    if across_layouts is not None:
        lane, lane_table = _section(across_layouts, across_base or base, magnitude)
        content["how"]["layouts"] = list(layouts)
        content["how"]["outlier"] = (
            f"a variant whose distance exceeds {OUTLIER:g} x max(median distance of the other "
            "variants, same-layout spread) is left out of the lane for that value"
        )
        content["layout_tolerances"] = lane
        content["layout_spreads"] = lane_table
        content["variants"] = dict(variants or {})
    return content


def writes_nothing(content: Mapping[str, Any]) -> bool:
    """Whether a :func:`document` keeps every default (no entry in either lane)."""
    return not content["tolerances"] and not content.get("layout_tolerances")


def write(
    directory: Path,
    content: Mapping[str, Any] | None,
    *,
    carry: Collection[str] = (),
    envelope: Mapping[str, Any] | None = None,
) -> bool:
    """Put ``tolerances.json`` into the golden ``directory``, listed in its manifest, or
    with ``content`` ``None`` take away the one there; whether the golden changed.
    ``envelope``: the ``envelope.json`` written beside it in the same commit (``None``: no
    long run's band was measured, and an earlier one goes).

    ``carry``: the lanes (:data:`LANES`) this calibration did not measure, taken as the file
    there holds them (:func:`carried`); a file left with no entry in either is removed. The
    golden is re-committed as a whole (its other files kept as they are), under its lock,
    like any other update of it.
    """
    from ... import store

    with store.locked(directory):
        store.recover(directory)
        manifest = store.read_manifest(directory)
        if manifest is None:
            raise GoldenError(
                f"{directory}: no golden to calibrate (it was never recorded); record it "
                "first (`pytest --update-golden` on its test), then calibrate"
            )
        info = manifest["files"].get(TOLERANCES)
        if content is not None and carry and info is not None:
            try:
                earlier = store.read_json(directory / TOLERANCES, expect_digest=info["digest"])
            except GoldenFormatError:
                earlier = None  # a damaged file is dropped, as --update-golden drops it
            content = carried(content, earlier, carry)
        if content is not None and writes_nothing(content):
            content = None
        if envelope is not None:
            envelope = _carried_bands(envelope, directory, manifest, carry)
        nothing_there = info is None and ENVELOPE not in manifest["files"]
        if content is None and envelope is None and nothing_there:
            return False
        tx = store.Transaction(directory)
        # The environment whose noise this is: the golden's (runs differ only as perturbed).
        fingerprint = manifest.get("fingerprint")
        try:
            for filename, kept in manifest["files"].items():
                if filename not in (TOLERANCES, ENVELOPE):
                    tx.keep(filename, kept)
            if content is not None:
                content = {**content, "how": {**content["how"], "fingerprint": fingerprint}}
                tx.write_json(TOLERANCES, content, kind="tolerances")
            if envelope is not None:
                envelope = {**envelope, "how": {**envelope["how"], "fingerprint": fingerprint}}
                tx.write_json(ENVELOPE, envelope, kind="envelope")
            tx.commit({k: v for k, v in manifest.items() if k not in ("format", "schema", "files")})
        except BaseException:
            tx.abort()
            raise
    return True


def _carried_bands(
    content: Mapping[str, Any], directory: Path, manifest: Mapping[str, Any], lanes: Collection[str]
) -> dict[str, Any] | None:
    """``envelope.json``'s ``content`` with the ``lanes`` this calibration did not measure
    taken from the file there (named under ``how.kept``); ``None`` where no lane holds a
    band."""
    from ... import store
    from .envelope import DRIFTING, LANES

    out = {**content, "how": dict(content["how"])}
    info = manifest["files"].get(ENVELOPE)
    if info is not None and lanes:
        try:
            earlier = store.read_json(directory / ENVELOPE, expect_digest=info["digest"])
        except GoldenFormatError:
            earlier = {}  # a damaged file is dropped, as --update-golden drops it
        kept = [lane for lane in lanes if LANES[lane] in earlier and LANES[lane] not in out]
        out.update({LANES[lane]: earlier[LANES[lane]] for lane in kept})
        if ACROSS in kept and DRIFTING in earlier:
            out[DRIFTING] = earlier[DRIFTING]
        if kept:
            out["how"]["kept"] = kept
    if not any(out.get(section) for section in (*LANES.values(), DRIFTING)):
        return None
    return out


def carried(content: Mapping[str, Any], earlier: Any, lanes: Collection[str]) -> dict[str, Any]:
    """``content`` with the ``lanes`` it did not measure taken from ``earlier`` (the file's
    document), named under ``how.kept``; a lane ``earlier`` has no entry in stays out."""
    out = {**content, "how": dict(content["how"])}
    if not isinstance(earlier, dict) or earlier.get("format") != FORMAT:
        return out
    kept = []
    for lane in lanes:
        sections = LANES[lane]
        if not earlier.get(sections[0]):
            continue
        kept.append(lane)
        out.update({key: earlier[key] for key in sections if key in earlier})
        if lane == ACROSS:
            how = earlier.get("how", {})
            out["how"].update({k: how[k] for k in ("layouts", "outlier") if k in how})
    if kept:
        out["how"]["kept"] = sorted(kept, key=list(LANES).index)
    return out


def _below(resolver: Resolver, ignored: Collection[str], name: str, dtype: str) -> Tolerance:
    """The tolerance under the calibrated layer: ``resolver``'s, unless a run did not
    compare ``name`` (``ignored``, its marker's tolerances included)."""
    return IGNORE if name in ignored else resolver.resolve(name, (dtype,))[0]


def calibrate_goldens(
    samples: Mapping[str, Mapping[str, Sequence[Any]]],
    skipped: Mapping[str, Mapping[str, str]],
    resolver: Resolver,
    *,
    runs: int,
    perturbations: Sequence[str],
    layouts: Mapping[str, Mapping[str, str]] | None = None,
    replaying: Sequence[str] = (),
    variant_resolver: Resolver | None = None,
    certificates: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Write ``tolerances.json`` for every golden with at least one test of 2+ usable runs.

    ``samples``: golden directory -> test id -> each run's sample
    (:meth:`.Golden.calibration_sample`); ``skipped``: golden
    directory -> test id -> why its runs do not count; ``layouts``: golden directory ->
    test id -> the variant id of a ``same_math()`` or ``parallel.variants()`` test;
    ``replaying``: the test ids that replay another test's golden; ``certificates``: test
    id -> what the float64 oracle said of the variant (:func:`certificate`). ``resolver`` gives the
    tolerances below the calibrated layer, ``variant_resolver`` those of a variant (default
    ``resolver``); a value they do not compare, or a run did not (its marker's tolerances),
    gets no entry. Returns one summary entry per golden (what was written, or why nothing
    was; ``written`` False and ``removed`` when every value keeps its default; ``measured``:
    the tests whose failures during calibration it now holds, :func:`measured_failures`).
    """
    out = []
    for directory, tests in sorted(samples.items()):
        left_out = skipped.get(directory, {})
        usable = {t: r for t, r in tests.items() if t not in left_out and len(r) > 1}
        if not usable:
            reasons = sorted(set(left_out.values())) or ["fewer than 2 runs completed"]
            out.append({"directory": directory, "skipped": "; ".join(reasons), "rows": []})
            continue
        of_layout = {t: lay for t, lay in (layouts or {}).get(directory, {}).items() if t in usable}
        ignored = {n for runs in usable.values() for run in runs for n in run.get("ignored", ())}
        across_base = functools.partial(_below, variant_resolver or resolver, ignored)
        lane = variant_lane(usable, of_layout, replaying, across_base, certificates or {})
        own = {t: r for t, r in usable.items() if t not in replaying}  # the golden's own tests
        if not own and lane is None:
            out.append({"directory": directory, "skipped": VARIANT_ALONE, "rows": []})
            continue
        content = document(
            _same_layout_spreads(own, replaying),
            functools.partial(_below, resolver, ignored),
            runs=runs,
            perturbations=perturbations,
            tests=sorted(usable),
            across_layouts=lane[0] if lane else None,
            layouts=sorted(set(of_layout.values())),
            across_base=across_base,
            variants=lane[1] if lane else None,
            magnitude=_recorded_magnitudes(usable),
        )
        carry = [name for name, measured in ((SAME, own), (ACROSS, lane)) if not measured]
        found = _envelope(
            usable,
            replaying,
            lane,
            functools.partial(_below, variant_resolver or resolver, ignored),
            _recorded_magnitudes(usable),
            {"runs": runs, "perturbations": list(perturbations)},
        )
        measured = measured_failures(content, usable, replaying, found[0])
        out.append(_write_calibrated(directory, content, left_out, carry, found, measured))
    return out


def measured_failures(
    content: Mapping[str, Any],
    usable: Mapping[str, Sequence[Any]],
    replaying: Collection[str],
    bands: Mapping[str, Any] | None,
) -> list[str]:
    """The tests whose runs failed against the golden during calibration only on values that
    the written lane applying to the test now holds (``content``'s calibrated tolerances,
    ``bands``' envelope): their failures are what was measured. A variant (``replaying``)
    qualifies only where the float64 oracle did not find it not the same math and it was left
    out of none of those values; any other test is judged by the same-layout lane. A run
    that failed otherwise (``unmeasured``: a value missing, a mask, a bound) rules it out."""
    from .envelope import LANES as BAND_SECTIONS

    out = []
    for test, runs in sorted(usable.items()):
        if any(run.get("unmeasured") for run in runs):
            continue
        failed = {name for run in runs for name in run.get("failed", ())}
        lane = ACROSS if test in replaying else SAME
        record = content.get("variants", {}).get(test, {}) if lane == ACROSS else {}
        verdict = record.get("certificate", {}).get("verdict")
        if not failed or (lane == ACROSS and (not record or verdict == NOT_SAME_MATH)):
            continue
        held = set(content.get(LANES[lane][0]) or {}) | set(
            (bands or {}).get(BAND_SECTIONS[lane]) or {}
        )
        if failed <= held - set(record.get("excluded", {})):
            out.append(test)
    return out


def _envelope(
    usable: Mapping[str, Sequence[Any]],
    replaying: Collection[str],
    lane: tuple[dict[str, Spread], dict[str, Any]] | None,
    base: Callable[[str, str], Tolerance],
    magnitude: Magnitude,
    how: Mapping[str, Any],
) -> tuple[dict[str, Any] | None, dict[str, str]]:
    """``(envelope.json's content, the bands refused and why)``: per lane measured
    (:data:`.envelope.LANES`) the bands (:mod:`.envelope`) of the runs of the golden's own
    tests, and across variants of those and the variants' runs, each variant left out of
    the values it is an outlier for; ``None`` where no lane was measured."""
    from . import envelope

    recorded = [run["recorded"] for runs in usable.values() for run in runs if run.get("recorded")]
    if not recorded:
        return None, {}
    own = [
        (run["metrics"], ())
        for t, runs in sorted(usable.items())
        if t not in replaying
        for run in runs
    ]
    sources: dict[str, list[tuple[Any, Any]]] = {SAME: own} if own else {}
    if lane is not None:
        sources[ACROSS] = own + [
            (run["metrics"], lane[1][t]["excluded"])
            for t, runs in sorted(usable.items())
            if t in replaying and lane[1][t]["certificate"]["verdict"] != NOT_SAME_MATH
            for run in runs
        ]
    lanes, refused, drifting = {}, {}, {}
    for name, runs in sources.items():
        found, why, drifts = envelope.bands(recorded[0], runs, base=base, magnitude=magnitude)
        lanes[name] = found
        if name == ACROSS:  # not comparable across variants, listed as such on every replay
            drifting = drifts
            why = {metric: text for metric, text in why.items() if metric not in drifts}
        refused.update({f"{name}: {metric}": text for metric, text in why.items()})
    if not lanes:
        return None, refused
    content = envelope.document(lanes, {**how, "tests": sorted(usable)})
    if drifting:
        content[envelope.DRIFTING] = drifting
    return content, refused


def _recorded_magnitudes(usable: Mapping[str, Sequence[Any]]) -> Magnitude:
    """Each metric's largest recorded magnitude, the smallest any run saw (a run that
    recorded the golden saw none): what the run will bound the entry by."""
    found: dict[str, float] = {}
    for test_runs in usable.values():
        for run in test_runs:
            for name, magnitude in run.get("magnitudes", {}).items():
                found[name] = min(magnitude, found.get(name, math.inf))
    return found.get


def _same_layout_spreads(
    usable: Mapping[str, Sequence[Any]], replaying: Collection[str]
) -> dict[str, Spread]:
    """Each value's spread over the runs of each test (``usable``: test id -> its runs'
    samples), merged over the tests."""
    found: dict[str, Spread] = {}
    for measured in _own_spreads(usable, replaying).values():
        for name, spread in measured.items():
            found[name] = spread if name not in found else found[name].merge(spread)
    return found


def _own_spreads(
    usable: Mapping[str, Sequence[Any]], replaying: Collection[str]
) -> dict[str, dict[str, Spread]]:
    """Per test, each value's spread over its own runs (a test that replays another's golden:
    metrics only, as its tensors' distance to that golden is no same-layout noise)."""
    out = {}
    for test, test_runs in usable.items():
        measured = spreads([run["metrics"] for run in test_runs])
        if test not in replaying:
            measured.update(tensor_spreads([run["tensors"] for run in test_runs]))
        out[test] = measured
    return out


# --------------------------------------------------------------------------- variants


def variant_lane(
    usable: Mapping[str, Sequence[Any]],
    of_layout: Mapping[str, str],
    replaying: Collection[str],
    base: Callable[[str, str], Tolerance],
    certificates: Mapping[str, Mapping[str, Any]] | None = None,
) -> tuple[dict[str, Spread], dict[str, Any]] | None:
    """The spreads of the calibrated variant lane, and per variant test its record:
    ``None`` unless the tests are of two variants or more (``of_layout``: test id ->
    variant id; ``replaying``: the variants' test ids).

    A variant the float64 oracle certified (``certificates``, :func:`certificate`) is kept
    on every value: its distance is the noise of the precision, whatever its size. One
    the oracle found not the same math is left out of every value. Any other variant (its
    code could not run in float64, or no certification ran) is measured on its own: per
    value, its distance to the reference's runs (:func:`variant_distances`); where it is an
    outlier (:func:`outliers`) against the other variants and the same-layout spread (the
    reference's own, which no variant can inflate; the median of the variants' own where
    the reference was not selected) it is left out of that value's lane. The lane pools
    the runs of the reference and of the variants kept.
    """
    if len(set(of_layout.values())) < 2:
        return None
    verdicts = {t: (certificates or {}).get(t, {}).get("verdict") for t in of_layout}
    reference = [t for t in sorted(of_layout) if t not in replaying]
    variants = [t for t in sorted(of_layout) if t in replaying]
    if reference:
        center = _mean_run([run["metrics"] for t in reference for run in usable[t]])
    else:  # the reference was not selected: the variants' median stands in for it
        center = _median_run([_mean_run([r["metrics"] for r in usable[t]]) for t in variants])
    distances = {t: variant_distances(center, usable[t]) for t in variants}
    own = _own_spreads({t: usable[t] for t in reference or variants}, replaying)
    trusted = [t for t in variants if verdicts[t] != NOT_SAME_MATH]
    judged = _judge({t: distances[t] for t in trusted}, list(own.values()), base)
    excluded = {t: why for t, why in judged.items() if verdicts[t] != CERTIFIED}
    records = {
        t: {
            **_record(of_layout[t], distances[t], excluded.get(t, {}), usable[t], base),
            "certificate": dict((certificates or {}).get(t) or uncertified()),
        }
        for t in variants
    }
    return _pooled(usable, reference, trusted, excluded), records


def certificate(comparisons: Sequence[Any], *, error: str = "") -> dict[str, Any]:
    """What the float64 oracle says of a variant from its float64 run's comparisons against
    the reference's float64 values: ``certified`` (with the largest distance in units of
    the float64 bound), ``not the same math`` (with the first value that differs, its step
    and relative size), or ``not certified`` when the run could not compare (``error``)."""
    if error:
        return uncertified(f"its float64 run could not run: {error}")
    drifted = [c for c in comparisons if str(c.verdict) == "fail"]
    compared = [c for c in comparisons if c.excess is not None and str(c.verdict) == "pass"]
    if not drifted and not compared:
        return uncertified("its float64 run compared no value")
    if not drifted:
        return {"verdict": CERTIFIED, "largest": max(_within(c) for c in compared)}
    first = min(drifted, key=lambda c: (c.step, -(c.excess or math.inf)))
    size = first.rel_diff if first.rel_diff is not None else first.abs_diff
    return {
        "verdict": NOT_SAME_MATH,
        "value": first.name,
        "step": first.step,
        "differs_by": size,
        "values": sorted({c.name for c in drifted}),
    }


def _within(c: Any) -> float:
    """A passing comparison's difference over the difference allowed (0: equal values).
    ``Comparison.excess`` cannot say: it is 0 for every value within its tolerance."""
    if not c.abs_diff:
        return 0.0
    expected = c.expected if isinstance(c.expected, (int, float)) else 0.0
    allowed = c.tolerance.atol + c.tolerance.rtol * (c.scale or abs(expected))
    return c.abs_diff / allowed if allowed > 0 else math.inf


def uncertified(why: str = "no float64 certification ran for it") -> dict[str, Any]:
    """The certificate of a variant the oracle could not judge: the outlier rule applies."""
    return {"verdict": UNCERTIFIED, "why": why}


def variant_distances(
    center: Mapping[str, Mapping[str, Any]], runs: Sequence[Any]
) -> dict[str, Spread]:
    """Per value, a variant's distance to the reference: for a metric, the largest
    ``|mean over its runs - center|`` over steps (``center``: the mean of the reference's
    runs), as a :class:`Spread` measured against the reference's magnitude; for a tensor,
    the largest distance of its runs to the golden (:func:`tensor_spreads`)."""
    mean = _mean_run([run["metrics"] for run in runs])
    found = spreads([center, mean], recorded=1) if center and mean else {}
    found.update(tensor_spreads([run["tensors"] for run in runs]))
    return found


def outliers(
    distances: Mapping[str, float], *, noise: float, floor: float
) -> dict[str, dict[str, Any]]:
    """Of one value: the variants (test id -> distance to the reference) that are outliers.

    A variant is one when its distance exceeds ``OUTLIER x baseline``, the baseline being
    the larger of the median distance of the other variants (when there are 2 or more)
    and ``noise``, the same-layout spread, and at least ``floor`` (distances within
    rounding are no outliers). With fewer than 2 other variants and no same-layout spread
    there is nothing to compare against but rounding: the baseline is ``floor``.
    """
    out = {}
    for test, distance in distances.items():
        others = [d for t, d in distances.items() if t != test]
        candidates = [(noise, "the same-layout spread")] if noise > 0 else []
        if len(others) >= 2:
            candidates.append((statistics.median(others), "the other variants"))
        baseline, against = max(candidates, default=(floor, "rounding"))
        if baseline < floor:
            baseline, against = floor, "rounding"
        if distance > OUTLIER * baseline:
            out[test] = {
                "distance": distance,
                "times": distance / baseline,
                "against": against,
                "baseline": baseline,
            }
    return out


def _measured(spread: Spread, base: Tolerance, absolute: bool) -> float:
    """The number a tolerance is derived from: the absolute spread at rounding level, a
    tensor's distance, the spread over the largest magnitude under ``scale="recorded"``,
    else the relative spread."""
    if absolute:
        return spread.abs
    if spread.scaled or base.scale != RECORDED:
        return spread.rel
    return spread.of_magnitude


def _judge(
    distances: Mapping[str, Mapping[str, Spread]],
    same: Sequence[Mapping[str, Spread]],
    base: Callable[[str, str], Tolerance],
) -> dict[str, dict[str, dict[str, Any]]]:
    """Test id -> value -> why the variant is an outlier for that value (:func:`outliers`),
    each value measured the way its tolerance measures; values not compared are not judged.
    ``same``: per test, the spreads over its own runs; their median is the noise."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for name in sorted({n for found in distances.values() for n in found}):
        first = next(found[name] for found in distances.values() if name in found)
        below = base(name, first.dtype)
        if below.ignore:
            continue
        absolute = at_rounding_level(first)
        measured = {
            t: _measured(found[name], below, absolute)
            for t, found in distances.items()
            if name in found
        }
        own = [_measured(test[name], below, absolute) for test in same if name in test]
        noise = statistics.median(own) if own else 0.0
        eps = EPS.get(first.dtype, EPS["float64"])
        floor = ROUNDING_LEVEL / OUTLIER if absolute else DTYPE_FLOOR * eps
        for test, why in outliers(measured, noise=noise, floor=floor).items():
            out.setdefault(test, {})[name] = {**why, "absolute": absolute}
    return out


def _record(
    variant: str,
    distances: Mapping[str, Spread],
    excluded: Mapping[str, Any],
    runs: Sequence[Any],
    base: Callable[[str, str], Tolerance],
) -> dict[str, Any]:
    """What ``tolerances.json`` keeps of a variant: its distances, as measured, what was
    excluded and why, and the values that failed against the golden during calibration."""
    shown = {}
    for name, spread in sorted(distances.items()):
        below = base(name, spread.dtype)
        if not below.ignore:
            absolute = at_rounding_level(spread)
            shown[name] = {
                "distance": _measured(spread, below, absolute),
                "measure": "absolute" if absolute else "relative",
            }
    failed = sorted({name for run in runs for name in run.get("failed", ())})
    return {"variant": variant, "distances": shown, "excluded": dict(excluded), "failed": failed}


def _pooled(
    usable: Mapping[str, Sequence[Any]],
    reference: Sequence[str],
    variants: Sequence[str],
    excluded: Mapping[str, Mapping[str, Any]],
) -> dict[str, Spread]:
    """Each value's spread over the runs of the reference and of every variant not excluded
    for it, measured against the reference's magnitude."""
    left_out: dict[str, set[str]] = {}  # value -> the tests excluded for it
    for test, names in excluded.items():
        for name in names:
            left_out.setdefault(name, set()).add(test)
    out: dict[str, Spread] = {}
    for leaving in {frozenset(), *(frozenset(tests) for tests in left_out.values())}:
        ref_runs = [run for t in reference for run in usable[t]]
        runs = ref_runs + [run for t in variants if t not in leaving for run in usable[t]]
        found = spreads([run["metrics"] for run in runs], recorded=len(ref_runs) or None)
        found.update(tensor_spreads([run["tensors"] for run in runs]))
        for name, spread in found.items():
            if frozenset(left_out.get(name, ())) == leaving:
                out[name] = spread
    return out


def _mean_run(runs: Sequence[Mapping[str, Mapping[str, Any]]]) -> dict[str, dict[str, Any]]:
    """``{step: {name: (mean over runs, dtype)}}`` over the steps and values every run has."""
    return _per_value(runs, lambda xs: math.fsum(xs) / len(xs))


def _median_run(means: Sequence[Mapping[str, Mapping[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per step and value, the median of ``means`` (:func:`_mean_run` of each variant)."""
    return _per_value(means, statistics.median)


def _per_value(
    runs: Sequence[Mapping[str, Mapping[str, Any]]], reduce: Callable[[list[float]], float]
) -> dict[str, dict[str, Any]]:
    """``{step: {name: (reduce(values of the runs), dtype)}}`` over what every run has."""
    if not runs:
        return {}
    out: dict[str, dict[str, Any]] = {}
    for step in set.intersection(*(set(r) for r in runs)):
        for name in set.intersection(*(set(r[step]) for r in runs)):
            value = reduce([float(r[step][name][0]) for r in runs])
            out.setdefault(step, {})[name] = (value, runs[0][step][name][1])
    return out


def _write_calibrated(
    directory: str,
    content: dict[str, Any],
    left_out: Mapping[str, str],
    carry: Sequence[str],
    envelope: tuple[dict[str, Any] | None, dict[str, str]] = (None, {}),
    measured: Sequence[str] = (),
) -> dict[str, Any]:
    """Write ``content`` as ``directory``'s tolerances.json, keeping the lanes ``carry``
    names as the file holds them (or remove the file where nothing is left), and the
    ``envelope`` (its content, and the bands refused) as its envelope.json; the summary
    entry of the golden (``measured``: :func:`measured_failures`, once written)."""
    path = Path(directory) / TOLERANCES
    bands, refused = envelope
    try:
        changed = write(Path(directory), content, carry=carry, envelope=bands)
    except GoldenError as exc:  # e.g. never recorded: the other goldens still calibrate
        reason = str(exc).removeprefix(f"{directory}: ")
        return {"directory": directory, "skipped": reason, "rows": []}
    nothing = writes_nothing(content)
    return {
        "directory": directory,
        "skipped": "; ".join(f"{t}: {why}" for t, why in sorted(left_out.items())),
        "rows": _summary_rows(content),
        "variants": _notable_variants(content),
        "written": not nothing,
        "removed": nothing and changed and not path.exists(),
        "kept": _kept(path) if carry else [],
        "envelope": _envelope_summary(bands, refused),
        "measured": list(measured),
    }


def _envelope_summary(bands: Mapping[str, Any] | None, refused: Mapping[str, str]) -> dict:
    """What the summary says of a written envelope: per lane its metrics, steps, runs, the
    fewest distinct runs at a step and the metrics whose runs repeated the golden bit for
    bit; the bands refused."""
    from .envelope import DRIFTING, LANES, MARGIN, margin

    lanes = {}
    for lane, section in LANES.items():
        metrics = (bands or {}).get(section) or {}
        if metrics:
            counts = [c for m in metrics.values() for c in m.get("distinct") or () if c]
            lanes[lane] = {
                "metrics": sorted(metrics),
                "steps": max(len(m["steps"]) for m in metrics.values()),
                "runs": max(m["runs"] for m in metrics.values()),
                "distinct": min(counts, default=None),
                "identical": sorted(
                    n for n, m in metrics.items() if not any(m["below"] + m["above"])
                ),
            }
            grown = margin(min(counts, default=0))
            lanes[lane]["margin"] = grown if grown != MARGIN else None
    kept = (bands or {}).get("how", {}).get("kept", [])
    drifting = sorted((bands or {}).get(DRIFTING, {}))
    return {"lanes": lanes, "kept": kept, "refused": dict(refused), "drifting": drifting}


def _kept(path: Path) -> list[str]:
    """The lanes the written ``tolerances.json`` at ``path`` kept from the earlier one."""
    from ... import store

    return store.read_json(path)["how"].get("kept", []) if path.exists() else []


def _summary_rows(content: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each value's spread and calibrated tolerance in ``content``, lane by lane."""
    rows = [
        {"metric": name, "lane": "same layout", **entry, **content["tolerances"].get(name, {})}
        for name, entry in content["spreads"].items()
    ]
    rows += [
        {
            "metric": name,
            "lane": "across variants",
            **entry,
            **content["layout_tolerances"].get(name, {}),
        }
        for name, entry in content.get("layout_spreads", {}).items()
    ]
    return rows


def _notable_variants(content: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The variants the summary names: those excluded from the lane for some value, those
    that failed against the golden during calibration, with their distances, and those the
    float64 oracle judged (certified or not the same math) or could not."""
    return [
        {"test": test, **record}
        for test, record in sorted(content.get("variants", {}).items())
        if record["excluded"]
        or record["failed"]
        or record.get("certificate", uncertified()) != uncertified()
    ]
