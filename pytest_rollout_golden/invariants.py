"""Property checkers for rollout-correction and loss code: point them at your own functions.

Each checker takes your function and one rollout batch (from
:func:`pytest_rollout_golden.strategies.rollout_batches` or your own), returns ``None`` when
every invariant holds and raises ``AssertionError`` otherwise. The message starts with the
broken invariant's name in brackets (``[rs_mask.reference_agreement]``) and lists the
offending batch/token positions with their values.

Batches are dicts with ``old_log_probs``, ``rollout_log_probs``, ``log_probs``,
``response_mask``, ``advantages`` (``[B, T]``) and ``uid`` (``[B]``). Padding positions may
hold any finite garbage. Checkers never modify the batch they are given.

Loss functions are called as ``loss_fn(batch, *, global_tokens, global_seqs)`` and return a
scalar tensor (or a tuple whose first item is one), where ``global_tokens`` is the number of
valid tokens and ``global_seqs`` the number of sequences with at least one valid token in the
*whole* step (full batch). Gradients are taken with respect to ``batch["log_probs"]``: the
checker passes a fresh leaf tensor there, so the loss must be computed from it.

Tolerances. Agreement is judged in float64. The reference runs in float64 on the exact values
your function received; your function's rounding is allowed for from the unit roundoff
``eps`` of the lowest-precision dtype involved (input or output): about
``4·eps·(1 + |log w|)`` relative for a value ``exp(log w)`` (exp turns an absolute error in
the exponent into a relative one), plus ``n·eps_acc`` for reductions over ``n`` terms, with
``eps_acc`` the float32 roundoff for float32/bf16 (torch accumulates low-precision sums in
float32) and the float64 roundoff for float64. Boolean decisions (RS keep/drop, IcePop,
PPO clip regions) are not judged where the deciding statistic lies within that tolerance of
a bound: there, either decision is correct. This keeps the checkers free of false alarms for
every generated batch while a bug in float64 still shows as an error many orders of
magnitude above the tolerance. In bf16 the tolerances are honest and therefore wide (a
sequence-level IS weight over 12 tokens is only known to a few percent).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, NoReturn

import torch
from torch import Tensor

from . import parallel
from .reference import correction as corr
from .reference.losses import AggMode, policy_loss
from .reference.masking import as_bool_mask, masked_mean, valid_rows

__all__ = [
    "check_is_weights",
    "check_linear_in_advantages",
    "check_packing_invariance",
    "check_padding_invariance",
    "check_permutation_invariance",
    "check_ppo_clip",
    "check_ppo_reduces_to_reinforce",
    "check_rs_mask",
    "check_split_invariance",
    "check_zero_advantage",
]

Batch = Mapping[str, Any]
MAX_SHOWN = 8
_F32_EPS = torch.finfo(torch.float32).eps
_F64_EPS = torch.finfo(torch.float64).eps
_TOKEN_FLOATS = ("old_log_probs", "rollout_log_probs", "log_probs", "advantages")


# --------------------------------------------------------------------------- failure reports


def _fail(invariant: str, summary: str, details: Sequence[str] = ()) -> NoReturn:
    lines = [f"[{invariant}] {summary}"]
    lines += [f"  {line}" for line in details[:MAX_SHOWN]]
    if len(details) > MAX_SHOWN:
        lines.append(f"  ... and {len(details) - MAX_SHOWN} more")
    raise AssertionError("\n".join(lines))


def _g(value: float) -> str:
    return f"{value:.6g}"


def _positions(bad: Tensor) -> list[tuple[int, ...]]:
    return [tuple(int(i) for i in index) for index in bad.nonzero()]


# --------------------------------------------------------------------------- small helpers


def _f64(values: Tensor) -> Tensor:
    return values.detach().to(torch.float64)


def _eps(*dtypes: torch.dtype) -> float:
    floats = [torch.finfo(d).eps for d in dtypes if d.is_floating_point]
    return max(floats) if floats else _F64_EPS


def _acc_eps(eps: float) -> float:
    return eps if eps < _F32_EPS else _F32_EPS


def _first(output: Any) -> Any:
    return output[0] if isinstance(output, tuple | list) else output


def _accepts(fn: Callable[..., Any], name: str) -> bool:
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(
        (p.name == name and p.kind != p.POSITIONAL_ONLY) or p.kind == p.VAR_KEYWORD
        for p in parameters
    )


def _valid(batch: Batch) -> Tensor:
    return as_bool_mask(batch["response_mask"])


def _counts(batch: Batch) -> tuple[int, int]:
    valid = _valid(batch)
    return int(valid.sum()), int(valid.any(dim=-1).sum())


def _replace_valid(values: Tensor, valid: Tensor, new: Tensor) -> Tensor:
    return torch.where(valid, new.to(values.dtype), values)


def _regarble(batch: Batch) -> dict[str, Any]:
    """The batch with different (still finite) garbage in every padding position."""
    valid = _valid(batch)
    out = dict(batch)
    for key in _TOKEN_FLOATS:
        if key in batch:
            values = batch[key]
            out[key] = torch.where(valid, values, values + 37.0 + values.abs())
    return out


def _token_tensor(name: str, output: Any, shape: torch.Size) -> Tensor:
    output = _first(output)
    if not isinstance(output, Tensor):
        _fail(f"{name}.shape", f"expected a tensor, got {type(output).__name__}")
    if output.shape != shape:
        _fail(f"{name}.shape", f"expected shape {tuple(shape)}, got {tuple(output.shape)}")
    if output.is_floating_point() and not bool(torch.isfinite(output).all()):
        bad = ~torch.isfinite(output)
        _fail(
            f"{name}.finite",
            f"{int(bad.sum())} non-finite entries",
            [f"(b={b}, t={t}): {_g(float(output[b, t]))}" for b, t in _positions(bad)],
        )
    return output


# --------------------------------------------------------------------------- IS weights


def check_is_weights(
    fn: Callable[..., Any],
    batch: Batch,
    *,
    level: corr.ISLevel,
    threshold: float | str | None,
    batch_normalize: bool = False,
) -> None:
    """Check ``fn(old_log_prob, rollout_log_prob, response_mask) -> weights [B, T]``.

    ``level``, ``threshold`` and ``batch_normalize`` describe what ``fn`` is configured to
    compute (a tuple return is allowed; its first item is the weights). Invariants:

    * ``is_weights.nonnegative``; ``is_weights.zero_on_padding``;
    * ``is_weights.sequence_constant`` (sequence level): one weight per sequence;
    * ``is_weights.padding_independence``: other garbage on padding, same weights;
    * ``is_weights.normalized_mean`` (batch_normalize): mean 1 at the IS level — over valid
      tokens, or over sequences of their mean weight — unless the reference skips
      normalization (mean ≤ 1e-8);
    * ``is_weights.truncation`` / ``is_weights.icepop_bounds``: before normalization, weights
      are ≤ upper (truncation) or 0 or inside ``[lower, upper]`` (IcePop). With
      ``batch_normalize`` the checker undoes the normalization with the reference normalizer
      (if your normalizer is wrong, ``normalized_mean`` or ``reference_agreement`` says so);
    * ``is_weights.reference_agreement``: equal to the reference within dtype tolerance.
    """
    old, rollout, mask = batch["old_log_probs"], batch["rollout_log_probs"], batch["response_mask"]
    weights_out = _token_tensor("is_weights", fn(old, rollout, mask), mask.shape)
    w = _f64(weights_out)
    valid = as_bool_mask(mask)
    eps = _eps(old.dtype, weights_out.dtype)
    acc = _acc_eps(eps)
    thr = corr.parse_is_threshold(threshold)

    old64, rollout64 = _f64(old), _f64(rollout)
    log_w = corr.is_log_weights(old64, rollout64, mask, level=level)
    raw = corr.raw_is_weights(old64, rollout64, mask, level=level)
    # Rounding of log ratios scales with the log-probs themselves (an implementation may sum
    # old and rollout log-probs separately before subtracting).
    token_magnitude = old64.abs() + rollout64.abs()
    if level == "token":
        magnitude = token_magnitude
    else:
        per_row = corr.masked_sum(token_magnitude, mask, dim=-1)
        magnitude = per_row.unsqueeze(-1).expand_as(w)
    n_row = valid.sum(dim=-1, keepdim=True).expand_as(w).to(torch.float64)
    spread = n_row if level == "sequence" else torch.ones_like(w)
    elem_rtol = 4 * eps * (1 + magnitude) + 4 * acc * spread * magnitude
    norm_rtol = float(elem_rtol[valid].max()) if bool(valid.any()) else 0.0
    norm_rtol += 4 * acc * int(valid.sum())
    tiny = 4 * torch.finfo(weights_out.dtype).tiny

    def describe(b: int, t: int) -> str:
        return f"(b={b}, t={t}): fn={_g(float(w[b, t]))}, log weight={_g(float(log_w[b, t]))}"

    negative = w < 0
    if bool(negative.any()):
        _fail(
            "is_weights.nonnegative",
            "negative IS weights",
            [describe(*p) for p in _positions(negative)],
        )
    on_padding = ~valid & (w != 0)
    if bool(on_padding.any()):
        _fail(
            "is_weights.zero_on_padding",
            "non-zero IS weights on padding positions",
            [describe(*p) for p in _positions(on_padding)],
        )
    if level == "sequence":
        first = w.gather(-1, valid.long().argmax(dim=-1, keepdim=True)).expand_as(w)
        uneven = valid & ((w - first).abs() > 2 * elem_rtol * first.abs() + tiny)
        if bool(uneven.any()):
            _fail(
                "is_weights.sequence_constant",
                "sequence-level weights differ within a sequence",
                [
                    f"{describe(b, t)}, first weight of row {_g(float(first[b, t]))}"
                    for b, t in _positions(uneven)
                ],
            )
    again = _f64(_token_tensor("is_weights", fn(*_is_inputs(_regarble(batch))), mask.shape))
    moved = (again - w).abs() > 2 * elem_rtol * w.abs() + tiny
    if bool(moved.any()):
        _fail(
            "is_weights.padding_independence",
            "changing only the garbage in padding positions changed the weights of valid tokens "
            "(padding log ratios leak into the weights, e.g. a sequence sum over all T positions)",
            [f"{describe(b, t)} -> {_g(float(again[b, t]))}" for b, t in _positions(moved)],
        )

    # The reference, with IcePop decisions on near-boundary weights resolved as fn did.
    thresholded = corr.apply_is_threshold(raw, threshold)
    if thr.icepop:
        assert thr.lower is not None and thr.upper is not None
        near = valid & (
            ((raw - thr.lower).abs() <= elem_rtol * thr.lower)
            | ((raw - thr.upper).abs() <= elem_rtol * thr.upper)
        )
        inside = (raw >= thr.lower) & (raw <= thr.upper)
        inside = torch.where(near, w != 0, inside)
        thresholded = torch.where(inside & valid, raw, torch.zeros_like(raw))
    candidates: list[tuple[Tensor, float]] = [(thresholded, 1.0)]
    if batch_normalize:
        mean = float(corr.is_normalizer(thresholded, mask, level=level))
        if mean > corr.NORMALIZE_MIN * (1 + norm_rtol):
            candidates = [(thresholded / mean, mean)]
        elif mean > corr.NORMALIZE_MIN * (1 - norm_rtol):
            candidates = [(thresholded / mean, mean), (thresholded, 1.0)]
        if candidates[0][1] != 1.0 and len(candidates) == 1:
            fn_mean = float(corr.is_normalizer(w, mask, level=level))
            if abs(fn_mean - 1) > 2 * norm_rtol + 8 * acc:
                token_mean = float(masked_mean(w, mask))
                rows = valid_rows(mask)
                seq_mean = float(masked_mean(masked_mean(w, mask, dim=-1), rows))
                _fail(
                    "is_weights.normalized_mean",
                    f"batch-normalized {level}-level weights have mean {_g(fn_mean)} at the "
                    f"{level} level, expected 1",
                    [
                        f"mean over {int(valid.sum())} valid tokens: {_g(token_mean)}",
                        f"mean over {int(rows.sum())} sequences of their mean weight: "
                        f"{_g(seq_mean)}",
                    ],
                )
    if len(candidates) == 1 and thr.upper is not None:
        factor = candidates[0][1]
        before = w * factor
        if thr.icepop:
            assert thr.lower is not None
            slack = elem_rtol + 2 * norm_rtol
            outside = (
                valid
                & (before != 0)
                & ((before < thr.lower * (1 - slack)) | (before > thr.upper * (1 + slack)))
            )
            name, what = (
                "is_weights.icepop_bounds",
                f"neither 0 nor inside [{thr.lower}, {thr.upper}]",
            )
        else:
            outside = valid & (before > thr.upper * (1 + elem_rtol + 2 * norm_rtol))
            name, what = "is_weights.truncation", f"above the truncation threshold {thr.upper}"
        if bool(outside.any()):
            note = f" (weights × reference normalizer {_g(factor)})" if factor != 1.0 else ""
            _fail(
                name,
                f"weights before normalization{note} are {what}",
                [
                    f"{describe(b, t)}, before normalization {_g(float(before[b, t]))}"
                    for b, t in _positions(outside)
                ],
            )
    tolerance = (elem_rtol + 2 * norm_rtol) * 2
    failures = []
    for expected, _ in candidates:
        off = valid & ((w - expected).abs() > tolerance * expected.abs() + tiny)
        if not bool(off.any()):
            return
        failures.append((off, expected))
    off, expected = failures[0]
    _fail(
        "is_weights.reference_agreement",
        f"{int(off.sum())} of {int(valid.sum())} valid weights differ from the reference "
        f"(level={level!r}, threshold={threshold!r}, batch_normalize={batch_normalize})",
        [f"{describe(b, t)}, reference={_g(float(expected[b, t]))}" for b, t in _positions(off)],
    )


def _is_inputs(batch: Batch) -> tuple[Tensor, Tensor, Tensor]:
    return batch["old_log_probs"], batch["rollout_log_probs"], batch["response_mask"]


# --------------------------------------------------------------------------- RS masks


def _rs_decisions(
    batch: Batch, criteria: Sequence[corr.RSCriterion], eps: float
) -> tuple[Tensor, Tensor, list[tuple[corr.RSCriterion, Tensor, Tensor]]]:
    """Reference keep mask, ambiguous positions, and per criterion (stat, keep) in float64."""
    old64, rollout64 = _f64(batch["old_log_probs"]), _f64(batch["rollout_log_probs"])
    mask = batch["response_mask"]
    valid = as_bool_mask(mask)
    acc = _acc_eps(eps)
    log_ratio = old64 - rollout64
    lr = log_ratio.clamp(-corr.SAFETY_BOUND, corr.SAFETY_BOUND)
    lr_error = old64.abs() + rollout64.abs()  # what rounding of log ratios scales with
    keep = valid.clone()
    ambiguous = torch.zeros_like(valid)
    details = []
    n_row = valid.sum(dim=-1).to(torch.float64)
    for item in criteria:
        per_token = corr.token_divergence(lr, item.estimator)
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
        stat = item.statistic(log_ratio, mask)
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


def check_rs_mask(
    fn: Callable[..., Any], batch: Batch, *, criterion: str, threshold: float | str
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
      bounds is pointed out);
    * ``rs_mask.monotone``: moving the training log-probs halfway towards the rollout ones
      never drops a kept token (checked when every k1 interval contains ratio 1), and, with
      the keywords, neither does widening the bounds;
    * ``rs_mask.intersection`` (keywords, several criteria): the combined mask equals the
      intersection of the single-criterion masks.
    """
    criteria = corr.parse_rs_criteria(criterion, threshold)
    configurable = _accepts(fn, "criterion") and _accepts(fn, "threshold")
    mask = batch["response_mask"]
    valid = as_bool_mask(mask)
    dtypes: list[torch.dtype] = [batch["old_log_probs"].dtype]

    def call(b: Batch, crit: str = criterion, thr: float | str = threshold) -> Tensor:
        kwargs = {"criterion": crit, "threshold": thr} if configurable else {}
        out = _token_tensor("rs_mask", fn(*_is_inputs(b), **kwargs), mask.shape)
        if out.dtype != torch.bool:
            dtypes.append(out.dtype)
            not_binary = (out != 0) & (out != 1)
            if bool(not_binary.any()):
                _fail(
                    "rs_mask.binary",
                    "keep mask values must be 0/1",
                    [
                        f"(b={b_}, t={t}): {_g(float(out[b_, t]))}"
                        for b_, t in _positions(not_binary)
                    ],
                )
        return out != 0

    keep = call(batch)
    outside = keep & ~valid
    if bool(outside.any()):
        _fail(
            "rs_mask.subset_of_response_mask",
            "padding positions are marked as kept",
            [f"(b={b}, t={t})" for b, t in _positions(outside)],
        )
    if all(item.sequence_level for item in criteria):
        partial = [
            row
            for row in range(valid.shape[0])
            if 0 < int((keep[row] & valid[row]).sum()) < int(valid[row].sum())
        ]
        if partial:
            _fail(
                "rs_mask.whole_sequences",
                f"sequence criteria {criterion!r} kept only part of a sequence",
                [
                    f"row {row}: kept t={_positions(keep[row] & valid[row])}, "
                    f"dropped t={_positions(valid[row] & ~keep[row])}"
                    for row in partial
                ],
            )
    moved = call(_regarble(batch)) != keep
    if bool(moved.any()):
        _fail(
            "rs_mask.padding_independence",
            "changing only the garbage in padding positions changed the mask of valid tokens",
            [
                f"(b={b}, t={t}): kept={bool(keep[b, t])} -> {not bool(keep[b, t])}"
                for b, t in _positions(moved)
            ],
        )

    eps = _eps(*dtypes)
    reference, ambiguous, details = _rs_decisions(batch, criteria, eps)
    wrong = valid & (keep != reference) & ~ambiguous
    if bool(wrong.any()):
        log_ratio = _f64(batch["old_log_probs"]) - _f64(batch["rollout_log_probs"])
        lines = []
        for b, t in _positions(wrong):
            verdicts = []
            for item, stat, kept in details:
                value = float(stat[b] if item.sequence_level else stat[b, t])
                lo, hi = item.bounds()
                verdicts.append(
                    f"{item.name}={_g(value)} in [{_g(lo)}, {_g(hi)}]? "
                    f"{'keep' if kept[b, t] else 'drop'}"
                )
            lines.append(
                f"(b={b}, t={t}): fn {'keeps' if keep[b, t] else 'drops'}, reference "
                f"{'keeps' if reference[b, t] else 'drops'}; "
                f"ratio={_g(math.exp(float(log_ratio[b, t])))}; " + "; ".join(verdicts)
            )
        hint = _reciprocal_hint(batch, criteria, keep, wrong)
        _fail(
            "rs_mask.reference_agreement",
            f"{int(wrong.sum())} of {int(valid.sum())} valid tokens kept/dropped unlike the "
            f"reference for {criterion!r} with {threshold!r}{hint}",
            lines,
        )

    if all(item.lower is None or item.lower <= 1.0 <= item.upper for item in criteria):
        old, rollout = batch["old_log_probs"], batch["rollout_log_probs"]
        halfway = dict(batch)
        halfway["old_log_probs"] = _replace_valid(old, valid, rollout + (old - rollout) / 2)
        _, halfway_ambiguous, _ = _rs_decisions(halfway, criteria, eps)
        lost = keep & ~call(halfway) & ~halfway_ambiguous
        if bool(lost.any()):
            _fail(
                "rs_mask.monotone",
                "moving the training log-probs halfway towards the rollout log-probs (a smaller "
                "divergence) dropped tokens that were kept",
                [f"(b={b}, t={t})" for b, t in _positions(lost)],
            )
    if configurable:
        wide = _widened(criteria)
        lost = keep & ~call(batch, criterion, wide)
        if bool(lost.any()):
            _fail(
                "rs_mask.monotone",
                f"widening the bounds from {threshold!r} to {wide!r} dropped tokens that were kept",
                [f"(b={b}, t={t})" for b, t in _positions(lost)],
            )
        if len(criteria) > 1:
            combined = valid.clone()
            for item in criteria:
                combined &= call(batch, item.name, item.spec())
            differ = (combined != keep) & ~ambiguous
            if bool(differ.any()):
                _fail(
                    "rs_mask.intersection",
                    f"the mask for {criterion!r} is not the intersection of its single criteria",
                    [
                        f"(b={b}, t={t}): combined keeps={bool(keep[b, t])}, intersection keeps="
                        f"{bool(combined[b, t])}"
                        for b, t in _positions(differ)
                    ],
                )


def _reciprocal_hint(
    batch: Batch, criteria: Sequence[corr.RSCriterion], keep: Tensor, wrong: Tensor
) -> str:
    """Explain a disagreement that verl's reciprocal k1 bounds reproduce exactly."""
    if not any(item.estimator == "k1" for item in criteria):
        return ""
    swapped = [
        corr.RSCriterion(item.name, upper=1.0 / item.lower, lower=1.0 / item.upper)
        if item.lower is not None
        else item
        for item in criteria
    ]
    reciprocal, _, _ = _rs_decisions(batch, swapped, _F64_EPS)
    if bool((reciprocal[wrong] == keep[wrong]).all()):
        return (
            " — every disagreement matches keeping 1/upper ≤ ratio ≤ 1/lower (the reciprocal "
            "k1 bounds of verl's code) instead of lower ≤ ratio ≤ upper"
        )
    return ""


# --------------------------------------------------------------------------- loss evaluation


def _leaf_batch(batch: Batch) -> tuple[dict[str, Any], Tensor]:
    """A shallow copy of the batch whose ``log_probs`` is a fresh leaf requiring grad."""
    leaf = batch["log_probs"].detach().clone().requires_grad_(True)
    out = dict(batch)
    out["log_probs"] = leaf
    return out, leaf


def _scalar(name: str, output: Any) -> Tensor:
    value = _first(output)
    if not isinstance(value, Tensor):
        value = torch.as_tensor(value, dtype=torch.float64)
    if value.numel() != 1:
        _fail(f"{name}.shape", f"the loss must be a scalar, got shape {tuple(value.shape)}")
    return value.reshape(())


def _grad(loss: Tensor, leaf: Tensor) -> Tensor:
    if not loss.requires_grad:
        return torch.zeros_like(leaf, dtype=torch.float64)
    (grad,) = torch.autograd.grad(loss, leaf, allow_unused=True)
    return torch.zeros_like(leaf, dtype=torch.float64) if grad is None else _f64(grad)


def _loss_kwargs(
    loss_fn: Callable[..., Any], global_tokens: int, global_seqs: int, **extra: Any
) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"global_tokens": global_tokens, "global_seqs": global_seqs}
    for key, value in extra.items():
        if _accepts(loss_fn, key):
            kwargs[key] = value
    return kwargs


class _Evaluation:
    """Loss value and gradient w.r.t. ``log_probs`` (both float64) of one loss call."""

    def __init__(self, name: str, loss_fn: Callable[..., Any], batch: Batch, **extra: Any):
        global_tokens, global_seqs = _counts(batch)
        full, leaf = _leaf_batch(batch)
        loss = _scalar(
            name, loss_fn(full, **_loss_kwargs(loss_fn, global_tokens, global_seqs, **extra))
        )
        self.dtype = loss.dtype
        self.value = float(loss.detach())
        self.grad = _grad(loss, leaf)
        if not math.isfinite(self.value):
            _fail(f"{name}.finite", f"the loss is {self.value}")
        if not bool(torch.isfinite(self.grad).all()):
            bad = ~torch.isfinite(self.grad)
            _fail(
                f"{name}.finite",
                "non-finite gradient entries",
                [f"(b={b}, t={t}): {_g(float(self.grad[b, t]))}" for b, t in _positions(bad)],
            )


class _Tolerance:
    """Absolute tolerance for comparing two ways of computing the same loss."""

    def __init__(
        self, batch: Batch, dtypes: Sequence[torch.dtype], reference: _Evaluation, pieces: int = 1
    ):
        eps = _eps(batch["log_probs"].dtype, *dtypes)
        acc = _acc_eps(eps)
        valid = _valid(batch)
        n = int(valid.sum())
        magnitude = 1.0
        for key in _TOKEN_FLOATS:
            if key in batch and bool(valid.any()):
                magnitude = max(magnitude, 1.0 + float(_f64(batch[key])[valid].abs().max()))
        self.rtol = 8 * (eps * (2 + pieces) + acc * n)
        grad_scale = float(reference.grad.abs().sum()) * magnitude
        self.value_atol = self.rtol * (abs(reference.value) + grad_scale) + 1e-300
        self.grad_atol = 8 * (eps + acc * n) * float(reference.grad.abs().max()) + 1e-300
        self.grad_rtol = 8 * eps

    def value_close(self, a: float, b: float) -> bool:
        return abs(a - b) <= self.value_atol

    def grad_off(self, a: Tensor, b: Tensor) -> Tensor:
        return (a - b).abs() > self.grad_atol + self.grad_rtol * b.abs()


def _grad_lines(
    off: Tensor, got: Tensor, expected: Tensor, got_name: str, expected_name: str
) -> list[str]:
    return [
        f"(b={b}, t={t}): {got_name}={_g(float(got[b, t]))}, "
        f"{expected_name}={_g(float(expected[b, t]))}"
        for b, t in _positions(off)
    ]


def _compare(
    invariant: str,
    what: str,
    tolerance: _Tolerance,
    got: _Evaluation | tuple[float, Tensor],
    expected: _Evaluation,
    *,
    got_name: str,
    expected_name: str,
    details: Sequence[str] = (),
    grad_mask: Tensor | None = None,
) -> None:
    value, grad = (got.value, got.grad) if isinstance(got, _Evaluation) else got
    if not tolerance.value_close(value, expected.value):
        ratio = f" (ratio {_g(value / expected.value)})" if expected.value else ""
        _fail(
            invariant,
            f"{what}: {got_name} loss {_g(value)} != "
            f"{expected_name} loss {_g(expected.value)}{ratio}",
            details,
        )
    off = tolerance.grad_off(grad, expected.grad)
    if grad_mask is not None:
        off &= grad_mask
    if bool(off.any()):
        _fail(
            f"{invariant}.gradient",
            f"{what}: gradients w.r.t. log_probs differ at {int(off.sum())} positions",
            list(details) + _grad_lines(off, grad, expected.grad, got_name, expected_name),
        )


# --------------------------------------------------------------------------- split / DP


def check_split_invariance(
    loss_fn: Callable[..., Any],
    batch: Batch,
    *,
    n_splits: int = 2,
    dp_size: int = 1,
    grad_reduce: Literal["mean", "sum"] = "mean",
) -> None:
    """Micro-batch (and data-parallel) pieces must add up to the full-batch loss and gradient.

    ``loss_fn(micro_batch, *, global_tokens, global_seqs)`` is called on each piece with the
    counts of the whole batch. The pieces of a rank are summed (gradient accumulation).
    Several partitions are tried — contiguous by row count, greedy by token budget, and
    interleaved — so micro-batches hold different token counts whenever rows have different
    lengths; a per-micro-batch token mean, however it is weighted, cannot pass.

    DP variant (``dp_size > 1``): the rows are cut into ``dp_size`` contiguous shards (one
    per rank, possibly empty), each shard into ``n_splits`` micro-batches. A rank's loss is
    what it back-propagates; the gradient all-reduce then averages (``grad_reduce="mean"``,
    the usual DDP/FSDP behaviour) or sums the ranks' gradients. Averaging divides by
    ``dp_size``, so a correct loss multiplies its rank-local value by ``dp_size``: the
    checker passes ``dp_size=`` to ``loss_fn`` (it must accept that keyword) and compares
    ``Σ_ranks loss_rank / dp_size`` with the full batch computed as one rank (``dp_size=1``).
    Gradients are linear, so comparing the averaged losses is comparing the averaged
    gradients. A normalizer applied twice shows as a ratio of ``1/dp_size²``.

    Invariants: ``split_invariance`` (value), ``split_invariance.gradient``.
    """
    if dp_size > 1 and not _accepts(loss_fn, "dp_size"):
        raise TypeError(
            "check_split_invariance with dp_size > 1 needs a loss_fn accepting dp_size="
        )
    if grad_reduce not in ("mean", "sum"):
        raise ValueError(f"grad_reduce must be 'mean' or 'sum', got {grad_reduce!r}")
    global_tokens, global_seqs = _counts(batch)
    full = _Evaluation("split_invariance", loss_fn, batch, dp_size=1)
    mask = batch["response_mask"]
    shards = parallel.dp_shards(parallel.batch_size(batch), dp_size)
    schemes: dict[str, list[list[list[int]]]] = {}
    for shard in shards:
        local = parallel.micro_batch_splits(mask[shard], n_splits) if shard else {}
        for name in ("by_count", "by_token_budget", "interleaved"):
            pieces = [[shard[i] for i in piece] for piece in local.get(name, [])]
            schemes.setdefault(name, []).append(pieces)
    counts = parallel.token_counts(mask)
    for name, ranks in schemes.items():
        work, leaf = _leaf_batch(batch)
        total: Tensor | float = 0.0
        lines = []
        for rank, pieces in enumerate(ranks):
            for rows in pieces:
                piece = _scalar(
                    "split_invariance",
                    loss_fn(
                        parallel.select_rows(work, rows),
                        **_loss_kwargs(loss_fn, global_tokens, global_seqs, dp_size=dp_size),
                    ),
                )
                total = total + piece
                where = f"rank {rank} " if dp_size > 1 else ""
                lines.append(
                    f"{where}rows {rows} ({sum(counts[r] for r in rows)} valid tokens): "
                    f"loss {_g(float(piece.detach()))}"
                )
        if grad_reduce == "mean":
            total = total / dp_size
        total_t = torch.as_tensor(total)
        got = (float(total_t.detach()), _grad(total_t, leaf))
        tolerance = _Tolerance(batch, [full.dtype, total_t.dtype], full, pieces=len(lines))
        layout = f"{dp_size} DP ranks × " if dp_size > 1 else ""
        what = f"{layout}{n_splits} micro-batches split {name}"
        if dp_size > 1 and full.value and abs(got[0] / full.value * dp_size**2 - 1) < 1e-6:
            lines.append("ratio is 1/dp_size²: the DP normalizer looks applied twice")
        if dp_size > 1 and full.value and abs(got[0] / full.value * dp_size - 1) < 1e-6:
            lines.append(
                "ratio is 1/dp_size: the loss is not multiplied by dp_size before the "
                "mean all-reduce"
            )
        _compare(
            "split_invariance",
            what,
            tolerance,
            got,
            full,
            got_name="summed pieces",
            expected_name="full batch",
            details=lines,
        )


# --------------------------------------------------------------------------- layout invariances


def check_permutation_invariance(loss_fn: Callable[..., Any], batch: Batch) -> None:
    """Reordering the rows (reversed, rotated by one) changes neither the loss nor the gradient
    of each token. Invariants: ``permutation_invariance`` (value), ``….gradient``."""
    size = parallel.batch_size(batch)
    base = _Evaluation("permutation_invariance", loss_fn, batch)
    orders = {"reversed": list(range(size))[::-1], "rotated": [*range(1, size), 0]}
    for name, order in orders.items():
        if order == list(range(size)):
            continue
        moved = _Evaluation("permutation_invariance", loss_fn, parallel.select_rows(batch, order))
        device = moved.grad.device
        inverse = torch.empty(size, dtype=torch.long, device=device)
        inverse[torch.tensor(order, device=device)] = torch.arange(size, device=device)
        got = (moved.value, moved.grad[inverse])
        _compare(
            "permutation_invariance",
            f"rows {name} (order {order})",
            _Tolerance(batch, [base.dtype, moved.dtype], base),
            got,
            base,
            got_name="permuted",
            expected_name="original",
        )


def check_padding_invariance(loss_fn: Callable[..., Any], batch: Batch, *, extra: int = 3) -> None:
    """Padding must not matter: different garbage in the padding positions, and ``extra``
    more padding columns filled with garbage (on the batch's padding side), leave the loss
    and the gradient of every valid token unchanged; padding gets zero gradient.

    Note: ``seq-mean-token-sum-norm`` with its default normalizer (the padded length ``T``)
    is *not* padding invariant by definition; give it a fixed ``loss_scale_factor``.
    Invariants: ``padding_invariance`` (value), ``….gradient``, ``….padding_gradient``.
    """
    base = _Evaluation("padding_invariance", loss_fn, batch)
    valid = _valid(batch)
    leaked = ~valid & (base.grad != 0)
    if bool(leaked.any()):
        _fail(
            "padding_invariance.padding_gradient",
            "padding positions have a non-zero gradient",
            [f"(b={b}, t={t}): {_g(float(base.grad[b, t]))}" for b, t in _positions(leaked)],
        )
    regarbled = _Evaluation("padding_invariance", loss_fn, _regarble(batch))
    tolerance = _Tolerance(batch, [base.dtype, regarbled.dtype], base)
    _compare(
        "padding_invariance",
        "other garbage in the padding positions",
        tolerance,
        regarbled,
        base,
        got_name="regarbled",
        expected_name="original",
    )
    side = "left" if parallel.padding_side(batch["response_mask"]) == "left" else "right"
    wider = parallel.pad_columns(batch, extra, side=side, fill=57.5)
    widened = _Evaluation("padding_invariance", loss_fn, wider)
    keep = slice(extra, None) if side == "left" else slice(0, valid.shape[-1])
    extra_cols = slice(0, extra) if side == "left" else slice(valid.shape[-1], None)
    leaked = widened.grad[:, extra_cols] != 0
    if bool(leaked.any()):
        _fail(
            "padding_invariance.padding_gradient",
            f"{extra} extra padding columns on the {side} get a non-zero gradient",
            [f"(b={b}, extra column {t})" for b, t in _positions(leaked)],
        )
    _compare(
        "padding_invariance",
        f"{extra} extra garbage padding columns on the {side}",
        _Tolerance(batch, [base.dtype, widened.dtype], base),
        (widened.value, widened.grad[:, keep]),
        base,
        got_name="wider",
        expected_name="original",
    )


def check_packing_invariance(
    padded_loss_fn: Callable[..., Any], packed_loss_fn: Callable[..., Any], batch: Batch
) -> None:
    """The padded ``[B, T]`` loss equals the packed ``[1, ΣL]`` (remove-padding) loss.

    ``padded_loss_fn(batch, *, global_tokens, global_seqs)`` as everywhere;
    ``packed_loss_fn(packed, *, cu_seqlens, global_tokens, global_seqs)`` gets the batch
    from :func:`pytest_rollout_golden.parallel.pack`: token tensors ``[1, N]`` holding each
    row's valid tokens in order, an all-valid mask, ``uid`` unchanged, and ``cu_seqlens``
    (int32 ``[B + 1]``). A function handling both layouts can be passed twice. Gradients of
    the packed call are scattered back to ``[B, T]`` and compared.
    Invariants: ``packing_invariance`` (value), ``….gradient``.
    """
    padded = _Evaluation("packing_invariance", padded_loss_fn, batch)
    global_tokens, global_seqs = _counts(batch)
    packed, cu_seqlens = parallel.pack(batch)
    work, leaf = _leaf_batch(packed)
    loss = _scalar(
        "packing_invariance",
        packed_loss_fn(
            work, cu_seqlens=cu_seqlens, global_tokens=global_tokens, global_seqs=global_seqs
        ),
    )
    grad = parallel.unpack(_grad(loss, leaf), cu_seqlens, batch["response_mask"])
    _compare(
        "packing_invariance",
        f"packed into {int(cu_seqlens[-1])} tokens with cu_seqlens={cu_seqlens.tolist()}",
        _Tolerance(batch, [padded.dtype, loss.dtype], padded, pieces=2),
        (float(loss.detach()), grad),
        padded,
        got_name="packed",
        expected_name="padded",
    )


# --------------------------------------------------------------------------- PPO / advantages


def _on_policy(batch: Batch) -> dict[str, Any]:
    out = dict(batch)
    out["old_log_probs"] = batch["log_probs"].clone()
    out["rollout_log_probs"] = batch["log_probs"].clone()
    return out


def check_ppo_clip(
    loss_fn: Callable[..., Any],
    batch: Batch,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float | None = None,
    clip_ratio_c: float = 3.0,
    agg_mode: AggMode | None = None,
    loss_scale_factor: float | None = None,
) -> None:
    """Check a dual-clip PPO policy loss through its gradient pattern (and values).

    The checker sets ``rollout_log_probs = old_log_probs`` so that IS weights are 1 and RS
    keeps every token, then computes ``r = exp(log_probs - old_log_probs)``. Per token, the
    gradient must be zero where the objective is clipped and non-zero with the sign of
    ``-A`` elsewhere, whatever the aggregation:

    * ``ppo_clip.upper_clip``: ``A > 0`` and ``r > 1 + ε_high``;
    * ``ppo_clip.lower_clip``: ``A < 0`` and ``r < 1 - ε_low``;
    * ``ppo_clip.dual_clip``: ``A < 0`` and ``r > clip_ratio_c`` (the loss is capped at
      ``-A·clip_ratio_c``);
    * ``ppo_clip.unclipped_gradient``: every other token with ``A != 0``.

    Tokens whose ratio is within rounding of a clip boundary are not judged. With
    ``agg_mode`` the value and gradient must also match the reference
    (``ppo_clip.reference_agreement``), using the batch's global counts.
    """
    high = clip_ratio_low if clip_ratio_high is None else clip_ratio_high
    work = dict(batch)
    work["rollout_log_probs"] = batch["old_log_probs"].clone()
    result = _Evaluation("ppo_clip", loss_fn, work)
    valid = _valid(batch)
    eps = _eps(batch["log_probs"].dtype, result.dtype)
    log_ratio = _f64(batch["log_probs"]) - _f64(batch["old_log_probs"])
    ratio = log_ratio.clamp(-corr.SAFETY_BOUND, corr.SAFETY_BOUND).exp()
    advantages = _f64(batch["advantages"])
    band = 8 * eps * (1 + log_ratio.abs()) * ratio
    edges = (1 + high, 1 - clip_ratio_low, clip_ratio_c)
    near = torch.zeros_like(valid)
    for edge in edges:
        near |= (ratio - edge).abs() <= band * edge + 8 * eps
    near |= log_ratio.abs() >= corr.SAFETY_BOUND
    judged = valid & ~near
    positive, negative = advantages > 0, advantages < 0
    regions = {
        "ppo_clip.dual_clip": judged & negative & (ratio > clip_ratio_c),
        "ppo_clip.upper_clip": judged & positive & (ratio > 1 + high),
        "ppo_clip.lower_clip": judged & negative & (ratio < 1 - clip_ratio_low),
    }
    grad = result.grad
    zero_atol = 8 * eps * float(grad.abs().max()) + 1e-300
    expectations = {
        "ppo_clip.dual_clip": (
            f"A < 0 and ratio > clip_ratio_c={clip_ratio_c}: the loss is capped at -A·c"
        ),
        "ppo_clip.upper_clip": f"A > 0 and ratio > 1 + ε_high={1 + high}",
        "ppo_clip.lower_clip": f"A < 0 and ratio < 1 - ε_low={1 - clip_ratio_low}",
    }

    def line(b: int, t: int) -> str:
        return (
            f"(b={b}, t={t}): A={_g(float(advantages[b, t]))}, ratio={_g(float(ratio[b, t]))}, "
            f"gradient={_g(float(grad[b, t]))}"
        )

    for name, region in regions.items():
        moving = region & (grad.abs() > zero_atol)
        if bool(moving.any()):
            _fail(
                name,
                f"clipped tokens still have a gradient ({expectations[name]})",
                [line(*p) for p in _positions(moving)],
            )
    clipped = (
        regions["ppo_clip.dual_clip"]
        | regions["ppo_clip.upper_clip"]
        | regions["ppo_clip.lower_clip"]
    )
    free = judged & (advantages != 0) & ~clipped
    wrong = free & ~(grad * -advantages.sign() > 0)
    if bool(wrong.any()):
        _fail(
            "ppo_clip.unclipped_gradient",
            "unclipped tokens must have a gradient with the sign of -A",
            [line(*p) for p in _positions(wrong)],
        )
    if agg_mode is not None:
        global_tokens, global_seqs = _counts(batch)

        def reference(b: Batch, **_: Any) -> Tensor:
            return policy_loss(
                b["log_probs"],
                b["old_log_probs"],
                b["advantages"],
                b["response_mask"],
                agg_mode=agg_mode,
                global_tokens=global_tokens,
                global_seqs=global_seqs,
                loss_scale_factor=loss_scale_factor,
                clip_ratio_low=clip_ratio_low,
                clip_ratio_high=clip_ratio_high,
                clip_ratio_c=clip_ratio_c,
            )[0]

        expected = _Evaluation("ppo_clip", reference, _as_float64(work))
        _compare(
            "ppo_clip.reference_agreement",
            f"PPO-clip with agg_mode={agg_mode!r}",
            _Tolerance(batch, [result.dtype], expected),
            result,
            expected,
            got_name="fn",
            expected_name="reference",
            grad_mask=~near,
        )


def _as_float64(batch: Batch) -> dict[str, Any]:
    return {
        k: _f64(v) if isinstance(v, Tensor) and v.is_floating_point() else v
        for k, v in batch.items()
    }


def check_ppo_reduces_to_reinforce(
    ppo_loss_fn: Callable[..., Any], reinforce_loss_fn: Callable[..., Any], batch: Batch
) -> None:
    """On-policy (ratio 1), PPO-clip is the REINFORCE surrogate in value and gradient.

    The checker sets ``old_log_probs = rollout_log_probs = log_probs`` (so IS weights are 1)
    and calls both functions with the same aggregation. At ratio 1 no clip is active, so

    * ``ppo_reduces_to_reinforce.gradient``: ∇PPO = ∇REINFORCE (``-A·w`` per token);
    * ``ppo_reduces_to_reinforce``: the PPO value ``Σ -A·w`` equals the value of the
      REINFORCE surrogate in ratio form, which is the sum of its gradient entries (the
      log-prob form ``-A·log π`` has the same gradient but a different value).
    """
    work = _on_policy(batch)
    ppo = _Evaluation("ppo_reduces_to_reinforce", ppo_loss_fn, work)
    reinforce = _Evaluation("ppo_reduces_to_reinforce", reinforce_loss_fn, work)
    tolerance = _Tolerance(batch, [ppo.dtype, reinforce.dtype], reinforce, pieces=2)
    off = tolerance.grad_off(ppo.grad, reinforce.grad)
    if bool(off.any()):
        _fail(
            "ppo_reduces_to_reinforce.gradient",
            "at ratio 1 the PPO gradient differs from the REINFORCE gradient at "
            f"{int(off.sum())} positions",
            _grad_lines(off, ppo.grad, reinforce.grad, "ppo", "reinforce"),
        )
    surrogate = float(reinforce.grad.sum())
    if not tolerance.value_close(ppo.value, surrogate):
        _fail(
            "ppo_reduces_to_reinforce",
            f"at ratio 1 the PPO loss is {_g(ppo.value)}, but the REINFORCE surrogate in "
            "ratio form "
            f"(the sum of its gradient, Σ -A·w) is {_g(surrogate)}",
        )


def _with_advantages(batch: Batch, advantages: Tensor) -> dict[str, Any]:
    out = dict(batch)
    out["advantages"] = _replace_valid(batch["advantages"], _valid(batch), advantages)
    return out


def check_zero_advantage(loss_fn: Callable[..., Any], batch: Batch) -> None:
    """With all valid advantages zero (padding garbage kept), the policy loss and its gradient
    are zero. Point it at the policy-gradient term only (no KL or entropy term).
    Invariants: ``zero_advantage`` (value), ``zero_advantage.gradient``."""
    zeroed = _with_advantages(batch, torch.zeros_like(batch["advantages"]))
    result = _Evaluation("zero_advantage", loss_fn, zeroed)
    eps = _eps(batch["log_probs"].dtype, result.dtype)
    if abs(result.value) > 16 * eps:
        _fail("zero_advantage", f"all advantages are zero but the loss is {_g(result.value)}")
    moving = result.grad.abs() > 16 * eps
    if bool(moving.any()):
        _fail(
            "zero_advantage.gradient",
            "all advantages are zero but the gradient is not",
            [f"(b={b}, t={t}): {_g(float(result.grad[b, t]))}" for b, t in _positions(moving)],
        )


def check_linear_in_advantages(
    loss_fn: Callable[..., Any],
    batch: Batch,
    *,
    scales: Sequence[float] = (2.0, 0.25),
    additive: bool = False,
) -> None:
    """Scaling the valid advantages by ``c > 0`` scales the loss and gradient by ``c``.

    PPO-clip is only positively homogeneous (the clip side depends on the sign of A);
    REINFORCE is linear, so pass ``additive=True`` to also check ``L(A + A') = L(A) + L(A')``
    (with ``A'`` the advantages of the rows rotated by one) and ``L(-A) = -L(A)``. Powers of
    two keep the scaling exact. Invariants: ``linear_in_advantages.homogeneity``,
    ``linear_in_advantages.additivity`` (and ``.gradient`` variants).
    """
    base = _Evaluation("linear_in_advantages", loss_fn, batch)
    advantages = batch["advantages"]
    for scale in scales:
        if scale <= 0:
            raise ValueError(f"scales must be > 0 (got {scale}); use additive=True for negation")
        scaled = _Evaluation(
            "linear_in_advantages", loss_fn, _with_advantages(batch, advantages * scale)
        )
        expected = (base.value * scale, base.grad * scale)
        _compare(
            "linear_in_advantages.homogeneity",
            f"advantages × {scale}",
            _Tolerance(batch, [base.dtype, scaled.dtype], scaled),
            expected,
            scaled,
            got_name=f"{scale} × L(A)",
            expected_name=f"L({scale}·A)",
        )
    if not additive:
        return
    valid = _valid(batch)
    other = torch.where(valid, advantages, torch.zeros_like(advantages)).roll(1, dims=0)
    pairs = {
        "L(-A) = -L(A)": (-advantages, None),
        "L(A + A') = L(A) + L(A')": (advantages + other, other),
    }
    for what, (combined_adv, second) in pairs.items():
        combined = _Evaluation(
            "linear_in_advantages", loss_fn, _with_advantages(batch, combined_adv)
        )
        if second is None:
            expected = (-base.value, -base.grad)
        else:
            part = _Evaluation("linear_in_advantages", loss_fn, _with_advantages(batch, second))
            expected = (base.value + part.value, base.grad + part.grad)
        _compare(
            "linear_in_advantages.additivity",
            what,
            _Tolerance(batch, [base.dtype, combined.dtype], combined, pieces=2),
            expected,
            combined,
            got_name="sum of parts",
            expected_name="combined",
        )
