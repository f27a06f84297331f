"""Stand-ins with exactly the public attributes of vLLM's output classes.

Written from ``vllm/outputs.py`` and ``vllm/logprobs.py`` (``RequestOutput``,
``CompletionOutput``, ``Logprob``, ``FlatLogprobs``) and the fields of
``vllm.SamplingParams`` that the adapter reads, plus a two-prompt, n=2 example.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass
class Logprob:  # vllm.logprobs.Logprob
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclasses.dataclass
class FlatLogprobs:  # vllm.logprobs.FlatLogprobs (SamplingParams(flat_logprobs=True))
    start_indices: list[int] = dataclasses.field(default_factory=list)
    end_indices: list[int] = dataclasses.field(default_factory=list)
    token_ids: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    ranks: list[int | None] = dataclasses.field(default_factory=list)
    decoded_tokens: list[str | None] = dataclasses.field(default_factory=list)

    def append(self, position: dict[int, Logprob] | None) -> None:
        self.start_indices.append(len(self.logprobs))
        for token_id, lp in (position or {}).items():
            self.token_ids.append(token_id)
            self.logprobs.append(lp.logprob)
            self.ranks.append(lp.rank)
            self.decoded_tokens.append(lp.decoded_token)
        self.end_indices.append(len(self.logprobs))

    def __len__(self) -> int:
        return len(self.start_indices)

    def __getitem__(self, i: int) -> dict[int, Logprob]:
        span = range(self.start_indices[i], self.end_indices[i])
        return {self.token_ids[j]: Logprob(self.logprobs[j], self.ranks[j]) for j in span}


@dataclasses.dataclass
class CompletionOutput:  # vllm.outputs.CompletionOutput
    index: int
    text: str
    token_ids: Any
    cumulative_logprob: float | None
    logprobs: Any
    routed_experts: Any = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    lora_request: Any = None
    kv_transfer_params: dict | None = None


class RequestOutput:  # vllm.outputs.RequestOutput
    def __init__(
        self,
        request_id,
        prompt,
        prompt_token_ids,
        prompt_logprobs,
        outputs,
        finished,
        metrics=None,
        lora_request=None,
        encoder_prompt=None,
        encoder_prompt_token_ids=None,
        num_cached_tokens=None,
    ):
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_token_ids = prompt_token_ids
        self.prompt_logprobs = prompt_logprobs
        self.outputs = outputs
        self.finished = finished
        self.metrics = metrics
        self.lora_request = lora_request
        self.encoder_prompt = encoder_prompt
        self.encoder_prompt_token_ids = encoder_prompt_token_ids
        self.num_cached_tokens = num_cached_tokens


EOS = 2


def completion(index, tokens, logprobs, *, top=0, flat=False, reason=None, rank_of_sampled=3):
    """A CompletionOutput whose sampled token is NOT the top-ranked entry when ``top`` > 0."""
    positions = []
    for t, lp in zip(tokens, logprobs, strict=True):
        entry = {t: Logprob(lp, rank_of_sampled, f"<{t}>")}
        for k in range(top):  # vLLM puts the sampled token first, then the top k
            entry.setdefault(1000 + k, Logprob(lp + 0.5 + k, k + 1))
        positions.append(entry)
    if flat:
        container = FlatLogprobs()
        for p in positions:
            container.append(p)
    else:
        container = positions
    reason = reason or ("stop" if tokens and tokens[-1] == EOS else "length")
    return CompletionOutput(
        index, "", tuple(tokens), sum(logprobs), container, finish_reason=reason
    )


def outputs(*, flat=False, top=0):
    """Two prompts, n=2 each; completions listed out of index order, as nothing forbids."""
    return [
        RequestOutput(
            "7",
            "a",
            [5, 6, 7],
            None,
            [
                completion(1, [20, 21, EOS], [-0.5, -1.25, -0.125], flat=flat, top=top),
                completion(0, [30], [-2.0], flat=flat, top=top),
            ],
            True,
        ),
        RequestOutput(
            "8",
            "b",
            [9],
            None,
            [
                completion(0, [40, 41, 42, 43], [-0.25, -0.75, -1.5, -3.0], flat=flat, top=top),
                completion(1, [EOS], [-0.0625], flat=flat, top=top),
            ],
            True,
        ),
    ]


@dataclasses.dataclass
class SamplingParams:  # the fields of vllm.SamplingParams the adapter reads
    n: int = 1
    seed: int | None = None
    logprobs: int | None = None
    max_tokens: int | None = 16
