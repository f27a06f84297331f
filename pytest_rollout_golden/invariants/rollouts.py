"""Checkers of what asynchronous and deterministic rollouts get wrong, on the batch they made.

* :func:`check_group_diversity`: the completions of a prompt's group are not all identical.
  A deterministic engine seeded the same for every sample of a prompt returns one
  completion ``n`` times (UniRL #208): every group-normalized advantage (GRPO, RLOO) is 0
  and the step learns nothing, while every metric looks plausible.
* :func:`check_token_ids_kept`: the ids a trainer trains on are the ids the engine sampled.
  An agent loop that re-tokenizes the conversation text between turns gets other ids where
  a tokenizer merges across a turn boundary or a chat template re-renders a turn; the
  engine's log probs then belong to another sequence than the trainer's.

Both take what the rollout produced (token ids, masks, group ids), not a function, and raise
``AssertionError`` starting with the invariant's name in brackets.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from .comparison import fail

MAX_IDENTICAL = 0.5
"""The largest fraction of groups whose completions may all be identical. Correct sampling
repeats a whole group only where the model is near-certain (a short answer at a low
temperature); the defect repeats every group. Half leaves room for the first."""


def _completions(batch: Mapping[str, Any], response_key: str, mask_key: str) -> list[tuple]:
    """Each sample's response ids where its mask is 1, as a tuple."""
    responses = torch.as_tensor(batch[response_key])
    mask = batch.get(mask_key)
    mask = torch.ones_like(responses, dtype=torch.bool) if mask is None else torch.as_tensor(mask)
    if mask.shape != responses.shape:
        raise ValueError(
            f"{mask_key} has shape {tuple(mask.shape)}, {response_key} {tuple(responses.shape)}"
        )
    return [tuple(r[m.bool()].tolist()) for r, m in zip(responses, mask, strict=True)]


def check_group_diversity(
    batch: Mapping[str, Any],
    *,
    group_key: str = "uid",
    response_key: str = "responses",
    mask_key: str = "response_mask",
    max_identical: float = MAX_IDENTICAL,
) -> None:
    """Check that at most ``max_identical`` of the groups (samples sharing
    ``batch[group_key]``, a prompt's ``n`` completions) consist of one completion repeated.

    Completions are ``batch[response_key]`` (``[B, T]`` token ids) where
    ``batch[mask_key]`` is 1 (all of them without a mask). Groups of one sample are not
    counted. Raises ``AssertionError`` (``[rollout.identical_groups]``) listing the groups.
    """
    groups: dict[Any, list[int]] = {}
    for i, uid in enumerate(list(batch[group_key])):
        groups.setdefault(uid, []).append(i)
    completions = _completions(batch, response_key, mask_key)
    sized = {uid: rows for uid, rows in groups.items() if len(rows) > 1}
    identical = [uid for uid, rows in sized.items() if len({completions[i] for i in rows}) == 1]
    if sized and len(identical) > max_identical * len(sized):
        fail(
            "rollout.identical_groups",
            f"{len(identical)} of {len(sized)} groups hold one completion repeated (at most "
            f"{max_identical:g} of them may): every group-normalized advantage there is 0. "
            "A deterministic engine seeded alike for every sample of a prompt does this; "
            "give each sample its own seed (e.g. seed + sample index)",
            [
                f"{group_key}={uid!r}: {len(sized[uid])} x {list(completions[sized[uid][0]])[:12]}"
                for uid in identical
            ],
        )


def check_token_ids_kept(
    turns: Sequence[Sequence[int]],
    input_ids: Sequence[int] | torch.Tensor,
    loss_mask: Sequence[int] | torch.Tensor,
    *,
    decode: Callable[[list[int]], str] | None = None,
) -> None:
    """Check that the trained positions of one trajectory hold the ids the engine sampled.

    ``turns``: the engine's sampled ids of each assistant turn, in order; ``input_ids`` and
    ``loss_mask``: the trainer's sequence (1-D) and the positions it trains on. The ids at
    the trained positions, in order, must be the turns' ids concatenated. ``decode``
    (a tokenizer's ``decode``) shows the text of ids that differ. Raises ``AssertionError``
    (``[rollout.token_ids_kept]``) at the first turn and position that differ.
    """
    ids = torch.as_tensor(input_ids).reshape(-1).tolist()
    mask = torch.as_tensor(loss_mask).reshape(-1).bool().tolist()
    if len(ids) != len(mask):
        raise ValueError(f"input_ids has {len(ids)} ids, loss_mask {len(mask)} positions")
    trained = [(position, i) for position, (i, m) in enumerate(zip(ids, mask, strict=True)) if m]
    sampled = [(t, k, int(i)) for t, turn in enumerate(turns) for k, i in enumerate(turn)]
    shown = (lambda x: f" ({decode(x)!r})") if decode is not None else (lambda x: "")
    for n, ((position, got), (turn, k, want)) in enumerate(zip(trained, sampled, strict=False)):
        if got != want:
            start = n - k  # where this turn's ids begin among the trained ones
            fail(
                "rollout.token_ids_kept",
                f"turn {turn}, its token {k}: the engine sampled {want}{shown([want])}, the "
                f"trainer trains on {got}{shown([got])} at position {position}; build the "
                "training sequence from the sampled ids (token in, token out) instead of "
                "re-tokenizing the conversation's text",
                [
                    f"sampled: {list(turns[turn])}{shown(list(turns[turn]))}",
                    f"trained from position {trained[start][0]}: "
                    f"{[g for _, g in trained[start : start + len(turns[turn])]]}",
                ],
            )
    if len(trained) != len(sampled):
        fail(
            "rollout.token_ids_kept",
            f"the trainer trains on {len(trained)} positions, the engine sampled "
            f"{len(sampled)} ids over {len(turns)} turns; a turn was re-tokenized into another "
            "number of ids, or the loss mask covers a prompt or tool output",
        )
