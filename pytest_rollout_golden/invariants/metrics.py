"""Checkers for logged metrics: ``rollout_corr/*`` of rollout correction, ``ppo_kl`` and
``pg_clipfrac`` of the policy loss. Agreement with the reference, and finite values (no
exception) on degenerate batches."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from ..reference import correction as corr
from ..reference.losses import policy_loss
from ..reference.masking import as_bool_mask
from .comparison import (
    GUARD_RTOL,
    Batch,
    accumulation_roundoff,
    f64,
    fail,
    resolve_tolerance,
    unit_roundoff,
    versus,
)

__all__ = ["IS_METRICS", "PPO_METRICS", "check_ppo_metrics", "check_rollout_corr_metrics"]

IS_METRICS: tuple[str, ...] = (
    "rollout_is_mean",
    "rollout_is_std",
    "rollout_is_min",
    "rollout_is_max",
    "rollout_is_eff_sample_size",
    "rollout_is_ratio_fraction_high",
    "rollout_is_ratio_fraction_low",
    "rollout_is_oob_ratio",
    "kl",
    "k3_kl",
)
"""``rollout_corr/`` metrics compared by default (when ``fn`` reports them)."""

PPO_METRICS: tuple[str, ...] = ("ppo_kl", "pg_clipfrac")

_PREFIXES = ("rollout_corr/", "actor/")


def _metrics(name: str, output: Any) -> dict[str, float]:
    """The metrics dict of ``output`` (a dict, or the first dict in a tuple), unprefixed."""
    found = output if isinstance(output, Mapping) else None
    if found is None and isinstance(output, tuple | list):
        found = next((item for item in output if isinstance(item, Mapping)), None)
    if found is None:
        fail(
            f"{name}.shape", f"expected a dict of metrics (or a tuple holding one), got {output!r}"
        )
    out = {}
    for key, value in found.items():
        for prefix in _PREFIXES:
            key = key.removeprefix(prefix)
        out[key] = float(value.detach()) if isinstance(value, Tensor) else value
    return out


def _describe(batch: Batch) -> str:
    mask = batch["response_mask"]
    valid = as_bool_mask(mask)
    return (
        f"{tuple(mask.shape)} batch with {int(valid.sum())} valid tokens in "
        f"{int(valid.any(dim=-1).sum())} sequences"
    )


AS_GIVEN = "the batch as given"


def _evaluate(
    name: str,
    fn: Callable[..., Any],
    args: Sequence[Any],
    batch: Batch,
    names: Sequence[str],
    what: str = AS_GIVEN,
) -> dict[str, float]:
    """Call ``fn``; an exception or a non-finite metric among ``names`` fails, naming the batch."""
    where = what if what == AS_GIVEN else f"the degenerate batch where {what}"
    try:
        output = fn(*args)
    except Exception as error:  # the point: a crash (assert included) is a finding
        fail(
            f"{name}.{'exception' if what == AS_GIVEN else 'degenerate_batch'}",
            f"fn raised {type(error).__name__}: {error} on {where}",
            [_describe(batch)],
        )
    metrics = _metrics(name, output)
    bad = {
        key: metrics[key]
        for key in names
        if isinstance(metrics.get(key), int | float) and not math.isfinite(metrics[key])
    }
    if bad:
        fail(
            f"{name}.finite",
            f"non-finite metrics on {where}: "
            + ", ".join(f"{k}={v}" for k, v in sorted(bad.items())),
            [_describe(batch)],
        )
    return metrics


def _compare(
    name: str,
    got: Mapping[str, Any],
    expected: Mapping[str, float],
    tolerances: Mapping[str, tuple[float, float]],
    names: Sequence[str],
    rtol: float | None,
    atol: float | None,
    context: str,
) -> None:
    lines = []
    for key in names:
        if key not in got or key not in expected:
            continue
        default_rtol, default_atol = tolerances[key]
        tolerance = resolve_tolerance(default_rtol, default_atol, rtol, atol)
        value = float(got[key])
        if not math.isfinite(value) or tolerance.exceeded(value, expected[key]):
            allowed = float(tolerance.atol + tolerance.rtol * abs(expected[key]))
            lines.append(
                f"{key}: {versus('fn', value, 'reference', expected[key])}, allowed {allowed:.3g}"
            )
    if lines:
        fail(f"{name}.reference_agreement", f"{len(lines)} metrics differ ({context})", lines)


def _near_fraction(log_values: Tensor, band: Tensor, bounds: Sequence[float]) -> float:
    """Fraction of units whose log value is within ``band`` of the log of a bound."""
    if log_values.numel() == 0:
        return 0.0
    near = torch.zeros_like(log_values, dtype=torch.bool)
    for bound in bounds:
        near |= (log_values - math.log(bound)).abs() <= band
    return float(near.double().mean())


def _is_tolerances(
    batch: Batch, level: str, threshold: float | str, eps: float
) -> dict[str, tuple[float, float]]:
    old, rollout, mask = (
        f64(batch["old_log_probs"]),
        f64(batch["rollout_log_probs"]),
        batch["response_mask"],
    )
    valid = as_bool_mask(mask)
    acc = accumulation_roundoff(eps)
    n = max(int(valid.sum()), 1)
    parsed = corr.parse_is_threshold(threshold)
    raw = corr.raw_is_weights(old, rollout, mask, level=level)
    weights = corr.apply_is_threshold(raw, threshold)
    log_w = corr.is_log_weights(old, rollout, mask, level=level)
    token_magnitude = (old.abs() + rollout.abs()).masked_fill(~valid, 0)
    if level == "token":
        magnitude, log_values = token_magnitude[valid], log_w[valid]
    else:
        rows = valid.any(dim=-1)
        magnitude, log_values = token_magnitude.sum(dim=-1)[rows], log_w[:, 0][rows]
    weight_rtol = 8 * eps * (1 + float(magnitude.max()) if magnitude.numel() else 1.0)
    w = weights[valid]
    w_max = float(w.max()) if w.numel() else 0.0
    mean_square = float(w.square().mean()) if w.numel() else 0.0
    summed = weight_rtol + 8 * acc * n
    band = 8 * eps * (1 + magnitude)
    upper = parsed.upper
    lower = parsed.lower if parsed.lower is not None else (1 / upper if upper else None)
    bounds = [b for b in (lower, upper) if b]
    fraction = _near_fraction(log_values, band, bounds) + GUARD_RTOL
    lr = (old - rollout).clamp(-corr.SAFETY_BOUND, corr.SAFETY_BOUND)[valid]
    lr_scale = float((lr.exp() + lr.abs() + token_magnitude[valid]).max()) if lr.numel() else 0.0
    return {
        "rollout_is_mean": (summed + GUARD_RTOL, summed * w_max),
        "rollout_is_min": (weight_rtol + GUARD_RTOL, 1e-300),
        "rollout_is_max": (weight_rtol + GUARD_RTOL, 1e-300),
        # A one-pass variance E[w²] - E[w]² cancels: its rounding shows under the sqrt. An
        # epsilon guard in its denominators would too (sqrt(δ/n · E[w²]) at zero spread), and
        # is deliberately not allowed for: that is an error of 1e-4 on a std of 0.
        "rollout_is_std": (
            summed + GUARD_RTOL,
            math.sqrt(16 * summed * mean_square) + summed * w_max,
        ),
        "rollout_is_eff_sample_size": (4 * summed + GUARD_RTOL, 4 * summed),
        "rollout_is_ratio_fraction_high": (0.0, fraction),
        "rollout_is_ratio_fraction_low": (0.0, fraction),
        "rollout_is_oob_ratio": (0.0, fraction),
        "kl": (GUARD_RTOL, 8 * (eps + acc * n) * lr_scale),
        "k3_kl": (GUARD_RTOL + weight_rtol, 8 * (eps + acc * n) * lr_scale * (1 + w_max)),
    }


def _degenerate_is_batches(batch: Batch, threshold: float | str) -> list[tuple[str, dict]]:
    """(description, batch) pairs: every weight zeroed (IcePop), one valid token, none."""
    mask = batch["response_mask"]
    valid = as_bool_mask(mask)
    out = []
    parsed = corr.parse_is_threshold(threshold)
    if parsed.icepop:
        assert parsed.upper is not None and parsed.lower is not None
        if math.isfinite(parsed.upper):
            outside = batch["rollout_log_probs"] + math.log(parsed.upper) + 1.0
        else:  # one-sided "lower_inf": below the lower bound
            outside = batch["rollout_log_probs"] + math.log(parsed.lower) - 1.0
        old = torch.where(valid, outside.to(batch["old_log_probs"].dtype), batch["old_log_probs"])
        out.append(("IcePop zeroes every valid weight", dict(batch, old_log_probs=old)))
    first = torch.zeros_like(valid)
    first.view(-1)[int(valid.view(-1).long().argmax())] = True
    out.append(
        ("only one token is valid", dict(batch, response_mask=(mask * first).to(mask.dtype)))
    )
    out.append(
        (
            "no token is valid (every token rejected)",
            dict(batch, response_mask=torch.zeros_like(mask)),
        )
    )
    return out


def check_rollout_corr_metrics(
    fn: Callable[..., Any],
    batch: Batch,
    *,
    level: corr.ISLevel,
    threshold: float | str,
    metrics: Sequence[str] = IS_METRICS,
    degenerate: bool = True,
    rtol: float | None = None,
    atol: float | None = None,
) -> None:
    """Check ``fn(old_log_prob, rollout_log_prob, response_mask) -> metrics`` (a dict, or a
    tuple holding one, such as ``(weights, metrics)``; names with or without the
    ``rollout_corr/`` prefix) for IS weights of ``level`` with ``threshold``.

    * ``metrics.reference_agreement``: every name of ``metrics`` that ``fn`` reports equals
      the reference (``reference.compute_is_weights`` and ``reference.offpolicy_metrics``);
    * ``metrics.degenerate_batch`` / ``metrics.finite``: on the batch reduced to one valid
      token, to no valid token (every token rejected) and, for IcePop, with every valid
      weight zeroed, ``fn`` returns finite metrics instead of raising (``degenerate=False``
      skips these batches and checks agreement only).

    Tolerances (default rule): relative, the rounding of the weights (``8·eps·(1 + |log π|)``)
    and of the ``n``-term means (``8·eps_acc·n``) plus :data:`GUARD_RTOL`; absolute, the same
    times the largest weight, under a square root for the std (one-pass variance formulas
    cancel); fractions (high/low/oob) allow the share of units within rounding of a bound.
    ``rtol``/``atol`` replace either part.
    """
    args = (batch["old_log_probs"], batch["rollout_log_probs"], batch["response_mask"])
    got = _evaluate("metrics", fn, args, batch, metrics)
    old, rollout = f64(args[0]), f64(args[1])
    eps = unit_roundoff(args[0].dtype)
    tolerances = _is_tolerances(batch, level, threshold, eps)
    # Beyond ±20 nats, metrics of the clamped (verl) and of the exact weights are both right.
    log_w = corr.is_log_weights(old, rollout, args[2], level=level)
    far = (log_w.abs() > corr.SAFETY_BOUND) | ((old - rollout).abs() > corr.SAFETY_BOUND)
    beyond = bool((as_bool_mask(args[2]) & far).any())
    failures = []
    for clamp in (True, False) if beyond else (True,):
        _, expected = corr.compute_is_weights(
            old, rollout, args[2], level=level, threshold=threshold, clamp=clamp
        )
        expected.update(corr.offpolicy_metrics(old, rollout, args[2], clamp=clamp))
        expected = {k.removeprefix(corr.METRIC_PREFIX): v for k, v in expected.items()}
        try:
            _compare(
                "metrics",
                got,
                expected,
                tolerances,
                metrics,
                rtol,
                atol,
                f"level={level!r}, threshold={threshold!r}"
                + ("" if clamp else "; metrics of the exact weights exp(log w)"),
            )
            break
        except AssertionError as error:
            failures.append(error)
    else:
        raise failures[0]
    for what, reduced in _degenerate_is_batches(batch, threshold) if degenerate else []:
        inputs = (reduced["old_log_probs"], reduced["rollout_log_probs"], reduced["response_mask"])
        _evaluate("metrics", fn, inputs, reduced, metrics, what)


def check_ppo_metrics(
    fn: Callable[..., Any],
    batch: Batch,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float | None = None,
    clip_ratio_c: float = 3.0,
    metrics: Sequence[str] = PPO_METRICS,
    degenerate: bool = True,
    rtol: float | None = None,
    atol: float | None = None,
) -> None:
    """Check ``fn(batch) -> metrics`` (a dict, or a tuple holding one such as
    ``(loss, metrics)``; names with or without ``actor/``) of a PPO policy loss.

    ``ppo_kl`` is the mean of ``old - logp`` over valid tokens, ``pg_clipfrac`` the fraction
    of valid tokens where the clipped term is the larger loss. Invariants:
    ``ppo_metrics.reference_agreement`` (tokens within rounding of a clip bound may count
    either way) and ``ppo_metrics.degenerate_batch`` / ``.finite`` (one valid token, no
    valid token; skipped with ``degenerate=False``). ``rtol``/``atol`` replace the default
    relative/absolute tolerance.
    """
    mask = batch["response_mask"]
    valid = as_bool_mask(mask)
    got = _evaluate("ppo_metrics", fn, (batch,), batch, metrics)
    logp, old = f64(batch["log_probs"]), f64(batch["old_log_probs"])
    _, expected = policy_loss(
        logp,
        old,
        f64(batch["advantages"]),
        mask,
        clip_ratio_low=clip_ratio_low,
        clip_ratio_high=clip_ratio_high,
        clip_ratio_c=clip_ratio_c,
    )
    expected = {k.removeprefix("actor/"): v for k, v in expected.items()}
    eps = unit_roundoff(batch["log_probs"].dtype)
    acc = accumulation_roundoff(eps)
    n = max(int(valid.sum()), 1)
    log_ratio = (logp - old)[valid]
    scale = float((logp.abs() + old.abs())[valid].max()) if bool(valid.any()) else 0.0
    high = clip_ratio_low if clip_ratio_high is None else clip_ratio_high
    band = 8 * eps * (1 + log_ratio.abs() + (logp.abs() + old.abs())[valid])
    near = _near_fraction(log_ratio, band, [1 - clip_ratio_low, 1 + high, clip_ratio_c])
    tolerances = {
        "ppo_kl": (GUARD_RTOL, 8 * (eps + acc * n) * scale),
        "pg_clipfrac": (0.0, near + GUARD_RTOL),
        "pg_clipfrac_lower": (0.0, near + GUARD_RTOL),
    }
    _compare("ppo_metrics", got, expected, tolerances, metrics, rtol, atol, "PPO clip")
    first = torch.zeros_like(valid)
    first.view(-1)[int(valid.view(-1).long().argmax())] = True
    cases = (
        ("only one token is valid", (mask * first).to(mask.dtype)),
        ("no token is valid (every token rejected)", torch.zeros_like(mask)),
    )
    for what, reduced in cases if degenerate else ():
        small = dict(batch, response_mask=reduced)
        _evaluate("ppo_metrics", fn, (small,), small, metrics, what)
