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


MARKED = STEP.replace(
    """def test_sweep(golden):
    batch = golden.rollout(make_rollout)
    golden.check_accumulation(step, batch, micro_batch_sizes=[1, 2, 8], accumulation_steps=[1, 2])
""",
    """import pytest

@pytest.mark.golden_accumulation(step, make_rollout, micro_batch_sizes=[1, 2, 8],
                                 accumulation_steps=[1, 2])
def test_sweep(golden):
    batch = golden.rollout(make_rollout)
""",
)


def test_the_marker_sweeps_the_recorded_rollout_as_the_fixture_method_does(project):
    assert "golden_accumulation" in MARKED
    project.write(MARKED.replace("BUGGY", "False"))
    project.run().assert_outcomes(passed=1)
    project.run().assert_outcomes(passed=1)  # replayed: the recorded rollout is swept
    project.write(MARKED.replace("BUGGY", "True"))
    result = project.run()
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "[accumulation_invariance]" in out and "0.5x the baseline's" in out, out
    assert "vs micro-batch 2 × accumulation 2" in out, out  # the setting pair


def test_the_marker_without_the_golden_fixture_sweeps_the_batch_it_is_given(project):
    source = MARKED.replace(
        "def test_sweep(golden):\n    batch = golden.rollout(make_rollout)\n",
        "def test_sweep():\n    pass\n",
    )
    source = source.replace('    golden.check({"tokens": batch["response_mask"].sum()})\n', "")
    project.write(source.replace("BUGGY", "True"))
    result = project.run()
    result.assert_outcomes(failed=1)
    assert "0.5x the baseline's" in result.stdout.str()


def test_a_marker_without_a_step_fails_with_its_usage(project):
    project.write(
        "import pytest\n\n@pytest.mark.golden_accumulation(batch=[1])\ndef test_x():\n    pass\n"
    )
    result = project.run()
    result.assert_outcomes(failed=1)
    assert "@pytest.mark.golden_accumulation(step, batch, **settings)" in result.stdout.str()
