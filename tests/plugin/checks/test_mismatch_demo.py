"""A real train–inference pair on CPU: a tiny Llama built from a config (no download).

The "engine" decodes incrementally with a KV cache, one sequence at a time, sampling at
temperature 0.7 and reporting processed log probs (``log_softmax(logits / T)``, vLLM's
``logprobs_mode="processed_logprobs"``), in float32 or bf16. The "trainer" recomputes the
log probs of the sampled tokens in one padded float32 forward (left-padded prompts,
right-padded responses, verl's position ids). A correct pair passes the published bounds;
each seeded bug fails ``golden.check_mismatch`` naming the metric, the bound and where.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest
import torch

from pytest_rollout_golden import Golden, mismatch
from pytest_rollout_golden.errors import GoldenMismatch

transformers = pytest.importorskip("transformers")

PROMPTS = [[1, 5, 9, 13, 22, 7], [1, 30, 4], [1, 11, 12, 13, 14, 15, 16, 17], [1, 40]]
MAX_TOKENS = [10, 6, 8, 3]  # ragged responses: right padding in the batch
TEMPERATURE = 0.7
P, R = max(map(len, PROMPTS)), max(MAX_TOKENS)


@pytest.fixture(scope="module")
def model():
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    built = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():  # sharper distributions than the default init (std 0.02)
        for weight in built.parameters():
            if weight.dim() > 1:
                weight.mul_(4.0)
    return built


def _step(model, input_ids, cache):
    """One decode step. The KV cache's keyword is ``cache`` in transformers 5.24 and
    ``past_key_values`` in 5.17; the forward swallows an unknown keyword into ``**kwargs``
    (and then decodes without context), so it is read off the signature."""
    kwargs = {}
    if cache is not None:
        keyword = "cache" if "cache" in inspect.signature(model.forward).parameters else None
        kwargs[keyword or "past_key_values"] = cache
    out = model(input_ids=input_ids, use_cache=True, **kwargs)
    return out.logits[:, -1], getattr(out, "cache", None) or out.past_key_values


def engine(model, dtype, temperature=TEMPERATURE):
    """Sampled tokens and their processed log probs, decoding with a KV cache in ``dtype``."""
    generator = torch.Generator().manual_seed(0)
    model.to(dtype)
    rows = []
    try:
        with torch.no_grad():
            for prompt, max_tokens in zip(PROMPTS, MAX_TOKENS, strict=True):
                logits, cache = _step(model, torch.tensor([prompt]), None)
                tokens, log_probs = [], []
                for _ in range(max_tokens):
                    scores = torch.log_softmax(logits.float() / temperature, dim=-1)[0]
                    token = int(torch.multinomial(scores.exp(), 1, generator=generator))
                    tokens.append(token)
                    log_probs.append(float(scores[token]))
                    logits, cache = _step(model, torch.tensor([[token]]), cache)
                rows.append((tokens, log_probs))
    finally:
        model.float()
    return rows


def rollout_batch(rows):
    """verl's layout: left-padded prompts, right-padded responses, 0 on padding."""
    B = len(rows)
    input_ids = torch.zeros(B, P + R, dtype=torch.long)
    attention_mask = torch.zeros(B, P + R, dtype=torch.long)
    responses = torch.zeros(B, R, dtype=torch.long)
    response_mask = torch.zeros(B, R, dtype=torch.long)
    rollout_log_probs = torch.zeros(B, R)
    for b, (prompt, (tokens, log_probs)) in enumerate(zip(PROMPTS, rows, strict=True)):
        input_ids[b, P - len(prompt) : P] = torch.tensor(prompt)
        attention_mask[b, P - len(prompt) : P + len(tokens)] = 1
        input_ids[b, P : P + len(tokens)] = torch.tensor(tokens)
        responses[b, : len(tokens)] = torch.tensor(tokens)
        response_mask[b, : len(tokens)] = 1
        rollout_log_probs[b, : len(tokens)] = torch.tensor(log_probs)
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "responses": responses,
        "response_mask": response_mask,
        "rollout_log_probs": rollout_log_probs,
    }


def trainer(model, batch, *, bug=None):
    """The trainer's float32 log probs of the sampled tokens; ``bug`` seeds one mistake."""
    mask = batch["attention_mask"]
    if bug == "padding side":  # a right-padding mask for a left-padded batch
        lengths = mask.sum(-1, keepdim=True)
        mask = (torch.arange(mask.shape[-1]) < lengths).long()
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(
            input_ids=batch["input_ids"], attention_mask=mask, position_ids=position_ids
        ).logits
    predicting = logits[:, P - 1 : -1]  # logits[t - 1] predict token t
    if bug == "off by one":  # logits[t] (predicting token t + 1) scored against token t
        predicting = logits[:, P:]
    tokens = batch["responses"]
    if bug == "wrong token":  # the greedy token instead of the sampled one
        tokens = predicting.argmax(-1)
    temperature = 1.0 if bug == "temperature" else TEMPERATURE
    return mismatch.sampled_log_probs(predicting, tokens, temperature=temperature)


def gate(directory: Path, log_probs, batch) -> str:
    """Run ``golden.check_mismatch`` on a golden of its own; the failure text ('' if none)."""
    try:
        with Golden(directory) as golden:
            golden.check_mismatch(log_probs, batch["rollout_log_probs"], batch["response_mask"])
    except GoldenMismatch as failure:
        return str(failure)
    return ""


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bf16"])
def test_a_correct_engine_trainer_pair_passes_records_and_replays(model, dtype, tmp_path):
    batch = rollout_batch(engine(model, dtype))
    log_probs = trainer(model, batch)
    values = mismatch.metrics(log_probs, batch["rollout_log_probs"], batch["response_mask"])
    if dtype == torch.float32:  # KV-cache decode vs one padded forward: float32 rounding only
        assert values["abs_logprob_diff_max"] < 1e-5
    else:  # a bf16 engine is visibly off, but well within the published bounds
        assert 1e-4 < values["abs_logprob_diff_mean"] < 0.0104 / 2
    assert gate(tmp_path / "g", log_probs, batch) == ""  # recorded
    again = rollout_batch(engine(model, dtype))
    assert gate(tmp_path / "g", trainer(model, again), again) == ""  # replayed, same numbers
    assert torch.equal(again["rollout_log_probs"], batch["rollout_log_probs"])


def test_a_grown_mismatch_fails_against_the_golden_within_the_bounds(model, tmp_path):
    batch = rollout_batch(engine(model, torch.float32))
    assert gate(tmp_path / "g", trainer(model, batch), batch) == ""
    bf16 = rollout_batch(engine(model, torch.bfloat16))  # the engine switched to bf16
    text = gate(tmp_path / "g", trainer(model, bf16), bf16)
    assert "mismatch/abs_logprob_diff_mean" in text
    assert "beyond its bound" not in text  # the golden catches it, not a bound


BUGS = {
    # bug: (a metric whose bound it breaks, rows it shows worst)
    "temperature": ("mismatch/token_mult_prob_error", None),
    "off by one": ("mismatch/gen_kl_error", None),
    "wrong token": ("mismatch/abs_logprob_diff_mean", None),
    "padding side": ("mismatch/gen_kl_error", {1, 3}),  # the rows with padded prompts
}


@pytest.mark.parametrize("bug", list(BUGS))
def test_each_seeded_bug_fails_naming_metric_bound_and_location(model, bug, tmp_path):
    batch = rollout_batch(engine(model, torch.float32))
    text = gate(tmp_path / "g", trainer(model, batch, bug=bug), batch)
    metric, rows = BUGS[bug]
    assert re.search(rf"beyond its bound at step 0: {metric} = [\d.e+-]+, bound {metric} <= ", text)
    assert "(NeMo-RL CI:" in text or "(SkyRL CI:" in text
    worst = re.search(r"worst sequences \(mean \|log_probs - rollout_log_probs\|\): (.*)", text)
    assert worst is not None and re.search(r"worst tokens: \(row \d, position \d+\)", text)
    if rows is not None:
        first_two = {int(b) for b in re.findall(r"row (\d+):", worst.group(1))[:2]}
        assert first_two == rows
    assert not (tmp_path / "g").exists()  # a run beyond a bound records nothing


def test_the_exact_lane_is_not_a_cpu_path(model, tmp_path):
    """Why the exact lane skips here: KV-cache decode and one padded prefill round apart."""
    batch = rollout_batch(engine(model, torch.float32))
    exceeded = r"abs_logprob_diff_max = [\d.e-]+, bound .* <= 0\.0 "
    with pytest.raises(GoldenMismatch, match=exceeded), Golden(tmp_path / "g") as golden:
        golden.check_mismatch(
            trainer(model, batch),
            batch["rollout_log_probs"],
            batch["response_mask"],
            bounds={"abs_logprob_diff_max": 0.0},
        )


@pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="exact lane (bitwise-equal engine and trainer log probs) is a GPU path: it needs "
    "batch-invariant kernels (vLLM VLLM_BATCH_INVARIANT=1, SGLang deterministic inference); "
    "CPU decode and prefill round differently",
)
def test_the_exact_lane_demands_bitwise_equal_log_probs_on_gpu(model, tmp_path):
    """The exact lane's mechanics on a GPU: an engine prefill and a trainer forward of the
    same sequence with the same kernels pass ``abs_logprob_diff_max <= 0``."""
    cuda = model.to("cuda")
    try:
        with torch.no_grad():
            prompt = torch.tensor([PROMPTS[0] + [3, 4, 5, 6]], device="cuda")
            logits = cuda(input_ids=prompt).logits[:, len(PROMPTS[0]) - 1 : -1]
            first = mismatch.sampled_log_probs(logits, prompt[:, len(PROMPTS[0]) :])
            again = cuda(input_ids=prompt).logits[:, len(PROMPTS[0]) - 1 : -1]
            second = mismatch.sampled_log_probs(again, prompt[:, len(PROMPTS[0]) :])
    finally:
        model.to("cpu")
    mask = torch.ones_like(first, dtype=torch.bool)
    with Golden(tmp_path / "g") as golden:
        golden.check_mismatch(first, second, mask, bounds={"abs_logprob_diff_max": 0.0})
