"""Checker for group advantage estimators (GRPO, Dr.GRPO, RLOO, REINFORCE++ baseline)."""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..reference.advantages import ESTIMATORS, group_mean_std, outcome_advantages, sequence_scores
from ..reference.masking import as_bool_mask
from .comparison import (
    F32_EPS,
    F64_EPS,
    GUARD_RTOL,
    Batch,
    CheckTolerance,
    accumulation_roundoff,
    f64,
    fail,
    fmt,
    positions,
    require_fields,
    resolve_tolerance,
    single_token_whitening,
    token_tensor,
    unit_roundoff,
    versus,
)

__all__ = ["check_advantages"]

_ZERO_MEAN = ("grpo", "grpo_no_std", "drgrpo", "rloo")
_STD_SCALED = ("grpo", "reinforce_baseline")
_SINGLETON = {
    "grpo": "s / (1 + ε) (group mean 0, std 1)",
    "grpo_no_std": "s (group mean 0)",
    "drgrpo": "s (group mean 0)",
    "rloo": "s (no other sample to form a baseline)",
}


def _group_max(values: Tensor, uid: Tensor) -> Tensor:
    """Per-row maximum of ``values`` over the row's group."""
    _, inverse = torch.unique(uid, return_inverse=True)
    best = torch.zeros(int(inverse.max()) + 1, dtype=values.dtype)
    best = best.scatter_reduce(0, inverse, values, reduce="amax")
    return best[inverse]


def _row_values(advantages: Tensor, valid: Tensor) -> Tensor:
    """The advantage of each row, read at its first valid token."""
    return advantages.gather(-1, valid.long().argmax(dim=-1, keepdim=True)).squeeze(-1)


def _row_tolerance(
    batch: Batch,
    uid: Tensor,
    estimator: str,
    epsilon: float,
    expected: Tensor,
    eps: float,
    rtol: float | None,
    atol: float | None,
) -> CheckTolerance:
    """Per-row tolerance ``[B]`` (the default rule of :func:`check_advantages`)."""
    rewards = f64(batch["token_level_rewards"])
    mask = batch["response_mask"]
    valid = as_bool_mask(mask)
    acc = accumulation_roundoff(eps)
    scores = sequence_scores(rewards, mask)
    _, std, size = group_mean_std(scores, uid)
    size = size.to(torch.float64)
    magnitude = _group_max(scores.abs(), uid) + 1e-300
    tokens = valid.sum(dim=-1).to(torch.float64)
    reward_mass = (rewards.abs() * valid).sum(dim=-1)
    # Absolute error of the centered score s - mean: rounding of each score (a sum over the
    # row's tokens) and of the group mean (a sum over the group).
    centered = 8 * (eps * magnitude + acc * size * magnitude) + 8 * acc * tokens * reward_mass
    if estimator == "rloo":
        centered = 2 * centered  # n/(n - 1) ≤ 2
    denominator = torch.ones_like(scores)
    if estimator == "grpo":
        denominator = torch.where(size > 1, std, torch.ones_like(std)) + epsilon
    elif estimator == "reinforce_baseline":
        total = int(valid.sum())
        row_c = _row_values(expected, valid)
        token_mean, token_std = _token_moments(batch, uid, epsilon)
        # Whitening mixes every row into the batch mean: each row inherits the worst error.
        spread = 8 * (eps + acc * total) * float(scores.abs().max() + row_c.abs().max())
        centered = torch.full_like(scores, float(centered.max()) + spread)
        # The batch mean may carry an epsilon guard on its token count (verl's masked_mean).
        centered = centered + GUARD_RTOL * abs(token_mean)
        denominator = torch.full_like(scores, token_std)
    relative = 8 * eps + 8 * acc * size + GUARD_RTOL
    if estimator in _STD_SCALED:
        relative = relative + 1e-6 / denominator  # a guard of up to 1e-6 on the std
    return resolve_tolerance(relative, centered / denominator + 1e-300, rtol, atol)


def _token_moments(batch: Batch, uid: Tensor, epsilon: float) -> tuple[float, float]:
    """Token mean ``μ`` and ``sqrt(v + ε)`` of the group-centered scores (REINFORCE++ baseline)."""
    rewards, mask = f64(batch["token_level_rewards"]), batch["response_mask"]
    valid = as_bool_mask(mask)
    scores = sequence_scores(rewards, mask)
    mean, _, _ = group_mean_std(scores, uid)
    centered = (scores - mean).unsqueeze(-1).expand(valid.shape)[valid]
    n = centered.numel()
    variance = float((centered - centered.mean()).square().sum()) / max(n - 1, 1)
    return float(centered.mean()), (variance + epsilon) ** 0.5


def _call(fn: Callable[..., Any], batch: Batch, uid: Any, estimator: str) -> Tensor:
    mask = batch["response_mask"]
    output = fn(batch["token_level_rewards"], mask, uid)
    if estimator == "reinforce_baseline":  # whitened over the batch's valid tokens
        single_token_whitening("advantages", output, as_bool_mask(mask))
    return f64(token_tensor("advantages", output, mask.shape, batch))


def _rows(value: Any, rows: list[int], size: int) -> Any:
    """``value`` restricted to ``rows`` when it has one entry per row, else unchanged."""
    if isinstance(value, Tensor) and value.dim() and value.shape[0] == size:
        return value[torch.tensor(rows, dtype=torch.long, device=value.device)]
    if isinstance(value, np.ndarray) and value.ndim and value.shape[0] == size:
        return value[np.asarray(rows, dtype=np.int64)]
    if isinstance(value, list | tuple) and len(value) == size:
        return type(value)(value[i] for i in rows)
    return value


def _select(batch: Batch, rows: list[int]) -> dict[str, Any]:
    size = batch["response_mask"].shape[0]
    return {key: _rows(value, rows, size) for key, value in batch.items()}


def group_index(labels: Any) -> Tensor:
    """Int64 ``[B]`` group ids from group labels: a tensor, a numpy array (verl keeps ``uid``
    as an object array of strings) or a list; equal labels, equal ids."""
    if isinstance(labels, Tensor):
        return labels.long()
    ids: dict[Any, int] = {}
    items = labels.tolist() if isinstance(labels, np.ndarray) else list(labels)
    return torch.tensor([ids.setdefault(label, len(ids)) for label in items], dtype=torch.long)


def _relabel(labels: Any) -> Any:
    """Other names for the same groups, in the container and type of ``labels``."""
    if isinstance(labels, Tensor):
        return labels.max() - labels + 5
    items = labels.tolist() if isinstance(labels, np.ndarray) else list(labels)
    numbers = all(isinstance(x, int | float) and not isinstance(x, bool) for x in items)
    top = max(items) if numbers and items else 0
    renamed = [top - x + 5 if numbers else f"relabeled-{x}" for x in items]
    if isinstance(labels, np.ndarray):
        return np.array(renamed, dtype=labels.dtype if numbers else object)
    return type(labels)(renamed)


class _AdvantageRun:
    """``fn``'s advantages of one batch and, computed on first use, the float64 reference,
    the per-row tolerance and the rows that exceed it: what the invariants judge."""

    def __init__(
        self,
        fn: Callable[..., Any],
        batch: Batch,
        *,
        estimator: str,
        epsilon: float,
        rtol: float | None,
        atol: float | None,
        variant: Callable[..., Any] | None,
        group_size: int | None,
    ):
        self.fn, self.batch, self.variant, self.group_size = fn, batch, variant, group_size
        self.estimator, self.epsilon, self.rtol, self.atol = estimator, epsilon, rtol, atol
        self.mask = batch["response_mask"]
        self.valid = as_bool_mask(self.mask)
        self.size_b = self.mask.shape[0]
        if group_size is not None:
            if group_size < 1:
                raise ValueError(f"group_size must be >= 1, got {group_size}")
            self.uid = torch.arange(self.size_b) // group_size
            self.labels = batch.get("uid", self.uid)
        else:
            self.labels = batch["uid"]
            self.uid = group_index(self.labels)
        self.got = _call(fn, batch, self.labels, estimator)
        # The input dtype sets the accuracy owed: float64 in, float64-accurate out.
        self.eps = unit_roundoff(batch["token_level_rewards"].dtype)

    @cached_property
    def row(self) -> Tensor:
        return _row_values(self.got, self.valid)

    @cached_property
    def expected(self) -> Tensor:
        rewards64 = f64(self.batch["token_level_rewards"])
        return outcome_advantages(
            rewards64, self.mask, self.uid, estimator=self.estimator, epsilon=self.epsilon
        )

    @cached_property
    def expected_row(self) -> Tensor:
        return _row_values(self.expected, self.valid)

    @cached_property
    def scores(self) -> Tensor:
        return sequence_scores(f64(self.batch["token_level_rewards"]), self.mask)

    @cached_property
    def group_sizes(self) -> Tensor:
        return group_mean_std(self.scores, self.uid)[2]

    def row_tolerance(self, eps: float, rtol: float | None, atol: float | None) -> CheckTolerance:
        return _row_tolerance(
            self.batch, self.uid, self.estimator, self.epsilon, self.expected, eps, rtol, atol
        )

    @cached_property
    def tolerance(self) -> CheckTolerance:
        return self.row_tolerance(self.eps, self.rtol, self.atol)

    @cached_property
    def off(self) -> Tensor:
        """Rows whose advantage is beyond tolerance of the reference."""
        return self.tolerance.exceeded(self.row, self.expected_row)

    def lines(
        self,
        bad: Tensor,
        reference: Tensor | None = None,
        name: str = "reference",
        got: Tensor | None = None,
        got_name: str = "fn",
    ) -> list[str]:
        reference = self.expected_row if reference is None else reference
        got = self.row if got is None else got
        return [
            f"row {b} (uid={int(self.uid[b])}, group of {int(self.group_sizes[b])}, "
            f"score {float(self.scores[b])!r}): "
            + versus(got_name, float(got[b]), name, float(reference[b]))
            for (b,) in positions(bad)
        ]


def _zero_on_padding(run: _AdvantageRun) -> None:
    leaked = ~run.valid & (run.got != 0)
    if bool(leaked.any()):
        fail(
            "advantages.zero_on_padding",
            "non-zero advantages on padding positions",
            [f"(b={b}, t={t}): {fmt(float(run.got[b, t]))}" for b, t in positions(leaked)],
        )


def _broadcast(run: _AdvantageRun) -> None:
    uneven = run.valid & (run.got != run.row.unsqueeze(-1))
    if bool(uneven.any()):
        fail(
            "advantages.broadcast",
            "an outcome advantage must be one value broadcast over the row's valid tokens",
            [
                f"(b={b}, t={t}): {float(run.got[b, t])!r}, row value {float(run.row[b])!r}"
                for b, t in positions(uneven)
            ],
        )


def _singleton(run: _AdvantageRun) -> None:
    single = run.off & (run.group_sizes == 1)
    if run.estimator in _SINGLETON and bool(single.any()):
        fail(
            "advantages.singleton",
            f"singleton groups: {run.estimator} gives a group of one {_SINGLETON[run.estimator]}",
            run.lines(single),
        )


def _precision(run: _AdvantageRun) -> None:
    """An error that float32 statistics explain, on float64 input, is named so."""
    if bool(run.off.any()) and run.eps == F64_EPS and run.rtol is None and run.atol is None:
        loose = run.row_tolerance(F32_EPS, None, None)
        if not bool(loose.exceeded(run.row, run.expected_row).any()):
            fail(
                "advantages.precision",
                "float64 input, but the advantages are only float32-accurate (group statistics "
                "computed in float32?)",
                run.lines(run.off),
            )


def _group_mean_zero(run: _AdvantageRun) -> None:
    if run.estimator not in _ZERO_MEAN:
        return
    tolerance = run.tolerance
    _, inverse, counts = torch.unique(run.uid, return_inverse=True, return_counts=True)
    sums = torch.zeros(counts.numel(), dtype=torch.float64).index_add(0, inverse, run.row)
    allowed = torch.zeros_like(sums).index_add(
        0, inverse, tolerance.atol + tolerance.rtol * run.expected_row.abs()
    )
    # A row without valid tokens shows 0, not its advantage: its group is not judged.
    empty = torch.zeros_like(sums).index_add(0, inverse, (~run.valid.any(dim=-1)).double())
    biased = (counts > 1) & (sums.abs() > allowed) & (empty == 0)
    if bool(biased.any()):
        fail(
            "advantages.group_mean_zero",
            f"{run.estimator} advantages must average to 0 over each group of two or more",
            [
                f"uid={int(label)}: mean {fmt(float(sums[g] / counts[g]))} over "
                f"{int(counts[g])} rows"
                for g, label in enumerate(torch.unique(run.uid))
                if bool(biased[g])
            ],
        )


def _reference_agreement(run: _AdvantageRun) -> None:
    if bool(run.off.any()):
        fail(
            "advantages.reference_agreement",
            f"{int(run.off.sum())} of {len(run.row)} rows differ from the {run.estimator} "
            f"reference (epsilon={run.epsilon})",
            run.lines(run.off),
        )


# The row-order and group-label invariants compare fn's new answer with the reference, not
# with its first answer: two low-precision results, each within tolerance of the reference,
# may differ by twice it.


def _row_order(run: _AdvantageRun) -> None:
    reversed_rows = list(range(len(run.row)))[::-1]
    blocks_kept = run.group_size is None or run.size_b % run.group_size == 0
    flipped = _select(run.batch, reversed_rows)
    flipped_labels = flipped.get("uid", run.uid) if run.group_size is not None else flipped["uid"]
    moved = _row_values(
        _call(run.fn, flipped, flipped_labels, run.estimator), run.valid.flip(0)
    ).flip(0)
    off = run.tolerance.exceeded(moved, run.expected_row) & blocks_kept
    if bool(off.any()):
        fail(
            "advantages.row_order",
            "reversing the rows changed the advantages (reversed rows, compared with the "
            "reference)",
            run.lines(off, got=moved, got_name="fn on reversed rows"),
        )


def _group_labels(run: _AdvantageRun) -> None:
    if run.group_size is not None:
        return
    relabeled = dict(run.batch, uid=_relabel(run.labels))
    moved = _row_values(_call(run.fn, relabeled, relabeled["uid"], run.estimator), run.valid)
    off = run.tolerance.exceeded(moved, run.expected_row)
    if bool(off.any()):
        fail(
            "advantages.group_labels",
            "renaming the groups (uid → max(uid) - uid + 5, or a prefix) changed the advantages "
            "(relabeled, "
            "compared with the reference)",
            run.lines(off, got=moved, got_name="fn on relabeled groups"),
        )


def _variant_agreement(run: _AdvantageRun) -> None:
    if run.variant is None:
        return
    other = _row_values(_call(run.variant, run.batch, run.labels, run.estimator), run.valid)
    # Both are held to the same tolerance around the reference, so they may differ by
    # twice it.
    doubled = CheckTolerance(rtol=2 * run.tolerance.rtol, atol=2 * run.tolerance.atol)
    off = doubled.exceeded(other, run.row)
    if bool(off.any()):
        fail(
            "advantages.variant_agreement",
            "the two implementations disagree"
            + (" on singleton groups" if bool((run.group_sizes[off] == 1).all()) else ""),
            run.lines(off, other, "variant"),
        )


_INVARIANTS: tuple[Callable[[_AdvantageRun], None], ...] = (
    _zero_on_padding,
    _broadcast,
    _singleton,
    _precision,
    _group_mean_zero,
    _reference_agreement,
    _row_order,
    _group_labels,
    _variant_agreement,
)
"""The invariants of :func:`check_advantages`, in the order they are judged."""


def check_advantages(
    fn: Callable[..., Any],
    batch: Batch,
    *,
    estimator: str,
    epsilon: float = 1e-6,
    rtol: float | None = None,
    atol: float | None = None,
    variant: Callable[..., Any] | None = None,
    group_size: int | None = None,
) -> None:
    """Check ``fn(token_level_rewards, response_mask, uid) -> advantages [B, T]``.

    ``batch`` holds ``token_level_rewards`` and ``response_mask`` (``[B, T]``, rewards zero
    on padding: see :func:`pytest_rollout_golden.strategies.reward_batches`) and ``uid``
    (``[B]`` group labels: an int tensor, a numpy array such as verl's object array of
    strings, or a list). Other entries, tensors or not, are carried along (and cut with the
    rows when they have one entry per row). ``group_size=n`` declares the contiguous layout
    of TRL, slime and ROLL instead: rows ``[k·n, (k+1)·n)`` form group ``k`` (a last, shorter
    block is a group of its own) and ``uid`` may be absent (``fn`` then gets ``row // n``).
    A row without a valid token scores 0 and counts in its group (verl's convention); its
    advantages must be 0 (all padding). A tuple return is allowed (first item).
    ``estimator`` is one of
    ``"grpo"`` (``(s - mean_g) / (std_g + ε)``, unbiased std), ``"grpo_no_std"`` and its
    alias ``"drgrpo"`` (``s - mean_g``), ``"rloo"`` (``s - mean of the others``),
    ``"reinforce_baseline"`` (``s - mean_g``, then whitened over the batch's valid tokens with
    ``sqrt(var + ε)``; verl uses ``ε = 1e-8`` there). ``s`` is the row's summed reward.

    * ``advantages.zero_on_padding``; ``advantages.broadcast``: one value per row;
    * ``advantages.singleton``: a group of one gets ``s / (1 + ε)`` (GRPO), ``s`` (Dr.GRPO,
      RLOO); REINFORCE++ baseline centers it on 0 before whitening;
    * ``advantages.precision``: float64 in, float64-accurate out (an error only float32
      statistics explain, such as a group mean computed in float32, is named so);
    * ``advantages.group_mean_zero`` (GRPO, Dr.GRPO, RLOO, groups of two or more);
    * ``advantages.reference_agreement``: equal to the float64 reference within tolerance;
    * ``advantages.row_order`` / ``advantages.group_labels``: reversing the rows reverses
      the result (with ``group_size``, only when ``B`` is a multiple of it: the blocks stay
      blocks); renaming the groups changes nothing (not with ``group_size``). Both compare
      with the reference;
    * ``advantages.variant_agreement``: with ``variant`` (a second implementation, e.g. a
      vectorized one), both agree on every row, singleton groups included.

    Tolerance per row (default rule): absolute, the rounding of ``s - mean`` in the input
    dtype (``8·(eps + eps_acc·n_group)·max|s|`` plus the rounding of each row sum) divided by
    the estimator's denominator; relative, ``8·eps + 8·eps_acc·n_group`` plus
    :data:`GUARD_RTOL`, plus ``1e-6 / denominator`` for std-scaled estimators (a guard of up
    to 1e-6 on the std other than ``ε``). ``rtol``/``atol`` replace either part.
    """
    if estimator not in ESTIMATORS:
        raise ValueError(f"estimator must be one of {ESTIMATORS}, got {estimator!r}")
    needed = ("token_level_rewards", "response_mask") + (() if group_size else ("uid",))
    require_fields(batch, needed, "check_advantages", "reward_batches()")
    run = _AdvantageRun(
        fn,
        batch,
        estimator=estimator,
        epsilon=epsilon,
        rtol=rtol,
        atol=atol,
        variant=variant,
        group_size=group_size,
    )
    for invariant in _INVARIANTS:
        invariant(run)
