"""A verl-style rollout batch from the results of SGLang's ``Engine.generate`` / ``/generate``.

Reads the plain dicts SGLang returns, without importing SGLang (checked against SGLang
0.5.23: ``TokenizerManager._handle_batch_output`` and ``add_logprob_to_meta_info`` in
``sglang/srt/managers/tokenizer_manager.py``). One dict per completion, with
``output_ids`` (the generated token ids) and ``meta_info``:

* ``output_token_logprobs``: one ``(logprob, token_id, text)`` per generated token (a list
  over HTTP; ``text`` is ``None`` unless ``return_text_in_logprobs=True``); entry ``i`` is
  the log prob of ``output_ids[i]``, from the logits at the position before it;
* ``input_token_logprobs``: the same for the prompt from ``logprob_start_len`` on, its
  first value ``None`` (nothing predicts it); ``prompt_tokens``, ``completion_tokens``;
* ``finish_reason``: ``{"type": "stop" | "length" | "abort", ...}``; ``id``.

A single prompt with ``n=1`` gives one dict, anything else a list, prompt-major: the ``n``
samples of prompt 0, then those of prompt 1, ... Ask for log probs with
``return_logprob=True``; without it ``output_token_logprobs`` is missing and
:func:`sglang_rollout` raises.

Which log probs these are: by default ``log_softmax(logits / temperature)`` after the
penalties, logit bias, grammar masks and custom logit processors, before top-k / top-p /
min-p, i.e. at the sampling temperature (``Sampler.forward`` in
``sglang/srt/layers/sampler.py``). With the environment variable
``SGLANG_RETURN_ORIGINAL_LOGPROB=1`` on the server, and for greedy requests
(``temperature=0``, which SGLang runs as ``top_k=1`` at temperature 1), they are the raw
``log_softmax(logits)``, at temperature 1. The batch says which in vLLM's words
(``meta_info["logprobs_mode"]``: ``"processed_logprobs"`` or ``"raw_logprobs"``), so that
:func:`log_prob_temperature` gives the temperature to pass to
:func:`pytest_rollout_golden.mismatch.sampled_log_probs`.
"""

from __future__ import annotations

import operator
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ._internal.rollout_rows import Row, rollout_batch
from .store.codec import RolloutBatch
from .vllm_batch import log_prob_temperature

__all__ = ["log_prob_temperature", "sglang_generate", "sglang_rollout"]

ORIGINAL_LOGPROB_ENV = "SGLANG_RETURN_ORIGINAL_LOGPROB"
"""The environment variable that makes SGLang return log probs before temperature."""

_GREEDY_BELOW = 1e-6  # SGLang's _SAMPLING_EPS: a lower temperature is greedy (top_k=1)
_LOGPROB_HINT = "generate with return_logprob=True"


def sglang_rollout(
    results: Mapping[str, Any] | Sequence[Mapping[str, Any]],
    *,
    input_ids: Sequence[int] | Sequence[Sequence[int]],
    pad_token_id: int,
    prompt_length: int | None = None,
    response_length: int | None = None,
    uids: Sequence[str] | None = None,
    temperature: float | None = None,
    return_original_logprob: bool = False,
) -> RolloutBatch:
    """The verl rollout batch of SGLang's ``results`` for the prompts ``input_ids``.

    ``results``: what ``Engine.generate(input_ids=..., return_logprob=True)`` (or
    ``async_generate``, or the HTTP ``/generate`` endpoint) returned, one dict or the list;
    ``input_ids``: the prompts' token ids as given to it (one list of ints for one prompt).
    The same batch as :func:`pytest_rollout_golden.vllm_batch.vllm_rollout`: one row per
    result in SGLang's order (prompt-major, so the ``n`` samples of prompt ``i`` share
    ``uids[i]``, default ``str(i)``), the same keys, padding, masks and dtypes;
    ``non_tensor_batch["finish_reason"]`` is the ``type`` of SGLang's finish reason.

    ``meta_info`` holds ``pad_token_id``, ``temperature`` when given, and ``logprobs_mode``:
    ``"raw_logprobs"`` when ``return_original_logprob`` (the server ran with
    ``SGLANG_RETURN_ORIGINAL_LOGPROB=1``) or the temperature is 0 (greedy), otherwise
    ``"processed_logprobs"`` (see the module docstring).

    Each result is checked against its prompt: a ValueError names the result and field when
    ``output_token_logprobs`` is missing, its length or token ids differ from
    ``output_ids`` (a log prob shifted by one position, the prompt's last token's among
    them, is named as such), or ``prompt_tokens`` / ``input_token_logprobs`` are not
    those of the prompt it is paired with.
    """
    items = [results] if isinstance(results, Mapping) else list(results)
    prompts = _prompts(input_ids)
    if not items:
        raise ValueError("no SGLang results to convert (empty results)")
    if len(items) % len(prompts):
        raise ValueError(
            f"got {len(items)} SGLang results for {len(prompts)} prompts: each prompt has n "
            "results, prompt-major; pass the input_ids given to generate"
        )
    if uids is not None and len(uids) != len(prompts):
        raise ValueError(f"got {len(uids)} uids for {len(prompts)} prompts")
    n = len(items) // len(prompts)
    rows = []
    for j, result in enumerate(items):
        k = j // n
        uid = str(k) if uids is None else uids[k]
        rows.append(_row(result, prompts[k], uid, f"SGLang result {j} (prompt {k})"))
    meta_info: dict[str, Any] = {}
    if temperature is not None:
        meta_info["temperature"] = float(temperature)
    raw = return_original_logprob or (temperature is not None and temperature < _GREEDY_BELOW)
    meta_info["logprobs_mode"] = "raw_logprobs" if raw else "processed_logprobs"
    return rollout_batch(
        rows,
        pad_token_id=pad_token_id,
        prompt_length=prompt_length,
        response_length=response_length,
        meta_info=meta_info,
        max_tokens_hint="sampling_params={{'max_new_tokens': {R}}}",
    )


def _prompts(input_ids: Sequence[int] | Sequence[Sequence[int]]) -> list[list[int]]:
    """The prompts' token ids, one list per prompt (SGLang's single-prompt form too)."""
    if isinstance(input_ids, (str, bytes)) or not len(input_ids):
        raise ValueError("input_ids must be the prompts' token ids, as given to generate")
    try:
        operator.index(input_ids[0])  # an int (numpy's, a 0-d tensor's too): one prompt
    except TypeError:
        return [[int(t) for t in prompt] for prompt in input_ids]  # type: ignore[union-attr]
    return [[int(t) for t in input_ids]]  # type: ignore[arg-type]


def _row(result: Mapping[str, Any], prompt: list[int], uid: str, where: str) -> Row:
    """One completion: its tokens, the log prob of each, checked against ``prompt``."""
    meta = result.get("meta_info")
    if not isinstance(meta, Mapping) or "output_ids" not in result:
        raise ValueError(
            f"{where} has no {'output_ids' if isinstance(meta, Mapping) else 'meta_info'}: "
            "pass the dicts Engine.generate or /generate returned, unchanged"
        )
    where = f"{where}, id {meta.get('id')!r}"
    tokens = [int(t) for t in result["output_ids"]]
    _check_prompt(meta, result.get("prompt_token_ids"), prompt, where)
    entries = meta.get("output_token_logprobs")
    if entries is None:
        raise ValueError(f"{where} carries no meta_info['output_token_logprobs']; {_LOGPROB_HINT}")
    logprobs = _sampled_logprobs(list(entries), tokens, prompt, where)
    reason = meta.get("finish_reason")
    reason = reason.get("type") if isinstance(reason, Mapping) else reason
    return Row(prompt, tokens, logprobs, uid, reason)


def _check_prompt(
    meta: Mapping[str, Any], prompt_token_ids: Any, prompt: list[int], where: str
) -> None:
    """The result was generated from ``prompt``, as far as the result tells."""
    remedy = (
        "results are prompt-major (the n samples of prompt 0 first); pass the input_ids "
        "given to generate, in their order"
    )
    count = meta.get("prompt_tokens")
    if count is not None and int(count) != len(prompt):
        raise ValueError(
            f"{where}: meta_info['prompt_tokens'] is {count} but its prompt has "
            f"{len(prompt)} tokens; {remedy}"
        )
    if prompt_token_ids is not None and [int(t) for t in prompt_token_ids] != prompt:
        raise ValueError(f"{where}: prompt_token_ids are not its prompt's input_ids; {remedy}")
    scored = [int(e[1]) for e in meta.get("input_token_logprobs") or ()]
    if scored and prompt[len(prompt) - len(scored) :] != scored:
        raise ValueError(
            f"{where}: meta_info['input_token_logprobs'] are not for the last {len(scored)} "
            f"tokens of its prompt; {remedy}"
        )


def _sampled_logprobs(
    entries: list[Any], tokens: list[int], prompt: list[int], where: str
) -> list[float]:
    """The log prob of each generated token: ``entries[i]`` must be ``output_ids[i]``'s."""
    ids = [int(e[1]) for e in entries]
    field = "meta_info['output_token_logprobs']"
    if ids != tokens:
        shifted = prompt[-1:] + tokens
        if ids in (shifted, shifted[:-1]) and ids:
            raise ValueError(
                f"{where}: {field} is shifted by one position: entry 0 is for the prompt's last "
                f"token {ids[0]}, entry i for the token before output_ids[i]; entry i must be "
                "the log prob of output_ids[i] (the logits at the position before it predict "
                "it): pass SGLang's output_token_logprobs unchanged, not sliced from the prompt's"
            )
        if len(ids) != len(tokens):
            raise ValueError(
                f"{where} has {len(tokens)} output_ids but {len(ids)} entries in {field}; "
                "pass the result unchanged (a streamed result only once it finished)"
            )
        i = next(i for i, (a, b) in enumerate(zip(ids, tokens, strict=True)) if a != b)
        raise ValueError(
            f"{where}: {field}[{i}] is for token {ids[i]} but output_ids[{i}] is {tokens[i]}; "
            "entry i must be the log prob of output_ids[i]"
        )
    out = []
    for i, entry in enumerate(entries):
        if entry[0] is None:
            raise ValueError(f"{where}: {field}[{i}] has no logprob (None); {_LOGPROB_HINT}")
        out.append(float(entry[0]))
    return out


def sglang_generate(
    engine: Any,
    input_ids: Sequence[int] | Sequence[Sequence[int]],
    sampling_params: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
    *,
    pad_token_id: int,
    prompt_length: int | None = None,
    response_length: int | None = None,
    uids: Sequence[str] | None = None,
) -> Callable[[], RolloutBatch]:
    """A ``generate`` for ``golden.rollout``: ``engine.generate`` as a batch.

    ``golden.rollout(sglang_generate(engine, input_ids, {"temperature": 0.7, "n": 4},
    pad_token_id=tok.pad_token_id))`` runs SGLang only when the rollout is recorded, with
    ``return_logprob=True``. The batch's ``temperature`` is the sampling params' (SGLang's
    default 1.0), and its log probs are raw where ``SGLANG_RETURN_ORIGINAL_LOGPROB`` is set
    in this process's environment (the engine's processes inherit it).
    """
    params = sampling_params or {}
    temperatures = {
        float(p.get("temperature", 1.0))
        for p in ([params] if isinstance(params, Mapping) else params)
    }
    temperature = temperatures.pop() if len(temperatures) == 1 else None
    original = os.environ.get(ORIGINAL_LOGPROB_ENV, "").lower() in ("1", "true")

    def generate() -> RolloutBatch:
        results = engine.generate(
            input_ids=input_ids, sampling_params=sampling_params, return_logprob=True
        )
        return sglang_rollout(
            results,
            input_ids=input_ids,
            uids=uids,
            temperature=temperature,
            return_original_logprob=original,
            pad_token_id=pad_token_id,
            prompt_length=prompt_length,
            response_length=response_length,
        )

    return generate
