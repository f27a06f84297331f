"""The vLLM adapter on vLLM 0.33.0's own output classes, built by vLLM's own output path.

``vllm_engine.generate`` decodes a toy model and hands each step to vLLM's real
``OutputProcessor`` (``LogprobsProcessor``, ``ParentRequest``), which builds the
``RequestOutput`` / ``CompletionOutput`` / ``Logprob`` / ``FlatLogprobs`` objects that
``LLM.generate`` returns; the toy sampler keeps what it drew, the truth every conversion is
held to bit for bit. Planted faults (a top-1 log prob for the sampled one, a shifted
position, a wrong temperature) must fail: the adapter refuses them, or the mismatch gate
(the default bounds of ``golden.check_mismatch``) catches them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import types
import typing
from pathlib import Path

import pytest
import torch
import vllm_engine
from vllm_engine import EOS, logits_of

from pytest_rollout_golden import mismatch, vllm_batch
from pytest_rollout_golden._internal.tolerance.mismatch_bounds import DEFAULT_BOUNDS
from pytest_rollout_golden.vllm_batch import log_prob_temperature, vllm_generate, vllm_rollout

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
VLLM010 = Path(os.environ.get("VLLM010_TARGET", REPO / ".venv" / "vllm010"))

PROMPTS = [[5, 6, 11], [9], [3, 4]]
TEMPERATURE = 0.7
MODES = ["raw_logprobs", "processed_logprobs"]


def sampling_params(vllm, *, flat: bool = False, top: int = 2) -> list:
    """Three requests: n=2 with the top ``top`` and prompt logprobs, n=1 with only the sampled
    token's log prob, n=3; stop tokens, EOS and max_tokens end them."""
    common: dict = {"temperature": TEMPERATURE, "stop_token_ids": [17, 12]}
    if flat:  # vLLM 0.10 has no FlatLogprobs
        common["flat_logprobs"] = True
    return [
        vllm.SamplingParams(n=2, seed=3, logprobs=top, max_tokens=6, prompt_logprobs=1, **common),
        vllm.SamplingParams(n=1, seed=21, logprobs=0, max_tokens=4, **common),
        vllm.SamplingParams(n=3, seed=5, logprobs=top, max_tokens=5, **common),
    ]


def generate(vllm, mode: str = "raw_logprobs", **kwargs) -> vllm_engine.Generation:
    return vllm_engine.generate(vllm, PROMPTS, sampling_params(vllm, **kwargs), logprobs_mode=mode)


def rows(generation: vllm_engine.Generation) -> list[tuple[list[int], vllm_engine.Sampled]]:
    """``(prompt, truth)`` per completion, request by request, index by index."""
    return [
        (PROMPTS[int(request)], generation.sampled[(request, index)])
        for request, index in sorted(generation.sampled, key=lambda key: (int(key[0]), key[1]))
    ]


def assert_converts_exactly(batch, generation: vllm_engine.Generation) -> None:
    """``batch`` holds exactly what the sampler drew: ids, masks and float32 log-prob bits."""
    truth = rows(generation)
    P = max(len(prompt) for prompt, _ in truth)
    R = max(len(t.tokens) for _, t in truth)
    b = batch.batch
    assert b["responses"].shape == (len(truth), R) and b["prompts"].shape == (len(truth), P)
    for row, (prompt, sampled) in enumerate(truth):
        n = len(sampled.tokens)
        assert b["prompts"][row, P - len(prompt) :].tolist() == prompt
        assert b["attention_mask"][row, :P].tolist() == [0] * (P - len(prompt)) + [1] * len(prompt)
        assert b["responses"][row, :n].tolist() == sampled.tokens
        assert b["response_mask"][row].tolist() == [1] * n + [0] * (R - n)
        lp = b["rollout_log_probs"][row]
        assert lp.dtype == torch.float32
        assert lp[:n].view(torch.int32).tolist() == sampled.log_probs.view(torch.int32).tolist()
        assert lp[n:].view(torch.int32).tolist() == [0] * (R - n)
    groups = [str(i) for i, request in enumerate(PROMPTS) for _ in generation_group(generation, i)]
    assert batch.non_tensor_batch["uid"].tolist() == groups


def generation_group(generation: vllm_engine.Generation, request: int) -> list[int]:
    return sorted(index for r, index in generation.sampled if r == str(request))


def trainer_log_probs(batch, *, temperature: float, shift: int = 0) -> torch.Tensor:
    """The trainer's side, per row on the unpadded sequence: the toy model's logits
    ``[P-1 : -1]`` (shifted by ``shift`` for a planted fault) through
    :func:`mismatch.sampled_log_probs`."""
    b = batch.batch
    out = torch.zeros_like(b["rollout_log_probs"])
    for row in range(len(out)):
        mask = b["attention_mask"][row].bool()
        sequence = b["input_ids"][row][mask]
        n = int(b["response_mask"][row].sum())
        start = len(sequence) - n - 1 + shift
        logits = logits_of(torch.cat([sequence, sequence[-1:]]))[start : start + n]
        out[row, :n] = mismatch.sampled_log_probs(logits, sequence[-n:], temperature=temperature)
    return out


def gate(log_probs: torch.Tensor, batch) -> dict[str, float]:
    """The default mismatch bounds ``golden.check_mismatch`` holds, and which ones fail."""
    b = batch.batch
    values = mismatch.metrics(log_probs, b["rollout_log_probs"], b["response_mask"])
    return {
        name: values[name]
        for name, bound in DEFAULT_BOUNDS.items()
        if not bound.holds(values[name])
    }


# ------------------------------------------------------------------- the real classes


def test_the_objects_are_vllms_own_and_cover_every_case(vllm):
    """The generation really has what the conversion must handle; else the tests below
    would pass on too little."""
    from vllm.logprobs import FlatLogprobs, Logprob
    from vllm.outputs import CompletionOutput, RequestOutput

    outputs = generate(vllm).outputs
    assert [type(o) for o in outputs] == [RequestOutput] * 3
    assert [o.request_id for o in outputs] == ["0", "1", "2"]
    completions = [c for o in outputs for c in o.outputs]
    assert all(type(c) is CompletionOutput for c in completions)
    assert [len(o.outputs) for o in outputs] == [2, 1, 3]
    positions = [p for c in completions for p in c.logprobs]
    assert all(type(lp) is Logprob for p in positions for lp in p.values())
    # the sampled token is listed first; where it is not rank 1, the top 2 follow it
    assert any(next(iter(p.values())).rank > 1 and len(p) == 3 for p in positions)
    reasons = {(c.finish_reason, c.stop_reason, c.token_ids[-1] == EOS) for c in completions}
    assert {("stop", None, True), ("length", None, False)} <= reasons
    assert any(r == "stop" and isinstance(s, int) for r, s, _ in reasons)
    assert outputs[0].prompt_logprobs[0] is None and len(outputs[0].prompt_logprobs) == 3
    flat = generate(vllm, flat=True).outputs
    assert all(type(c.logprobs) is FlatLogprobs for o in flat for c in o.outputs)


@pytest.mark.parametrize("flat", [False, True], ids=["dicts", "FlatLogprobs"])
@pytest.mark.parametrize("mode", MODES)
def test_conversion_is_bit_exact(vllm, mode, flat):
    generation = generate(vllm, mode, flat=flat)
    batch = vllm_rollout(generation.outputs, pad_token_id=0)
    assert_converts_exactly(batch, generation)
    finish = [c.finish_reason for o in generation.outputs for c in o.outputs]
    assert batch.non_tensor_batch["finish_reason"].tolist() == finish
    assert batch.meta_info == {"pad_token_id": 0}


def test_top_k_logprobs_do_not_change_the_sampled_ones(vllm):
    with_top = vllm_rollout(generate(vllm, top=5).outputs, pad_token_id=0)
    sampled_only = vllm_rollout(generate(vllm, top=0).outputs, pad_token_id=0)
    assert torch.equal(with_top.batch["rollout_log_probs"], sampled_only.batch["rollout_log_probs"])


# ------------------------------------------------------------- planted converter faults


def top1_logprobs(logprobs, tokens, where):
    """A converter bug: the rank-1 entry's log prob instead of the sampled token's."""
    return [min(p.values(), key=lambda lp: lp.rank).logprob for p in logprobs]


def shifted_logprobs(logprobs, tokens, where):
    """A converter bug: each token gets the next position's log prob."""
    values = [p[t].logprob for p, t in zip(logprobs, tokens, strict=True)]
    return values[1:] + values[-1:]


@pytest.mark.parametrize("fault", [top1_logprobs, shifted_logprobs])
def test_a_planted_converter_fault_fails_the_exactness_check(vllm, monkeypatch, fault):
    generation = generate(vllm)
    monkeypatch.setattr(vllm_batch, "_sampled_logprobs", fault)
    with pytest.raises(AssertionError):
        assert_converts_exactly(vllm_rollout(generation.outputs, pad_token_id=0), generation)


# ----------------------------------------------------------- logprobs_mode, temperature


class ToyLLM:
    """``vllm.LLM`` as the adapter reads it: ``generate`` and ``llm_engine.model_config``."""

    def __init__(self, vllm, mode):
        self.vllm, self.mode = vllm, mode
        self.llm_engine = types.SimpleNamespace(
            model_config=types.SimpleNamespace(logprobs_mode=mode)
        )

    def generate(self, prompts, sampling_params, use_tqdm=True):
        return vllm_engine.generate(
            self.vllm,
            prompts,
            sampling_params,
            logprobs_mode=getattr(self.mode, "value", self.mode),
        ).outputs


def test_the_adapter_reads_logprobs_mode_where_vllm_keeps_it(vllm):
    """``LLM.llm_engine.model_config.logprobs_mode``: the path ``ToyLLM`` stands in for
    (read from the source: ``vllm.entrypoints.llm`` imports xgrammar, not installed here)."""
    from vllm.config.model import LogprobsMode, ModelConfig

    root = Path(vllm.__file__).parent
    assert "logprobs_mode" in ModelConfig.__dataclass_fields__
    assert "self.llm_engine = LLMEngine" in (root / "entrypoints" / "llm.py").read_text()
    engine = (root / "v1" / "engine" / "llm_engine.py").read_text()
    assert "self.model_config = vllm_config.model_config" in engine
    assert set(typing.get_args(LogprobsMode)) == {
        "raw_logprobs", "processed_logprobs", "raw_logits", "processed_logits",
    }  # fmt: skip


@pytest.mark.parametrize("mode", MODES)
def test_the_trainer_at_the_recorded_temperature_matches_exactly(vllm, mode):
    batch = vllm_generate(ToyLLM(vllm, mode), PROMPTS, sampling_params(vllm), pad_token_id=0)()
    assert batch.meta_info == {"pad_token_id": 0, "temperature": TEMPERATURE, "logprobs_mode": mode}
    temperature = log_prob_temperature(batch)
    assert temperature == (1.0 if mode == "raw_logprobs" else TEMPERATURE)
    trainer = trainer_log_probs(batch, temperature=temperature)
    assert torch.equal(trainer, batch.batch["rollout_log_probs"])
    assert gate(trainer, batch) == {}


@pytest.mark.parametrize("mode", MODES)
def test_a_trainer_at_the_other_temperature_fails_the_gate(vllm, mode):
    batch = vllm_generate(ToyLLM(vllm, mode), PROMPTS, sampling_params(vllm), pad_token_id=0)()
    wrong = TEMPERATURE if mode == "raw_logprobs" else 1.0
    assert gate(trainer_log_probs(batch, temperature=wrong), batch)


def test_a_batch_that_misstates_the_engines_mode_fails_the_gate(vllm):
    """Processed log probs recorded as raw: the trainer follows the batch to temperature 1."""
    batch = vllm_generate(
        ToyLLM(vllm, "processed_logprobs"), PROMPTS, sampling_params(vllm), pad_token_id=0
    )()
    batch.meta_info["logprobs_mode"] = "raw_logprobs"
    assert gate(trainer_log_probs(batch, temperature=log_prob_temperature(batch)), batch)


def test_a_trainer_off_by_one_position_fails_the_gate(vllm):
    """``logits[t]`` for token ``t`` instead of ``logits[t - 1]``."""
    batch = vllm_rollout(generate(vllm).outputs, pad_token_id=0)
    assert gate(trainer_log_probs(batch, temperature=1.0), batch) == {}
    assert gate(trainer_log_probs(batch, temperature=1.0, shift=1), batch)


# ------------------------------------------------------------ faults in the input


def test_logprobs_one_position_off_are_refused_when_only_the_sampled_token_is_listed(vllm):
    outputs = generate(vllm).outputs
    completion = outputs[1].outputs[0]  # logprobs=0: one entry per position, the sampled token
    assert len(set(completion.token_ids)) == len(completion.token_ids) > 1
    completion.logprobs = completion.logprobs[1:] + completion.logprobs[:1]
    with pytest.raises(
        ValueError,
        match=r"vLLM request '1', completion 0: no logprob for the sampled token \d+ at position 0",
    ):
        vllm_rollout(outputs, pad_token_id=0)


def test_log_probs_of_the_neighbouring_position_fail_the_gate(vllm):
    """An engine-side shift the adapter cannot see: each sampled token carries its log prob
    under the next position's distribution."""
    from vllm.logprobs import Logprob

    generation = generate(vllm)
    for output in generation.outputs:
        for completion in output.outputs:
            truth = generation.sampled[(output.request_id, completion.index)]
            rows_ = truth.reported[1:] + truth.reported[-1:]
            completion.logprobs = [
                {t: Logprob(float(row[t]), 1)} for t, row in zip(truth.tokens, rows_, strict=True)
            ]
    batch = vllm_rollout(generation.outputs, pad_token_id=0)
    assert gate(trainer_log_probs(batch, temperature=1.0), batch)


@pytest.mark.parametrize("mode", ["raw_logits", "processed_logits"])
def test_logits_modes_are_refused(vllm, mode):
    """vLLM's ``*_logits`` modes report logits, not log probs: no trainer temperature matches
    them, so a batch of them would fail every mismatch gate for no bug of the trainer."""
    from vllm.config.model import LogprobsMode

    assert mode in typing.get_args(LogprobsMode)
    message = rf"logprobs_mode '{mode}' reports logits, not log probs.*logprobs_mode='raw_logprobs'"
    with pytest.raises(ValueError, match=message):
        log_prob_temperature({"logprobs_mode": mode, "temperature": TEMPERATURE})
    llm = ToyLLM(vllm, mode)
    with pytest.raises(ValueError, match=message):
        vllm_generate(llm, PROMPTS, sampling_params(vllm), pad_token_id=0)
    with pytest.raises(ValueError, match=message):
        vllm_rollout(generate(vllm).outputs, pad_token_id=0, logprobs_mode=mode)


# ------------------------------------------------------------------- vLLM 0.10.2

VLLM010_CHECK = """
import vllm
from vllm.config import LogprobsMode

import test_vllm_classes as t
from pytest_rollout_golden.vllm_batch import log_prob_temperature, vllm_generate, vllm_rollout

assert vllm.__version__ == "0.10.2", vllm.__file__
for mode in t.MODES:
    generation = t.generate(vllm, mode)
    assert all(type(c.logprobs) is list for o in generation.outputs for c in o.outputs)
    t.assert_converts_exactly(vllm_rollout(generation.outputs, pad_token_id=0), generation)
    llm = t.ToyLLM(vllm, LogprobsMode(mode))  # an enum in 0.10, a string in 0.33
    batch = vllm_generate(llm, t.PROMPTS, t.sampling_params(vllm), pad_token_id=0)()
    assert batch.meta_info["logprobs_mode"] == mode
    trainer = t.trainer_log_probs(batch, temperature=log_prob_temperature(batch))
    assert trainer.equal(batch.batch["rollout_log_probs"])
try:
    llm = t.ToyLLM(vllm, LogprobsMode.RAW_LOGITS)
    vllm_generate(llm, t.PROMPTS, t.sampling_params(vllm), pad_token_id=0)
except ValueError as error:
    assert "reports logits, not log probs" in str(error)
else:
    raise AssertionError("raw_logits accepted")
print("vLLM 0.10.2 converts bit-exactly")
"""


@pytest.mark.usefixtures("vllm")  # the packages 0.10.2 imports come with 0.33.0's folder
def test_vllm_0_10_converts_bit_exactly():
    """The oldest release checked, in a subprocess with its own folder first on the path:
    ``Logprob`` dicts only (no ``FlatLogprobs``), ``LogprobsLists`` of lists, one request id,
    ``logprobs_mode`` an enum."""
    if not (VLLM010 / "vllm" / "outputs.py").is_file():
        pytest.skip(
            f"vLLM 0.10.2 is not installed in {VLLM010}; install it as "
            "tests/upstream/requirements-vllm010.txt says"
        )
    # vLLM 0.10.2 first; the packages both releases import come from the inherited path
    path = os.pathsep.join([str(VLLM010), str(REPO), str(HERE), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path}
    done = subprocess.run(
        [sys.executable, "-c", VLLM010_CHECK], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("vLLM 0.10.2 converts bit-exactly")
