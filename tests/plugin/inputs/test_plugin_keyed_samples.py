"""golden.rollout_samples: samples that complete in any order (asynchronous engines, agent
loops) are recorded keyed by what identifies them and come back in key order, so the training
step sees one batch whatever order the engine finished in; multi-turn samples with tool calls
round-trip exactly."""

from __future__ import annotations

import json

import pytest

# An agent loop whose samples finish in an order set by values.json (the engine's timing);
# the "training step" weighs samples by their position, so an order change moves the loss.
AGENT = """
import json, pathlib
import torch

V = json.loads((pathlib.Path(__file__).parent / "values.json").read_text())


def sample(uid, index):
    ids = [uid * 10 + index, 7, 3 + index]
    changed = [uid, index] == V.get("changed")  # one sample's token and log prob moved
    if changed:
        ids[1] += 1
    return {
        "uid": f"p{uid}", "index": index, "version": 3,
        "messages": [
            {"role": "user", "content": f"add {uid} and {index}"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"name": "calc", "arguments": {"a": uid, "b": index}}]},
            {"role": "tool", "content": str(uid + index)},
            {"role": "assistant", "content": f"{uid + index}"},
        ],
        "token_ids": torch.tensor(ids),
        "turn_loss_mask": [[0, 1, 1], [0, 0, 1]],
        "logprob": -0.1 * (uid + 1) - 0.01 * index - (0.5 if changed else 0.0),
    }


def engine():
    for uid, index in V["completion"]:
        yield sample(uid, index)


def test_agent(golden):
    samples = golden.rollout_samples(
        engine, key=lambda s: (s["uid"], s["index"]), order=V.get("order", "key")
    )
    seen = [(s["uid"], s["index"]) for s in samples]
    (pathlib.Path(__file__).parent / "seen.json").write_text(json.dumps(seen))
    weights = torch.arange(1, len(samples) + 1, dtype=torch.float64)
    logprobs = torch.tensor([s["logprob"] for s in samples], dtype=torch.float64)
    golden.check({"loss": float((weights * logprobs).sum() / weights.sum())})
    for s in samples:
        want = sample(int(s["uid"][1:]), s["index"])
        assert torch.equal(s.pop("token_ids"), want.pop("token_ids"))
        assert s == want  # messages, tool calls, loss masks, floats: exact
"""
FIRST = [[1, 0], [0, 1], [0, 0], [1, 1]]
OTHER = [[0, 0], [1, 1], [0, 1], [1, 0]]
KEYED = [["p0", 0], ["p0", 1], ["p1", 0], ["p1", 1]]


@pytest.fixture
def agent(project):
    project.write(AGENT)
    return project


def seen(project) -> list:
    return json.loads((project.pytester.path / "seen.json").read_text())


def test_samples_come_back_in_key_order_whatever_order_they_completed_in(agent):
    agent.set_values(completion=FIRST)
    agent.run().assert_outcomes(passed=1)  # records
    assert seen(agent) == KEYED
    agent.set_values(completion=OTHER)  # replay never runs the engine
    agent.run("--golden-exact").assert_outcomes(passed=1)
    assert seen(agent) == KEYED
    # re-recorded under another completion order: the same loss, bit for bit
    agent.run("--update-golden", "--golden-regenerate").assert_outcomes(passed=1)
    agent.run("--golden-exact").assert_outcomes(passed=1)


def test_order_recorded_gives_the_completion_order_of_the_recording(agent):
    agent.set_values(completion=FIRST, order="recorded")
    agent.run().assert_outcomes(passed=1)
    assert seen(agent) == [["p1", 0], ["p0", 1], ["p0", 0], ["p1", 1]]
    agent.set_values(completion=OTHER, order="recorded")
    agent.run().assert_outcomes(passed=1)
    assert seen(agent) == [["p1", 0], ["p0", 1], ["p0", 0], ["p1", 1]]


def regenerated(result) -> str:
    """What ``--golden-regenerate`` said of the rollout."""
    line = next(x for x in result.outlines if "rollout 'rollout' step 0: regenerated" in x)
    return line.split("regenerated, ", 1)[1]


def test_regenerated_in_another_completion_order_the_rollout_is_identical(agent):
    agent.set_values(completion=FIRST)
    agent.run().assert_outcomes(passed=1)
    agent.set_values(completion=OTHER)
    result = agent.run("--update-golden", "--golden-regenerate")
    result.assert_outcomes(passed=1)
    assert regenerated(result) == "identical to the recorded one"


def test_a_regenerated_sample_that_changed_is_named_by_its_key(agent):
    agent.set_values(completion=FIRST)
    agent.run().assert_outcomes(passed=1)
    agent.set_values(completion=[*OTHER, [2, 0]], changed=[1, 0])
    result = agent.run("--update-golden", "--golden-regenerate")
    result.assert_outcomes(passed=1)
    assert regenerated(result) == (
        "keys added: samples/('p2', 0)/token_ids; "
        "elements differ: samples/('p1', 0)/token_ids 1 of 3; "
        "non-tensor values or structure changed: samples/('p1', 0)/logprob, samples/('p2', 0)"
    )


def test_two_samples_with_one_key_are_refused_naming_the_key(agent):
    agent.set_values(completion=[[0, 0], [1, 0], [0, 0]])
    result = agent.run()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["*rollout 'rollout' at step 0: samples 0 and 2 have the same key ('p0', 0)*"]
    )
    assert not (agent.pytester.path / "golden").exists() or not list(
        (agent.pytester.path / "golden").rglob("*.safetensors")
    )


def test_a_rollout_recorded_without_keys_is_refused_by_rollout_samples(project):
    project.write(
        """
        import json, pathlib

        def test_agent(golden):
            mode = json.loads((pathlib.Path(__file__).parent / "values.json").read_text())
            if mode["keyed"]:
                golden.rollout_samples(lambda: [{"a": 1}], key=lambda s: s["a"])
            else:
                golden.rollout(lambda: [{"a": 1}])
        """
    )
    project.set_values(keyed=False)
    project.run().assert_outcomes(passed=1)
    project.set_values(keyed=True)
    result = project.run()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*rollout 'rollout' at step 0 was recorded by golden.rollout(), not "
            "golden.rollout_samples()*--update-golden --golden-regenerate*"
        ]
    )
