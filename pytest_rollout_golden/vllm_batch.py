"""A verl-style rollout batch from the outputs of ``vllm.LLM.generate``.

Reads vLLM's public output classes by attribute, without importing vLLM:

* ``vllm.outputs.RequestOutput``: ``request_id``, ``prompt_token_ids``, ``outputs``;
* ``vllm.outputs.CompletionOutput``: ``index``, ``token_ids``, ``logprobs``,
  ``finish_reason``;
* the sample logprobs of a completion (``vllm.logprobs.SampleLogprobs``): either a
  list with one ``dict[int, vllm.logprobs.Logprob]`` per generated token (the
  ``Logprob`` dataclass has ``logprob``, ``rank``, ``decoded_token``), or
  ``vllm.logprobs.FlatLogprobs`` (``SamplingParams(flat_logprobs=True)``), whose flat
  lists ``token_ids`` / ``logprobs`` are sliced per position by ``start_indices`` /
  ``end_indices``. Any other sequence whose item ``i`` is such a dict works too.

The logprob taken for each position is that of the sampled token, looked up by its
id (with ``logprobs=k`` the dict also holds the top k, and the sampled token need not
be the first). Ask vLLM for it with ``SamplingParams(logprobs=0)``; without
``logprobs`` vLLM returns ``None`` and :func:`vllm_rollout` raises. Set
``SamplingParams(seed=...)`` too, so that regenerating the rollout on the same
machine and vLLM version gives the same tokens.

Which log probs these are is the engine's choice, not the request's: vLLM's engine
argument ``logprobs_mode`` (``LLM(..., logprobs_mode=...)``) is ``"raw_logprobs"`` by
default, the log softmax of the model's logits *before* temperature, penalties and
top-k/top-p, i.e. at temperature 1; ``"processed_logprobs"`` gives them after the logits
processors, penalties, temperature scaling and top-k/top-p (renormalized over the tokens
kept), i.e. of the distribution actually sampled from. ``"raw_logits"`` and
``"processed_logits"`` report logits, not log probs, and are refused. A trainer comparing
its log probs with ``rollout_log_probs`` must compute them at the same temperature, or
every run at temperature ≠ 1 shows a spurious mismatch (TRL #4159); with top-k/top-p,
processed log probs are renormalized over the kept tokens, which a temperature alone does
not reproduce. :func:`vllm_generate` stores the sampling ``temperature`` and, where the engine
exposes it, its ``logprobs_mode`` in ``meta_info``; :func:`log_prob_temperature` reads the
temperature the recorded log probs are at, for
:func:`pytest_rollout_golden.mismatch.sampled_log_probs`.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from ._internal.rollout_rows import Row, rollout_batch
from .store.codec import RolloutBatch

__all__ = ["VllmSamplingWarning", "log_prob_temperature", "vllm_generate", "vllm_rollout"]

RAW_MODES = ("raw_logprobs",)
"""vLLM ``logprobs_mode`` values reported before temperature scaling."""

LOGITS_MODES = ("raw_logits", "processed_logits")
"""vLLM ``logprobs_mode`` values that report logits, not log probs: refused."""

_LOGPROBS_HINT = (
    "pass SamplingParams(logprobs=0) (the sampled token's log prob; logprobs=k adds the top k)"
)


class VllmSamplingWarning(UserWarning):
    """The SamplingParams make the recorded rollout impossible to regenerate."""


def vllm_rollout(
    outputs: Sequence[Any],
    *,
    pad_token_id: int,
    prompt_length: int | None = None,
    response_length: int | None = None,
    uids: Sequence[str] | None = None,
    temperature: float | None = None,
    logprobs_mode: str | None = None,
) -> RolloutBatch:
    """The verl rollout batch of ``outputs``, the ``RequestOutput`` list of ``LLM.generate``.

    One row per completion, request by request, completions in ``index`` order; the
    ``n`` completions of one prompt share a ``uid`` (``uids[i]`` for request ``i``,
    default ``str(i)``). ``batch`` holds, with P = ``prompt_length`` and R =
    ``response_length`` (default: the longest prompt / completion):

    * ``prompts`` [B, P] left-padded, ``responses`` [B, R] right-padded with
      ``pad_token_id``; ``input_ids`` = both side by side (int64);
    * ``attention_mask`` [B, P+R] (1 on real tokens), ``response_mask`` [B, R] (1 on
      generated tokens, EOS included, as vLLM lists it in ``token_ids``), int64;
    * ``position_ids`` = ``clamp(cumsum(attention_mask) - 1, min=0)`` (verl's
      ``compute_position_id_with_mask``);
    * ``rollout_log_probs`` [B, R] float32: vLLM's log prob of each sampled token, 0 on
      padding.

    ``non_tensor_batch`` holds ``uid`` and ``finish_reason`` (numpy object arrays);
    ``meta_info`` holds ``pad_token_id``, and ``temperature`` / ``logprobs_mode`` when
    given (the sampling temperature; the engine's ``logprobs_mode``, see the module
    docstring). For a verl ``DataProto``:
    ``DataProto.from_dict(b.batch, b.non_tensor_batch, b.meta_info)``.
    """
    meta_info: dict[str, Any] = {}
    if temperature is not None:
        meta_info["temperature"] = float(temperature)
    if logprobs_mode is not None:
        meta_info["logprobs_mode"] = _log_prob_mode(logprobs_mode)
    return rollout_batch(
        _rows(outputs, uids),
        pad_token_id=pad_token_id,
        prompt_length=prompt_length,
        response_length=response_length,
        meta_info=meta_info,
        max_tokens_hint="SamplingParams(max_tokens={R})",
    )


def _rows(outputs: Sequence[Any], uids: Sequence[str] | None) -> list[Row]:
    """One row per completion, request by request, completions in ``index`` order."""
    if uids is not None and len(uids) != len(outputs):
        raise ValueError(f"got {len(uids)} uids for {len(outputs)} vLLM request outputs")
    rows = []
    for i, request in enumerate(outputs):
        prompt = request.prompt_token_ids
        if prompt is None:
            raise ValueError(
                f"vLLM request {request.request_id!r} has no prompt_token_ids; "
                "only decoder-only generation outputs can be converted"
            )
        uid = str(i) if uids is None else uids[i]
        for completion in sorted(request.outputs, key=lambda c: c.index):
            where = f"vLLM request {request.request_id!r}, completion {completion.index}"
            tokens = [int(t) for t in completion.token_ids]
            logprobs = _sampled_logprobs(completion.logprobs, tokens, where)
            rows.append(Row(list(prompt), tokens, logprobs, uid, completion.finish_reason))
    if not rows:
        raise ValueError("no vLLM completions to convert (empty outputs)")
    return rows


def log_prob_temperature(meta_info: Any) -> float:
    """The temperature ``rollout_log_probs`` were computed at: 1.0 for vLLM's default
    ``raw_logprobs``, the sampling temperature for ``processed_logprobs``.

    ``meta_info``: a batch's (``RolloutBatch``, verl ``DataProto``) or the batch itself.
    ValueError when it does not say (a batch from :func:`vllm_rollout` without
    ``logprobs_mode``): then state it with ``LLM(..., logprobs_mode=...)`` knowledge of your
    own.
    """
    meta = getattr(meta_info, "meta_info", meta_info)
    mode = meta.get("logprobs_mode")
    if mode is None:
        raise ValueError(
            "the batch does not say which log probs the engine reported (no logprobs_mode in "
            "meta_info): vLLM's default raw_logprobs are at temperature 1, processed_logprobs "
            "at the sampling temperature"
        )
    if _log_prob_mode(mode) in RAW_MODES:
        return 1.0
    temperature = meta.get("temperature")
    if temperature is None:
        raise ValueError(f"logprobs_mode {mode!r} is at the sampling temperature, not in meta_info")
    return float(temperature)


def vllm_generate(
    llm: Any,
    prompts: Any,
    sampling_params: Any,
    *,
    pad_token_id: int,
    prompt_length: int | None = None,
    response_length: int | None = None,
    uids: Sequence[str] | None = None,
) -> Callable[[], RolloutBatch]:
    """A ``generate`` for ``golden.rollout``: ``llm.generate(prompts, sampling_params)`` as a batch.

    ``golden.rollout(vllm_generate(llm, prompts, params, pad_token_id=tok.pad_token_id))``
    runs vLLM only when the rollout is recorded. The parameters are checked here, before
    anything runs: a ``sampling_params`` without ``logprobs`` is a ValueError (the batch
    would have no ``rollout_log_probs``), one without ``seed`` a
    :class:`VllmSamplingWarning` (a regenerated rollout would hold other tokens).
    """
    for params in sampling_params if isinstance(sampling_params, Sequence) else [sampling_params]:
        if getattr(params, "logprobs", None) is None:
            raise ValueError(
                f"SamplingParams has logprobs=None, so vLLM returns no log probs and the "
                f"batch cannot hold rollout_log_probs; {_LOGPROBS_HINT}"
            )
        if getattr(params, "seed", None) is None:
            warnings.warn(
                "SamplingParams has seed=None: regenerating this rollout gives other tokens; "
                "pass SamplingParams(seed=...) to record a rollout you can regenerate",
                VllmSamplingWarning,
                stacklevel=2,
            )
    temperatures = {
        getattr(p, "temperature", None)
        for p in (sampling_params if isinstance(sampling_params, Sequence) else [sampling_params])
    }
    return functools.partial(
        _generate,
        llm,
        prompts,
        sampling_params,
        pad_token_id=pad_token_id,
        prompt_length=prompt_length,
        response_length=response_length,
        uids=uids,
        temperature=temperatures.pop() if len(temperatures) == 1 else None,
        logprobs_mode=mode if (mode := engine_logprobs_mode(llm)) is None else _log_prob_mode(mode),
    )


def _log_prob_mode(mode: Any) -> str:
    """``mode`` as a string; ValueError for the modes that report logits."""
    mode = str(getattr(mode, "value", mode))
    if mode in LOGITS_MODES:
        raise ValueError(
            f"logprobs_mode {mode!r} reports logits, not log probs: rollout_log_probs would "
            "hold logits, which no trainer log probs match; start the engine with "
            "LLM(..., logprobs_mode='raw_logprobs') or 'processed_logprobs'"
        )
    return mode


def engine_logprobs_mode(llm: Any) -> str | None:
    """``llm``'s ``logprobs_mode`` engine argument, where the engine exposes it."""
    for path in ("llm_engine.model_config", "llm_engine.vllm_config.model_config"):
        obj = llm
        for attr in path.split("."):
            obj = getattr(obj, attr, None)
        mode = getattr(obj, "logprobs_mode", None)
        if mode is not None:
            return str(getattr(mode, "value", mode))
    return None


def _generate(llm: Any, prompts: Any, sampling_params: Any, **convert: Any) -> RolloutBatch:
    return vllm_rollout(llm.generate(prompts, sampling_params, use_tqdm=False), **convert)


def _sampled_logprobs(logprobs: Any, tokens: list[int], where: str) -> list[float]:
    """The log prob vLLM reported for each sampled token of one completion."""
    if logprobs is None:
        raise ValueError(f"{where} carries no logprobs; {_LOGPROBS_HINT}")
    if len(logprobs) != len(tokens):
        raise ValueError(
            f"{where} has {len(tokens)} tokens but logprobs for {len(logprobs)} positions"
        )
    flat = all(
        hasattr(logprobs, a) for a in ("start_indices", "end_indices", "token_ids", "logprobs")
    )
    out = []
    for i, token in enumerate(tokens):
        if flat:  # FlatLogprobs: read its lists instead of building a dict per position
            ids = logprobs.token_ids[logprobs.start_indices[i] : logprobs.end_indices[i]]
            at = ids.index(token) + logprobs.start_indices[i] if token in ids else None
            value = None if at is None else logprobs.logprobs[at]
        else:
            entry = (logprobs[i] or {}).get(token)
            value = None if entry is None else entry.logprob
        if value is None:
            raise ValueError(f"{where}: no logprob for the sampled token {token} at position {i}")
        out.append(float(value))
    return out
