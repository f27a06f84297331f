"""golden.check_scores: the scores a reward model or verifier gives to the recorded rollouts,
one gated value per sample named by its id; scoring in other batch sizes is a same-math
variant, so a reward that depends on the batch it was scored in fails naming the samples."""

from __future__ import annotations

import pytest

REWARD = """
import json, pathlib
import pytest
import torch
from pytest_rollout_golden import same_math

V = json.loads((pathlib.Path(__file__).parent / "values.json").read_text())
IDS = [f"p{p}#{i}" for p in range(3) for i in range(2)]


def reward_model(features):
    # a per-sample head; "batch_norm" is the defect: scores standardized over the batch
    w = torch.linspace(-1.0, 1.0, features.shape[-1], dtype=torch.float32)
    scores = torch.tanh(features @ w)
    if V.get("batch_norm"):
        scores = (scores - scores.mean()) / (scores.std() + 1e-6) if len(scores) > 1 else scores
    return scores


@pytest.mark.parametrize("batch_size", same_math([6, 2, 1], ids=lambda b: f"bs{b}"))
def test_reward(golden, batch_size):
    features = golden.rollout(lambda: torch.randn(6, 8))
    scores = torch.cat([reward_model(chunk) for chunk in features.split(batch_size)])
    golden.check_scores(scores, ids=IDS, name="rm")
"""


@pytest.fixture
def reward(project):
    project.write(REWARD)
    project.set_values()
    result = project.run()
    result.assert_outcomes(passed=3)  # bs6 records; bs2, bs1 replay it
    return project


def test_scores_in_other_batch_sizes_pass_and_a_batch_dependent_reward_fails_naming_samples(
    reward,
):
    reward.set_values(batch_norm=True)
    result = reward.run()
    result.assert_outcomes(passed=1, failed=2)  # the reference's batch: same scores as bs6
    out = result.stdout.str()
    assert "test_reward[bs2] against the golden of the reference [bs6]" in out
    row = reward.mismatch_row(result, "rm/p0#0")
    assert row["step"] == "0" and float(row["beyond"].rstrip("x")) > 10


def test_scores_are_recorded_one_metric_per_sample(reward):
    import json

    metrics = json.loads((reward.golden_dir("test_reward[bs6]") / "metrics.json").read_text())
    assert sorted(metrics["steps"]["0"]) == sorted(
        f"rm/p{p}#{i}" for p in range(3) for i in range(2)
    )
    assert metrics["steps"]["0"]["rm/p0#0"]["dtype"] == "float32"


@pytest.mark.parametrize(
    ("call", "words"),
    [
        ("golden.check_scores(torch.ones(3), ids=['a', 'b'])", "3 scores but 2 ids"),
        ("golden.check_scores(torch.ones(2), ids=['a', 'a'])", "ids 0 and 1 are both 'a'"),
        ("golden.check_scores(torch.ones(2, 2))", "one score per sample (1-D), got shape (2, 2)"),
        ("golden.check_scores([0.5, 'x'])", "score 1 ('x') is not a number"),
    ],
)
def test_scores_that_cannot_be_gated_are_refused(project, call, words):
    project.write(f"import torch\n\ndef test_x(golden):\n    {call}\n")
    result = project.run()
    result.assert_outcomes(failed=1)
    assert words in result.stdout.str()


HF_REWARD = """
import pytest
import torch
from pytest_rollout_golden import same_math

transformers = pytest.importorskip("transformers")


def reward_model():
    config = transformers.Qwen2Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, num_labels=1, pad_token_id=0,
    )
    torch.manual_seed(0)
    return transformers.Qwen2ForSequenceClassification(config).eval()


def score(model, sequences, batch_size):
    out = []
    for start in range(0, len(sequences), batch_size):
        chunk = sequences[start : start + batch_size]
        width = max(len(s) for s in chunk)
        ids = torch.tensor([s + [0] * (width - len(s)) for s in chunk])
        mask = (ids != 0).long()
        with torch.no_grad():
            out.append(model(input_ids=ids, attention_mask=mask).logits[:, 0])
    return torch.cat(out)


@pytest.mark.parametrize("batch_size", same_math([6, 3, 1], ids=lambda b: f"bs{b}"))
def test_rm(golden, deterministic, batch_size):
    lengths = golden.rollout(lambda: [5, 9, 3, 12, 7, 4])
    g = torch.Generator().manual_seed(1)
    sequences = [torch.randint(1, 64, (n,), generator=g).tolist() for n in lengths]
    golden.check_scores(score(reward_model(), sequences, batch_size), name="rm")
"""


def test_a_real_reward_model_scored_in_other_batch_sizes_passes_at_the_defaults(project):
    project.write(HF_REWARD)
    result = project.run()
    result.assert_outcomes(passed=3)  # bs6 records, bs3 and bs1 replay: padding differs
    assert project.counts(result)["replayed"] == 2
