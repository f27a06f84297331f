"""Completions of a rollout engine as one verl rollout batch: what the engine adapters share.

An adapter (``vllm_batch``, ``sglang_batch``) reads its engine's outputs into :class:`Row`
values, one per completion; :func:`rollout_batch` pads them into the verl layout.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ..store.codec import RolloutBatch


class Row(NamedTuple):
    """One completion of one prompt: a row of the batch."""

    prompt: list[int]
    tokens: list[int]
    logprobs: list[float]
    uid: str
    finish_reason: Any


def rollout_batch(
    rows: list[Row],
    *,
    pad_token_id: int,
    prompt_length: int | None,
    response_length: int | None,
    meta_info: dict[str, Any],
    max_tokens_hint: str,
) -> RolloutBatch:
    """The verl rollout batch of ``rows``, in their order; ``meta_info`` gets ``pad_token_id``.

    ``max_tokens_hint`` formats the remedy for a completion longer than ``response_length``
    in the engine's own words (``{R}`` is the length), e.g. ``SamplingParams(max_tokens={R})``.
    """
    import numpy as np

    P, R = _lengths(rows, prompt_length, response_length, max_tokens_hint)
    non_tensor_batch = {
        "uid": _objects([r.uid for r in rows], np),
        "finish_reason": _objects([r.finish_reason for r in rows], np),
    }
    meta = {"pad_token_id": pad_token_id, **meta_info}
    return RolloutBatch(_tensors(rows, P, R, pad_token_id), non_tensor_batch, meta)


def _lengths(
    rows: list[Row], prompt_length: int | None, response_length: int | None, max_tokens_hint: str
) -> tuple[int, int]:
    """``(P, R)``: the prompt and response widths, by default the longest of each."""
    longest_prompt = max(len(r.prompt) for r in rows)
    longest_response = max(len(r.tokens) for r in rows)
    P = longest_prompt if prompt_length is None else prompt_length
    R = longest_response if response_length is None else response_length
    if longest_prompt > P:
        raise ValueError(
            f"a prompt has {longest_prompt} tokens, more than prompt_length={P}; "
            "truncate prompts before generating, or raise prompt_length"
        )
    if longest_response > R:
        raise ValueError(
            f"a completion has {longest_response} tokens, more than response_length={R}; "
            f"generate with {max_tokens_hint.format(R=R)}, or raise response_length"
        )
    return P, R


def _tensors(rows: list[Row], P: int, R: int, pad_token_id: int) -> dict[str, Any]:
    """The ``batch``: prompts left-padded to ``P``, responses right-padded to ``R``, their
    masks, positions and the sampled tokens' log probs."""
    import torch

    B = len(rows)
    prompts = torch.full((B, P), pad_token_id, dtype=torch.int64)
    responses = torch.full((B, R), pad_token_id, dtype=torch.int64)
    prompt_mask = torch.zeros((B, P), dtype=torch.int64)
    response_mask = torch.zeros((B, R), dtype=torch.int64)
    rollout_log_probs = torch.zeros((B, R), dtype=torch.float32)
    for b, (prompt, tokens, logprobs, _, _) in enumerate(rows):
        if prompt:
            prompts[b, P - len(prompt) :] = torch.tensor(prompt, dtype=torch.int64)
            prompt_mask[b, P - len(prompt) :] = 1
        if tokens:
            responses[b, : len(tokens)] = torch.tensor(tokens, dtype=torch.int64)
            response_mask[b, : len(tokens)] = 1
            rollout_log_probs[b, : len(tokens)] = torch.tensor(logprobs, dtype=torch.float32)
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    return {
        "prompts": prompts,
        "responses": responses,
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(dim=1) - 1).clamp(min=0),
        "response_mask": response_mask,
        "rollout_log_probs": rollout_log_probs,
    }


def _objects(values: list[Any], np: Any) -> Any:
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out
