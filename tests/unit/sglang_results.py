"""SGLang's ``Engine.generate`` result dicts, built as SGLang 0.5.23 builds them.

SGLang's modules that build these dicts do not import here (``sglang/srt/configs``
imports ``torchvision`` at module level, whose PyPI wheels are CUDA builds that fail
beside torch's CPU build: ``operator torchvision::nms does not exist``; ``sglang`` itself
imports ``triton``), so each step below follows the source, named in its comment.
"""

from __future__ import annotations

import math
from typing import Any

EOS = 2


def finish_reason(kind: str, value: Any = None) -> dict[str, Any]:
    """``BaseFinishReason.to_json()`` (``sglang/srt/managers/schedule_batch.py``):
    ``FINISH_MATCHED_TOKEN`` / ``FINISH_LENGTH`` / ``FINISH_ABORT``."""
    if kind == "stop":
        return {"type": "stop", "matched": value}
    if kind == "length":
        return {"type": "length", "length": value}
    return {"type": "abort", "message": value or "Aborted", "status_code": None, "err_type": None}


def detokenize_logprob_tokens(vals, idxs, decode_to_text=False):
    """``TokenizerManager.detokenize_logprob_tokens`` (``tokenizer_manager.py``)."""
    if not decode_to_text:
        return [(logprob, token_id, None) for logprob, token_id in zip(vals, idxs, strict=True)]
    return list(zip(vals, idxs, [f"<{i}>" for i in idxs], strict=True))


def detokenize_top_logprobs_tokens(vals, idxs, decode_to_text=False):
    """``TokenizerManager.detokenize_top_logprobs_tokens``: ``None`` for an empty position."""
    return [
        detokenize_logprob_tokens(v, i, decode_to_text) if v else None
        for v, i in zip(vals, idxs, strict=True)
    ]


def result(
    rid: str,
    prompt: list[int],
    output_ids: list[int],
    logprobs: list[float],
    *,
    reason: dict[str, Any] | None = None,
    top: int = 0,
    logprob_start_len: int = -1,
    prompt_logprobs: list[float] | None = None,
    text_in_logprobs: bool = False,
) -> dict[str, Any]:
    """One finished, non-streamed result of ``Engine.generate(..., return_logprob=True)``.

    ``TokenizerManager._handle_batch_output`` (a ``BatchStrOutput``): ``meta_info`` starts
    with ``id``, ``finish_reason``, ``prompt_tokens``; ``convert_logprob_style`` /
    ``add_logprob_to_meta_info`` add the logprob fields; then ``completion_tokens``; the
    dict is ``{"text", "output_ids", "meta_info"}``. With ``top`` > 0 the top tokens are
    others than the sampled one, ranked above it.
    """
    if reason is None:
        reason = (
            finish_reason("stop", EOS)
            if output_ids[-1:] == [EOS]
            else finish_reason("length", len(output_ids))
        )
    # Scheduler: logprob_start_len -1 with return_logprob means len(origin_input_ids)
    # (Scheduler.handle_generate_request); SchedulerLogprobResultProcessor.
    # _process_input_token_logprobs: values [None] + computed[:-1], ids input_ids[start:]
    # prompt_logprobs[t - 1]: the log prob of prompt[t], from the logits at position t - 1
    start = len(prompt) if logprob_start_len == -1 else logprob_start_len
    computed = list(prompt_logprobs or [-1.0] * (len(prompt) - 1))[start:]
    input_vals = [None, *computed][: len(prompt) - start]
    meta: dict[str, Any] = {
        "id": rid,
        "finish_reason": reason,
        "prompt_tokens": len(prompt),
        "weight_version": "default",
        "num_retractions": 0,
        "input_token_logprobs": detokenize_logprob_tokens(
            input_vals, prompt[start:], text_in_logprobs
        ),
        "output_token_logprobs": detokenize_logprob_tokens(logprobs, output_ids, text_in_logprobs),
        "output_token_logprobs_length": len(output_ids),
    }
    if top:
        ranked = [[lp + 0.5 + k for k in range(top)] for lp in logprobs]
        ids = [[1000 + k for k in range(top)] for _ in logprobs]
        meta["input_top_logprobs"] = detokenize_top_logprobs_tokens(
            [None] * len(input_vals), [None] * len(input_vals), text_in_logprobs
        )
        meta["output_top_logprobs"] = detokenize_top_logprobs_tokens(ranked, ids, text_in_logprobs)
    meta.update({"reasoning_tokens": 0, "completion_tokens": len(output_ids), "cached_tokens": 0})
    meta["e2e_latency"] = 0.01
    return {
        "text": "".join(f"<{t}>" for t in output_ids),
        "output_ids": output_ids,
        "meta_info": meta,
    }


PROMPTS = [[5, 6, 7], [9]]


def results(**kwargs: Any) -> list[dict[str, Any]]:
    """``Engine.generate(input_ids=PROMPTS, sampling_params={"n": 2}, return_logprob=True)``:
    prompt-major (``TokenizerManager._handle_batch_request`` sends prompt 0's n samples
    first and gathers the responses in that order)."""
    return [
        result("a0", PROMPTS[0], [30], [-2.0], **kwargs),
        result("a1", PROMPTS[0], [20, 21, EOS], [-0.5, -1.25, -0.125], **kwargs),
        result("b0", PROMPTS[1], [40, 41, 42, 43], [-0.25, -0.75, -1.5, -3.0], **kwargs),
        result("b1", PROMPTS[1], [EOS], [-0.0625], **kwargs),
    ]


def as_json(value: Any) -> Any:
    """What the HTTP ``/generate`` endpoint's JSON reads back as: tuples become lists."""
    if isinstance(value, dict):
        return {k: as_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [as_json(v) for v in value]
    assert not (isinstance(value, float) and math.isnan(value))
    return value
