"""The SGLang adapter: ``Engine.generate`` / ``/generate`` result dicts -> a verl rollout batch.

SGLang's result-building modules do not import on these machines (see ``sglang_results.py``),
so the dicts are built step by step as SGLang 0.5.23's source builds them.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import sglang_results
import torch
import vllm_outputs
from sglang_results import EOS, PROMPTS, as_json, finish_reason, result, results

from pytest_rollout_golden import Golden, GoldenMismatch, RolloutBatch
from pytest_rollout_golden.mismatch import sampled_log_probs
from pytest_rollout_golden.sglang_batch import (
    log_prob_temperature,
    sglang_generate,
    sglang_rollout,
)
from pytest_rollout_golden.vllm_batch import vllm_rollout

# ----------------------------------------------------------------------- conversion


def test_the_same_completions_give_the_batch_vllm_gives():
    """Same prompts, tokens and log probs as ``vllm_outputs.outputs()``: the same batch."""
    batch = sglang_rollout(results(), input_ids=PROMPTS, pad_token_id=0)
    expected = vllm_rollout(vllm_outputs.outputs(), pad_token_id=0)
    assert type(batch) is RolloutBatch and len(batch) == 4
    assert sorted(batch.batch) == sorted(expected.batch)
    for key, tensor in expected.batch.items():
        assert batch.batch[key].dtype == tensor.dtype, key
        assert torch.equal(batch.batch[key], tensor), key
    assert batch.non_tensor_batch["uid"].tolist() == ["0", "0", "1", "1"]
    assert batch.non_tensor_batch["finish_reason"].tolist() == ["length", "stop", "length", "stop"]
    assert batch.meta_info == {"pad_token_id": 0, "logprobs_mode": "processed_logprobs"}


def test_log_probs_are_sglangs_floats_rounded_once_to_float32():
    lps = [-0.1234567890123, -2.718281828459045, -1e-9]
    batch = sglang_rollout(result("r", [4], [7, 8, EOS], lps), input_ids=[4], pad_token_id=0)
    got = batch.batch["rollout_log_probs"]
    assert torch.equal(got, torch.tensor([lps], dtype=torch.float64).to(torch.float32))


def test_a_single_prompt_gives_one_dict_or_n_dicts():
    one = sglang_rollout(
        result("r", [5, 6], [30, EOS], [-1.0, -0.5]), input_ids=[5, 6], pad_token_id=0
    )
    assert one.batch["responses"].tolist() == [[30, EOS]]
    assert one.batch["prompts"].tolist() == [[5, 6]]
    n = [result(f"r{i}", [5, 6], [30 + i], [-1.0]) for i in range(3)]
    batch = sglang_rollout(n, input_ids=torch.tensor([5, 6]), pad_token_id=0, uids=["q"])
    assert batch.non_tensor_batch["uid"].tolist() == ["q", "q", "q"]
    assert batch.batch["responses"][:, 0].tolist() == [30, 31, 32]


def test_uids_name_the_prompts():
    numpy_prompts = [np.array(p, dtype=np.int64) for p in PROMPTS]
    batch = sglang_rollout(results(), input_ids=numpy_prompts, pad_token_id=0, uids=["q-a", "q-b"])
    assert batch.non_tensor_batch["uid"].tolist() == ["q-a", "q-a", "q-b", "q-b"]
    with pytest.raises(ValueError, match="got 1 uids for 2 prompts"):
        sglang_rollout(results(), input_ids=PROMPTS, pad_token_id=0, uids=["x"])


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        (finish_reason("stop", EOS), "stop"),
        (finish_reason("stop", "\n\n"), "stop"),
        (finish_reason("length", 2), "length"),
        (finish_reason("abort", "client disconnected"), "abort"),
    ],
)
def test_the_finish_reason_is_its_type(reason, expected):
    out = result("r", [5], [30, 31], [-1.0, -2.0], reason=reason)
    batch = sglang_rollout(out, input_ids=[5], pad_token_id=0)
    assert batch.non_tensor_batch["finish_reason"].tolist() == [expected]


def test_top_logprobs_and_text_in_logprobs_change_nothing():
    """With top_logprobs_num=2 the sampled token ranks third; the adapter reads
    output_token_logprobs, the sampled token's, not output_top_logprobs[i][0]."""
    plain = sglang_rollout(results(), input_ids=PROMPTS, pad_token_id=0).batch
    with_top = results(top=2, text_in_logprobs=True)
    first = with_top[0]["meta_info"]
    assert first["output_top_logprobs"][0][0] == (-1.5, 1000, "<1000>")
    assert first["output_token_logprobs"][0] == (-2.0, 30, "<30>")
    batch = sglang_rollout(with_top, input_ids=PROMPTS, pad_token_id=0).batch
    assert torch.equal(batch["rollout_log_probs"], plain["rollout_log_probs"])


def test_prompt_logprobs_and_the_http_form_convert_the_same():
    plain = sglang_rollout(results(), input_ids=PROMPTS, pad_token_id=0).batch
    scored = results(logprob_start_len=0, prompt_logprobs=[-3.0, -4.0])
    assert scored[0]["meta_info"]["input_token_logprobs"] == [
        (None, 5, None),
        (-3.0, 6, None),
        (-4.0, 7, None),
    ]
    for form in (scored, as_json(scored)):
        batch = sglang_rollout(form, input_ids=PROMPTS, pad_token_id=0).batch
        for key in plain:
            assert torch.equal(batch[key], plain[key]), key


# ------------------------------------------------------------------------ mistakes


def test_results_without_return_logprob_are_a_clear_error():
    out = results()
    del out[2]["meta_info"]["output_token_logprobs"]
    with pytest.raises(ValueError) as info:
        sglang_rollout(out, input_ids=PROMPTS, pad_token_id=0)
    assert str(info.value) == (
        "SGLang result 2 (prompt 1), id 'b0' carries no meta_info['output_token_logprobs']; "
        "generate with return_logprob=True"
    )


def shifted(out, *, keep_length):
    """The mistake of a hand-written conversion: the log probs taken one position early, the
    first being the prompt's last token's (from ``input_token_logprobs``)."""
    meta, prompt = out["meta_info"], PROMPTS[0]
    entries = [(-0.875, prompt[-1], None), *meta["output_token_logprobs"]]
    meta["output_token_logprobs"] = entries[:-1] if keep_length else entries
    return out


@pytest.mark.parametrize("keep_length", [True, False], ids=["same-length", "one-longer"])
def test_log_probs_shifted_by_one_position_are_named(keep_length):
    out = results()
    out[1] = shifted(out[1], keep_length=keep_length)
    with pytest.raises(ValueError) as info:
        sglang_rollout(out, input_ids=PROMPTS, pad_token_id=0)
    assert str(info.value).startswith(
        "SGLang result 1 (prompt 0), id 'a1': meta_info['output_token_logprobs'] is shifted by "
        "one position: entry 0 is for the prompt's last token 7, entry i for the token before "
        "output_ids[i]; entry i must be the log prob of output_ids[i]"
    )


def test_log_probs_of_other_tokens_or_another_count_are_refused():
    out = results()
    out[2]["meta_info"]["output_token_logprobs"][1] = (-0.75, 99, None)
    with pytest.raises(
        ValueError,
        match=r"result 2 \(prompt 1\), id 'b0': meta_info\['output_token_logprobs'\]\[1\] is "
        r"for token 99 but output_ids\[1\] is 41",
    ):
        sglang_rollout(out, input_ids=PROMPTS, pad_token_id=0)
    out = results()
    out[2]["output_ids"] = out[2]["output_ids"][:-1]
    with pytest.raises(ValueError, match=r"id 'b0' has 3 output_ids but 4 entries in meta_info"):
        sglang_rollout(out, input_ids=PROMPTS, pad_token_id=0)
    out = results()
    out[3]["meta_info"]["output_token_logprobs"][0] = (None, EOS, None)
    with pytest.raises(ValueError, match=r"\['output_token_logprobs'\]\[0\] has no logprob"):
        sglang_rollout(out, input_ids=PROMPTS, pad_token_id=0)


def test_results_paired_with_the_wrong_prompt_are_refused():
    with pytest.raises(ValueError, match=r"result 0 \(prompt 0\), id 'a0': meta_info\['prompt_"):
        sglang_rollout(results(), input_ids=PROMPTS[::-1], pad_token_id=0)
    scored = results(logprob_start_len=1)
    with pytest.raises(ValueError, match="input_token_logprobs'] are not for the last 2 tokens"):
        sglang_rollout(scored, input_ids=[[5, 6, 8], [9]], pad_token_id=0)
    with pytest.raises(ValueError, match="got 4 SGLang results for 3 prompts"):
        sglang_rollout(results(), input_ids=[*PROMPTS, [1]], pad_token_id=0)


def test_lengths_shorter_than_the_data_are_refused():
    with pytest.raises(ValueError, match=r"sampling_params=\{'max_new_tokens': 3\}"):
        sglang_rollout(results(), input_ids=PROMPTS, pad_token_id=0, response_length=3)


# -------------------------------------------------------------- log-prob semantics


@pytest.mark.parametrize(
    ("kwargs", "mode", "at"),
    [
        ({"temperature": 0.7}, "processed_logprobs", 0.7),
        ({"temperature": 0.7, "return_original_logprob": True}, "raw_logprobs", 1.0),
        ({"temperature": 0.0}, "raw_logprobs", 1.0),
    ],
)
def test_the_batch_says_at_which_temperature_its_log_probs_are(kwargs, mode, at):
    batch = sglang_rollout(results(), input_ids=PROMPTS, pad_token_id=0, **kwargs)
    assert batch.meta_info["logprobs_mode"] == mode
    assert batch.meta_info["temperature"] == kwargs["temperature"]
    assert log_prob_temperature(batch) == at


def test_without_the_temperature_the_batch_cannot_say():
    batch = sglang_rollout(results(), input_ids=PROMPTS, pad_token_id=0)
    with pytest.raises(ValueError, match="at the sampling temperature, not in meta_info"):
        log_prob_temperature(batch)


T = 0.7


def engine_rollout(return_original_logprob=False):
    """Logits of a toy policy, tokens sampled from them at T, and SGLang's log probs as
    ``Sampler.forward`` computes them: ``log(softmax(logits / T))`` (``log_softmax(logits)``
    with SGLANG_RETURN_ORIGINAL_LOGPROB); ``logits[b, i]`` predicts output token i."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 6, 16, generator=gen) * 3
    tokens = torch.multinomial(torch.softmax(logits / T, -1).view(-1, 16), 1, generator=gen)
    tokens = tokens.view(4, 6)
    scored = (
        torch.log_softmax(logits, -1)
        if return_original_logprob
        else torch.log(torch.softmax(logits / T, -1))
    )
    lps = scored.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    prompts = [[3, 4], [5]]
    outs = [
        result(f"r{b}", prompts[b // 2], tokens[b].tolist(), lps[b].tolist(), reason=None)
        for b in range(4)
    ]
    batch = sglang_rollout(
        outs,
        input_ids=prompts,
        pad_token_id=0,
        temperature=T,
        return_original_logprob=return_original_logprob,
    )
    return logits, batch


@pytest.mark.parametrize("original", [False, True], ids=["processed", "original"])
def test_a_trainer_at_the_batchs_temperature_passes_the_gate(tmp_path, original):
    logits, batch = engine_rollout(original)
    b = batch.batch
    log_probs = sampled_log_probs(logits, b["responses"], temperature=log_prob_temperature(batch))
    with Golden(tmp_path) as golden:
        golden.check_mismatch(log_probs, b["rollout_log_probs"], b["response_mask"])


@pytest.mark.parametrize(
    ("original", "temperature"), [(False, 1.0), (True, T)], ids=["processed", "original"]
)
def test_a_trainer_at_the_other_temperature_fails_the_gate(tmp_path, original, temperature):
    logits, batch = engine_rollout(original)
    b = batch.batch
    log_probs = sampled_log_probs(logits, b["responses"], temperature=temperature)
    with pytest.raises(GoldenMismatch, match="beyond its bound"), Golden(tmp_path) as golden:
        golden.check_mismatch(log_probs, b["rollout_log_probs"], b["response_mask"])


def test_a_trainer_one_position_off_fails_the_gate(tmp_path):
    logits, batch = engine_rollout()
    b = batch.batch
    off = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)  # logits[i - 1] scores token i
    log_probs = sampled_log_probs(off, b["responses"], temperature=log_prob_temperature(batch))
    with pytest.raises(GoldenMismatch, match="beyond its bound"), Golden(tmp_path) as golden:
        golden.check_mismatch(log_probs, b["rollout_log_probs"], b["response_mask"])


# ----------------------------------------------------------------- generate for golden.rollout


class FakeEngine:
    def __init__(self):
        self.calls = []

    def generate(self, prompt=None, sampling_params=None, input_ids=None, **kwargs):
        self.calls.append((input_ids, sampling_params, kwargs))
        return sglang_results.results()


def test_sglang_generate_runs_sglang_only_when_called(monkeypatch):
    monkeypatch.delenv("SGLANG_RETURN_ORIGINAL_LOGPROB", raising=False)
    engine = FakeEngine()
    params = {"n": 2, "temperature": 0.7, "max_new_tokens": 8}
    generate = sglang_generate(engine, PROMPTS, params, pad_token_id=0)
    assert engine.calls == []
    batch = generate()
    assert engine.calls == [(PROMPTS, params, {"return_logprob": True})]
    assert batch.meta_info == {
        "pad_token_id": 0,
        "temperature": 0.7,
        "logprobs_mode": "processed_logprobs",
    }
    plain = sglang_rollout(results(), input_ids=PROMPTS, pad_token_id=0).batch
    assert torch.equal(batch.batch["rollout_log_probs"], plain["rollout_log_probs"])


@pytest.mark.parametrize(("env", "at"), [("1", 1.0), ("true", 1.0), ("0", 0.5)])
def test_sglang_generate_reads_the_original_logprob_switch(monkeypatch, env, at):
    monkeypatch.setenv("SGLANG_RETURN_ORIGINAL_LOGPROB", env)
    batch = sglang_generate(FakeEngine(), PROMPTS, {"temperature": 0.5}, pad_token_id=0)()
    assert log_prob_temperature(batch) == at


SGLANG_IN_GOLDEN = """
import pathlib

from pytest_rollout_golden.sglang_batch import sglang_generate

import sglang_results


class Engine:
    def generate(self, input_ids=None, sampling_params=None, return_logprob=False):
        with open(pathlib.Path(__file__).parent / "calls.log", "a") as log:
            log.write("sglang\\n")
        return sglang_results.results()


def test_rollout(golden):
    generate = sglang_generate(Engine(), sglang_results.PROMPTS, {"n": 2}, pad_token_id=0)
    batch = golden.rollout(generate)
    assert batch.meta_info["temperature"] == 1.0  # replayed too: the trainer still knows it
    assert batch.meta_info["logprobs_mode"] == "processed_logprobs"
    golden.check_tensors("rollout", {"log_probs": batch.batch["rollout_log_probs"]})
"""


def test_sglang_generate_records_then_replays_without_sglang(project):
    project.write(Path(sglang_results.__file__).read_text(), "sglang_results")
    project.write(SGLANG_IN_GOLDEN)
    for calls in (["sglang"], []):  # records, then replays without calling SGLang
        project.run("test_it.py").assert_outcomes(passed=1)
        assert project.calls() == calls


def test_importing_the_adapter_does_not_import_sglang():
    code = "import sys, pytest_rollout_golden.sglang_batch; print('sglang' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
