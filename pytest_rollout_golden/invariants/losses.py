"""Checkers for policy losses: aggregation across micro-batches/DP/packing, PPO clip, advantages."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
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
    garbage_padding,
    holds_garbage,
    padding_hint,
    positions,
    refill_padding,
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


class _LossTolerance:
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
    tolerance: _LossTolerance,
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


class _SplitRun:
    """The full-batch loss of a split-invariance check, the row partitions (per scheme, per
    rank, the micro-batches' rows) and the counts every piece is called with."""

    def __init__(
        self,
        loss_fn: Callable[..., Any],
        batch: Batch,
        *,
        n_splits: int,
        dp_size: int,
        grad_reduce: Literal["mean", "sum"],
        rtol: float | None,
        atol: float | None,
    ):
        self.loss_fn, self.batch, self.n_splits, self.dp_size = loss_fn, batch, n_splits, dp_size
        self.grad_reduce, self.rtol, self.atol = grad_reduce, rtol, atol
        self.global_tokens, self.global_seqs = batch_counts(batch)
        self.full = _Evaluation("split_invariance", loss_fn, batch, dp_size=1)
        mask = batch["response_mask"]
        shards = parallel.dp_shards(parallel.batch_size(batch), dp_size)
        self.schemes: dict[str, list[list[list[int]]]] = {}
        for shard in shards:
            local = parallel.micro_batch_splits(mask[shard], n_splits) if shard else {}
            for name in ("by_count", "by_token_budget", "interleaved"):
                pieces = [[shard[i] for i in piece] for piece in local.get(name, [])]
                self.schemes.setdefault(name, []).append(pieces)
        self.row_tokens = parallel.token_counts(mask)

    def summed_pieces(self, ranks: list[list[list[int]]]) -> tuple[Tensor, Tensor, list[str]]:
        """What the ranks back-propagate, reduced as the all-reduce does; its gradient; one
        line per piece."""
        work, leaf = _leaf_batch(self.batch)
        total: Tensor | float = 0.0
        lines = []
        for rank, pieces in enumerate(ranks):
            for rows in pieces:
                kwargs = _loss_kwargs(
                    self.loss_fn,
                    self.global_tokens,
                    self.global_seqs,
                    dp_size=self.dp_size,
                    n_micro_batches=len(pieces),
                )
                piece = _scalar(
                    "split_invariance", self.loss_fn(parallel.select_rows(work, rows), **kwargs)
                )
                total = total + piece
                where = f"rank {rank} " if self.dp_size > 1 else ""
                lines.append(
                    f"{where}rows {rows} ({sum(self.row_tokens[r] for r in rows)} valid tokens): "
                    f"loss {fmt(float(piece.detach()))}"
                )
        if self.grad_reduce == "mean":
            total = total / self.dp_size
        total_t = torch.as_tensor(total)
        return total_t, _grad(total_t, leaf), lines

    def dp_hints(self, value: float) -> list[str]:
        """Name a ratio of ``1/dp_size`` or ``1/dp_size²`` to the full batch."""
        dp_size, full = self.dp_size, self.full.value
        hints = []
        if dp_size > 1 and full and abs(value / full * dp_size**2 - 1) < 1e-6:
            hints.append("ratio is 1/dp_size²: the DP normalizer looks applied twice")
        if dp_size > 1 and full and abs(value / full * dp_size - 1) < 1e-6:
            hints.append(
                "ratio is 1/dp_size: the loss is not multiplied by dp_size before the "
                "mean all-reduce"
            )
        return hints


def _split_invariance(run: _SplitRun) -> None:
    """Every partition scheme in turn: the summed pieces against the full batch."""
    for name, ranks in run.schemes.items():
        total, grad, lines = run.summed_pieces(ranks)
        got = (float(total.detach()), grad)
        tolerance = _LossTolerance(
            run.batch,
            [run.full.dtype, total.dtype],
            run.full,
            pieces=len(lines),
            rtol=run.rtol,
            atol=run.atol,
        )
        layout = f"{run.dp_size} DP ranks × " if run.dp_size > 1 else ""
        what = f"{layout}{run.n_splits} micro-batches split {name}"
        _compare(
            "split_invariance",
            what,
            tolerance,
            got,
            run.full,
            got_name="summed pieces",
            expected_name="full batch",
            details=lines + run.dp_hints(got[0]),
        )


_SPLIT_INVARIANTS: tuple[Callable[[_SplitRun], None], ...] = (_split_invariance,)
"""The invariants of :func:`check_split_invariance` (its value and ``.gradient`` parts are
judged together, scheme by scheme)."""


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
    run = _SplitRun(
        loss_fn,
        batch,
        n_splits=n_splits,
        dp_size=dp_size,
        grad_reduce=grad_reduce,
        rtol=rtol,
        atol=atol,
    )
    for invariant in _SPLIT_INVARIANTS:
        invariant(run)


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
            _LossTolerance(batch, [base.dtype, moved.dtype], base, rtol=rtol, atol=atol),
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
    refilled = _Evaluation("padding_invariance", loss_fn, refill_padding(batch))
    tolerance = _LossTolerance(batch, [base.dtype, refilled.dtype], base, rtol=rtol, atol=atol)
    _compare(
        "padding_invariance",
        "other garbage in the padding positions",
        tolerance,
        refilled,
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
        _LossTolerance(batch, [base.dtype, widened.dtype], base, rtol=rtol, atol=atol),
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
        _LossTolerance(batch, [padded.dtype, loss.dtype], padded, pieces=2, rtol=rtol, atol=atol),
        (float(loss.detach()), grad),
        padded,
        got_name="packed",
        expected_name="padded",
    )


# --------------------------------------------------------------------------- clipped ratios


@dataclass(frozen=True)
class _ClipSettings:
    """What the user says a clipped-ratio loss computes, and the tolerance they ask for."""

    clip_ratio_low: float
    clip_ratio_high: float | None
    agg_mode: AggMode | None
    loss_scale_factor: float | None
    rtol: float | None
    atol: float | None


class _ClipRun:
    """A clipped-ratio policy loss (PPO-clip, CISPO) evaluated on the batch with
    ``rollout_log_probs = old_log_probs``, and the float64 inputs its gradient is judged by.

    Subclasses set the ratio per token with :meth:`set_ratio`, the tokens ``judged``, and
    :meth:`line`, the description of one token.
    """

    name: str
    judged: Tensor

    def __init__(self, loss_fn: Callable[..., Any], batch: Batch, settings: _ClipSettings):
        self.batch, self.settings, self.agg_mode = batch, settings, settings.agg_mode
        self.low = settings.clip_ratio_low
        self.high = self.low if settings.clip_ratio_high is None else settings.clip_ratio_high
        self.work = dict(batch)
        self.work["rollout_log_probs"] = batch["old_log_probs"].clone()
        self.result = _Evaluation(self.name, loss_fn, self.work)
        self.grad = self.result.grad
        self.valid = valid_mask(batch)
        self.eps = unit_roundoff(batch["log_probs"].dtype, self.result.dtype)
        self.log_probs64, self.old64 = f64(batch["log_probs"]), f64(batch["old_log_probs"])
        self.log_ratio = self.log_probs64 - self.old64
        self.advantages = f64(batch["advantages"])

    def set_ratio(
        self, log_ratio: Tensor, edges: Sequence[float], limit: float, spread: Tensor | float = 0.0
    ) -> None:
        """Set ``ratio = exp(log_ratio)`` and ``near``, the tokens not judged: a ratio within
        rounding (plus ``spread``) of a clip edge, or a log ratio beyond ``±limit``."""
        eps = self.eps
        self.log_ratio = log_ratio
        self.ratio = log_ratio.clamp(-corr.SAFETY_BOUND, corr.SAFETY_BOUND).exp()
        band = (8 * eps * (1 + log_ratio.abs()) + spread) * self.ratio
        near = log_ratio.abs() >= limit
        for edge in edges:
            near |= (self.ratio - edge).abs() <= band * edge + 8 * eps
        self.near = near

    def line(self, b: int, t: int) -> str:
        raise NotImplementedError

    def against_minus_a(self, tokens: Tensor) -> Tensor:
        """Those of ``tokens`` whose gradient does not have the sign of ``-A``."""
        return tokens & ~(self.grad * -self.advantages.sign() > 0)

    def fail_at(self, invariant: str, summary: str, tokens: Tensor) -> None:
        if bool(tokens.any()):
            fail(invariant, summary, [self.line(*p) for p in positions(tokens)])

    def reference_agreement(self, what: str, **options: Any) -> None:
        """With ``agg_mode``, value and gradient equal the reference ``policy_loss`` (with
        the clip settings and ``options``) on the batch's global counts; gradients of tokens
        ``near`` an edge are not judged."""
        settings = self.settings
        if settings.agg_mode is None:
            return
        options |= {
            "agg_mode": settings.agg_mode,
            "loss_scale_factor": settings.loss_scale_factor,
            "clip_ratio_low": settings.clip_ratio_low,
            "clip_ratio_high": settings.clip_ratio_high,
        }
        global_tokens, global_seqs = batch_counts(self.batch)

        def reference(b: Batch, **_: Any) -> Tensor:
            inputs = (b["log_probs"], b["old_log_probs"], b["advantages"], b["response_mask"])
            counts = {"global_tokens": global_tokens, "global_seqs": global_seqs}
            return policy_loss(*inputs, **counts, **options)[0]

        expected = _Evaluation(self.name, reference, _as_float64(self.work))
        tolerance = _LossTolerance(
            self.batch, [self.result.dtype], expected, rtol=settings.rtol, atol=settings.atol
        )
        _compare(
            f"{self.name}.reference_agreement",
            what,
            tolerance,
            self.result,
            expected,
            got_name="fn",
            expected_name="reference",
            grad_mask=~self.near,
        )


def _as_float64(batch: Batch) -> dict[str, Any]:
    return {
        k: f64(v) if isinstance(v, Tensor) and v.is_floating_point() else v
        for k, v in batch.items()
    }


# --------------------------------------------------------------------------- PPO clip


class _PPOClipRun(_ClipRun):
    """The clip regions of a dual-clip PPO loss: per token (or per sequence, GSPO) ratio,
    where the objective is clipped, and the tokens judged."""

    name = "ppo_clip"

    def __init__(
        self,
        loss_fn: Callable[..., Any],
        batch: Batch,
        settings: _ClipSettings,
        *,
        clip_ratio_c: float | None,
        ratio_level: RatioLevel,
    ):
        super().__init__(loss_fn, batch, settings)
        self.clip_ratio_c, self.ratio_level = clip_ratio_c, ratio_level
        high, low = self.high, self.low
        self.edges = tuple(e for e in (1 + high, 1 - low, clip_ratio_c) if e is not None)
        log_ratio, limit, spread = self._level_ratio()
        self.set_ratio(log_ratio, self.edges, limit, spread)
        self.judged = judged = self.valid & ~self.near
        ratio, positive, negative = self.ratio, self.advantages > 0, self.advantages < 0
        dual_c = math.inf if clip_ratio_c is None else clip_ratio_c
        self.regions = {
            "ppo_clip.dual_clip": judged & negative & (ratio > dual_c),
            "ppo_clip.upper_clip": judged & positive & (ratio > 1 + high),
            "ppo_clip.lower_clip": judged & negative & (ratio < 1 - low),
        }
        self.expectations = {
            "ppo_clip.dual_clip": (
                f"A < 0 and ratio > clip_ratio_c={clip_ratio_c}: the loss is capped at -A·c"
            ),
            "ppo_clip.upper_clip": f"A > 0 and ratio > 1 + ε_high={1 + high}",
            "ppo_clip.lower_clip": f"A < 0 and ratio < 1 - ε_low={1 - low}",
        }

    def _level_ratio(self) -> tuple[Tensor, float, Tensor | float]:
        """The log ratio of each token at the ratio level, the log ratio beyond which a
        token is not judged, and the rounding the ratio carries beyond the token's own."""
        if self.ratio_level == "sequence":
            # The row mean carries the rounding of a sum over the row and possibly a count guard.
            log_probs64, old64, mask = self.log_probs64, self.old64, self.batch["response_mask"]
            acc = accumulation_roundoff(self.eps)
            magnitude = masked_mean(log_probs64.abs() + old64.abs(), mask, dim=-1)
            n_row = self.valid.sum(dim=-1).to(torch.float64)
            seq = sequence_log_ratio(log_probs64, old64, mask)
            spread = (8 * acc * n_row * magnitude + GUARD_RTOL * seq.abs()).unsqueeze(-1)
            return seq.unsqueeze(-1).expand_as(self.log_ratio), 10.0, spread
        if self.ratio_level == "token":
            return self.log_ratio, corr.SAFETY_BOUND, 0.0
        raise ValueError(f"ratio_level must be 'token' or 'sequence', got {self.ratio_level!r}")

    def line(self, b: int, t: int) -> str:
        value = float(self.ratio[b, t])
        digits = max(digits_to_separate(value, edge) for edge in self.edges)
        return (
            f"(b={b}, t={t}): A={fmt(float(self.advantages[b, t]))}, ratio={fmt(value, digits)}, "
            f"gradient={fmt(float(self.grad[b, t]))}"
        )

    def clipped_with_gradient(self, region: str) -> None:
        """Tokens of a clip region must have a zero gradient (up to rounding of the largest)."""
        zero_atol = 8 * self.eps * float(self.grad.abs().max()) + 1e-300
        moving = self.regions[region] & (self.grad.abs() > zero_atol)
        summary = f"clipped tokens still have a gradient ({self.expectations[region]})"
        self.fail_at(region, summary, moving)


def _ppo_clip_dual_clip(run: _PPOClipRun) -> None:
    run.clipped_with_gradient("ppo_clip.dual_clip")


def _ppo_clip_upper_clip(run: _PPOClipRun) -> None:
    run.clipped_with_gradient("ppo_clip.upper_clip")


def _ppo_clip_lower_clip(run: _PPOClipRun) -> None:
    run.clipped_with_gradient("ppo_clip.lower_clip")


def _ppo_clip_unclipped_gradient(run: _PPOClipRun) -> None:
    clipped = (
        run.regions["ppo_clip.dual_clip"]
        | run.regions["ppo_clip.upper_clip"]
        | run.regions["ppo_clip.lower_clip"]
    )
    free = run.judged & (run.advantages != 0) & ~clipped
    run.fail_at(
        "ppo_clip.unclipped_gradient",
        "unclipped tokens must have a gradient with the sign of -A",
        run.against_minus_a(free),
    )


def _ppo_clip_reference_agreement(run: _PPOClipRun) -> None:
    run.reference_agreement(
        f"PPO-clip with agg_mode={run.agg_mode!r}, ratio_level={run.ratio_level!r}",
        clip_ratio_c=run.clip_ratio_c,
        ratio_level=run.ratio_level,
    )


_PPO_CLIP_INVARIANTS: tuple[Callable[[_PPOClipRun], None], ...] = (
    _ppo_clip_dual_clip,
    _ppo_clip_upper_clip,
    _ppo_clip_lower_clip,
    _ppo_clip_unclipped_gradient,
    _ppo_clip_reference_agreement,
)
"""The invariants of :func:`check_ppo_clip`, in the order they are judged."""


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
    settings = _ClipSettings(
        clip_ratio_low, clip_ratio_high, agg_mode, loss_scale_factor, rtol, atol
    )
    run = _PPOClipRun(loss_fn, batch, settings, clip_ratio_c=clip_ratio_c, ratio_level=ratio_level)
    for invariant in _PPO_CLIP_INVARIANTS:
        invariant(run)


# --------------------------------------------------------------------------- PPO / advantages


def _on_policy(batch: Batch) -> dict[str, Any]:
    out = dict(batch)
    out["old_log_probs"] = batch["log_probs"].clone()
    out["rollout_log_probs"] = batch["log_probs"].clone()
    return out


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
    tolerance = _LossTolerance(
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
    """With all valid advantages zero, the policy loss and its gradient are zero. Point it at
    the policy-gradient term only (no KL or entropy term). The advantages' padding keeps its
    garbage, or gets some when it holds zeros (``rollout_batches(garbage=False)``): a loss
    that ignores its mask (an unmasked mean) then shows here on every batch with padding.
    Advantages are only multiplied, so this is safe for code that exponentiates log-probs
    before masking. Invariants: ``zero_advantage`` (value), ``zero_advantage.gradient``."""
    advantages = garbage_padding(batch["advantages"], valid_mask(batch))
    zeroed = _with_advantages({**batch, "advantages": advantages}, torch.zeros_like(advantages))
    result = _Evaluation("zero_advantage", loss_fn, zeroed)
    eps = unit_roundoff(batch["log_probs"].dtype, result.dtype)
    tolerance = resolve_tolerance(0.0, 16 * eps, rtol, atol)
    if tolerance.exceeded(result.value, 0.0):
        fail(
            "zero_advantage",
            f"all valid advantages are zero but the loss is {result.value!r} (padding "
            "advantages hold garbage: a loss that ignores its mask picks it up)",
        )
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
            _LossTolerance(batch, [base.dtype, scaled.dtype], scaled, rtol=rtol, atol=atol),
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
            _LossTolerance(
                batch, [base.dtype, combined.dtype], combined, pieces=2, rtol=rtol, atol=atol
            ),
            expected,
            combined,
            got_name="sum of parts",
            expected_name="combined",
        )


# --------------------------------------------------------------------------- CISPO


class _CISPORun(_ClipRun):
    """The clipped, detached weight ``w`` of a CISPO loss and the tokens judged."""

    name = "cispo"

    def __init__(self, loss_fn: Callable[..., Any], batch: Batch, settings: _ClipSettings):
        super().__init__(loss_fn, batch, settings)
        high, low = self.high, self.low
        self.set_ratio(self.log_ratio, edges=(1 + high, 1 - low), limit=corr.SAFETY_BOUND)
        self.weight = self.ratio.clamp(1 - low, 1 + high)
        self.judged = self.valid & ~self.near & (self.advantages != 0)
        self.clipped = (self.ratio > 1 + high) | (self.ratio < 1 - low)

    def line(self, b: int, t: int) -> str:
        return (
            f"(b={b}, t={t}): A={fmt(float(self.advantages[b, t]))}, "
            f"ratio={fmt(float(self.ratio[b, t]))}, "
            f"clipped weight={fmt(float(self.weight[b, t]))}, "
            f"log_prob={fmt(float(self.log_probs64[b, t]))}, "
            f"gradient={fmt(float(self.grad[b, t]))}"
        )


def _cispo_clipped_tokens_learn(run: _CISPORun) -> None:
    run.fail_at(
        "cispo.clipped_tokens_learn",
        "tokens outside the clip interval must keep a gradient of sign -A (CISPO clips "
        "the detached weight, not the objective)",
        run.against_minus_a(run.judged) & run.clipped,
    )


def _cispo_gradient_sign(run: _CISPORun) -> None:
    run.fail_at(
        "cispo.gradient_sign",
        "tokens must have a gradient with the sign of -A",
        run.against_minus_a(run.judged),
    )


def _cispo_stop_gradient(run: _CISPORun) -> None:
    """``gradient / (-A·w)`` is the aggregation coefficient: one value per row."""
    judged, weight, grad = run.judged, run.weight, run.grad
    coefficient = grad / (-run.advantages * weight).where(judged, torch.ones_like(weight))
    slack = 16 * run.eps * (2 + run.log_probs64.abs() + run.old64.abs()) + 2 * GUARD_RTOL
    lines = []
    for b in range(judged.shape[0]):
        columns = judged[b].nonzero().flatten().tolist()
        if len(columns) < 2:
            continue
        first = columns[0]
        for t in columns[1:]:
            allowed = (slack[b, first] + slack[b, t]) * abs(float(coefficient[b, first]))
            if abs(float(coefficient[b, t] - coefficient[b, first])) > allowed:
                lines.append(
                    f"{run.line(b, t)}: gradient/(-A·w)={fmt(float(coefficient[b, t]))}, at "
                    f"t={first} {fmt(float(coefficient[b, first]))}"
                )
    if lines:
        fail(
            "cispo.stop_gradient",
            "the gradient is not -A·w times one coefficient per row: the clipped weight w is "
            "not detached, or not clipped",
            lines,
        )


def _cispo_reference_agreement(run: _CISPORun) -> None:
    run.reference_agreement(f"CISPO with agg_mode={run.agg_mode!r}", loss_type="cispo")


_CISPO_INVARIANTS: tuple[Callable[[_CISPORun], None], ...] = (
    _cispo_clipped_tokens_learn,
    _cispo_gradient_sign,
    _cispo_stop_gradient,
    _cispo_reference_agreement,
)
"""The invariants of :func:`check_cispo`, in the order they are judged."""


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
    settings = _ClipSettings(
        clip_ratio_low, clip_ratio_high, agg_mode, loss_scale_factor, rtol, atol
    )
    run = _CISPORun(loss_fn, batch, settings)
    for invariant in _CISPO_INVARIANTS:
        invariant(run)
