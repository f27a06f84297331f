"""golden.check_bitwise through pytest: the bitwise train-inference lane on a recorded rollout
(record -> replay), a one-ULP break that fails naming the token, a neutered control that
reports inconclusive (never a pass), a lane without a control listed as such, the first module
that differs, and the float64 oracle leaving the lane out."""

from __future__ import annotations

import pytest

SOURCE = """
import math

import pytest
import torch

from pytest_rollout_golden import bitwise

V, H = 64, 32


class Toy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(V, H)
        self.proj = torch.nn.Linear(H, H)
        self.head = torch.nn.Linear(H, V, bias=False)

    def forward(self, tokens, split=1):
        logits = self.head(torch.tanh(self.proj(self.embed(tokens))))
        chunks = logits.split(V // split, dim=-1)  # a split-K log-sum-exp when split > 1
        lse = torch.stack([c.logsumexp(-1) for c in chunks], -1).logsumexp(-1)
        return logits.gather(-1, tokens[..., None]).squeeze(-1) - lse


def generate():
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, V, (4, 6), generator=g)
    mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2, [1] * 5 + [0], [1] * 2 + [0] * 4])
    with torch.no_grad():
        engine = Toy()(tokens)
    return {"tokens": tokens, "response_mask": mask, "rollout_log_probs": engine}


@pytest.mark.parametrize("case", ["bitwise", "one_ulp", "neutered", "uncontrolled", "located"])
def test_lane(golden, case):
    batch = golden.rollout(generate, step=0)
    tokens, engine = batch["tokens"], batch["rollout_log_probs"]
    model = Toy()
    if case == "located":
        with torch.no_grad():  # the trainer's copy of one bias, 1e-3 off
            model.proj.bias[3] += 1e-3
    with torch.no_grad():
        trainer = model(tokens)
        control = model(tokens, split=1 if case == "neutered" else 4)
    if case == "one_ulp":
        trainer[2, 3] = torch.nextafter(trainer[2, 3], torch.tensor(-math.inf))
    engine_model = Toy()
    golden.check_bitwise(
        trainer, engine, batch["response_mask"], step=0,
        control=None if case == "uncontrolled" else (lambda: control),
        locate=lambda: bitwise.first_divergence(
            model, lambda: model(tokens), lambda: engine_model(tokens), other=engine_model
        ),
    )
"""


@pytest.fixture
def lane(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.delenv("CI", raising=False)  # the first run records the rollouts
    pytester.makepyfile(test_lane=SOURCE)
    return pytester


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rA", *args)


def outcomes(result: pytest.RunResult) -> dict[str, str]:
    found = {}
    for line in result.outlines:
        for verdict in ("PASSED", "FAILED", "ERROR"):
            if line.startswith(f"{verdict} test_lane.py::test_lane["):
                found[line.split("[", 1)[1].split("]", 1)[0]] = verdict
    return found


EXPECTED = {
    "bitwise": "PASSED",
    "one_ulp": "FAILED",
    "neutered": "FAILED",
    "uncontrolled": "PASSED",
    "located": "FAILED",
}


@pytest.mark.parametrize("mode", [(), ("--update-golden",)], ids=["record", "update"])
def test_the_lane_holds_while_recording(lane: pytest.Pytester, mode: tuple[str, ...]) -> None:
    assert outcomes(run(lane, *mode)) == EXPECTED


def test_the_lane_on_the_replayed_rollout(lane: pytest.Pytester) -> None:
    run(lane, "--update-golden")
    result = run(lane)
    assert outcomes(result) == EXPECTED
    text = result.stdout.str()
    # the one-ULP break: the first token, both values, their bits, the ULP distance, the count
    assert (
        "bitwise train-inference lane broken at step 0: bitwise/log_probs: 1 of 17 values "
        "differ in their bits (float32); first at (sample 2, token 3): trainer "
    ) in text
    assert "1 ULP apart; the furthest 1 ULP apart" in text
    assert "a tolerance cannot widen this lane" in text
    # a control that computes what the lane computes cannot show the lane can fail
    assert (
        "inconclusive at step 0: the control did not fire: bitwise/log_probs's control equals "
        "the engine in all 17 compared values"
    ) in text
    # no control declared: passes, and says so
    assert "bitwise/log_probs/control (step 0; no must-fail control declared: a bitwise " in text
    # the first module whose output differs, in execution order
    assert "first module whose output differs: proj (call 0, output 0): " in text
    # nothing the lane checks tells --update-golden to take it
    assert "--update-golden" not in "\n".join(
        line for line in result.outlines if "bitwise" in line or "inconclusive" in line
    )


def test_the_float64_oracle_leaves_the_lane_out(lane: pytest.Pytester) -> None:
    run(lane, "--update-golden")
    result = run(lane, "--golden-certify", "--update-golden", "-k", "bitwise")
    result.assert_outcomes(passed=1)
    assert "the float64 oracle does not run the bitwise lane" in result.stdout.str()
