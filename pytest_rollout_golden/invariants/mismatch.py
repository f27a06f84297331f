"""Checker for train–inference mismatch metrics: your own ``token_mult_prob_error``,
``gen_kl_error``, mismatch KL, ``train_rollout_logprob_abs_diff``... against
:func:`pytest_rollout_golden.mismatch.metrics`."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from functools import cached_property
from typing import Any

import torch
from torch import Tensor

from .. import mismatch
from .._internal.tolerance.mismatch_bounds import METRIC_NAMES
from ..reference.masking import as_bool_mask
from .comparison import (
    GUARD_RTOL,
    Batch,
    accumulation_roundoff,
    f64,
    fail,
    refill_padding,
    resolve_tolerance,
    unit_roundoff,
    versus,
)

__all__ = ["ALIASES", "check_mismatch_metrics"]

ALIASES: dict[str, str] = {
    "mismatch_kl": "gen_kl_error",  # Prime-RL: r - log r - 1, r = exp(train - inference)
    "train_rollout_logprob_abs_diff": "abs_logprob_diff_seq_mean",  # slime
    "kl": "k1_kl",  # verl rollout_corr/kl
    "sampling_logp_difference/mean": "abs_logprob_diff_mean",  # TRL
    "sampling_logp_difference/max": "abs_logprob_diff_max",  # TRL
}
"""Names frameworks log, by the metric of :mod:`.mismatch` they compute."""


def _reference_name(key: str, names: Mapping[str, str] | None) -> str | None:
    """The reference metric ``fn``'s ``key`` computes (None: not a mismatch metric)."""
    if names is not None:
        return names.get(key)
    for candidate in (key, key.rsplit("/", 1)[-1], key.split("/", 1)[-1]):
        if candidate in METRIC_NAMES:
            return candidate
        if candidate in ALIASES:
            return ALIASES[candidate]
    return None


def _call(fn: Callable[..., Any], args: tuple[Tensor, Tensor, Tensor], what: str) -> dict:
    try:
        output = fn(*args)
    except Exception as error:  # the point: a crash (assert included) is a finding
        fail("mismatch.exception", f"fn raised {type(error).__name__}: {error} on {what}")
    if not isinstance(output, Mapping):
        fail("mismatch.shape", f"expected a dict of metrics, got {type(output).__name__}")
    return {
        key: float(value.detach()) if isinstance(value, Tensor) else float(value)
        for key, value in output.items()
    }


def _tolerances(train: Tensor, rollout: Tensor, valid: Tensor, eps: float) -> dict[str, float]:
    """Per metric, the absolute allowance of a correct implementation in the inputs' dtype
    (before the relative part): ``8·eps·T + 4·n·eps_acc·T`` with ``T`` the largest term the
    metric sums (a log prob, ``exp(|d|)``, ``exp(2|d|)``)."""
    d = (train - rollout)[valid].abs()
    n = max(int(valid.sum()), 1)
    acc = accumulation_roundoff(eps)
    log_term = float((train.abs() + rollout.abs())[valid].max()) if d.numel() else 0.0
    clamped = d.clamp(max=20.0)
    exp_term = float(torch.exp(clamped).max()) if d.numel() else 1.0
    terms = {
        "log": 1.0 + log_term,
        "exp": exp_term * (1.0 + log_term),
        "k3": exp_term * (1.0 + log_term) + float(d.max() if d.numel() else 0.0) + 1.0,
        "chi2": exp_term**2 * (1.0 + log_term),
    }
    family = {
        "token_mult_prob_error": "exp",
        "seq_token_mult_prob_error_max": "exp",
        "ppl_ratio": "exp",
        "k3_kl": "k3",
        "gen_kl_error": "k3",
        "policy_kl_error": "k3",
        "seq_k3_kl_max": "k3",
        "chi2_token": "chi2",
    }
    out = {}
    for name in METRIC_NAMES:
        term = terms[family.get(name, "log")]
        out[name] = 8 * eps * term + 4 * n * acc * term
    band = 8 * eps * (1.0 + log_term)
    near = ((d - math.log(mismatch.RATIO_BOUND)).abs() <= band).sum()
    out["ratio_outside_fraction"] = (int(near) + 1e-9) / n
    return out


class _MismatchRun:
    """``fn``'s metrics of one batch, matched to the reference's names, and a way to judge the
    metrics of another call against the reference (computed on first use)."""

    def __init__(
        self,
        fn: Callable[..., Any],
        batch: Batch,
        *,
        names: Mapping[str, str] | None,
        rtol: float | None,
        atol: float | None,
    ):
        self.fn, self.batch, self.rtol, self.atol = fn, batch, rtol, atol
        self.train, self.rollout, self.mask = (
            batch["old_log_probs"],
            batch["rollout_log_probs"],
            batch["response_mask"],
        )
        self.valid = as_bool_mask(self.mask)
        self.got = _call(fn, (self.train, self.rollout, self.mask), "the batch as given")
        matched = {key: _reference_name(key, names) for key in self.got}
        self.matched = {key: name for key, name in matched.items() if name is not None}

    @cached_property
    def expected(self) -> dict[str, float]:
        return mismatch.metrics(self.train, self.rollout, self.mask)

    @cached_property
    def allowance(self) -> tuple[float, dict[str, float]]:
        """The default relative tolerance, and per metric the absolute one."""
        train, rollout, valid = self.train, self.rollout, self.valid
        eps = unit_roundoff(train.dtype, rollout.dtype)
        train64, rollout64 = f64(train), f64(rollout)
        per_metric = _tolerances(train64, rollout64, valid, eps)
        magnitude = train64.abs() + rollout64.abs()
        log_term = float(magnitude[valid].max()) if bool(valid.any()) else 0
        default_rtol = 8 * eps * (1 + log_term) + 4 * int(valid.sum()) * accumulation_roundoff(eps)
        default_rtol += GUARD_RTOL
        return default_rtol, per_metric

    def differing(self, values: Mapping[str, float]) -> list[str]:
        """One line per matched metric of ``values`` that is missing or off the reference."""
        expected = self.expected
        default_rtol, allowance = self.allowance
        lines = []
        for key, name in self.matched.items():
            if key not in values:
                lines.append(f"{key}: missing from this call's metrics")
                continue
            tolerance = resolve_tolerance(default_rtol, allowance[name], self.rtol, self.atol)
            value, reference = values[key], expected[name]
            if not math.isfinite(reference):
                ok = value == reference or (math.isnan(value) and math.isnan(reference))
            else:
                ok = math.isfinite(value) and not tolerance.exceeded(value, reference)
            if not ok:
                allowed = tolerance.atol + tolerance.rtol * abs(reference)
                label = key if key == name else f"{key} ({name})"
                lines.append(
                    f"{label}: {versus('fn', value, 'reference', reference)}, allowed {allowed:.3g}"
                )
        return lines

    def differing_on(self, args: tuple[Tensor, Tensor, Tensor], what: str) -> list[str]:
        return self.differing(_call(self.fn, args, what))


def _names(run: _MismatchRun) -> None:
    if not run.matched:
        fail(
            "mismatch.names",
            f"none of fn's metrics {sorted(run.got)} is a mismatch metric; pass names={{your "
            f"name: reference name}} (reference names: {', '.join(METRIC_NAMES)})",
        )


def _reference_agreement(run: _MismatchRun) -> None:
    lines = run.differing(run.got)
    if lines:
        fail(
            "mismatch.reference_agreement",
            f"{len(lines)} metrics differ from the reference (d = log_probs - "
            "rollout_log_probs; see pytest_rollout_golden.mismatch for each formula)",
            lines,
        )


def _padding_independence(run: _MismatchRun) -> None:
    refilled = refill_padding(run.batch)
    args = (refilled["old_log_probs"], refilled["rollout_log_probs"], run.mask)
    lines = run.differing_on(args, "the batch with other garbage on padding")
    if lines:
        fail(
            "mismatch.padding_independence",
            "changing only the garbage on padding changed the metrics (padding leaks in: a "
            "mean over all T positions, or a mask applied after exp)",
            lines,
        )


def _nonfinite_padding(run: _MismatchRun) -> None:
    if bool(run.valid.all()):
        return
    train, rollout, valid = run.train, run.rollout, run.valid
    for fill in (math.inf, -math.inf, math.nan):
        poisoned = (
            torch.where(valid, train, torch.full_like(train, fill)),
            torch.where(valid, rollout, torch.full_like(rollout, -fill)),
            run.mask,
        )
        lines = run.differing_on(poisoned, f"the batch with {fill} on padding")
        if lines:
            fail(
                "mismatch.nonfinite_padding",
                f"{fill} on padding leaked into the metrics (x * mask keeps NaN and "
                "inf · 0 is NaN: select valid tokens with torch.where)",
                lines,
            )


def _mask_dtype(run: _MismatchRun) -> None:
    mask = run.mask
    for dtype in (torch.bool, torch.int64, run.train.dtype):
        if mask.dtype == dtype:
            continue
        args = (run.train, run.rollout, run.valid.to(dtype))
        lines = run.differing_on(args, f"a {dtype} mask")
        if lines:
            fail(
                "mismatch.mask_dtype",
                f"the same mask as {dtype} (was {mask.dtype}) changed the metrics",
                lines,
            )


_INVARIANTS: tuple[Callable[[_MismatchRun], None], ...] = (
    _names,
    _reference_agreement,
    _padding_independence,
    _nonfinite_padding,
    _mask_dtype,
)
"""The invariants of :func:`check_mismatch_metrics`, in the order they are judged."""


def check_mismatch_metrics(
    fn: Callable[..., Any],
    batch: Batch,
    *,
    names: Mapping[str, str] | None = None,
    rtol: float | None = None,
    atol: float | None = None,
) -> None:
    """Check ``fn(log_probs, rollout_log_probs, response_mask) -> {name: value}``.

    The trainer's log probs are the batch's ``old_log_probs`` (the recomputation the
    engine's ``rollout_log_probs`` are compared with). ``fn``'s names are matched to the
    reference's by ``names`` (``{your name: reference name}``), else by name, last path
    component, or :data:`ALIASES` (``mismatch_kl``, ``train_rollout_logprob_abs_diff``...).
    Invariants:

    * ``mismatch.names``: at least one of ``fn``'s metrics is a mismatch metric;
    * ``mismatch.reference_agreement``: each matched metric equals the reference;
    * ``mismatch.padding_independence``: other garbage on padding, same metrics;
    * ``mismatch.nonfinite_padding``: ``inf``, ``-inf`` and NaN on padding, same metrics
      (``x * mask`` turns NaN · 0 into NaN: select with ``torch.where``);
    * ``mismatch.mask_dtype``: the mask as bool, int64 and float, same metrics.

    Tolerance: relative ``8·eps·(1 + M) + 4·n·eps_acc + GUARD_RTOL`` (``M`` the largest
    valid log-prob magnitude, ``n`` the valid tokens) plus an absolute part from the largest
    term each metric sums; ``rtol``/``atol`` replace either part.

    A batch without a valid token is refused (ValueError): every metric of it reads 0.
    """
    mask = batch["response_mask"]
    if not bool(as_bool_mask(mask).any()):
        from .._internal.wording import nothing_selected

        raise ValueError(
            f"check_mismatch_metrics: {nothing_selected(mask.numel(), 'the batch out')}"
        )
    run = _MismatchRun(fn, batch, names=names, rtol=rtol, atol=atol)
    for invariant in _INVARIANTS:
        invariant(run)
