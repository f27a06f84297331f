"""Where a rollout is recorded: a recording that holds trainer outputs says so."""

from __future__ import annotations

DERIVED = """
import torch


def test_step(golden):
    ones = torch.ones(4)
    batch = golden.rollout(lambda: {"ids": torch.arange(4), "advantages": ones, "returns": ones})
    golden.check({"pg_loss": float(batch["advantages"].sum())})
"""


def test_a_rollout_holding_trainer_outputs_is_named_once_when_recorded(project):
    project.write(DERIVED)
    recorded = project.run()
    recorded.assert_outcomes(passed=1)
    recorded.stdout.fnmatch_lines(
        [
            "rollout inputs of test_it.py::test_step:",
            "    rollout 'rollout': recorded with advantages, returns, which look computed by the "
            "trainer, not returned by the engine; *",
        ]
    )
    assert "look computed" not in project.run().stdout.str()  # replays do not repeat it
