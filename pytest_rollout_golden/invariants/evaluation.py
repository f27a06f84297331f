"""How the loss checkers evaluate a user's loss: its value and gradient w.r.t. one batch
field (float64), the tolerance two computations of one loss are judged by, and the sum of a
loss over micro-batches and data-parallel ranks against the full batch."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Literal, Protocol

import torch
from torch import Tensor

from .. import parallel
from .comparison import (
    GUARD_RTOL,
    TOKEN_FLOATS,
    Batch,
    accepts,
    accumulation_roundoff,
    batch_counts,
    f64,
    fail,
    first_item,
    fmt,
    padding_hint,
    positions,
    resolve_tolerance,
    unit_roundoff,
    valid_mask,
    versus,
)


def leaf_batch(batch: Batch, wrt: str = "log_probs") -> tuple[dict[str, Any], Tensor]:
    """A shallow copy of the batch whose ``wrt`` field is a fresh leaf requiring grad."""
    leaf = batch[wrt].detach().clone().requires_grad_(True)
    out = dict(batch)
    out[wrt] = leaf
    return out, leaf


def scalar_loss(name: str, output: Any) -> Tensor:
    value = first_item(output)
    if not isinstance(value, Tensor):
        value = torch.as_tensor(value, dtype=torch.float64)
    if value.numel() != 1:
        fail(f"{name}.shape", f"the loss must be a scalar, got shape {tuple(value.shape)}")
    return value.reshape(())


def gradient(loss: Tensor, leaf: Tensor) -> Tensor:
    if not loss.requires_grad:
        return torch.zeros_like(leaf, dtype=torch.float64)
    (grad,) = torch.autograd.grad(loss, leaf, allow_unused=True)
    return torch.zeros_like(leaf, dtype=torch.float64) if grad is None else f64(grad)


# Keywords passed only to a loss that names them: a ``**kwargs`` wrapper forwarding to a loss
# written before them would otherwise receive a keyword its callee does not take.
_BY_NAME_ONLY = frozenset({"global_rows"})


def loss_kwargs(
    loss_fn: Callable[..., Any], global_tokens: int, global_seqs: int, **extra: Any
) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"global_tokens": global_tokens, "global_seqs": global_seqs}
    for key, value in extra.items():
        if accepts(loss_fn, key, by_name=key in _BY_NAME_ONLY):
            kwargs[key] = value
    return kwargs


class Evaluation:
    """Loss value and gradient w.r.t. the batch's ``wrt`` field (both float64) of one loss
    call; ``extra`` keywords are passed where ``loss_fn`` accepts them."""

    def __init__(
        self,
        name: str,
        loss_fn: Callable[..., Any],
        batch: Batch,
        *,
        wrt: str = "log_probs",
        **extra: Any,
    ):
        extra.setdefault("n_micro_batches", 1)  # the whole batch in one piece
        extra.setdefault("global_rows", parallel.batch_size(batch))
        self.wrt = wrt
        global_tokens, global_seqs = batch_counts(batch)
        full, leaf = leaf_batch(batch, wrt)
        loss = scalar_loss(
            name, loss_fn(full, **loss_kwargs(loss_fn, global_tokens, global_seqs, **extra))
        )
        self.dtype = loss.dtype
        self.value = float(loss.detach())
        self.grad = gradient(loss, leaf)
        if not math.isfinite(self.value):
            fail(f"{name}.finite", f"the loss is {self.value}{padding_hint(batch)}")
        if not bool(torch.isfinite(self.grad).all()):
            bad = ~torch.isfinite(self.grad)
            fail(
                f"{name}.finite",
                f"non-finite gradient entries{padding_hint(batch)}",
                [f"(b={b}, t={t}): {fmt(float(self.grad[b, t]))}" for b, t in positions(bad)],
            )


SplitHints = Callable[[list[list[list[int]]], float], list[str]]
"""Lines naming the likely cause of a split-invariance failure, from the ranks' micro-batch
rows and the summed loss."""


class LossAllowance(Protocol):
    """What :func:`compare_losses` asks of a tolerance."""

    def value_close(self, a: float, b: float) -> bool: ...

    def grad_off(self, a: Tensor, b: Tensor) -> Tensor: ...


class LossTolerance:
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
        reference: Evaluation,
        pieces: int = 1,
        rtol: float | None = None,
        atol: float | None = None,
    ):
        eps = unit_roundoff(batch[reference.wrt].dtype, *dtypes)
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


def grad_lines(
    off: Tensor, got: Tensor, expected: Tensor, got_name: str, expected_name: str
) -> list[str]:
    return [
        f"(b={b}, t={t}): "
        + versus(got_name, float(got[b, t]), expected_name, float(expected[b, t]))
        for b, t in positions(off)
    ]


def compare_losses(
    invariant: str,
    what: str,
    tolerance: LossAllowance,
    got: Evaluation | tuple[float, Tensor],
    expected: Evaluation,
    *,
    got_name: str,
    expected_name: str,
    details: Sequence[str] = (),
    grad_mask: Tensor | None = None,
) -> None:
    value, grad = (got.value, got.grad) if isinstance(got, Evaluation) else got
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
            f"{what}: gradients w.r.t. {expected.wrt} differ at {int(off.sum())} positions",
            list(details) + grad_lines(off, grad, expected.grad, got_name, expected_name),
        )


# --------------------------------------------------------------------------- split / DP


class SplitRun:
    """The full-batch loss of a split-invariance check (reported as the invariant ``name``,
    gradients taken w.r.t. the field ``wrt``), the row partitions (per scheme, per rank, the
    micro-batches' rows) and the counts every piece is called with. ``hints(ranks, summed)``
    adds lines naming the likely cause of a disagreement."""

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
        name: str = "split_invariance",
        wrt: str = "log_probs",
        hints: SplitHints | None = None,
    ):
        self.loss_fn, self.batch, self.n_splits, self.dp_size = loss_fn, batch, n_splits, dp_size
        self.grad_reduce, self.rtol, self.atol = grad_reduce, rtol, atol
        self.name, self.wrt, self.hints = name, wrt, hints
        self.global_tokens, self.global_seqs = batch_counts(batch)
        self.full = Evaluation(name, loss_fn, batch, wrt=wrt, dp_size=1)
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
        work, leaf = leaf_batch(self.batch, self.wrt)
        total: Tensor | float = 0.0
        lines = []
        for rank, pieces in enumerate(ranks):
            for rows in pieces:
                kwargs = loss_kwargs(
                    self.loss_fn,
                    self.global_tokens,
                    self.global_seqs,
                    dp_size=self.dp_size,
                    n_micro_batches=len(pieces),
                    global_rows=parallel.batch_size(self.batch),
                )
                piece = scalar_loss(
                    self.name, self.loss_fn(parallel.select_rows(work, rows), **kwargs)
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
        return total_t, gradient(total_t, leaf), lines

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


def split_invariance(run: SplitRun) -> None:
    """Every partition scheme in turn: the summed pieces against the full batch."""
    for name, ranks in run.schemes.items():
        total, grad, lines = run.summed_pieces(ranks)
        got = (float(total.detach()), grad)
        tolerance = LossTolerance(
            run.batch,
            [run.full.dtype, total.dtype],
            run.full,
            pieces=len(lines),
            rtol=run.rtol,
            atol=run.atol,
        )
        layout = f"{run.dp_size} DP ranks × " if run.dp_size > 1 else ""
        what = f"{layout}{run.n_splits} micro-batches split {name}"
        compare_losses(
            run.name,
            what,
            tolerance,
            got,
            run.full,
            got_name="summed pieces",
            expected_name="full batch",
            details=lines + run.dp_hints(got[0]) + (run.hints(ranks, got[0]) if run.hints else []),
        )


def as_float64(batch: Batch) -> dict[str, Any]:
    """The batch with every floating-point tensor in float64."""
    return {
        k: f64(v) if isinstance(v, Tensor) and v.is_floating_point() else v
        for k, v in batch.items()
    }
