"""Micro-batch / gradient-accumulation invariance of a whole training step (float64).

A training step cuts its generation batch into micro-batches, accumulates gradients over
``accumulation_steps`` of them and steps the optimizer; how it cuts must not change what it
learns. :func:`check_accumulation_invariance` runs the user's step under a sweep of
:class:`AccumulationSetting` s and compares every result (gradients, parameters after the
step, the step-wide loss) with the baseline's: the same optimizer steps, each made of one
micro-batch. Frameworks shipped every one of these: gradients divided by the accumulation
steps twice (0.5x), losses summed but never scaled (4x), a per-micro-batch token mean
weighted by sample counts, ``zero_grad`` inside the accumulation loop (only the last
micro-batch learns), advantages sliced differently from the log probs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from .comparison import Batch, CheckTolerance, f64, fail, fmt, resolve_tolerance, versus
from .evaluation import as_float64

if TYPE_CHECKING:
    from hypothesis.strategies import DataObject, SearchStrategy

__all__ = [
    "ACCUMULATION_ATOL",
    "ACCUMULATION_RTOL",
    "AccumulationSetting",
    "AccumulationStep",
    "accumulation_grid",
    "accumulation_settings",
    "check_accumulation_invariance",
]

ACCUMULATION_RTOL = 1e-9
"""Relative part of the bound, times the largest magnitude of the baseline's value (the whole
tensor's, so an entry that cancels to near zero is judged on the scale of its tensor).
Cutting a batch differently only reorders float64 sums: each result moves by about
``n·eps·Σ|terms|`` with ``eps = 1.1e-16``, i.e. ``1e-15`` to ``1e-13`` relative for steps of
up to a thousand tokens whose terms are within a factor 100 of their sum. ``1e-9`` leaves
four orders of headroom above that, and a bug worth catching (a factor 0.5, one micro-batch
in four dropped, a ``1e-3`` drift from a misweighted micro-batch) is six orders above it."""

ACCUMULATION_ATOL = 1e-12
"""Absolute part of the bound, for results whose baseline is (close to) zero everywhere: an
unused parameter's gradient, a loss of cancelling terms. Rounding of order-one terms is
``1e-16`` to ``1e-14`` absolute, far below it."""

_DROPPED = "every entry is 0: were the gradients dropped (zero_grad inside the loop)?"


@dataclass(frozen=True)
class AccumulationSetting:
    """How one training step cuts its generation batch, TRL's and verl's knobs in one place.

    * ``micro_batch_size``: rows per forward/backward (TRL ``per_device_train_batch_size``,
      verl ``ppo_micro_batch_size_per_gpu``).
    * ``accumulation_steps``: micro-batches whose gradients are accumulated before each
      optimizer step (TRL ``gradient_accumulation_steps``, verl
      ``ppo_mini_batch_size / ppo_micro_batch_size_per_gpu``).
    * ``steps_per_generation``: micro-batches the generation batch is cut into, so the batch
      holds ``micro_batch_size · steps_per_generation`` rows and the step makes
      ``steps_per_generation / accumulation_steps`` optimizer steps (TRL
      ``steps_per_generation``; verl: train batch / mini-batch optimizer steps).
    * ``dtype``: the floating dtype to build the model in (the batch's floats are cast to it).
    """

    micro_batch_size: int
    accumulation_steps: int
    steps_per_generation: int
    dtype: torch.dtype = torch.float64

    def __post_init__(self) -> None:
        for name in ("micro_batch_size", "accumulation_steps", "steps_per_generation"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"AccumulationSetting.{name} must be an int >= 1, got {value!r}")
        if self.steps_per_generation % self.accumulation_steps:
            raise ValueError(
                f"steps_per_generation={self.steps_per_generation} is not a multiple of "
                f"accumulation_steps={self.accumulation_steps}: the last optimizer step would "
                "take a partial accumulation"
            )

    @property
    def rows(self) -> int:
        """Rows of the generation batch this setting consumes."""
        return self.micro_batch_size * self.steps_per_generation

    @property
    def optimizer_steps(self) -> int:
        """Optimizer steps per generation batch."""
        return self.steps_per_generation // self.accumulation_steps

    def schedule(self) -> list[list[range]]:
        """Per optimizer step, the rows of each of its micro-batches, in order."""
        size, k = self.micro_batch_size, self.accumulation_steps
        return [
            [range((s * k + i) * size, (s * k + i + 1) * size) for i in range(k)]
            for s in range(self.optimizer_steps)
        ]

    def baseline(self) -> AccumulationSetting:
        """The same optimizer steps, each made of one micro-batch, without accumulation."""
        steps = self.optimizer_steps
        return AccumulationSetting(self.rows // steps, 1, steps, self.dtype)

    def __str__(self) -> str:
        micro, steps = self.steps_per_generation, self.optimizer_steps
        return (
            f"micro-batch {self.micro_batch_size} × accumulation {self.accumulation_steps} "
            f"({micro} micro-batch{'es' if micro > 1 else ''} per generation, "
            f"{steps} optimizer step{'s' if steps > 1 else ''})"
        )


AccumulationStep = Callable[[dict[str, Any], AccumulationSetting], Mapping[str, Any]]
"""``step(batch, setting) -> {name: result}``: one training step over the generation batch
(float tensors in ``setting.dtype``) cut as ``setting`` says, from the same initial model
every call; results are tensors (gradients, parameters after the step) or numbers (a loss
the framework defines over the whole step)."""


# --------------------------------------------------------------------------- settings


def accumulation_grid(
    batch_size: int,
    *,
    micro_batch_sizes: Sequence[int] | None = None,
    accumulation_steps: Sequence[int] | None = None,
) -> list[AccumulationSetting]:
    """The sweep's settings for a batch of ``batch_size`` rows: every micro-batch size of
    ``micro_batch_sizes`` (default ``1, 2, batch_size``) with every accumulation of
    ``accumulation_steps`` (default ``1, 2`` and the one that makes a single optimizer step)
    that divides the batch. Combinations that do not divide it are left out; requested sizes
    none of which divides it are an error."""
    _require_positive("micro_batch_sizes", micro_batch_sizes)
    _require_positive("accumulation_steps", accumulation_steps)
    sizes = (1, 2, batch_size) if micro_batch_sizes is None else micro_batch_sizes
    grid: list[AccumulationSetting] = []
    for size in dict.fromkeys(sizes):
        if batch_size % size:
            continue
        steps = batch_size // size
        accumulations = (1, 2, steps) if accumulation_steps is None else accumulation_steps
        grid += [
            AccumulationSetting(size, k, steps)
            for k in dict.fromkeys(accumulations)
            if steps % k == 0
        ]
    if not grid:
        raise ValueError(
            f"none of micro_batch_sizes={list(sizes)} with accumulation_steps="
            f"{accumulation_steps} divides the batch's {batch_size} rows"
        )
    return grid


def accumulation_settings(batch_size: int) -> SearchStrategy[AccumulationSetting]:
    """Hypothesis strategy: any setting that cuts ``batch_size`` rows into equal micro-batches
    and whole optimizer steps. Shrinks towards micro-batches of one row accumulated over the
    whole batch (the setting furthest from the baseline)."""
    from hypothesis import strategies as st

    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    everything = [
        AccumulationSetting(size, k, batch_size // size)
        for size in _divisors(batch_size)
        for k in reversed(_divisors(batch_size // size))
    ]
    return st.sampled_from(everything)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _require_positive(name: str, values: Sequence[int] | None) -> None:
    if values is None:
        return
    if isinstance(values, int) or not values:
        raise ValueError(f"{name} must be a non-empty sequence of ints, got {values!r}")
    bad = [v for v in values if isinstance(v, bool) or not isinstance(v, int) or v < 1]
    if bad:
        raise ValueError(f"{name} must hold ints >= 1, got {bad}")


def _chosen_settings(
    size: int,
    micro_batch_sizes: Sequence[int] | None,
    accumulation_steps: Sequence[int] | None,
    settings: Sequence[AccumulationSetting] | None,
    data: DataObject | None,
) -> list[AccumulationSetting]:
    """The settings to compare: the grid, the user's list or hypothesis' draw."""
    grid_asked = micro_batch_sizes is not None or accumulation_steps is not None
    if sum((grid_asked, settings is not None, data is not None)) > 1:
        raise ValueError(
            "pass one of micro_batch_sizes/accumulation_steps (a grid), settings= (a list) or "
            "data= (drawn by hypothesis)"
        )
    if data is not None:
        from hypothesis import strategies as st

        drawn = st.lists(accumulation_settings(size), min_size=1, max_size=3, unique=True)
        return data.draw(drawn, label="accumulation settings")
    if settings is None:
        return accumulation_grid(
            size, micro_batch_sizes=micro_batch_sizes, accumulation_steps=accumulation_steps
        )
    for setting in settings:
        if (
            not isinstance(setting, AccumulationSetting)
            or setting.rows != size
            or setting.dtype != torch.float64
        ):
            raise ValueError(
                f"settings must be float64 AccumulationSettings consuming the batch's {size} "
                f"rows (micro_batch_size · steps_per_generation = {size}), got {setting!r}"
            )
    return list(settings)


# --------------------------------------------------------------------------- running the step


def _batch_rows(batch: Batch) -> int:
    if not isinstance(batch, Mapping):
        raise TypeError(
            f"check_accumulation_invariance takes a batch of named tensors (a dict), got "
            f"{type(batch).__name__}"
        )
    rows = {v.shape[0] for v in batch.values() if isinstance(v, Tensor) and v.dim() >= 1}
    if len(rows) != 1:
        raise ValueError(
            "the batch's tensors must share their first dimension (rows = samples), got "
            f"{sorted(rows) if rows else 'no tensors with a row dimension'}"
        )
    (size,) = rows
    if size < 2:
        raise ValueError(
            f"the batch has {size} row(s): it cannot be cut into micro-batches; give it 2 or more"
        )
    return size


def _run(step: AccumulationStep, batch: dict[str, Any], setting: AccumulationSetting) -> dict:
    """The step's results under ``setting``, as float64 tensors by name."""
    # A fresh copy per call: a step that edits its batch in place changes no other run.
    output = step({k: v.clone() if isinstance(v, Tensor) else v for k, v in batch.items()}, setting)
    if not isinstance(output, Mapping) or not output:
        fail(
            "accumulation_invariance.results",
            f"under {setting} the step returned {type(output).__name__} {output!r:.80}: it must "
            "return a non-empty mapping of named results (gradients, parameters, loss)",
        )
    results = {}
    for name, value in output.items():
        if not isinstance(value, Tensor):  # a Python number is a double
            value = torch.as_tensor(value, dtype=torch.float64)
        if value.is_floating_point() and value.dtype != setting.dtype:
            fail(
                "accumulation_invariance.dtype",
                f"under {setting} the step returned {name} in {value.dtype}, not "
                f"{setting.dtype}: build the model in setting.dtype, or the bound (float64 "
                "rounding) cannot hold",
            )
        results[str(name)] = f64(value)
    return results


# --------------------------------------------------------------------------- comparing


def _ratio_hint(name: str, got: Tensor, base: Tensor, setting: AccumulationSetting) -> str:
    """Name a result that is a simple multiple of the baseline's (0, 1/k, k, ...)."""
    if not bool(base.ne(0).any()):
        return ""
    if not bool(got.ne(0).any()):
        return f"; {name}: {_DROPPED}"
    ratio = float((got * base).sum() / (base * base).sum())
    if not torch.allclose(got, ratio * base, rtol=1e-6, atol=1e-9 * float(base.abs().max())):
        return ""
    k = setting.accumulation_steps
    causes = {
        1 / k: "a double division by accumulation steps?",
        float(k): "micro-batch losses summed without dividing by accumulation steps?",
    }
    cause = next((text for value, text in causes.items() if math.isclose(ratio, value)), None)
    if cause is None and int(base.ne(0).sum()) == 1:
        return ""  # any number is a multiple of another: only a known one explains
    cause = cause or "a normalizer counted over other rows?"
    return f"; {name} is {fmt(ratio, 4)}x the baseline's: {cause}"


def _difference_line(
    name: str, got: Tensor, base: Tensor, tolerance: CheckTolerance, setting: AccumulationSetting
) -> str | None:
    """One line for a result beyond the bound: where it differs most, by how much, how
    many times the bound that is; ``None`` when it is within the bound."""
    scale = float(base.abs().max()) if base.numel() else 0.0
    bound = tolerance.atol + tolerance.rtol * scale
    difference = (got - base).abs().nan_to_num(nan=math.inf)
    if not bool((difference > bound).any()):
        return None
    worst = int(difference.argmax())
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(worst), base.shape))
    where = f" at {index}" if index else ""
    largest = float(difference.flatten()[worst])
    return (
        f"{name}: largest difference {fmt(largest, 3)}{where}: "
        + versus("setting", float(got.flatten()[worst]), "baseline", float(base.flatten()[worst]))
        + f", {fmt(largest / bound, 3)}x the bound {fmt(bound, 3)} (atol {fmt(tolerance.atol)} "
        f"+ rtol {fmt(tolerance.rtol)} · max|baseline| {fmt(scale, 4)})"
        + _ratio_hint(name, got, base, setting)
    )


def _compare(
    baseline: AccumulationSetting,
    expected: dict[str, Tensor],
    setting: AccumulationSetting,
    got: dict[str, Tensor],
    tolerance: CheckTolerance,
) -> None:
    pair = f"baseline {baseline} vs {setting}"
    if sorted(got) != sorted(expected):
        fail(
            "accumulation_invariance.results",
            f"{pair}: the step returned other results: {sorted(got)} vs {sorted(expected)}",
        )
    lines: dict[str, str] = {}
    for name, base in expected.items():
        if not bool(torch.isfinite(base).all()):
            fail("accumulation_invariance.finite", f"{baseline}: {name} is not finite")
        if got[name].shape != base.shape:
            fail(
                "accumulation_invariance.results",
                f"{pair}: {name} has shape {tuple(got[name].shape)}, the baseline's "
                f"{tuple(base.shape)}",
            )
        line = _difference_line(name, got[name], base, tolerance, setting)
        if line is not None:
            lines[name] = line
    if lines:
        fail(
            "accumulation_invariance",
            f"{pair}: {len(lines)} of {len(expected)} results differ ({', '.join(lines)})",
            list(lines.values()),
        )


def check_accumulation_invariance(
    step: AccumulationStep,
    batch: Batch,
    *,
    micro_batch_sizes: Sequence[int] | None = None,
    accumulation_steps: Sequence[int] | None = None,
    settings: Sequence[AccumulationSetting] | None = None,
    data: DataObject | None = None,
    rtol: float | None = None,
    atol: float | None = None,
) -> None:
    """A training step must learn the same whatever its micro-batching and accumulation.

    ``step(batch, setting)`` (:data:`AccumulationStep`) runs one training step from the same
    initial model on the batch (rows = samples, floats cast to float64), cut as the
    :class:`AccumulationSetting` says, and returns its results by name: gradients,
    parameters after the step, and a loss where the framework defines it over the step.

    Settings: the grid of :func:`accumulation_grid` (``micro_batch_sizes``,
    ``accumulation_steps``; combinations that do not divide the batch are left out), your
    own ``settings``, or ``data=`` (hypothesis' ``st.data()``) to draw up to three from
    :func:`accumulation_settings` instead. Each setting is compared with its baseline
    (:meth:`AccumulationSetting.baseline`): for a single optimizer step per generation, one
    micro-batch of every row; where ``steps_per_generation`` exceeds ``accumulation_steps``,
    the same optimizer steps each made of one micro-batch.

    Bound: ``|setting − baseline| <= atol + rtol · max|baseline|`` per result, with
    :data:`ACCUMULATION_RTOL` ``1e-9`` and :data:`ACCUMULATION_ATOL` ``1e-12`` (their
    docstrings say why: float64 reordering moves results ``~1e-15``, the bugs ``>= 1e-3``).
    ``rtol``/``atol`` replace either part.

    Invariants: ``accumulation_invariance`` (a result beyond the bound: the message names the
    setting pair, each differing result with its largest difference, its ratio to the bound,
    and a simple ratio to the baseline where there is one — ``0.5x the baseline's: a double
    division by accumulation steps?``), ``….results`` (other names or shapes), ``….dtype``
    (a result not in ``setting.dtype``), ``….finite`` (a baseline result not finite).
    Bad arguments raise ``TypeError``/``ValueError``.
    """
    if not callable(step):
        raise TypeError(f"step must be callable as step(batch, setting), got {step!r}")
    size = _batch_rows(batch)
    tolerance = resolve_tolerance(ACCUMULATION_RTOL, ACCUMULATION_ATOL, rtol, atol)
    chosen = _chosen_settings(size, micro_batch_sizes, accumulation_steps, settings, data)
    work = as_float64(batch)
    results: dict[AccumulationSetting, dict[str, Tensor]] = {}
    # Single-optimizer-step settings first: they meet the ground truth and simple ratios.
    for setting in sorted(chosen, key=lambda s: (s.optimizer_steps, s.micro_batch_size)):
        baseline = setting.baseline()
        if setting == baseline:
            continue
        for run in (baseline, setting):
            if run not in results:
                results[run] = _run(step, work, run)
        _compare(baseline, results[baseline], setting, results[setting], tolerance)
