"""Checkers for policy losses: aggregation across micro-batches/DP/packing, PPO clip, advantages."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch
from torch import Tensor

from .. import parallel
from ..reference import correction as corr
from ..reference.losses import AggMode, RatioLevel, policy_loss, sequence_log_ratio
from ..reference.masking import masked_mean
from .comparison import (
    GUARD_RTOL,
    TOKEN_FLOATS,
    Batch,
    accepts,
    accumulation_roundoff,
    batch_counts,
    digits_to_separate,
    f64,
    fail,
    first_item,
    fmt,
    holds_garbage,
    padding_hint,
    positions,
    regarble,
    replace_valid,
    resolve_tolerance,
    unit_roundoff,
    valid_mask,
    versus,
)

__all__ = [
    "check_cispo",
    "check_linear_in_advantages",
    "check_packing_invariance",
    "check_padding_invariance",
    "check_permutation_invariance",
    "check_ppo_clip",
    "check_ppo_reduces_to_reinforce",
    "check_split_invariance",
    "check_zero_advantage",
]


# --------------------------------------------------------------------------- loss evaluation


def _leaf_batch(batch: Batch) -> tuple[dict[str, Any], Tensor]:
    """A shallow copy of the batch whose ``log_probs`` is a fresh leaf requiring grad."""
    leaf = batch["log_probs"].detach().clone().requires_grad_(True)
    out = dict(batch)
    out["log_probs"] = leaf
    return out, leaf


def _scalar(name: str, output: Any) -> Tensor:
    value = first_item(output)
    if not isinstance(value, Tensor):
        value = torch.as_tensor(value, dtype=torch.float64)
    if value.numel() != 1:
        fail(f"{name}.shape", f"the loss must be a scalar, got shape {tuple(value.shape)}")
    return value.reshape(())


def _grad(loss: Tensor, leaf: Tensor) -> Tensor:
    if not loss.requires_grad:
        return torch.zeros_like(leaf, dtype=torch.float64)
    (grad,) = torch.autograd.grad(loss, leaf, allow_unused=True)
    return torch.zeros_like(leaf, dtype=torch.float64) if grad is None else f64(grad)


def _loss_kwargs(
    loss_fn: Callable[..., Any], global_tokens: int, global_seqs: int, **extra: Any
) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"global_tokens": global_tokens, "global_seqs": global_seqs}
    for key, value in extra.items():
        if accepts(loss_fn, key):
            kwargs[key] = value
    return kwargs


class _Evaluation:
    """Loss value and gradient w.r.t. ``log_probs`` (both float64) of one loss call."""

    def __init__(self, name: str, loss_fn: Callable[..., Any], batch: Batch, **extra: Any):
        extra.setdefault("n_micro_batches", 1)  # the whole batch in one piece
        global_tokens, global_seqs = batch_counts(batch)
        full, leaf = _leaf_batch(batch)
        loss = _scalar(
            name, loss_fn(full, **_loss_kwargs(loss_fn, global_tokens, global_seqs, **extra))
        )
        self.dtype = loss.dtype
        self.value = float(loss.detach())
        self.grad = _grad(loss, leaf)
        if not math.isfinite(self.value):
            fail(f"{name}.finite", f"the loss is {self.value}{padding_hint(batch)}")
        if not bool(torch.isfinite(self.grad).all()):
            bad = ~torch.isfinite(self.grad)
            fail(
                f"{name}.finite",
                f"non-finite gradient entries{padding_hint(batch)}",
                [f"(b={b}, t={t}): {fmt(float(self.grad[b, t]))}" for b, t in positions(bad)],
            )


class _Tolerance:
    """How far two ways of computing the same loss may differ, in value and per-token gradient.

    Default rule: rounding, ``8·(eps·(2 + pieces) + eps_acc·n)`` relative to the size of the
    loss (``|L|`` plus the magnitudes of its per-token terms, bounded by ``Σ|∇L|`` times the
    largest token value), plus :data:`GUARD_RTOL` for epsilon guards in denominators.
    Gradients: ``8·eps + GUARD_RTOL`` relative plus rounding of the largest entry. The user's
    ``rtol`` replaces the relative part of both, ``atol`` the absolute part.
    """

    def __init__(
        self,
        batch: Batch,
        dtypes: Sequence[torch.dtype],
        reference: _Evaluation,
        pieces: int = 1,
        rtol: float | None = None,
        atol: float | None = None,
    ):
        eps = unit_roundoff(batch["log_probs"].dtype, *dtypes)
        acc = accumulation_roundoff(eps)
        valid = valid_mask(batch)
        n = int(valid.sum())
        magnitude = 1.0
        for key in TOKEN_FLOATS:
            if key in batch and bool(valid.any()):
                magnitude = max(magnitude, 1.0 + float(f64(batch[key])[valid].abs().max()))
        rounding = 8 * (eps * (2 + pieces) + acc * n)
        self.value_scale = abs(reference.value) + float(reference.grad.abs().sum()) * magnitude
        self.value = resolve_tolerance(rounding + GUARD_RTOL, 1e-300, rtol, atol)
        grad_atol = 8 * (eps + acc * n) * float(reference.grad.abs().max()) + 1e-300
        self.grad = resolve_tolerance(8 * eps + GUARD_RTOL, grad_atol, rtol, atol)

    def value_close(self, a: float, b: float) -> bool:
        return not self.value.exceeded(a, b, self.value_scale)

    def grad_off(self, a: Tensor, b: Tensor) -> Tensor:
        return self.grad.exceeded(a, b)


def _grad_lines(
    off: Tensor, got: Tensor, expected: Tensor, got_name: str, expected_name: str
) -> list[str]:
    return [
        f"(b={b}, t={t}): "
        + versus(got_name, float(got[b, t]), expected_name, float(expected[b, t]))
        for b, t in positions(off)
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
        ratio = f", ratio {value / expected.value:.6g}" if expected.value else ""
        fail(
            invariant,
            f"{what}: loss {versus(got_name, value, expected_name, expected.value)}{ratio}",
            details,
        )
    off = tolerance.grad_off(grad, expected.grad)
    if grad_mask is not None:
        off &= grad_mask
    if bool(off.any()):
        fail(
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
    rtol: float | None = None,
    atol: float | None = None,
) -> None:
    """Micro-batch (and data-parallel) pieces must add up to the full-batch loss and gradient.

    ``loss_fn(micro_batch, *, global_tokens, global_seqs)`` is called on each piece with the
    counts of the whole batch. The pieces of a rank are summed (gradient accumulation). If
    ``loss_fn`` accepts ``n_micro_batches=``, it is told how many pieces its rank's batch was
    cut into (1 for the full batch), as a trainer scaling by ``1/gradient_accumulation_steps``
    knows it.
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
    if dp_size > 1 and not accepts(loss_fn, "dp_size"):
        raise TypeError(
            "check_split_invariance with dp_size > 1 needs a loss_fn accepting dp_size="
        )
    if grad_reduce not in ("mean", "sum"):
        raise ValueError(f"grad_reduce must be 'mean' or 'sum', got {grad_reduce!r}")
    global_tokens, global_seqs = batch_counts(batch)
    full = _Evaluation("split_invariance", loss_fn, batch, dp_size=1)
    mask = batch["response_mask"]
    shards = parallel.dp_shards(parallel.batch_size(batch), dp_size)
    schemes: dict[str, list[list[list[int]]]] = {}
    for shard in shards:
        local = parallel.micro_batch_splits(mask[shard], n_splits) if shard else {}
        for name in ("by_count", "by_token_budget", "interleaved"):
            pieces = [[shard[i] for i in piece] for piece in local.get(name, [])]
            schemes.setdefault(name, []).append(pieces)
    row_tokens = parallel.token_counts(mask)
    for name, ranks in schemes.items():
        work, leaf = _leaf_batch(batch)
        total: Tensor | float = 0.0
        lines = []
        for rank, pieces in enumerate(ranks):
            for rows in pieces:
                kwargs = _loss_kwargs(
                    loss_fn,
                    global_tokens,
                    global_seqs,
                    dp_size=dp_size,
                    n_micro_batches=len(pieces),
                )
                piece = _scalar(
                    "split_invariance", loss_fn(parallel.select_rows(work, rows), **kwargs)
                )
                total = total + piece
                where = f"rank {rank} " if dp_size > 1 else ""
                lines.append(
                    f"{where}rows {rows} ({sum(row_tokens[r] for r in rows)} valid tokens): "
                    f"loss {fmt(float(piece.detach()))}"
                )
        if grad_reduce == "mean":
            total = total / dp_size
        total_t = torch.as_tensor(total)
        got = (float(total_t.detach()), _grad(total_t, leaf))
        tolerance = _Tolerance(
            batch, [full.dtype, total_t.dtype], full, pieces=len(lines), rtol=rtol, atol=atol
        )
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


def check_permutation_invariance(
    loss_fn: Callable[..., Any],
    batch: Batch,
    *,
    rtol: float | None = None,
    atol: float | None = None,
) -> None:
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
            _Tolerance(batch, [base.dtype, moved.dtype], base, rtol=rtol, atol=atol),
            got,
            base,
            got_name="permuted",
            expected_name="original",
        )


def check_padding_invariance(
    loss_fn: Callable[..., Any],
    batch: Batch,
    *,
    extra: int = 3,
    rtol: float | None = None,
    atol: float | None = None,
) -> None:
    """Padding must not matter: different garbage in the padding positions, and ``extra``
    more padding columns filled with garbage (on the batch's padding side), leave the loss
    and the gradient of every valid token unchanged; padding gets zero gradient. A field
    whose padding holds only zeros (``rollout_batches(garbage=...)`` without it) keeps zeros
    there and in the extra columns.

    Note: ``seq-mean-token-sum-norm`` with its default normalizer (the padded length ``T``)
    is *not* padding invariant by definition; give it a fixed ``loss_scale_factor``.
    Invariants: ``padding_invariance`` (value), ``….gradient``, ``….padding_gradient``.
    """
    base = _Evaluation("padding_invariance", loss_fn, batch)
    valid = valid_mask(batch)
    leaked = ~valid & (base.grad != 0)
    if bool(leaked.any()):
        fail(
            "padding_invariance.padding_gradient",
            "padding positions have a non-zero gradient",
            [f"(b={b}, t={t}): {fmt(float(base.grad[b, t]))}" for b, t in positions(leaked)],
        )
    regarbled = _Evaluation("padding_invariance", loss_fn, regarble(batch))
    tolerance = _Tolerance(batch, [base.dtype, regarbled.dtype], base, rtol=rtol, atol=atol)
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
    for key in parallel.token_keys(batch):  # fields without garbage get zero columns
        if key != "response_mask" and not holds_garbage(batch[key], valid):
            value = batch[key]
            zeros = value.new_zeros((value.shape[0], extra))
            wider[key] = torch.cat([zeros, value] if side == "left" else [value, zeros], dim=-1)
    widened = _Evaluation("padding_invariance", loss_fn, wider)
    keep = slice(extra, None) if side == "left" else slice(0, valid.shape[-1])
    extra_cols = slice(0, extra) if side == "left" else slice(valid.shape[-1], None)
    leaked = widened.grad[:, extra_cols] != 0
    if bool(leaked.any()):
        fail(
            "padding_invariance.padding_gradient",
            f"{extra} extra padding columns on the {side} get a non-zero gradient",
            [f"(b={b}, extra column {t})" for b, t in positions(leaked)],
        )
    _compare(
        "padding_invariance",
        f"{extra} extra garbage padding columns on the {side}",
        _Tolerance(batch, [base.dtype, widened.dtype], base, rtol=rtol, atol=atol),
        (widened.value, widened.grad[:, keep]),
        base,
        got_name="wider",
        expected_name="original",
    )


def check_packing_invariance(
    padded_loss_fn: Callable[..., Any],
    packed_loss_fn: Callable[..., Any],
    batch: Batch,
    *,
    rtol: float | None = None,
    atol: float | None = None,
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
    global_tokens, global_seqs = batch_counts(batch)
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
        _Tolerance(batch, [padded.dtype, loss.dtype], padded, pieces=2, rtol=rtol, atol=atol),
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
    clip_ratio_c: float | None = 3.0,
    agg_mode: AggMode | None = None,
    loss_scale_factor: float | None = None,
    ratio_level: RatioLevel = "token",
    rtol: float | None = None,
    atol: float | None = None,
) -> None:
    """Check a dual-clip PPO policy loss through its gradient pattern (and values).

    The checker sets ``rollout_log_probs = old_log_probs`` so that IS weights are 1 and RS
    keeps every token, then computes ``r = exp(log_probs - old_log_probs)`` per token, or,
    with ``ratio_level="sequence"`` (GSPO), the sequence ratio
    ``s_i = exp(mean over the row's valid tokens of (log_probs - old_log_probs))`` for every
    token of the row. ``clip_ratio_c=None`` means no dual clip (GSPO has none). Per token, the
    gradient must be zero where the objective is clipped and non-zero with the sign of
    ``-A`` elsewhere, whatever the aggregation:

    * ``ppo_clip.upper_clip``: ``A > 0`` and ``r > 1 + ε_high``;
    * ``ppo_clip.lower_clip``: ``A < 0`` and ``r < 1 - ε_low``;
    * ``ppo_clip.dual_clip``: ``A < 0`` and ``r > clip_ratio_c`` (the loss is capped at
      ``-A·clip_ratio_c``);
    * ``ppo_clip.unclipped_gradient``: every other token with ``A != 0``.

    Tokens whose ratio is within rounding of a clip boundary are not judged, nor tokens whose
    log ratio is beyond ±20 (±10 for sequence ratios, where verl clamps). With ``agg_mode``
    the value and gradient must also match the reference (``ppo_clip.reference_agreement``),
    using the batch's global counts.
    """
    high = clip_ratio_low if clip_ratio_high is None else clip_ratio_high
    work = dict(batch)
    work["rollout_log_probs"] = batch["old_log_probs"].clone()
    result = _Evaluation("ppo_clip", loss_fn, work)
    valid = valid_mask(batch)
    mask = batch["response_mask"]
    eps = unit_roundoff(batch["log_probs"].dtype, result.dtype)
    log_probs64, old64 = f64(batch["log_probs"]), f64(batch["old_log_probs"])
    log_ratio = log_probs64 - old64
    if ratio_level == "sequence":
        # The row mean carries the rounding of a sum over the row and possibly a count guard.
        acc = accumulation_roundoff(eps)
        magnitude = masked_mean(log_probs64.abs() + old64.abs(), mask, dim=-1)
        n_row = valid.sum(dim=-1).to(torch.float64)
        seq = sequence_log_ratio(log_probs64, old64, mask)
        log_ratio = seq.unsqueeze(-1).expand_as(log_ratio)
        spread = (8 * acc * n_row * magnitude + GUARD_RTOL * seq.abs()).unsqueeze(-1)
        limit = 10.0
    elif ratio_level == "token":
        spread = torch.zeros_like(log_ratio)
        limit = corr.SAFETY_BOUND
    else:
        raise ValueError(f"ratio_level must be 'token' or 'sequence', got {ratio_level!r}")
    ratio = log_ratio.clamp(-corr.SAFETY_BOUND, corr.SAFETY_BOUND).exp()
    advantages = f64(batch["advantages"])
    band = (8 * eps * (1 + log_ratio.abs()) + spread) * ratio
    edges = tuple(e for e in (1 + high, 1 - clip_ratio_low, clip_ratio_c) if e is not None)
    near = torch.zeros_like(valid)
    for edge in edges:
        near |= (ratio - edge).abs() <= band * edge + 8 * eps
    near |= log_ratio.abs() >= limit
    judged = valid & ~near
    positive, negative = advantages > 0, advantages < 0
    dual_c = math.inf if clip_ratio_c is None else clip_ratio_c
    regions = {
        "ppo_clip.dual_clip": judged & negative & (ratio > dual_c),
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
        value = float(ratio[b, t])
        digits = max(digits_to_separate(value, edge) for edge in edges)
        return (
            f"(b={b}, t={t}): A={fmt(float(advantages[b, t]))}, ratio={fmt(value, digits)}, "
            f"gradient={fmt(float(grad[b, t]))}"
        )

    for name, region in regions.items():
        moving = region & (grad.abs() > zero_atol)
        if bool(moving.any()):
            fail(
                name,
                f"clipped tokens still have a gradient ({expectations[name]})",
                [line(*p) for p in positions(moving)],
            )
    clipped = (
        regions["ppo_clip.dual_clip"]
        | regions["ppo_clip.upper_clip"]
        | regions["ppo_clip.lower_clip"]
    )
    free = judged & (advantages != 0) & ~clipped
    wrong = free & ~(grad * -advantages.sign() > 0)
    if bool(wrong.any()):
        fail(
            "ppo_clip.unclipped_gradient",
            "unclipped tokens must have a gradient with the sign of -A",
            [line(*p) for p in positions(wrong)],
        )
    if agg_mode is not None:
        global_tokens, global_seqs = batch_counts(batch)

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
                ratio_level=ratio_level,
            )[0]

        expected = _Evaluation("ppo_clip", reference, _as_float64(work))
        _compare(
            "ppo_clip.reference_agreement",
            f"PPO-clip with agg_mode={agg_mode!r}, ratio_level={ratio_level!r}",
            _Tolerance(batch, [result.dtype], expected, rtol=rtol, atol=atol),
            result,
            expected,
            got_name="fn",
            expected_name="reference",
            grad_mask=~near,
        )


def _as_float64(batch: Batch) -> dict[str, Any]:
    return {
        k: f64(v) if isinstance(v, Tensor) and v.is_floating_point() else v
        for k, v in batch.items()
    }


def check_ppo_reduces_to_reinforce(
    ppo_loss_fn: Callable[..., Any],
    reinforce_loss_fn: Callable[..., Any],
    batch: Batch,
    *,
    rtol: float | None = None,
    atol: float | None = None,
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
    tolerance = _Tolerance(
        batch, [ppo.dtype, reinforce.dtype], reinforce, pieces=2, rtol=rtol, atol=atol
    )
    off = tolerance.grad_off(ppo.grad, reinforce.grad)
    if bool(off.any()):
        fail(
            "ppo_reduces_to_reinforce.gradient",
            "at ratio 1 the PPO gradient differs from the REINFORCE gradient at "
            f"{int(off.sum())} positions",
            _grad_lines(off, ppo.grad, reinforce.grad, "ppo", "reinforce"),
        )
    surrogate = float(reinforce.grad.sum())
    if not tolerance.value_close(ppo.value, surrogate):
        fail(
            "ppo_reduces_to_reinforce",
            "at ratio 1 the PPO loss differs from the REINFORCE surrogate in ratio form (the "
            f"sum of its gradient, Σ -A·w): {versus('ppo', ppo.value, 'surrogate', surrogate)}",
        )


def _with_advantages(batch: Batch, advantages: Tensor) -> dict[str, Any]:
    out = dict(batch)
    out["advantages"] = replace_valid(batch["advantages"], valid_mask(batch), advantages)
    return out


def check_zero_advantage(
    loss_fn: Callable[..., Any],
    batch: Batch,
    *,
    rtol: float | None = None,
    atol: float | None = None,
) -> None:
    """With all valid advantages zero (padding garbage kept), the policy loss and its gradient
    are zero. Point it at the policy-gradient term only (no KL or entropy term).
    Invariants: ``zero_advantage`` (value), ``zero_advantage.gradient``."""
    zeroed = _with_advantages(batch, torch.zeros_like(batch["advantages"]))
    result = _Evaluation("zero_advantage", loss_fn, zeroed)
    eps = unit_roundoff(batch["log_probs"].dtype, result.dtype)
    tolerance = resolve_tolerance(0.0, 16 * eps, rtol, atol)
    if tolerance.exceeded(result.value, 0.0):
        fail("zero_advantage", f"all advantages are zero but the loss is {result.value!r}")
    moving = tolerance.exceeded(result.grad, 0.0)
    if bool(moving.any()):
        fail(
            "zero_advantage.gradient",
            "all advantages are zero but the gradient is not",
            [f"(b={b}, t={t}): {fmt(float(result.grad[b, t]))}" for b, t in positions(moving)],
        )


def check_linear_in_advantages(
    loss_fn: Callable[..., Any],
    batch: Batch,
    *,
    scales: Sequence[float] = (2.0, 0.25),
    additive: bool = False,
    rtol: float | None = None,
    atol: float | None = None,
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
            _Tolerance(batch, [base.dtype, scaled.dtype], scaled, rtol=rtol, atol=atol),
            expected,
            scaled,
            got_name=f"{scale} × L(A)",
            expected_name=f"L({scale}·A)",
        )
    if not additive:
        return
    valid = valid_mask(batch)
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
            _Tolerance(
                batch, [base.dtype, combined.dtype], combined, pieces=2, rtol=rtol, atol=atol
            ),
            expected,
            combined,
            got_name="sum of parts",
            expected_name="combined",
        )


# --------------------------------------------------------------------------- CISPO


def check_cispo(
    loss_fn: Callable[..., Any],
    batch: Batch,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float | None = None,
    agg_mode: AggMode | None = None,
    loss_scale_factor: float | None = None,
    rtol: float | None = None,
    atol: float | None = None,
) -> None:
    """Check a CISPO policy loss ``-sg(clamp(r, 1-ε_low, 1+ε_high))·A·log π`` through its
    gradient (and, with ``agg_mode``, its value).

    As in :func:`check_ppo_clip` the checker sets ``rollout_log_probs = old_log_probs`` and
    computes ``r = exp(log_probs - old_log_probs)`` and the clipped weight ``w``. With ``c_t``
    the aggregation's coefficient of token ``t``, the gradient is ``-A_t·w_t·c_t``:

    * ``cispo.clipped_tokens_learn``: tokens whose ratio is outside the interval keep a
      gradient of sign ``-A`` (PPO-clip would zero it);
    * ``cispo.gradient_sign``: every other token with ``A != 0`` has a gradient of sign ``-A``;
    * ``cispo.stop_gradient``: ``gradient / (-A·w)`` is the same for every judged token of a
      row (whatever the aggregation, ``c_t`` depends on the row at most). A weight that is
      not detached adds ``-A·log π·∂w``; an unclipped weight gives ``r`` instead of ``w``;
    * ``cispo.reference_agreement`` (with ``agg_mode``): value and gradient.

    Tokens within rounding of a clip bound, or with a log ratio beyond ±20, are not judged.
    """
    high = clip_ratio_low if clip_ratio_high is None else clip_ratio_high
    work = dict(batch)
    work["rollout_log_probs"] = batch["old_log_probs"].clone()
    result = _Evaluation("cispo", loss_fn, work)
    valid = valid_mask(batch)
    eps = unit_roundoff(batch["log_probs"].dtype, result.dtype)
    log_probs64, old64 = f64(batch["log_probs"]), f64(batch["old_log_probs"])
    log_ratio = log_probs64 - old64
    ratio = log_ratio.clamp(-corr.SAFETY_BOUND, corr.SAFETY_BOUND).exp()
    weight = ratio.clamp(1 - clip_ratio_low, 1 + high)
    advantages = f64(batch["advantages"])
    band = 8 * eps * (1 + log_ratio.abs()) * ratio
    near = log_ratio.abs() >= corr.SAFETY_BOUND
    for edge in (1 + high, 1 - clip_ratio_low):
        near |= (ratio - edge).abs() <= band * edge + 8 * eps
    judged = valid & ~near & (advantages != 0)
    clipped = (ratio > 1 + high) | (ratio < 1 - clip_ratio_low)
    grad = result.grad

    def line(b: int, t: int) -> str:
        return (
            f"(b={b}, t={t}): A={fmt(float(advantages[b, t]))}, ratio={fmt(float(ratio[b, t]))}, "
            f"clipped weight={fmt(float(weight[b, t]))}, log_prob={fmt(float(log_probs64[b, t]))}, "
            f"gradient={fmt(float(grad[b, t]))}"
        )

    wrong = judged & ~(grad * -advantages.sign() > 0)
    for name, region, what in (
        (
            "cispo.clipped_tokens_learn",
            wrong & clipped,
            "tokens outside the clip interval must keep a gradient of sign -A (CISPO clips "
            "the detached weight, not the objective)",
        ),
        ("cispo.gradient_sign", wrong, "tokens must have a gradient with the sign of -A"),
    ):
        if bool(region.any()):
            fail(name, what, [line(*p) for p in positions(region)])

    # gradient / (-A·w) is the aggregation coefficient: one value per row.
    coefficient = grad / (-advantages * weight).where(judged, torch.ones_like(weight))
    slack = 16 * eps * (2 + log_probs64.abs() + old64.abs()) + 2 * GUARD_RTOL
    lines = []
    uneven = torch.zeros_like(valid)
    for b in range(valid.shape[0]):
        columns = judged[b].nonzero().flatten().tolist()
        if len(columns) < 2:
            continue
        first = columns[0]
        for t in columns[1:]:
            allowed = (slack[b, first] + slack[b, t]) * abs(float(coefficient[b, first]))
            if abs(float(coefficient[b, t] - coefficient[b, first])) > allowed:
                uneven[b, t] = True
                lines.append(
                    f"{line(b, t)}: gradient/(-A·w)={fmt(float(coefficient[b, t]))}, at "
                    f"t={first} {fmt(float(coefficient[b, first]))}"
                )
    if lines:
        fail(
            "cispo.stop_gradient",
            "the gradient is not -A·w times one coefficient per row: the clipped weight w is "
            "not detached, or not clipped",
            lines,
        )
    if agg_mode is not None:
        global_tokens, global_seqs = batch_counts(batch)

        def reference(b: Batch, **_: Any) -> Tensor:
            return policy_loss(
                b["log_probs"],
                b["old_log_probs"],
                b["advantages"],
                b["response_mask"],
                loss_type="cispo",
                agg_mode=agg_mode,
                global_tokens=global_tokens,
                global_seqs=global_seqs,
                loss_scale_factor=loss_scale_factor,
                clip_ratio_low=clip_ratio_low,
                clip_ratio_high=clip_ratio_high,
            )[0]

        expected = _Evaluation("cispo", reference, _as_float64(work))
        _compare(
            "cispo.reference_agreement",
            f"CISPO with agg_mode={agg_mode!r}",
            _Tolerance(batch, [result.dtype], expected, rtol=rtol, atol=atol),
            result,
            expected,
            got_name="fn",
            expected_name="reference",
            grad_mask=~near,
        )
