"""Checkers for rollout correction: IS weights and RS masks."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import cached_property
from typing import Any

import torch
from torch import Tensor

from ..reference import correction as corr
from ..reference.masking import as_bool_mask, masked_mean, valid_rows
from .comparison import (
    F64_EPS,
    GUARD_RTOL,
    Batch,
    accepts,
    accumulation_roundoff,
    digits_to_separate,
    f64,
    fail,
    fmt,
    positions,
    refill_padding,
    refilled_lines,
    replace_valid,
    require_fields,
    resolve_tolerance,
    token_tensor,
    unit_roundoff,
    versus,
)

__all__ = ["check_is_weights", "check_rs_mask"]


# --------------------------------------------------------------------------- IS weights


class _ISRun:
    """``fn``'s IS weights of one batch in float64, the reference's log weights and raw
    weights, and the rounding allowed per weight (``elem_rtol``) and for the normalizer."""

    def __init__(
        self,
        fn: Callable[..., Any],
        batch: Batch,
        *,
        level: corr.ISLevel,
        threshold: corr.ISThresholdSpec,
        batch_normalize: bool,
        rs_filter: corr.RSFilter | None,
        rtol: float | None,
        atol: float | None,
    ):
        self.fn, self.batch, self.level, self.threshold = fn, batch, level, threshold
        self.batch_normalize, self.rtol, self.atol = batch_normalize, rtol, atol
        self.filter = None if rs_filter is None else corr.parse_rs_criteria(*rs_filter)
        old, rollout, mask = _is_inputs(batch)
        self.mask = mask
        weights_out = token_tensor("is_weights", fn(old, rollout, mask), mask.shape, batch)
        self.w = w = f64(weights_out)
        self.valid = valid = as_bool_mask(mask)
        eps = unit_roundoff(old.dtype, weights_out.dtype)
        self.acc = acc = accumulation_roundoff(eps)
        self.thr = corr.parse_is_threshold(threshold)
        self.old64, self.rollout64 = old64, rollout64 = f64(old), f64(rollout)
        self.log_w = corr.is_log_weights(old64, rollout64, mask, level=level)
        self.raw = corr.raw_is_weights(old64, rollout64, mask, level=level)
        # Rounding of log ratios scales with the log-probs themselves (an implementation may sum
        # old and rollout log-probs separately before subtracting).
        token_magnitude = old64.abs() + rollout64.abs()
        if level == "token":
            magnitude = token_magnitude
        else:
            reduce = corr.masked_sum if level == "sequence" else masked_mean
            magnitude = reduce(token_magnitude, mask, dim=-1).unsqueeze(-1).expand_as(w)
        n_row = valid.sum(dim=-1, keepdim=True).expand_as(w).to(torch.float64)
        spread = torch.ones_like(w) if level == "token" else n_row
        elem_rtol = 4 * eps * (1 + magnitude) + 4 * acc * spread * magnitude
        if level == "geometric":
            # A guarded token count in the mean moves the exponent by up to 1e-6 relative.
            elem_rtol = elem_rtol + GUARD_RTOL * self.log_w.abs()
        self.elem_rtol = elem_rtol
        norm_rtol = float(elem_rtol[valid].max()) if bool(valid.any()) else 0.0
        norm_rtol += 4 * acc * int(valid.sum()) + GUARD_RTOL
        self.norm_rtol = norm_rtol
        self.tiny = 4 * torch.finfo(weights_out.dtype).tiny

    def describe(self, b: int, t: int, expected: Tensor | None = None) -> str:
        got = float(self.w[b, t])
        if expected is None:
            value = f"fn={fmt(got)}"
        else:
            value = versus("fn", got, "reference", float(expected[b, t]))
        return f"(b={b}, t={t}): {value}, log weight={fmt(float(self.log_w[b, t]))}"

    @cached_property
    def raws(self) -> list[Tensor]:
        """Raw reference weights: clamped to ``exp(±20)``, and where a log weight lies beyond
        ±20 also exact (most frameworks other than verl): each is a whole candidate."""
        raws = [self.raw]
        beyond = self.valid & (self.log_w.abs() > corr.SAFETY_BOUND)
        if bool(beyond.any()):
            raws.append(
                corr.raw_is_weights(
                    self.old64, self.rollout64, self.mask, level=self.level, clamp=False
                )
            )
        return raws

    @cached_property
    def candidates(self) -> list[tuple[Tensor, float]]:
        """The reference, ``(expected, normalizer)`` per acceptable reading, with IcePop
        decisions on near-boundary weights resolved as fn did."""
        candidates: list[tuple[Tensor, float]] = []
        for base, clamp in zip(self.raws, (True, False), strict=False):
            candidates += _is_candidates(
                base,
                self.w,
                self.mask,
                self.threshold,
                self.level,
                self.batch_normalize,
                self.elem_rtol,
                self.norm_rtol,
                self.filter_keep(clamp),
            )
        return candidates

    def filter_keep(self, clamp: bool) -> Tensor | None:
        """What the composite's RS filter keeps (statistics clamped or exact, as the weights);
        within rounding of its bound, as ``fn`` decided (a zero weight is a rejection)."""
        if self.filter is None:
            return None
        eps = unit_roundoff(self.batch["old_log_probs"].dtype, self.w.dtype)
        keep, ambiguous, _ = _rs_decisions(self.batch, self.filter, eps, clamp=clamp)
        return torch.where(ambiguous, self.w != 0, keep)


def _is_weights_nonnegative(run: _ISRun) -> None:
    negative = run.w < 0
    if bool(negative.any()):
        fail(
            "is_weights.nonnegative",
            "negative IS weights",
            [run.describe(*p) for p in positions(negative)],
        )


def _is_weights_zero_on_padding(run: _ISRun) -> None:
    on_padding = ~run.valid & (run.w != 0)
    if bool(on_padding.any()):
        fail(
            "is_weights.zero_on_padding",
            "non-zero IS weights on padding positions",
            [run.describe(*p) for p in positions(on_padding)],
        )


def _is_weights_sequence_constant(run: _ISRun) -> None:
    if run.level == "token":
        return
    w = run.w
    first = w.gather(-1, run.valid.long().argmax(dim=-1, keepdim=True)).expand_as(w)
    uneven = run.valid & ((w - first).abs() > 2 * run.elem_rtol * first.abs() + run.tiny)
    if bool(uneven.any()):
        fail(
            "is_weights.sequence_constant",
            "sequence-level weights differ within a sequence",
            [
                f"(b={b}, t={t}): "
                + versus("fn", float(w[b, t]), "first weight of row", float(first[b, t]))
                for b, t in positions(uneven)
            ],
        )


def _is_weights_padding_independence(run: _ISRun) -> None:
    refilled = run.fn(*_is_inputs(refill_padding(run.batch)))
    again = f64(token_tensor("is_weights", refilled, run.mask.shape, run.batch))
    moved = (again - run.w).abs() > 2 * run.elem_rtol * run.w.abs() + run.tiny
    if bool(moved.any()):
        fail(
            "is_weights.padding_independence",
            "changing only the garbage in padding positions changed the weights of valid tokens "
            "(padding log ratios leak into the weights, e.g. a sequence sum over all T positions)",
            refilled_lines(moved, again, run.w),
        )


def _is_weights_normalized_mean(run: _ISRun) -> None:
    """Judged only when every candidate reference normalizes."""
    candidates, mask, level = run.candidates, run.mask, run.level
    normalized = [factor for _, factor in candidates if factor != 1.0]
    if not (run.batch_normalize and len(normalized) == len(candidates)):
        return
    fn_mean = float(corr.is_normalizer(run.w, mask, level=level))
    tolerance = resolve_tolerance(0.0, 2 * run.norm_rtol + 8 * run.acc, None, run.atol)
    if tolerance.exceeded(fn_mean, 1.0):
        token_mean = float(masked_mean(run.w, mask))
        rows = valid_rows(mask)
        seq_mean = float(masked_mean(masked_mean(run.w, mask, dim=-1), rows))
        fail(
            "is_weights.normalized_mean",
            f"batch-normalized {level}-level weights have mean "
            f"{fmt(fn_mean, digits_to_separate(fn_mean, 1.0))} at the {level} level, "
            f"expected 1 (difference {fn_mean - 1:.3g})",
            [
                f"mean over {int(run.valid.sum())} valid tokens: {fmt(token_mean)}",
                f"mean over {int(rows.sum())} sequences of their mean weight: {fmt(seq_mean)}",
            ],
        )


def _is_weights_truncation_and_icepop_bounds(run: _ISRun) -> None:
    if run.thr.upper is not None:
        # A composite's filter zeroes weights: those are judged by reference agreement.
        judged = run.valid if run.filter is None else run.valid & (run.w != 0)
        _check_bounds(
            run.w, judged, run.thr, run.candidates, run.elem_rtol, run.norm_rtol, run.describe
        )


def _is_weights_reference_agreement(run: _ISRun) -> None:
    """Agreement with any one candidate reference; a failure shows the first."""
    tolerance = resolve_tolerance(
        (run.elem_rtol + 2 * run.norm_rtol) * 2, run.tiny, run.rtol, run.atol
    )
    failures = []
    for expected, _ in run.candidates:
        off = run.valid & tolerance.exceeded(run.w, expected)
        if not bool(off.any()):
            return
        failures.append((off, expected))
    off, expected = failures[0]
    both = " or the exact exp(log w) where |log w| > 20" if len(run.raws) > 1 else ""
    fail(
        "is_weights.reference_agreement",
        f"{int(off.sum())} of {int(run.valid.sum())} valid weights differ from the reference "
        f"(level={run.level!r}, threshold={run.threshold!r}, "
        f"batch_normalize={run.batch_normalize}; "
        f"reference weight exp(clamp(log w, ±20)){both})",
        [run.describe(b, t, expected) for b, t in positions(off)],
    )


_IS_INVARIANTS: tuple[Callable[[_ISRun], None], ...] = (
    _is_weights_nonnegative,
    _is_weights_zero_on_padding,
    _is_weights_sequence_constant,
    _is_weights_padding_independence,
    _is_weights_normalized_mean,
    _is_weights_truncation_and_icepop_bounds,
    _is_weights_reference_agreement,
)
"""The invariants of :func:`check_is_weights`, in the order they are judged."""


def check_is_weights(
    fn: Callable[..., Any],
    batch: Batch,
    *,
    level: corr.ISLevel,
    threshold: corr.ISThresholdSpec,
    batch_normalize: bool = False,
    rs_filter: corr.RSFilter | None = None,
    rtol: float | None = None,
    atol: float | None = None,
) -> None:
    """Check ``fn(old_log_prob, rollout_log_prob, response_mask) -> weights [B, T]``.

    ``level`` (``"token"``, ``"sequence"`` or ``"geometric"``), ``threshold`` (truncation,
    IcePop ``"lower_upper"`` or a two-sided ``(lower, upper)`` clamp) and ``batch_normalize``
    describe what ``fn`` is configured to compute (a tuple return is allowed; its first item
    is the weights). ``rs_filter=(criterion, threshold)`` describes composite weights, zeroed
    after the threshold wherever that RS criterion rejects (NeMo-RL ``seq-mask-tis``:
    ``level="token"`` with ``("seq_mean_k1", ...)``; AReaL ``agg=sum``: ``level="geometric"``
    with ``("seq_sum_k1", ...)``). Where a log weight lies beyond ±20, both the clamped weight
    ``exp(±20)`` (verl) and the exact ``exp(log w)`` are accepted: the whole batch must agree
    with one of the two references. Invariants:

    * ``is_weights.nonnegative``; ``is_weights.zero_on_padding``;
    * ``is_weights.sequence_constant`` (sequence and geometric levels): one weight per
      sequence;
    * ``is_weights.padding_independence``: other garbage on padding, same weights;
    * ``is_weights.normalized_mean`` (batch_normalize): mean 1 at the IS level — over valid
      tokens, or over sequences of their mean weight — unless the reference skips
      normalization (mean ≤ 1e-8);
    * ``is_weights.truncation`` / ``is_weights.icepop_bounds``: before normalization, weights
      are ≤ upper (truncation), inside ``[lower, upper]`` (two-sided truncation) or 0 or
      inside ``[lower, upper]`` (IcePop). With
      ``batch_normalize`` the checker undoes the normalization with the reference normalizer
      (if your normalizer is wrong, ``normalized_mean`` or ``reference_agreement`` says so);
    * ``is_weights.reference_agreement``: equal to the reference within tolerance.

    Tolerance (default rule, see ``docs/numerics.md``): relative, the dtype's rounding of
    ``exp`` and of the reductions involved plus :data:`GUARD_RTOL` for an epsilon guard in
    the normalizer; ``rtol``/``atol`` replace the relative/absolute part.
    """
    require_fields(batch, _IS_FIELDS, "check_is_weights", "rollout_batches()")
    run = _ISRun(
        fn,
        batch,
        level=level,
        threshold=threshold,
        batch_normalize=batch_normalize,
        rs_filter=rs_filter,
        rtol=rtol,
        atol=atol,
    )
    for invariant in _IS_INVARIANTS:
        invariant(run)


def _is_candidates(
    raw: Tensor,
    w: Tensor,
    mask: Tensor,
    threshold: corr.ISThresholdSpec,
    level: corr.ISLevel,
    batch_normalize: bool,
    elem_rtol: Tensor,
    norm_rtol: float,
    keep: Tensor | None = None,
) -> list[tuple[Tensor, float]]:
    """Reference weights ``(expected, normalizer)`` acceptable for one choice of raw weights,
    zeroed outside ``keep`` (a composite's RS filter) after the threshold.

    IcePop decisions within rounding of a bound are taken as ``fn`` took them; a normalizer
    within rounding of the 1e-8 skip bound gives two candidates (normalized and not).
    """
    valid = as_bool_mask(mask)
    thr = corr.parse_is_threshold(threshold)
    thresholded = corr.apply_is_threshold(raw, threshold, mask)
    if thr.icepop:
        assert thr.lower is not None and thr.upper is not None
        near = valid & (raw - thr.lower).abs().le(elem_rtol * thr.lower)
        if math.isfinite(thr.upper):  # a one-sided "lower_inf" has no upper bound to be near
            near |= valid & (raw - thr.upper).abs().le(elem_rtol * thr.upper)
        inside = (raw >= thr.lower) & (raw <= thr.upper)
        inside = torch.where(near, w != 0, inside)
        thresholded = torch.where(inside & valid, raw, torch.zeros_like(raw))
    if keep is not None:
        thresholded = torch.where(keep, thresholded, torch.zeros_like(thresholded))
    if not batch_normalize:
        return [(thresholded, 1.0)]
    mean = float(corr.is_normalizer(thresholded, mask, level=level))
    if mean > corr.NORMALIZE_MIN * (1 + norm_rtol):
        return [(thresholded / mean, mean)]
    if mean > corr.NORMALIZE_MIN * (1 - norm_rtol):
        return [(thresholded / mean, mean), (thresholded, 1.0)]
    return [(thresholded, 1.0)]


def _check_bounds(
    w: Tensor,
    valid: Tensor,
    thr: corr.ISThreshold,
    candidates: Sequence[tuple[Tensor, float]],
    elem_rtol: Tensor,
    norm_rtol: float,
    describe: Callable[..., str],
) -> None:
    """Truncation / IcePop bounds on ``w`` times a candidate normalizer (any one will do)."""
    assert thr.upper is not None
    slack = elem_rtol + 2 * norm_rtol
    found = []
    for factor in dict.fromkeys(factor for _, factor in candidates):
        before = w * factor
        if thr.icepop:
            assert thr.lower is not None
            outside = (
                valid
                & (before != 0)
                & ((before < thr.lower * (1 - slack)) | (before > thr.upper * (1 + slack)))
            )
        else:
            outside = valid & (before > thr.upper * (1 + slack))
            if thr.lower is not None:
                outside |= valid & (before < thr.lower * (1 - slack))
        if not bool(outside.any()):
            return
        found.append((factor, before, outside))
    factor, before, outside = found[0]
    if thr.icepop:
        name, what = "is_weights.icepop_bounds", f"neither 0 nor inside [{thr.lower}, {thr.upper}]"
    elif thr.lower is not None:
        name, what = (
            "is_weights.truncation",
            f"outside the truncation bounds [{thr.lower}, {thr.upper}]",
        )
    else:
        name, what = "is_weights.truncation", f"above the truncation threshold {thr.upper}"
    note = f" (weights × reference normalizer {fmt(factor)})" if factor != 1.0 else ""
    fail(
        name,
        f"weights before normalization{note} are {what}",
        [
            f"{describe(b, t)}, before normalization "
            f"{fmt(float(before[b, t]), _digits_near(float(before[b, t]), thr))}"
            for b, t in positions(outside)
        ],
    )


def _digits_near(value: float, threshold: corr.ISThreshold) -> int:
    """Digits that tell ``value`` apart from the threshold's bounds."""
    bounds = [b for b in (threshold.lower, threshold.upper) if b is not None]
    return max((digits_to_separate(value, b) for b in bounds), default=6)


_IS_FIELDS = ("old_log_probs", "rollout_log_probs", "response_mask")


def _is_inputs(batch: Batch) -> tuple[Tensor, Tensor, Tensor]:
    return batch["old_log_probs"], batch["rollout_log_probs"], batch["response_mask"]


# --------------------------------------------------------------------------- RS masks


def _rs_decisions(
    batch: Batch,
    criteria: Sequence[corr.RSCriterion],
    eps: float,
    rtol: float | None = None,
    atol: float | None = None,
    *,
    clamp: bool = True,
) -> tuple[Tensor, Tensor, list[tuple[corr.RSCriterion, Tensor, Tensor]]]:
    """Reference keep mask, ambiguous positions, and per criterion (stat, keep) in float64;
    ``clamp=False``: statistics of the exact per-token values (no ±20 clamp).

    A statistic within tolerance of a bound is ambiguous: rounding (``atol``, from the dtype)
    and, for a per-sequence mean, an epsilon guard on its token count (``rtol``).
    """
    old64, rollout64 = f64(batch["old_log_probs"]), f64(batch["rollout_log_probs"])
    mask = batch["response_mask"]
    valid = as_bool_mask(mask)
    acc = accumulation_roundoff(eps)
    log_ratio = old64 - rollout64
    lr = log_ratio.where(valid, torch.zeros_like(log_ratio))
    lr = (
        lr.clamp(-corr.SAFETY_BOUND, corr.SAFETY_BOUND) if clamp else lr.clamp(max=corr.EXACT_BOUND)
    )
    lr_error = old64.abs() + rollout64.abs()  # what rounding of log ratios scales with
    keep = valid.clone()
    ambiguous = torch.zeros_like(valid)
    details = []
    n_row = valid.sum(dim=-1).to(torch.float64)
    for item in criteria:
        per_token = corr.token_divergence(lr, item.estimator, clamp=clamp)
        slope = {"k1": torch.ones_like(lr), "k2": lr.abs(), "k3": torch.expm1(lr).abs()}[
            item.estimator
        ]
        band = 8 * eps * (1 + per_token.abs() + (1 + slope) * lr_error)
        lo, hi = item.bounds()
        bound_size = max(abs(b) for b in (lo, hi) if math.isfinite(b))
        if item.aggregate == "sum":
            band = corr.masked_sum(band, mask, dim=-1) + 8 * acc * n_row * corr.masked_sum(
                per_token.abs(), mask, dim=-1
            )
        elif item.aggregate == "mean":
            band = (
                corr.masked_mean(band, mask, dim=-1)
                + 8 * acc * corr.masked_mean(per_token.abs(), mask, dim=-1) * n_row
            )
        elif item.aggregate == "max":
            band = corr.masked_max(band, mask, dim=-1)
        band = band + 8 * eps * bound_size
        stat = item.statistic(log_ratio, mask, clamp=clamp)
        guard = GUARD_RTOL if item.aggregate == "mean" else 0.0
        tolerance = resolve_tolerance(guard, band, rtol, atol)
        band = tolerance.atol + tolerance.rtol * stat.abs()
        near = ((stat - lo).abs() <= band) | ((stat - hi).abs() <= band)
        kept = (stat >= lo) & (stat <= hi)
        if item.sequence_level:
            near = near.unsqueeze(-1).expand_as(valid)
            kept = kept.unsqueeze(-1).expand_as(valid)
        keep &= kept
        ambiguous |= near & valid
        details.append((item, stat, kept))
    return keep, ambiguous, details


def _widened(criteria: Sequence[corr.RSCriterion]) -> str:
    parts = []
    for item in criteria:
        if item.lower is not None:
            parts.append(f"{item.lower / 2!r}_{item.upper * 2!r}")
        else:
            parts.append(repr(item.upper * 2))
    return ",".join(parts)


class _RSRun:
    """``fn``'s keep mask of one batch, a way to call ``fn`` again on variations of it, and,
    on first use, the reference decisions."""

    def __init__(
        self,
        fn: Callable[..., Any],
        batch: Batch,
        *,
        criterion: str,
        threshold: float | str,
        rtol: float | None,
        atol: float | None,
    ):
        self.fn, self.batch, self.criterion, self.threshold = fn, batch, criterion, threshold
        self.rtol, self.atol = rtol, atol
        self.criteria = corr.parse_rs_criteria(criterion, threshold)
        self.configurable = accepts(fn, "criterion") and accepts(fn, "threshold")
        self.mask = batch["response_mask"]
        self.valid = as_bool_mask(self.mask)
        self.dtypes: list[torch.dtype] = [batch["old_log_probs"].dtype]
        self.keep = self.call(batch)

    def call(self, b: Batch, crit: str | None = None, thr: float | str | None = None) -> Tensor:
        """``fn``'s keep mask of ``b`` (as bool), for ``crit``/``thr`` when it is configurable."""
        crit = self.criterion if crit is None else crit
        thr = self.threshold if thr is None else thr
        kwargs = {"criterion": crit, "threshold": thr} if self.configurable else {}
        out = token_tensor(
            "rs_mask", self.fn(*_is_inputs(b), **kwargs), self.mask.shape, self.batch
        )
        if out.dtype != torch.bool:
            self.dtypes.append(out.dtype)
            not_binary = (out != 0) & (out != 1)
            if bool(not_binary.any()):
                fail(
                    "rs_mask.binary",
                    "keep mask values must be 0/1",
                    [
                        f"(b={b_}, t={t}): {fmt(float(out[b_, t]))}"
                        for b_, t in positions(not_binary)
                    ],
                )
        return out != 0

    @cached_property
    def eps(self) -> float:
        """Unit roundoff of the inputs and of ``fn``'s masks, fixed at first use: the reference
        decisions are judged after the calls on the batch and on its refilled padding."""
        return unit_roundoff(*self.dtypes)

    @cached_property
    def beyond_clamp(self) -> bool:
        """Whether a valid log ratio lies beyond ±20, where clamped and exact statistics differ."""
        log_ratio = f64(self.batch["old_log_probs"]) - f64(self.batch["rollout_log_probs"])
        return bool((self.valid & (log_ratio.abs() > corr.SAFETY_BOUND)).any())

    def reference(self, clamp: bool) -> tuple[Tensor, Tensor, list[Any]]:
        """The reference decisions from clamped (verl) or exact statistics."""
        return _rs_decisions(self.batch, self.criteria, self.eps, self.rtol, self.atol, clamp=clamp)

    @cached_property
    def clamp(self) -> bool:
        """The convention ``fn`` follows: statistics of log ratios clamped to ±20 (verl), or
        of the exact ones (ROLL, AReaL, slime), whichever agrees with ``fn`` on the whole
        batch; the clamped one when neither does."""
        if not self.beyond_clamp:
            return True
        for clamp in (True, False):
            reference, ambiguous, _ = self.reference(clamp)
            if not bool((self.valid & (self.keep != reference) & ~ambiguous).any()):
                return clamp
        return True

    @cached_property
    def decisions(self) -> tuple[Tensor, Tensor, list[tuple[corr.RSCriterion, Tensor, Tensor]]]:
        """The reference keep mask, its ambiguous positions and the per-criterion details."""
        return self.reference(self.clamp)

    def verdicts(self, b: int, t: int) -> str:
        """Each criterion's statistic, bounds and decision at token ``(b, t)``."""
        _, _, details = self.decisions
        verdicts = []
        for item, stat, kept in details:
            value = float(stat[b] if item.sequence_level else stat[b, t])
            lo, hi = item.bounds()
            digits = max(digits_to_separate(value, lo), digits_to_separate(value, hi))
            verdicts.append(
                f"{item.name}={fmt(value, digits)} in [{fmt(lo, digits)}, {fmt(hi, digits)}]? "
                f"{'keep' if kept[b, t] else 'drop'}"
            )
        return "; ".join(verdicts)


def _rs_mask_subset_of_response_mask(run: _RSRun) -> None:
    outside = run.keep & ~run.valid
    if bool(outside.any()):
        fail(
            "rs_mask.subset_of_response_mask",
            "padding positions are marked as kept",
            [f"(b={b}, t={t})" for b, t in positions(outside)],
        )


def _rs_mask_whole_sequences(run: _RSRun) -> None:
    if not all(item.sequence_level for item in run.criteria):
        return
    keep, valid = run.keep, run.valid
    partial = [
        row
        for row in range(valid.shape[0])
        if 0 < int((keep[row] & valid[row]).sum()) < int(valid[row].sum())
    ]
    if partial:
        fail(
            "rs_mask.whole_sequences",
            f"sequence criteria {run.criterion!r} kept only part of a sequence",
            [
                f"row {row}: kept t={positions(keep[row] & valid[row])}, "
                f"dropped t={positions(valid[row] & ~keep[row])}"
                for row in partial
            ],
        )


def _rs_mask_padding_independence(run: _RSRun) -> None:
    moved = run.call(refill_padding(run.batch)) != run.keep
    if bool(moved.any()):
        fail(
            "rs_mask.padding_independence",
            "changing only the garbage in padding positions changed the mask of valid tokens",
            [
                f"(b={b}, t={t}): kept={bool(run.keep[b, t])} -> {not bool(run.keep[b, t])}"
                for b, t in positions(moved)
            ],
        )


def _rs_mask_reference_agreement(run: _RSRun) -> None:
    keep, valid = run.keep, run.valid
    reference, ambiguous, _ = run.decisions
    wrong = valid & (keep != reference) & ~ambiguous
    if not bool(wrong.any()):
        return
    log_ratio = f64(run.batch["old_log_probs"]) - f64(run.batch["rollout_log_probs"])
    lines = [
        f"(b={b}, t={t}): fn {'keeps' if keep[b, t] else 'drops'}, reference "
        f"{'keeps' if reference[b, t] else 'drops'}; "
        f"ratio={fmt(math.exp(float(log_ratio[b, t])))}; " + run.verdicts(b, t)
        for b, t in positions(wrong)
    ]
    hint = _reciprocal_hint(run.batch, run.criteria, keep, wrong, run.clamp)
    both = (
        " (statistics of log ratios clamped to ±20; the exact statistics disagree too)"
        if run.beyond_clamp
        else ""
    )
    fail(
        "rs_mask.reference_agreement",
        f"{int(wrong.sum())} of {int(valid.sum())} valid tokens kept/dropped unlike the "
        f"reference for {run.criterion!r} with {run.threshold!r}{both}{hint}",
        lines,
    )


def _rs_mask_monotone(run: _RSRun) -> None:
    """Halfway towards the rollout log-probs (when every k1 interval contains ratio 1), and,
    for a configurable ``fn``, with widened bounds."""
    criteria, keep, valid = run.criteria, run.keep, run.valid
    if all(item.lower is None or item.lower <= 1.0 <= item.upper for item in criteria):
        old, rollout = run.batch["old_log_probs"], run.batch["rollout_log_probs"]
        halfway = dict(run.batch)
        halfway["old_log_probs"] = replace_valid(old, valid, rollout + (old - rollout) / 2)
        _, halfway_ambiguous, _ = _rs_decisions(
            halfway, criteria, run.eps, run.rtol, run.atol, clamp=run.clamp
        )
        lost = keep & ~run.call(halfway) & ~halfway_ambiguous
        if bool(lost.any()):
            fail(
                "rs_mask.monotone",
                "moving the training log-probs halfway towards the rollout log-probs (a smaller "
                "divergence) dropped tokens that were kept",
                [f"(b={b}, t={t})" for b, t in positions(lost)],
            )
    if run.configurable:
        wide = _widened(criteria)
        lost = keep & ~run.call(run.batch, run.criterion, wide)
        if bool(lost.any()):
            fail(
                "rs_mask.monotone",
                f"widening the bounds from {run.threshold!r} to {wide!r} dropped tokens that "
                "were kept",
                [f"(b={b}, t={t})" for b, t in positions(lost)],
            )


def _rs_mask_intersection(run: _RSRun) -> None:
    if not (run.configurable and len(run.criteria) > 1):
        return
    combined = run.valid.clone()
    for item in run.criteria:
        combined &= run.call(run.batch, item.name, item.spec())
    _, ambiguous, _ = run.decisions
    differ = (combined != run.keep) & ~ambiguous
    if bool(differ.any()):
        fail(
            "rs_mask.intersection",
            f"the mask for {run.criterion!r} is not the intersection of its single criteria",
            [
                f"(b={b}, t={t}): combined keeps={bool(run.keep[b, t])}, intersection keeps="
                f"{bool(combined[b, t])}"
                for b, t in positions(differ)
            ],
        )


_RS_INVARIANTS: tuple[Callable[[_RSRun], None], ...] = (
    _rs_mask_subset_of_response_mask,
    _rs_mask_whole_sequences,
    _rs_mask_padding_independence,
    _rs_mask_reference_agreement,
    _rs_mask_monotone,
    _rs_mask_intersection,
)
"""The invariants of :func:`check_rs_mask`, in the order they are judged."""


def check_rs_mask(
    fn: Callable[..., Any],
    batch: Batch,
    *,
    criterion: str,
    threshold: float | str,
    rtol: float | None = None,
    atol: float | None = None,
) -> None:
    """Check ``fn(old_log_prob, rollout_log_prob, response_mask) -> keep mask [B, T]``.

    ``criterion``/``threshold`` describe what ``fn`` computes (verl grammar, e.g.
    ``"token_k1,seq_max_k2"`` with ``"0.6_1.6,2.5"``). The mask may be bool or 0/1; a tuple
    return is allowed (first item). If ``fn`` also accepts ``criterion=`` and ``threshold=``
    keywords, the checker passes them and additionally checks widening and intersection.

    * ``rs_mask.binary``; ``rs_mask.subset_of_response_mask``: nothing outside the mask kept;
    * ``rs_mask.whole_sequences``: only sequence criteria → each sequence kept or dropped whole;
    * ``rs_mask.padding_independence``: other garbage on padding, same mask;
    * ``rs_mask.reference_agreement``: exactly the tokens/sequences violating a criterion are
      dropped (k1 keeps ``lower ≤ ρ ≤ upper``; a disagreement that matches verl's reciprocal
      bounds is pointed out). Where a valid log ratio lies beyond ±20, statistics of the
      clamped log ratios (verl) and of the exact ones (ROLL, AReaL, slime) are both accepted,
      one convention for the whole batch;
    * ``rs_mask.monotone``: moving the training log-probs halfway towards the rollout ones
      never drops a kept token (checked when every k1 interval contains ratio 1), and, with
      the keywords, neither does widening the bounds;
    * ``rs_mask.intersection`` (keywords, several criteria): the combined mask equals the
      intersection of the single-criterion masks.

    Decisions are not judged where the statistic lies within tolerance of a bound: by default
    the dtype's rounding (absolute) plus :data:`GUARD_RTOL` relative for ``seq_mean_*``
    (an epsilon guard on the token count); ``rtol``/``atol`` replace either part.
    """
    require_fields(batch, _IS_FIELDS, "check_rs_mask", "rollout_batches()")
    run = _RSRun(fn, batch, criterion=criterion, threshold=threshold, rtol=rtol, atol=atol)
    for invariant in _RS_INVARIANTS:
        invariant(run)


def _reciprocal_hint(
    batch: Batch, criteria: Sequence[corr.RSCriterion], keep: Tensor, wrong: Tensor, clamp: bool
) -> str:
    """Explain a disagreement that verl's reciprocal k1 bounds reproduce exactly."""
    if not any(item.estimator == "k1" for item in criteria):
        return ""

    def inverse(x: float) -> float:
        return math.inf if x == 0 else 1.0 / x

    swapped = [
        corr.RSCriterion(item.name, upper=inverse(item.lower), lower=inverse(item.upper))
        if item.lower is not None
        else item
        for item in criteria
    ]
    reciprocal, _, _ = _rs_decisions(batch, swapped, F64_EPS, clamp=clamp)
    if bool((reciprocal[wrong] == keep[wrong]).all()):
        return (
            " — every disagreement matches keeping 1/upper ≤ ratio ≤ 1/lower (the reciprocal "
            "k1 bounds of verl's code) instead of lower ≤ ratio ≤ upper"
        )
    return ""
