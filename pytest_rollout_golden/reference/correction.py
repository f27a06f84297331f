"""Rollout correction: importance-sampling (IS) weights, rejection-sampling (RS) masks, metrics.

Notation: ``log_ratio = old_log_prob - rollout_log_prob`` = log(π_train / π_rollout) = log ρ,
``m`` = response mask. The semantics are those of verl's rollout-correction documentation
(``docs/numerics.md`` in this repository restates them with formulas):

* IS, token level: ``w = exp(clamp(log ρ, -20, 20))``; sequence level:
  ``w = exp(clamp(Σ_t m·log ρ, -20, 20))`` broadcast over the row; geometric level:
  ``w = exp(clamp(mean_t log ρ, -20, 20))`` (the geometric mean of the token ratios) broadcast
  over the row; then ``w *= m``.
* A float threshold truncates (``w = min(w, upper)``); a ``"lower_upper"`` string is IcePop
  (``w`` is zeroed outside ``[lower, upper]``; the mask is untouched); a ``(lower, upper)``
  pair is two-sided truncation (``w = clamp(w, lower, upper)`` on valid tokens).
* Optional batch normalization (after the threshold) divides by the mean weight at the IS
  level: token level over valid tokens, sequence level over sequences with at least one valid
  token of their per-sequence mean weight; skipped when that mean is ≤ 1e-8.
* RS criteria ``token_k*``, ``seq_sum_k*``, ``seq_mean_k*``, ``seq_max_k2|k3`` with
  ``k1 = -log ρ``, ``k2 = ½ (log ρ)²``, ``k3 = ρ - 1 - log ρ`` (log ρ clamped to ±20 first).
  A k1 criterion keeps ``lower ≤ ρ ≤ upper`` (on the token ratio, the sequence ratio Π ρ, or the
  geometric mean ratio), as the math states; ``"0_upper"`` / ``"lower_inf"`` are one-sided.
  verl's code compares ``-log ρ`` with ``[log lower, log upper]`` and so keeps
  ``1/upper ≤ ρ ≤ 1/lower`` instead; the two agree only for reciprocal-symmetric bounds such
  as ``"0.5_2.0"``.

Every metric is returned under its logged name, ``rollout_corr/<name>``, as a Python float
computed in float64.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from .masking import (
    as_bool_mask,
    masked_count,
    masked_fill_zero,
    masked_max,
    masked_mean,
    masked_sum,
    valid_rows,
)

SAFETY_BOUND = 20.0
"""Log-space clamp applied before every exponentiation of a log ratio."""

EXACT_BOUND = 700.0
"""With ``clamp=False`` (exact weights and statistics), the only clamp left, from above: where
float64 ``exp`` overflows."""

NORMALIZE_MIN = 1e-8
"""Batch normalization is skipped when the mean weight is at or below this value."""

METRIC_PREFIX = "rollout_corr/"

ISLevel = Literal["token", "sequence", "geometric"]
IS_LEVELS: tuple[str, ...] = ("token", "sequence", "geometric")

RS_CRITERIA: tuple[str, ...] = (
    "token_k1",
    "token_k2",
    "token_k3",
    "seq_sum_k1",
    "seq_sum_k2",
    "seq_sum_k3",
    "seq_mean_k1",
    "seq_mean_k2",
    "seq_mean_k3",
    "seq_max_k2",
    "seq_max_k3",
)


# --------------------------------------------------------------------------- threshold grammar


def _positive_number(text: str, where: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{where}: {text!r} is not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{where}: {text!r} must be a finite number > 0")
    return value


def _bounds(text: str, where: str, *, open_ended: bool = False) -> tuple[float, float]:
    """Parse ``"lower_upper"``; ``open_ended`` allows ``lower = 0`` or ``upper = inf``."""
    lower_text, upper_text = text.split("_", 1)
    lower_text, upper_text = lower_text.strip(), upper_text.strip()
    no_lower = open_ended and _is_number(lower_text, 0.0)
    no_upper = open_ended and _is_number(upper_text, math.inf)
    if no_lower and no_upper:
        raise ValueError(f"{where}: a one-sided k1 bound needs one finite side (got {text!r})")
    lower = 0.0 if no_lower else _positive_number(lower_text, f"{where} (lower bound)")
    upper = math.inf if no_upper else _positive_number(upper_text, f"{where} (upper bound)")
    if lower > upper:
        raise ValueError(f"{where}: lower bound {lower} is greater than upper bound {upper}")
    return lower, upper


def _is_number(text: str, value: float) -> bool:
    try:
        return float(text) == value
    except ValueError:
        return False


@dataclass(frozen=True)
class ISThreshold:
    """A parsed IS threshold: truncation (``lower is None``), IcePop bounds, or two-sided
    truncation (``two_sided``: ``clamp(w, lower, upper)``)."""

    upper: float | None
    lower: float | None = None
    two_sided: bool = False

    @property
    def icepop(self) -> bool:
        return self.lower is not None and not self.two_sided


ISThresholdSpec = float | str | tuple[float, float] | None
"""What :func:`parse_is_threshold` accepts."""

RSFilter = tuple[str, float | str]
"""``(criterion, threshold)`` of an RS criterion that zeroes IS weights (composite weights)."""


def parse_is_threshold(spec: ISThresholdSpec) -> ISThreshold:
    """Parse an IS threshold: ``None`` (none), ``2.0`` / ``"2.0"`` (truncation),
    ``"0.5_2.0"`` (IcePop; one-sided ``"0_2.0"`` zeroes only weights above 2 and
    ``"0.5_inf"`` only those below 0.5), ``(0.5, 2.0)`` (two-sided truncation, TIS with a
    lower clamp)."""
    if spec is None:
        return ISThreshold(upper=None)
    if isinstance(spec, bool):
        raise TypeError("IS threshold must be a number or a string, not a bool")
    if isinstance(spec, tuple | list):
        if len(spec) != 2 or not all(
            isinstance(v, int | float) and not isinstance(v, bool) for v in spec
        ):
            raise TypeError(f"a two-sided IS threshold is a pair of numbers, got {spec!r}")
        lower, upper = _bounds(f"{float(spec[0])!r}_{float(spec[1])!r}", f"IS threshold {spec!r}")
        return ISThreshold(upper=upper, lower=lower, two_sided=True)
    if isinstance(spec, int | float):
        return ISThreshold(upper=_positive_number(repr(float(spec)), "IS threshold"))
    if not isinstance(spec, str):
        raise TypeError(f"IS threshold must be a number or a string, got {type(spec).__name__}")
    text = spec.strip()
    if not text:
        raise ValueError("IS threshold: empty string")
    if "_" in text:
        lower, upper = _bounds(text, f"IS threshold {spec!r}", open_ended=True)
        return ISThreshold(upper=upper, lower=lower)
    return ISThreshold(upper=_positive_number(text, f"IS threshold {spec!r}"))


@dataclass(frozen=True)
class RSCriterion:
    """One rejection criterion with its bound(s).

    ``lower``/``upper`` are ratio bounds for k1 criteria (one-sided: ``lower = 0`` or
    ``upper = inf``); for k2/k3 ``upper`` bounds the statistic itself and ``lower`` is ``None``.
    """

    name: str
    upper: float
    lower: float | None = None

    @property
    def estimator(self) -> str:
        return self.name[-2:]

    @property
    def aggregate(self) -> str:
        """``"token"``, ``"sum"``, ``"mean"`` or ``"max"``."""
        return "token" if self.name.startswith("token") else self.name.split("_")[1]

    @property
    def sequence_level(self) -> bool:
        return self.aggregate != "token"

    def bounds(self) -> tuple[float, float]:
        """Closed interval ``[lo, hi]`` the statistic must lie in for the item to be kept."""
        if self.estimator == "k1":
            assert self.lower is not None
            lo = -math.inf if math.isinf(self.upper) else -math.log(self.upper)
            hi = math.inf if self.lower == 0 else -math.log(self.lower)
            return lo, hi
        return -math.inf, self.upper

    def statistic(self, log_ratio: Tensor, response_mask: Tensor, *, clamp: bool = True) -> Tensor:
        """The criterion's statistic: ``[B, T]`` for token criteria, ``[B]`` for sequence ones;
        ``clamp=False`` aggregates the exact per-token values (ROLL, AReaL, slime)."""
        per_token = token_divergence(log_ratio, self.estimator, clamp=clamp)
        if self.aggregate == "token":
            return per_token
        if self.aggregate == "sum":
            return masked_sum(per_token, response_mask, dim=-1)
        if self.aggregate == "mean":
            return masked_mean(per_token, response_mask, dim=-1)
        return masked_max(per_token, response_mask, dim=-1)

    def keep(self, log_ratio: Tensor, response_mask: Tensor, *, clamp: bool = True) -> Tensor:
        """Bool ``[B, T]``: valid tokens this criterion keeps."""
        stat = self.statistic(log_ratio, response_mask, clamp=clamp)
        lo, hi = self.bounds()
        kept = (stat >= lo) & (stat <= hi)
        if self.sequence_level:
            kept = kept.unsqueeze(-1).expand_as(log_ratio)
        return kept & as_bool_mask(response_mask)

    def spec(self) -> str:
        """The threshold text this criterion was parsed from (normalized)."""
        if self.lower is not None:
            return f"{self.lower!r}_{self.upper!r}"
        return repr(self.upper)


def parse_rs_criteria(criterion: str, threshold: float | str) -> tuple[RSCriterion, ...]:
    """Parse ``"token_k1,seq_max_k2"`` with ``"0.6_1.6,2.5"`` (or one shared threshold).

    A k1 part ``"0_2.0"`` keeps ``ρ ≤ 2`` only and ``"0.5_inf"`` keeps ``ρ ≥ 0.5`` only
    (one-sided; a bare ``"2.0"`` means ``"0.5_2.0"``)."""
    if not isinstance(criterion, str):
        raise TypeError(f"RS criterion must be a string, got {type(criterion).__name__}")
    names = [part.strip() for part in criterion.split(",")]
    for position, name in enumerate(names, start=1):
        if name not in RS_CRITERIA:
            raise ValueError(
                f"RS criterion part {position} ({name!r}) of {criterion!r} is not one of "
                f"{', '.join(RS_CRITERIA)}"
            )
    if isinstance(threshold, bool):
        raise TypeError("RS threshold must be a number or a string, not a bool")
    if isinstance(threshold, int | float):
        parts = [repr(float(threshold))]
    elif isinstance(threshold, str):
        parts = [part.strip() for part in threshold.split(",")]
    else:
        raise TypeError(f"RS threshold must be a number or a string, got {type(threshold)}")
    if len(parts) not in (1, len(names)):
        raise ValueError(
            f"RS threshold {threshold!r} has {len(parts)} parts; criterion {criterion!r} needs "
            f"1 (shared) or {len(names)}"
        )
    if len(parts) == 1:
        parts = parts * len(names)
    parsed = []
    for position, (name, text) in enumerate(zip(names, parts, strict=True), start=1):
        where = f"RS threshold part {position} ({text!r}) for {name!r}"
        if not text:
            raise ValueError(f"{where}: empty")
        if name.endswith("k1"):
            if "_" in text:
                lower, upper = _bounds(text, where, open_ended=True)
            else:
                upper = _positive_number(text, where)
                lower = 1.0 / upper
                if lower > upper:
                    raise ValueError(
                        f"{where}: a bare k1 bound is the upper ratio bound with lower = 1/upper, "
                        f"so it must be >= 1 (got {upper})"
                    )
            parsed.append(RSCriterion(name=name, upper=upper, lower=lower))
        else:
            if "_" in text:
                raise ValueError(f"{where}: k2/k3 criteria take one upper bound, not 'lower_upper'")
            parsed.append(RSCriterion(name=name, upper=_positive_number(text, where)))
    return tuple(parsed)


# --------------------------------------------------------------------------- statistics


def safe_log_ratio(old_log_prob: Tensor, rollout_log_prob: Tensor) -> Tensor:
    """``clamp(old - rollout, -20, 20)``."""
    return (old_log_prob - rollout_log_prob).clamp(-SAFETY_BOUND, SAFETY_BOUND)


def token_divergence(log_ratio: Tensor, estimator: str, *, clamp: bool = True) -> Tensor:
    """Per-token k1, k2 or k3 of a log ratio, clamped to ±20 first (verl); ``clamp=False``:
    exact, clamped only above +700, where float64 ``exp`` would overflow."""
    lr = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND) if clamp else log_ratio.clamp(max=EXACT_BOUND)
    if estimator == "k1":
        return -lr
    if estimator == "k2":
        return 0.5 * lr.square()
    if estimator == "k3":
        return torch.expm1(lr) - lr
    raise ValueError(f"unknown divergence estimator {estimator!r} (expected k1, k2 or k3)")


def _f64(values: Tensor) -> Tensor:
    return values.detach().to(torch.float64)


def _summary(values: Tensor) -> tuple[float, float, float, float]:
    """mean, population std, min, max of a 1-D float64 tensor (zeros when empty)."""
    if values.numel() == 0:
        return 0.0, 0.0, 0.0, 0.0
    mean = values.mean()
    std = (values - mean).square().mean().sqrt()
    return float(mean), float(std), float(values.min()), float(values.max())


def _prefixed(metrics: dict[str, float]) -> dict[str, float]:
    return {f"{METRIC_PREFIX}{key}": float(value) for key, value in metrics.items()}


# --------------------------------------------------------------------------- IS weights


def _check_level(level: str) -> None:
    if level not in IS_LEVELS:
        raise ValueError(f"IS level must be one of {IS_LEVELS}, got {level!r}")


def is_log_weights(
    old_log_prob: Tensor, rollout_log_prob: Tensor, response_mask: Tensor, *, level: ISLevel
) -> Tensor:
    """Unclamped log IS weight: ``log ρ`` per token, ``Σ_t m·log ρ`` (sequence) or
    ``mean_t log ρ`` over valid tokens (geometric) broadcast per row."""
    _check_level(level)
    log_ratio = old_log_prob - rollout_log_prob
    if level == "token":
        return log_ratio
    reduce = masked_sum if level == "sequence" else masked_mean
    return reduce(log_ratio, response_mask, dim=-1).unsqueeze(-1).expand_as(log_ratio)


def raw_is_weights(
    old_log_prob: Tensor,
    rollout_log_prob: Tensor,
    response_mask: Tensor,
    *,
    level: ISLevel,
    clamp: bool = True,
) -> Tensor:
    """IS weights before any threshold: ``exp(clamp(log w, ±20))`` (verl), or the exact
    ``exp(log w)`` with ``clamp=False`` (TRL, AReaL, slime, ROLL), zero on padding.

    Exact weights are clamped only above (+700, where float64 ``exp`` overflows): below, ``exp``
    underflows to 0 as the framework's own ``exp`` does (``exp(-750) = 0`` in float64, while a
    clamp at -700 would give ``9.9e-305``)."""
    log_w = is_log_weights(old_log_prob, rollout_log_prob, response_mask, level=level)
    weights = log_w.where(as_bool_mask(response_mask), torch.zeros_like(log_w))
    if clamp:
        weights = weights.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    return masked_fill_zero(weights.clamp(max=EXACT_BOUND).exp(), response_mask)


def apply_is_threshold(
    weights: Tensor, threshold: ISThresholdSpec, response_mask: Tensor | None = None
) -> Tensor:
    """Truncate (float), IcePop-zero (``"lower_upper"``) or clamp to ``[lower, upper]``
    (a pair) masked IS weights. Two-sided truncation keeps padding at zero: through
    ``response_mask``, or, without one, by leaving zero weights at zero."""
    parsed = parse_is_threshold(threshold)
    if parsed.upper is None:
        return weights
    if parsed.icepop:
        inside = (weights >= parsed.lower) & (weights <= parsed.upper)
        return torch.where(inside, weights, torch.zeros_like(weights))
    if parsed.two_sided:
        clamped = weights.clamp(parsed.lower, parsed.upper)
        keep = weights != 0 if response_mask is None else as_bool_mask(response_mask)
        return torch.where(keep, clamped, torch.zeros_like(weights))
    return weights.clamp(max=parsed.upper)


def is_normalizer(weights: Tensor, response_mask: Tensor, *, level: ISLevel) -> Tensor:
    """Mean weight at the IS level (the batch-normalization divisor before the 1e-8 guard)."""
    _check_level(level)
    if level == "token":
        return masked_mean(weights, response_mask)
    per_row = masked_mean(weights, response_mask, dim=-1)
    return masked_mean(per_row, valid_rows(response_mask))  # sequence and geometric levels


def normalize_is_weights(
    weights: Tensor, response_mask: Tensor, *, level: ISLevel
) -> tuple[Tensor, float]:
    """Divide by :func:`is_normalizer` unless it is ≤ 1e-8; returns ``(weights, factor)``.

    ``factor`` is the divisor applied (1.0 when normalization was skipped).
    """
    mean = is_normalizer(weights, response_mask, level=level)
    if float(mean) > NORMALIZE_MIN:
        return weights / mean, float(mean)
    return weights, 1.0


def compute_is_weights(
    old_log_prob: Tensor,
    rollout_log_prob: Tensor,
    response_mask: Tensor,
    *,
    level: ISLevel = "token",
    threshold: ISThresholdSpec = 2.0,
    batch_normalize: bool = False,
    clamp: bool = True,
    rs_filter: RSFilter | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """IS weights ``[B, T]`` (detached, zero on padding) and their ``rollout_corr/`` metrics.

    The metrics describe the weights after the threshold and before batch normalization.
    ``clamp=False`` computes exact weights (no ±20 clamp of the log weight).
    ``rs_filter=(criterion, threshold)``: composite weights, zeroed after the threshold (and
    before normalization) wherever that RS criterion rejects: NeMo-RL's ``seq-mask-tis`` is
    token IS with ``("seq_mean_k1", "lower_upper")`` (a geometric-mean sequence filter),
    AReaL's ``agg=sum`` geometric weights with ``("seq_sum_k1", "lower_upper")`` (a filter on
    the sequence's product ratio).
    """
    parsed = parse_is_threshold(threshold)
    with torch.no_grad():
        raw = raw_is_weights(
            old_log_prob, rollout_log_prob, response_mask, level=level, clamp=clamp
        )
        weights = apply_is_threshold(raw, threshold, response_mask)
        if rs_filter is not None:
            keep, _ = compute_rs_mask(
                old_log_prob,
                rollout_log_prob,
                response_mask,
                criterion=rs_filter[0],
                threshold=rs_filter[1],
                clamp=clamp,
            )
            weights = masked_fill_zero(weights, keep)
        metrics = _is_metrics(
            weights,
            raw,
            is_log_weights(old_log_prob, rollout_log_prob, response_mask, level=level),
            response_mask,
            level=level,
            threshold=parsed,
        )
        if batch_normalize:
            weights, factor = normalize_is_weights(weights, response_mask, level=level)
            metrics["rollout_is_batch_norm_factor"] = factor
    return weights, _prefixed(metrics)


def _is_metrics(
    weights: Tensor,
    raw: Tensor,
    log_w: Tensor,
    response_mask: Tensor,
    *,
    level: str,
    threshold: ISThreshold,
) -> dict[str, float]:
    valid = as_bool_mask(response_mask)
    rows = valid_rows(response_mask)
    w = _f64(weights)
    token_w = w[valid]
    mean, std, low, high = _summary(token_w)
    square_sum = float(token_w.square().sum())
    ess = float(token_w.sum()) ** 2 / (token_w.numel() * square_sum) if square_sum > 0 else 0.0
    metrics = {
        "rollout_is_mean": mean,
        "rollout_is_std": std,
        "rollout_is_min": low,
        "rollout_is_max": high,
        "rollout_is_eff_sample_size": ess,
    }
    # Fractions of raw (pre-threshold) ratios beyond the bounds, decided in log space.
    log_values = _f64(log_w)[valid] if level == "token" else _f64(log_w[:, 0])[rows]
    raw_row_mean = _f64(masked_mean(raw, response_mask, dim=-1))[rows]
    upper = threshold.upper
    lower = threshold.lower if threshold.lower is not None else (1.0 / upper if upper else None)
    if upper is None or log_values.numel() == 0:
        metrics["rollout_is_ratio_fraction_high"] = 0.0
        metrics["rollout_is_ratio_fraction_low"] = 0.0
    else:
        assert lower is not None
        high_fraction = (log_values > math.log(upper)).double().mean()
        low_fraction = (log_values < (math.log(lower) if lower > 0 else -math.inf)).double().mean()
        metrics["rollout_is_ratio_fraction_high"] = float(high_fraction)
        metrics["rollout_is_ratio_fraction_low"] = float(low_fraction)
    per_row = _f64(masked_mean(weights, response_mask, dim=-1))[rows]
    seq_mean, _, seq_min, seq_max = _summary(per_row)
    seq_std = float(per_row.std()) if per_row.numel() > 1 else 0.0
    metrics.update(
        {
            "rollout_is_seq_mean": seq_mean,
            "rollout_is_seq_std": seq_std,
            "rollout_is_seq_min": seq_min,
            "rollout_is_seq_max": seq_max,
            "rollout_is_seq_max_deviation": float((per_row - 1).abs().max())
            if per_row.numel()
            else 0.0,
        }
    )
    if upper is not None and raw_row_mean.numel():
        assert lower is not None
        metrics["rollout_is_seq_fraction_high"] = float((raw_row_mean > upper).double().mean())
        metrics["rollout_is_seq_fraction_low"] = float((raw_row_mean < lower).double().mean())
    if threshold.icepop:
        raw_valid = _f64(raw)[valid]
        outside = (raw_valid < threshold.lower) | (raw_valid > threshold.upper)
        metrics["rollout_is_oob_ratio"] = float(outside.double().mean()) if outside.numel() else 0.0
    return metrics


# --------------------------------------------------------------------------- RS masks


def compute_rs_mask(
    old_log_prob: Tensor,
    rollout_log_prob: Tensor,
    response_mask: Tensor,
    *,
    criterion: str,
    threshold: float | str,
    clamp: bool = True,
) -> tuple[Tensor, dict[str, float]]:
    """Keep mask ``[B, T]`` (the response mask with rejected tokens cleared, same dtype) + metrics.

    Comma-combined criteria must all pass; sequence criteria keep or drop whole sequences.
    ``clamp=False`` computes the statistics from exact per-token values (no ±20 clamp of the
    log ratio before a sequence sum or mean), as ROLL, AReaL and slime do.
    """
    criteria = parse_rs_criteria(criterion, threshold)
    valid = as_bool_mask(response_mask)
    rows = valid_rows(response_mask)
    with torch.no_grad():
        log_ratio = old_log_prob - rollout_log_prob
        keep = valid.clone()
        metrics: dict[str, float] = {}
        for item in criteria:
            kept = item.keep(log_ratio, response_mask, clamp=clamp)
            keep &= kept
            stat = _f64(item.statistic(log_ratio, response_mask, clamp=clamp))
            values = stat[rows] if item.sequence_level else stat[valid]
            mean, _, low, high = _summary(values)
            prefix = f"rollout_rs_{item.name}"
            metrics[f"{prefix}_mean"] = mean
            metrics[f"{prefix}_min"] = low
            metrics[f"{prefix}_max"] = high
            metrics.update(_masked_fractions(kept, valid, rows, prefix))
        metrics.update(_masked_fractions(keep, valid, rows, "rollout_rs"))
    result = keep if response_mask.dtype == torch.bool else keep.to(response_mask.dtype)
    return result, _prefixed(metrics)


def _masked_fractions(keep: Tensor, valid: Tensor, rows: Tensor, prefix: str) -> dict[str, float]:
    dropped = valid & ~keep
    n_tokens = int(masked_count(valid))
    n_rows = int(rows.sum())
    token_fraction = int(dropped.sum()) / n_tokens if n_tokens else 0.0
    row_fraction = int(dropped.any(dim=-1).sum()) / n_rows if n_rows else 0.0
    return {
        f"{prefix}_masked_fraction": token_fraction,
        f"{prefix}_seq_masked_fraction": row_fraction,
    }


# --------------------------------------------------------------------------- diagnostics


def offpolicy_metrics(
    old_log_prob: Tensor, rollout_log_prob: Tensor, response_mask: Tensor, *, clamp: bool = True
) -> dict[str, float]:
    """Off-policy diagnostics (kl, k3_kl, perplexities, log_ppl_diff, chi2_token, chi2_seq);
    ``clamp=False``: no ±20 clamp of the log ratios in k3_kl and chi2."""
    old, rollout = _f64(old_log_prob), _f64(rollout_log_prob)
    rows = valid_rows(response_mask)
    log_ratio = old - rollout
    bound = SAFETY_BOUND if clamp else EXACT_BOUND
    safe = log_ratio.where(as_bool_mask(response_mask), torch.zeros_like(log_ratio))
    safe = safe.clamp(-bound, bound)
    mean_old = masked_mean(old, response_mask, dim=-1)[rows]
    mean_rollout = masked_mean(rollout, response_mask, dim=-1)[rows]
    diff = mean_rollout - mean_old
    seq_log_ratio = masked_sum(log_ratio, response_mask, dim=-1)[rows]

    def row_mean(values: Tensor) -> float:
        return float(values.mean()) if values.numel() else 0.0

    has_tokens = bool(rows.any())
    metrics = {
        "kl": float(masked_mean(rollout - old, response_mask)),
        "k3_kl": float(masked_mean(torch.expm1(safe) - safe, response_mask)),
        "training_ppl": row_mean(torch.exp(-mean_old)),
        "training_log_ppl": row_mean(-mean_old),
        "rollout_ppl": row_mean(torch.exp(-mean_rollout)),
        "rollout_log_ppl": row_mean(-mean_rollout),
        "log_ppl_diff": row_mean(diff),
        "log_ppl_abs_diff": row_mean(diff.abs()),
        "log_ppl_diff_max": float(diff.max()) if has_tokens else 0.0,
        "log_ppl_diff_min": float(diff.min()) if has_tokens else 0.0,
        "ppl_ratio": row_mean(torch.exp(diff)),
        "chi2_token": float(masked_mean(torch.exp(2 * safe), response_mask)) - 1.0
        if has_tokens
        else 0.0,
        "chi2_seq": row_mean(torch.exp(2 * seq_log_ratio.clamp(-bound, bound))) - 1.0
        if has_tokens
        else 0.0,
    }
    return _prefixed(metrics)


def rollout_correction(
    old_log_prob: Tensor,
    rollout_log_prob: Tensor,
    response_mask: Tensor,
    *,
    is_level: ISLevel | None = None,
    is_threshold: ISThresholdSpec = 2.0,
    is_batch_normalize: bool = False,
    rs: str | None = None,
    rs_threshold: float | str | None = None,
) -> tuple[Tensor | None, Tensor, dict[str, float]]:
    """The whole step: IS weights (or ``None``), the RS-filtered response mask, all metrics."""
    metrics: dict[str, float] = {}
    weights = None
    if is_level is not None:
        weights, is_part = compute_is_weights(
            old_log_prob,
            rollout_log_prob,
            response_mask,
            level=is_level,
            threshold=is_threshold,
            batch_normalize=is_batch_normalize,
        )
        metrics.update(is_part)
    keep = response_mask.clone()
    if rs is not None:
        if rs_threshold is None:
            raise ValueError(f"RS criterion {rs!r} needs an rs_threshold")
        keep, rs_part = compute_rs_mask(
            old_log_prob, rollout_log_prob, response_mask, criterion=rs, threshold=rs_threshold
        )
        metrics.update(rs_part)
    metrics.update(offpolicy_metrics(old_log_prob, rollout_log_prob, response_mask))
    return weights, keep, metrics
