"""The golden gate of the tiny GRPO loop in tiny_rl.py.

First run (or ``pytest --update-golden``): the rollouts of three training steps
and the metrics of each step are recorded under golden/examples/. Every later
run replays the recorded rollouts, so no sampling happens, retrains, and fails
if pg_loss, kl, grad_norm, ... drift beyond their tolerances.

The micro-batch variants are same-math variants of the one-micro-batch run
(``same_math``): splitting a batch changes only the order of float32 sums, so they
replay its golden and must agree at the built-in defaults, and the classic bug of
averaging per-micro-batch token means weighted by sample fractions must be caught.
"""

from __future__ import annotations

import pytest
from tiny_rl import TrainConfig, generate_rollout, make_trainer, ppo_step

from pytest_rollout_golden import GoldenMismatch, same_math

STEPS = 3


def train(golden, cfg: TrainConfig) -> None:
    model, ref, optimizer = make_trainer()
    for step in range(STEPS):
        batch = golden.rollout(lambda step=step: generate_rollout(model, step=step), step=step)
        golden.check(ppo_step(model, ref, optimizer, batch, cfg), step=step)


def test_grpo_training_matches_golden(golden):
    train(golden, TrainConfig())


# Splitting into micro-batches only reorders float32 sums: a same-math variant of the
# one-micro-batch run, replaying its golden under the built-in defaults (which leave room for
# reordering noise). Averaging per-micro-batch token means weighted by sample fractions is
# the known bug, and must fail.
*SAME_MATH, BUG = same_math(
    {
        "mb1": (1, "token-mean"),  # the reference: records the golden
        "mb2": (2, "token-mean"),
        "mb4": (4, "token-mean"),
        "sample-fraction-mb4": (4, "sample-fraction"),
    }
)
KNOWN_BUG = pytest.mark.xfail(
    raises=GoldenMismatch, strict=True, reason="per-micro-batch means: the known bug"
)


@pytest.mark.golden(key="grpo_layouts")
@pytest.mark.parametrize(
    "layout", [*SAME_MATH, pytest.param(*BUG.values, id=BUG.id, marks=[*BUG.marks, KNOWN_BUG])]
)
def test_micro_batch_layouts_agree(golden, layout):
    micro_batches, aggregation = layout
    train(golden, TrainConfig(micro_batches=micro_batches, aggregation=aggregation))
