"""``golden.check_accumulation``: the micro-batch / accumulation sweep on a replayed rollout,
through the plugin: a correct step passes, a step that divides by the accumulation steps twice
fails naming the setting pair and the ratio."""

from __future__ import annotations

STEP = """
import torch

def make_rollout():
    g = torch.Generator().manual_seed(0)
    return {"log_probs": -torch.rand(8, 5, generator=g),
            "advantages": torch.randn(8, 1, generator=g).expand(8, 5).clone(),
            "response_mask": torch.rand(8, 5, generator=g) > 0.3}

def step(batch, setting):
    w = torch.ones((), dtype=setting.dtype, requires_grad=True)
    tokens = batch["response_mask"].sum()
    for micro in setting.schedule()[0]:
        rows = list(micro)
        lp = w * batch["log_probs"][rows]
        loss = -(batch["advantages"][rows] * lp * batch["response_mask"][rows]).sum() / tokens
        if BUGGY:
            loss = loss / setting.accumulation_steps
        loss.backward()
    return {"grad/w": w.grad}

def test_sweep(golden):
    batch = golden.rollout(make_rollout)
    golden.check_accumulation(step, batch, micro_batch_sizes=[1, 2, 8], accumulation_steps=[1, 2])
    golden.check({"tokens": batch["response_mask"].sum()})
"""


def test_a_correct_step_passes_and_a_double_division_fails_naming_the_settings(project):
    project.write(STEP.replace("BUGGY", "False"))
    project.run().assert_outcomes(passed=1)
    project.write(STEP.replace("BUGGY", "True"))
    result = project.run()
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "[accumulation_invariance]" in out
    assert "0.5x the baseline's" in out
