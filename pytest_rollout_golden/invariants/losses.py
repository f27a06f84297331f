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
    Batch,
    accepts,
    accumulation_roundoff,
    batch_counts,
    column_fill,
    digits_to_separate,
    f64,
    fail,
    fmt,
    garbage_padding,
    positions,
    refill_padding,
    replace_valid,
    resolve_tolerance,
    unequal_coefficients,
    unit_roundoff,
    valid_mask,
    versus,
)
from .evaluation import (
    Evaluation,
    LossTolerance,
    SplitRun,
    as_float64,
    compare_losses,
    grad_lines,
    gradient,
    leaf_batch,
    scalar_loss,
    split_invariance,
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


SeqCount = Literal["valid", "rows"]
"""What a sequence-level aggregation divides by: the sequences with at least one valid token
(``"valid"``, verl's ``global_seqs``) or every row, empty ones included (``"rows"``: TRL's
``loss_type="grpo"`` takes ``.mean()`` over the rows of each row's token mean)."""


_SPLIT_INVARIANTS: tuple[Callable[[SplitRun], None], ...] = (split_invariance,)
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
    run = SplitRun(
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
    base = Evaluation("permutation_invariance", loss_fn, batch)
    orders = {"reversed": list(range(size))[::-1], "rotated": [*range(1, size), 0]}
    for name, order in orders.items():
        if order == list(range(size)):
            continue
        moved = Evaluation("permutation_invariance", loss_fn, parallel.select_rows(batch, order))
        device = moved.grad.device
        inverse = torch.empty(size, dtype=torch.long, device=device)
        inverse[torch.tensor(order, device=device)] = torch.arange(size, device=device)
        got = (moved.value, moved.grad[inverse])
        compare_losses(
            "permutation_invariance",
            f"rows {name} (order {order})",
            LossTolerance(batch, [base.dtype, moved.dtype], base, rtol=rtol, atol=atol),
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
    base = Evaluation("padding_invariance", loss_fn, batch)
    valid = valid_mask(batch)
    leaked = ~valid & (base.grad != 0)
    if bool(leaked.any()):
        fail(
            "padding_invariance.padding_gradient",
            "padding positions have a non-zero gradient",
            [f"(b={b}, t={t}): {fmt(float(base.grad[b, t]))}" for b, t in positions(leaked)],
        )
    refilled = Evaluation("padding_invariance", loss_fn, refill_padding(batch))
    tolerance = LossTolerance(batch, [base.dtype, refilled.dtype], base, rtol=rtol, atol=atol)
    compare_losses(
        "padding_invariance",
        "other garbage in the padding positions",
        tolerance,
        refilled,
        base,
        got_name="regarbled",
        expected_name="original",
    )
    side = "left" if parallel.padding_side(batch["response_mask"]) == "left" else "right"
    wider = parallel.pad_columns(batch, extra, side=side)
    for key in parallel.token_keys(batch):
        if key != "response_mask":
            value = batch[key]
            fill = value.new_full((value.shape[0], extra), column_fill(key, value, valid))
            wider[key] = torch.cat([fill, value] if side == "left" else [value, fill], dim=-1)
    widened = Evaluation("padding_invariance", loss_fn, wider)
    keep = slice(extra, None) if side == "left" else slice(0, valid.shape[-1])
    extra_cols = slice(0, extra) if side == "left" else slice(valid.shape[-1], None)
    leaked = widened.grad[:, extra_cols] != 0
    if bool(leaked.any()):
        fail(
            "padding_invariance.padding_gradient",
            f"{extra} extra padding columns on the {side} get a non-zero gradient",
            [f"(b={b}, extra column {t})" for b, t in positions(leaked)],
        )
    compare_losses(
        "padding_invariance",
        f"{extra} extra garbage padding columns on the {side}",
        LossTolerance(batch, [base.dtype, widened.dtype], base, rtol=rtol, atol=atol),
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
    padded = Evaluation("packing_invariance", padded_loss_fn, batch)
    global_tokens, global_seqs = batch_counts(batch)
    packed, cu_seqlens = parallel.pack(batch)
    work, leaf = leaf_batch(packed)
    loss = scalar_loss(
        "packing_invariance",
        packed_loss_fn(
            work, cu_seqlens=cu_seqlens, global_tokens=global_tokens, global_seqs=global_seqs
        ),
    )
    grad = parallel.unpack(gradient(loss, leaf), cu_seqlens, batch["response_mask"])
    compare_losses(
        "packing_invariance",
        f"packed into {int(cu_seqlens[-1])} tokens with cu_seqlens={cu_seqlens.tolist()}",
        LossTolerance(batch, [padded.dtype, loss.dtype], padded, pieces=2, rtol=rtol, atol=atol),
        (float(loss.detach()), grad),
        padded,
        got_name="packed",
        expected_name="padded",
    )


# --------------------------------------------------------------------------- clipped ratios


@dataclass(frozen=True)
class ClipSettings:
    """What the user says a clipped-ratio loss computes, and the tolerance they ask for."""

    clip_ratio_low: float
    clip_ratio_high: float | None
    agg_mode: AggMode | None
    loss_scale_factor: float | None
    rtol: float | None
    atol: float | None
    seq_count: SeqCount = "valid"


class _ClipRun:
    """A clipped-ratio policy loss (PPO-clip, CISPO) evaluated on the batch with
    ``rollout_log_probs = old_log_probs``, and the float64 inputs its gradient is judged by.

    Subclasses set the ratio per token with :meth:`set_ratio`, the tokens ``judged``, and
    :meth:`line`, the description of one token.
    """

    name: str
    judged: Tensor

    def __init__(self, loss_fn: Callable[..., Any], batch: Batch, settings: ClipSettings):
        self.batch, self.settings, self.agg_mode = batch, settings, settings.agg_mode
        self.low = settings.clip_ratio_low
        self.high = self.low if settings.clip_ratio_high is None else settings.clip_ratio_high
        self.work = dict(batch)
        self.work["rollout_log_probs"] = batch["old_log_probs"].clone()
        self.result = Evaluation(self.name, loss_fn, self.work)
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
        rows = parallel.batch_size(self.batch)
        if settings.seq_count == "rows":
            global_seqs = rows
        elif settings.seq_count != "valid":
            raise ValueError(f"seq_count must be 'valid' or 'rows', got {settings.seq_count!r}")
        details = []
        if settings.seq_count == "valid" and global_seqs < rows:
            details.append(
                f"{rows - global_seqs} of {rows} rows have no valid token: a loss dividing by "
                "every row (TRL's loss_type='grpo') declares seq_count='rows'"
            )

        def reference(b: Batch, **_: Any) -> Tensor:
            inputs = (b["log_probs"], b["old_log_probs"], b["advantages"], b["response_mask"])
            counts = {"global_tokens": global_tokens, "global_seqs": global_seqs}
            return policy_loss(*inputs, **counts, **options)[0]

        expected = Evaluation(self.name, reference, as_float64(self.work))
        tolerance = LossTolerance(
            self.batch, [self.result.dtype], expected, rtol=settings.rtol, atol=settings.atol
        )
        compare_losses(
            f"{self.name}.reference_agreement",
            what,
            tolerance,
            self.result,
            expected,
            got_name="fn",
            expected_name="reference",
            details=details,
            grad_mask=~self.near,
        )


# --------------------------------------------------------------------------- PPO clip


class PPOClipRun(_ClipRun):
    """The clip regions of a dual-clip PPO loss: per token (or per sequence, GSPO) ratio,
    where the objective is clipped, and the tokens judged."""

    name = "ppo_clip"

    def __init__(
        self,
        loss_fn: Callable[..., Any],
        batch: Batch,
        settings: ClipSettings,
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


def _ppo_clip_dual_clip(run: PPOClipRun) -> None:
    run.clipped_with_gradient("ppo_clip.dual_clip")


def _ppo_clip_upper_clip(run: PPOClipRun) -> None:
    run.clipped_with_gradient("ppo_clip.upper_clip")


def _ppo_clip_lower_clip(run: PPOClipRun) -> None:
    run.clipped_with_gradient("ppo_clip.lower_clip")


def _ppo_clip_unclipped_gradient(run: PPOClipRun) -> None:
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


def _ppo_clip_reference_agreement(run: PPOClipRun) -> None:
    run.reference_agreement(
        f"PPO-clip with agg_mode={run.agg_mode!r}, ratio_level={run.ratio_level!r}",
        clip_ratio_c=run.clip_ratio_c,
        ratio_level=run.ratio_level,
    )


PPO_CLIP_INVARIANTS: tuple[Callable[[PPOClipRun], None], ...] = (
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
    seq_count: SeqCount = "valid",
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
    using the batch's global counts; ``seq_count="rows"`` declares that the sequence-level
    modes divide by every row, rows without a valid token included (TRL's ``grpo``).
    """
    settings = ClipSettings(
        clip_ratio_low, clip_ratio_high, agg_mode, loss_scale_factor, rtol, atol, seq_count
    )
    run = PPOClipRun(loss_fn, batch, settings, clip_ratio_c=clip_ratio_c, ratio_level=ratio_level)
    for invariant in PPO_CLIP_INVARIANTS:
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
    ppo = Evaluation("ppo_reduces_to_reinforce", ppo_loss_fn, work)
    reinforce = Evaluation("ppo_reduces_to_reinforce", reinforce_loss_fn, work)
    tolerance = LossTolerance(
        batch, [ppo.dtype, reinforce.dtype], reinforce, pieces=2, rtol=rtol, atol=atol
    )
    off = tolerance.grad_off(ppo.grad, reinforce.grad)
    if bool(off.any()):
        fail(
            "ppo_reduces_to_reinforce.gradient",
            "at ratio 1 the PPO gradient differs from the REINFORCE gradient at "
            f"{int(off.sum())} positions",
            grad_lines(off, ppo.grad, reinforce.grad, "ppo", "reinforce"),
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
    result = Evaluation("zero_advantage", loss_fn, zeroed)
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
    base = Evaluation("linear_in_advantages", loss_fn, batch)
    advantages = batch["advantages"]
    for scale in scales:
        if scale <= 0:
            raise ValueError(f"scales must be > 0 (got {scale}); use additive=True for negation")
        scaled = Evaluation(
            "linear_in_advantages", loss_fn, _with_advantages(batch, advantages * scale)
        )
        expected = (base.value * scale, base.grad * scale)
        compare_losses(
            "linear_in_advantages.homogeneity",
            f"advantages × {scale}",
            LossTolerance(batch, [base.dtype, scaled.dtype], scaled, rtol=rtol, atol=atol),
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
        combined = Evaluation(
            "linear_in_advantages", loss_fn, _with_advantages(batch, combined_adv)
        )
        if second is None:
            expected = (-base.value, -base.grad)
        else:
            part = Evaluation("linear_in_advantages", loss_fn, _with_advantages(batch, second))
            expected = (base.value + part.value, base.grad + part.grad)
        compare_losses(
            "linear_in_advantages.additivity",
            what,
            LossTolerance(
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

    def __init__(self, loss_fn: Callable[..., Any], batch: Batch, settings: ClipSettings):
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
    lines = [
        f"{run.line(b, t)}: gradient/(-A·w)={fmt(float(coefficient[b, t]))}, at "
        f"t={first} {fmt(float(coefficient[b, first]))}"
        for b, t, first in unequal_coefficients(coefficient, judged, slack, per_row=True)
    ]
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
    seq_count: SeqCount = "valid",
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
    ``seq_count`` as in :func:`check_ppo_clip`.
    """
    settings = ClipSettings(
        clip_ratio_low, clip_ratio_high, agg_mode, loss_scale_factor, rtol, atol, seq_count
    )
    run = _CISPORun(loss_fn, batch, settings)
    for invariant in _CISPO_INVARIANTS:
        invariant(run)
