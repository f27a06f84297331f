"""``LLM.generate`` on CPU without a GPU: a toy model decoded through vLLM's own output path.

vLLM's model runner and sampler need its CUDA build (``vllm._C``) and a chain of server
packages (``vllm.v1.sample.sampler`` imports ``vllm.v1.request``, hence xgrammar, fastapi,
opentelemetry, ...), so the sampling step is written out here, as
``vllm/v1/sample/sampler.py`` does it:

* raw log probs: ``logits.log_softmax(dim=-1, dtype=torch.float32)``, before temperature;
* processed log probs: the same after ``logits.div_(temperature)`` (no penalties, top-k or
  top-p in these requests);
* ``gather_logprobs``: the sampled token first, then the top ``k``; the sampled token's rank
  is the count of log probs ``>=`` its own.

Everything after the sampler is vLLM's own code: ``EngineCoreRequest`` / ``EngineCoreOutput``
carry ``LogprobsLists`` (numpy, as the engine core sends them) to the real
``OutputProcessor``, whose ``LogprobsProcessor`` builds the ``Logprob`` dicts or the
``FlatLogprobs``, whose ``ParentRequest`` gathers the ``n`` completions of a prompt, and which
returns the ``RequestOutput`` objects; they are sorted by request id as ``LLM._run_engine``
does. Stops follow ``vllm/v1/core/sched/utils.py:check_stop``: EOS (``stop_reason`` None), a
``stop_token_ids`` token (``stop_reason`` the id), ``max_tokens`` (``"length"``).
"""

from __future__ import annotations

import copy
import dataclasses
import inspect

import numpy as np
import torch

VOCAB = 40
EOS = 2


def logits_of(tokens: torch.Tensor) -> torch.Tensor:
    """The toy model: ``[..., L]`` token ids -> ``[..., L, VOCAB]`` float32 logits; row
    ``t`` predicts token ``t + 1`` (it depends on tokens ``t`` and ``t - 1``)."""
    table = torch.randn(VOCAB, VOCAB, generator=torch.Generator().manual_seed(1234)) * 1.5
    table[:, EOS] += 2.5  # some completions end on EOS within a few tokens
    previous = torch.cat([tokens[..., :1], tokens[..., :-1]], dim=-1)
    return table[tokens] + 0.5 * table[previous].roll(1, dims=-1)


@dataclasses.dataclass
class Sampled:
    """What the toy sampler drew for one completion: the ground truth of a conversion."""

    tokens: list[int]
    log_probs: torch.Tensor  # float32, the sampled tokens' log probs in the engine's mode
    reported: list[torch.Tensor]  # per position, the whole [VOCAB] row the engine reports


@dataclasses.dataclass
class Generation:
    outputs: list  # list[vllm.outputs.RequestOutput], as LLM.generate returns it
    sampled: dict[tuple[str, int], Sampled]  # (request_id, completion index) -> truth


def generate(vllm, prompts, params, *, logprobs_mode="raw_logprobs") -> Generation:
    """``LLM.generate(prompts, params)`` of the toy model: ``prompts`` token-id lists,
    ``params`` one ``vllm.SamplingParams`` or one per prompt."""
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine import EngineCoreOutput, EngineCoreRequest, FinishReason
    from vllm.v1.engine.output_processor import OutputProcessor
    from vllm.v1.engine.parallel_sampling import ParentRequest

    processor = OutputProcessor(tokenizer=None, log_stats=False)
    per_prompt = params if isinstance(params, list) else [params] * len(prompts)
    children = {}  # internal request id -> (external id, index, prompt, params)
    for i, (prompt, request_params) in enumerate(zip(prompts, per_prompt, strict=True)):
        request_params = copy.copy(request_params)
        request_params.output_kind = RequestOutputKind.FINAL_ONLY  # as LLM._add_request
        request = EngineCoreRequest(
            prompt_token_ids=list(prompt), mm_features=None, sampling_params=request_params,
            pooling_params=None, arrival_time=0.0, lora_request=None, cache_salt=None,
            data_parallel_rank=None, **_request_ids(EngineCoreRequest, str(i)),
        )  # fmt: skip
        if request_params.n == 1:
            processor.add_request(request, None, None, 0)
            children[request.request_id] = (str(i), 0, list(prompt), request_params)
            continue
        parent = _parent(ParentRequest, request)
        for index in range(request_params.n):
            child_id, child_params = parent.get_child_info(index)
            child = copy.copy(request)
            child.request_id, child.sampling_params = child_id, child_params
            processor.add_request(child, None, parent, index)
            children[child_id] = (str(i), index, list(prompt), child_params)

    finished, sampled = [], {}
    for child_id, (external, index, prompt, child_params) in children.items():
        truth = _decode(prompt, child_params, logprobs_mode)
        sampled[(external, index)] = truth
        for step, token in enumerate(truth.tokens):
            reason, stop_reason = _stop(truth.tokens, step, child_params)
            logprobs = _gather(truth.reported[step], token, child_params.logprobs)
            out = EngineCoreOutput(
                request_id=child_id, new_token_ids=[token], new_logprobs=logprobs,
                new_prompt_logprobs_tensors=(
                    _prompt_logprobs(prompt, child_params) if step == 0 else None
                ),
                finish_reason=None if reason is None else FinishReason[reason],
                stop_reason=stop_reason,
            )  # fmt: skip
            result = processor.process_outputs([out])
            finished += [o for o in result.request_outputs if o.finished]
    return Generation(sorted(finished, key=lambda o: int(o.request_id)), sampled)


def _request_ids(request_class, external: str) -> dict:
    """vLLM 0.33 keeps the caller's id as ``external_req_id`` and an internal one as
    ``request_id``; 0.10 has one id, and the EOS id on the request."""
    if "external_req_id" in request_class.__struct_fields__:
        return {"request_id": f"{external}-toy", "external_req_id": external}
    return {"request_id": external, "eos_token_id": EOS}


def _parent(parent_class, request):
    """``ParentRequest(request)`` (0.33) or ``ParentRequest(request_id, sampling_params)``."""
    if len(inspect.signature(parent_class).parameters) == 1:
        return parent_class(request)
    return parent_class(request.request_id, request.sampling_params)


def _decode(prompt, params, logprobs_mode) -> Sampled:
    """Sample one completion from the toy model, seeded like vLLM's per-request generator."""
    generator = torch.Generator().manual_seed(params.seed)
    tokens, log_probs, rows = [], [], []
    for _ in range(params.max_tokens):
        logits = logits_of(torch.tensor(prompt + tokens))[-1]
        scaled = logits.clone().div_(params.temperature)
        token = int(torch.multinomial(scaled.softmax(-1), 1, generator=generator))
        reported = _mode_log_probs(logits, scaled, logprobs_mode)
        tokens.append(token)
        log_probs.append(reported[token])
        rows.append(reported)
        if token == EOS or token in (params.stop_token_ids or ()):
            break
    return Sampled(tokens, torch.stack(log_probs), rows)


def _mode_log_probs(logits, scaled, mode) -> torch.Tensor:
    if mode == "raw_logprobs":
        return logits.log_softmax(dim=-1, dtype=torch.float32)
    if mode == "processed_logprobs":
        return scaled.log_softmax(dim=-1, dtype=torch.float32)
    raise ValueError(f"the toy sampler does not report {mode!r}")


def _stop(tokens, step, params) -> tuple[str | None, int | None]:
    token = tokens[step]
    if token == EOS:
        return "STOP", None
    if token in (params.stop_token_ids or ()):
        return "STOP", token
    if step + 1 == params.max_tokens:
        return "LENGTH", None
    return None, None


def _gather(row: torch.Tensor, token: int, k: int):
    """``LogprobsLists`` of one position as ``Sampler.gather_logprobs`` makes it: the sampled
    token, then the top ``k``; the sampled token's rank counts the log probs ``>=`` its own."""
    from vllm.v1.outputs import LogprobsLists

    top = row.topk(k)
    ids = np.array([[token, *top.indices.tolist()]], dtype=np.int32)
    values = torch.cat([row[token : token + 1], top.values]).unsqueeze(0).numpy()
    ranks = np.array([int((row >= row[token]).sum())])
    if "ndarray" not in str(LogprobsLists.__annotations__["logprobs"]):
        return LogprobsLists(ids.tolist(), values.tolist(), ranks.tolist())  # vLLM 0.10: lists
    return LogprobsLists(ids, values, ranks)


def _prompt_logprobs(prompt, params):
    """``LogprobsTensors`` of the prompt (positions 1.., raw: prompt tokens are not sampled)."""
    if params.prompt_logprobs is None:
        return None
    from vllm.v1.outputs import LogprobsTensors

    scores = logits_of(torch.tensor(prompt))[:-1].log_softmax(dim=-1, dtype=torch.float32)
    targets = torch.tensor(prompt[1:]).unsqueeze(-1)
    chosen = scores.gather(-1, targets)
    top = scores.topk(params.prompt_logprobs, dim=-1) if params.prompt_logprobs else None
    ids = targets if top is None else torch.cat([targets, top.indices], dim=1)
    values = chosen if top is None else torch.cat([chosen, top.values], dim=1)
    return LogprobsTensors(ids.to(torch.int32), values, (scores >= chosen).sum(-1))
