"""The vLLM adapter: ``LLM.generate`` outputs -> a verl rollout batch.

vLLM cannot run on these machines (no GPU; its wheel pins another torch), so most tests
feed the adapter objects with exactly the public attributes of vLLM's output classes, as
``vllm/outputs.py`` and ``vllm/logprobs.py`` define them (``RequestOutput``,
``CompletionOutput``, ``Logprob``, ``FlatLogprobs``; see ``vllm_outputs.py``). The last
test drives real vLLM with a tiny model and skips without a GPU or vLLM.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import vllm_outputs
from vllm_outputs import EOS, Logprob, SamplingParams, outputs

from pytest_rollout_golden import RolloutBatch
from pytest_rollout_golden.vllm_batch import (
    VllmSamplingWarning,
    log_prob_temperature,
    vllm_generate,
    vllm_rollout,
)

# ----------------------------------------------------------------------- conversion


def test_verl_layout_of_two_groups():
    batch = vllm_rollout(outputs(), pad_token_id=0)
    assert type(batch) is RolloutBatch and len(batch) == 4
    b = batch.batch
    assert torch.equal(b["prompts"], torch.tensor([[5, 6, 7]] * 2 + [[0, 0, 9]] * 2))
    assert torch.equal(
        b["responses"],
        torch.tensor([[30, 0, 0, 0], [20, 21, EOS, 0], [40, 41, 42, 43], [EOS, 0, 0, 0]]),
    )
    assert torch.equal(b["input_ids"], torch.cat([b["prompts"], b["responses"]], 1))
    assert torch.equal(
        b["response_mask"], torch.tensor([[1, 0, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0]])
    )
    assert torch.equal(
        b["attention_mask"],
        torch.cat([torch.tensor([[1, 1, 1]] * 2 + [[0, 0, 1]] * 2), b["response_mask"]], 1),
    )
    assert b["position_ids"].tolist() == [
        [0, 1, 2, 3, 3, 3, 3],
        [0, 1, 2, 3, 4, 5, 5],
        [0, 0, 0, 1, 2, 3, 4],
        [0, 0, 0, 1, 1, 1, 1],
    ]
    assert b["rollout_log_probs"].dtype == torch.float32
    assert b["rollout_log_probs"].tolist() == [
        [-2.0, 0, 0, 0],
        [-0.5, -1.25, -0.125, 0],
        [-0.25, -0.75, -1.5, -3.0],
        [-0.0625, 0, 0, 0],
    ]
    for key in ("prompts", "responses", "input_ids", "attention_mask", "position_ids"):
        assert b[key].dtype == torch.int64, key
    assert batch.non_tensor_batch["uid"].tolist() == ["0", "0", "1", "1"]
    assert batch.non_tensor_batch["finish_reason"].tolist() == ["length", "stop", "length", "stop"]
    assert batch.meta_info == {"pad_token_id": 0}


def test_every_row_holds_its_prompt_and_completion_at_consecutive_positions():
    """The layout as verl reads it: masked tokens are prompt + completion, positions 0..L-1."""
    rows = [(r.prompt_token_ids, sorted(r.outputs, key=lambda c: c.index)) for r in outputs()]
    expected = [list(p) + list(c.token_ids) for p, cs in rows for c in cs]
    batch = vllm_rollout(outputs(), pad_token_id=EOS, prompt_length=5, response_length=6)
    b = batch.batch
    assert b["prompts"].shape == (4, 5) and b["responses"].shape == (4, 6)
    for i, tokens in enumerate(expected):
        mask = b["attention_mask"][i].bool()
        assert b["input_ids"][i][mask].tolist() == tokens
        assert b["position_ids"][i][mask].tolist() == list(range(len(tokens)))
    # pad == EOS: the response mask still counts the EOS vLLM generated, not the padding
    assert b["response_mask"].sum(1).tolist() == [1, 3, 4, 1]


@pytest.mark.parametrize("flat", [False, True], ids=["list-of-dicts", "FlatLogprobs"])
def test_the_sampled_tokens_logprob_is_taken_not_the_top_ranked(flat):
    plain = vllm_rollout(outputs(), pad_token_id=0).batch["rollout_log_probs"]
    with_top = vllm_rollout(outputs(flat=flat, top=2), pad_token_id=0).batch["rollout_log_probs"]
    assert torch.equal(with_top, plain)


def test_uids_can_be_given():
    batch = vllm_rollout(outputs(), pad_token_id=0, uids=["q-a", "q-b"])
    assert batch.non_tensor_batch["uid"].tolist() == ["q-a", "q-a", "q-b", "q-b"]
    with pytest.raises(ValueError, match="got 1 uids for 2 vLLM request outputs"):
        vllm_rollout(outputs(), pad_token_id=0, uids=["x"])


def test_missing_logprobs_is_a_clear_error():
    out = outputs()
    out[1].outputs[0].logprobs = None
    with pytest.raises(ValueError) as info:
        vllm_rollout(out, pad_token_id=0)
    assert str(info.value) == (
        "vLLM request '8', completion 0 carries no logprobs; pass SamplingParams(logprobs=0) "
        "(the sampled token's log prob; logprobs=k adds the top k)"
    )


def test_logprob_of_another_token_is_refused():
    out = outputs()
    out[0].outputs[0].logprobs[2] = {99: Logprob(-1.0, 1)}  # completion 1: [20, 21, EOS]
    with pytest.raises(ValueError, match=r"completion 1: no logprob for the sampled token 2 at"):
        vllm_rollout(out, pad_token_id=0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"prompt_length": 2}, "a prompt has 3 tokens, more than prompt_length=2"),
        ({"response_length": 3}, r"generate with SamplingParams\(max_tokens=3\)"),
    ],
)
def test_lengths_shorter_than_the_data_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        vllm_rollout(outputs(), pad_token_id=0, **kwargs)


# ----------------------------------------------------------------- generate for golden.rollout


class FakeLLM:
    def __init__(self):
        self.calls = []

    def generate(self, prompts, sampling_params, use_tqdm=True):
        self.calls.append((prompts, sampling_params, use_tqdm))
        return outputs()


def test_vllm_generate_runs_vllm_only_when_called():
    llm = FakeLLM()
    prompts = [{"prompt_token_ids": [5, 6, 7]}, {"prompt_token_ids": [9]}]
    params = SamplingParams(n=2, seed=0, logprobs=0)
    generate = vllm_generate(llm, prompts, params, pad_token_id=0)
    assert llm.calls == []
    batch = generate()
    assert llm.calls == [(prompts, params, False)]
    assert torch.equal(
        batch.batch["responses"], vllm_rollout(outputs(), pad_token_id=0).batch["responses"]
    )


def test_vllm_generate_refuses_params_without_logprobs_before_running():
    llm = FakeLLM()
    with pytest.raises(ValueError, match=r"logprobs=None.*SamplingParams\(logprobs=0\)"):
        vllm_generate(llm, ["a"], SamplingParams(seed=0), pad_token_id=0)
    with pytest.raises(ValueError, match="logprobs=None"):
        vllm_generate(
            llm,
            ["a", "b"],
            [SamplingParams(seed=0, logprobs=0), SamplingParams(seed=1)],
            pad_token_id=0,
        )
    assert llm.calls == []


def test_vllm_generate_warns_without_a_seed():
    with pytest.warns(VllmSamplingWarning, match=r"seed=None: regenerating this rollout gives"):
        vllm_generate(FakeLLM(), ["a"], SamplingParams(logprobs=0), pad_token_id=0)


class Engine:  # the path to vLLM's engine argument: LLM.llm_engine.model_config
    def __init__(self, mode):
        self.model_config = type("ModelConfig", (), {"logprobs_mode": mode})()


@pytest.mark.parametrize(
    ("mode", "expected"),
    [("raw_logprobs", 1.0), ("processed_logprobs", 0.7), (None, None)],
)
def test_the_batch_says_at_which_temperature_its_log_probs_are(mode, expected):
    llm = FakeLLM()
    if mode is not None:
        llm.llm_engine = Engine(mode)
    params = SamplingParams(n=2, seed=0, logprobs=0)
    params.temperature = 0.7
    batch = vllm_generate(llm, [{"prompt_token_ids": [5]}] * 2, params, pad_token_id=0)()
    assert batch.meta_info["temperature"] == 0.7
    if expected is None:
        assert "logprobs_mode" not in batch.meta_info
        with pytest.raises(ValueError, match="raw_logprobs are at temperature 1"):
            log_prob_temperature(batch)
    else:
        assert batch.meta_info["logprobs_mode"] == mode
        assert log_prob_temperature(batch) == expected
        assert log_prob_temperature(batch.meta_info) == expected
    with pytest.raises(ValueError, match="not in meta_info"):
        log_prob_temperature({"logprobs_mode": "processed_logprobs"})


VLLM_IN_GOLDEN = """
import pathlib

from pytest_rollout_golden import RolloutBatch
from pytest_rollout_golden.vllm_batch import vllm_generate

import vllm_outputs


class LLM:
    def generate(self, prompts, sampling_params, use_tqdm=True):
        with open(pathlib.Path(__file__).parent / "calls.log", "a") as log:
            log.write("vllm\\n")
        return vllm_outputs.outputs()


def test_rollout(golden):
    params = vllm_outputs.SamplingParams(n=2, seed=0, logprobs=0)
    batch = golden.rollout(vllm_generate(LLM(), ["a", "b"], params, pad_token_id=0))
    assert type(batch) is RolloutBatch
    lp, mask = batch.batch["rollout_log_probs"], batch.batch["response_mask"]
    golden.check({"mean_rollout_logprob": (lp * mask).sum() / mask.sum()})
"""


def test_vllm_generate_records_then_replays_without_vllm(project):
    project.write(Path(vllm_outputs.__file__).read_text(), "vllm_outputs")
    project.write(VLLM_IN_GOLDEN)
    project.run("test_it.py").assert_outcomes(passed=1)
    assert project.calls() == ["vllm"]
    project.run("test_it.py").assert_outcomes(passed=1)
    assert project.calls() == []


def test_importing_the_package_and_adapter_does_not_import_vllm():
    code = (
        "import sys, pytest_rollout_golden, pytest_rollout_golden.plugin, "
        "pytest_rollout_golden.vllm_batch; print('vllm' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ----------------------------------------------------------------------- real vLLM


def test_real_vllm_generate_gives_a_consistent_batch():
    if not torch.cuda.is_available():
        pytest.skip(
            "no GPU: vLLM's engine needs one (CI installs vLLM only for its output classes, "
            "tests/upstream/test_vllm_classes.py)"
        )
    vllm = pytest.importorskip(
        "vllm",
        reason="vLLM is not installed: it needs a GPU and its own torch build; "
        "install `pytest-rollout-golden[vllm]` on a GPU machine to run this test",
    )
    model = os.environ.get("PRG_VLLM_MODEL", "facebook/opt-125m")
    llm = vllm.LLM(model=model, seed=0, enforce_eager=True, gpu_memory_utilization=0.3)
    prompts = [{"prompt_token_ids": [2, 100, 200, 300]}, {"prompt_token_ids": [2, 50]}]
    params = vllm.SamplingParams(n=2, seed=0, logprobs=0, max_tokens=8, temperature=1.0)
    batch = vllm_generate(llm, prompts, params, pad_token_id=1, response_length=8)()
    again = vllm_generate(llm, prompts, params, pad_token_id=1, response_length=8)()

    b, mask = batch.batch, batch.batch["response_mask"].bool()
    assert b["responses"].shape == (4, 8) and b["prompts"].shape == (4, 4)
    assert batch.non_tensor_batch["uid"].tolist() == ["0", "0", "1", "1"]
    assert set(batch.non_tensor_batch["finish_reason"].tolist()) <= {"stop", "length"}
    lp = b["rollout_log_probs"]
    assert torch.isfinite(lp).all() and (lp[mask] <= 0).all() and (lp[~mask] == 0).all()
    assert torch.equal(b["responses"], again.batch["responses"]), "seeded sampling must repeat"
    with pytest.raises(ValueError, match="logprobs=None"):
        vllm_generate(llm, prompts, vllm.SamplingParams(seed=0), pad_token_id=1)
