"""Every parallel layout of the reference policy gates against one golden: the single-process run.

The reference layout (tp1-pp1-dp1-padded-mb1) records the shared golden
``golden/@shared/parallel-policy-float32`` (rollouts of three steps, every metric of each
step, per-token log probs); every other layout runs on real ``torch.distributed`` processes,
replays those rollouts and must reproduce the metrics within the measured layout lane. The
default run covers one variant per parallelism feature (world size <= 4); the full matrix
of ``variants()`` is in ``test_parallel_matrix.py`` behind ``-m slow``.
"""

from __future__ import annotations

import pytest

from pytest_rollout_golden.parallel import Layout, layout_params
from pytest_rollout_golden.parallel.policy import PolicyConfig, check_step, make_rollout, run

CFG = PolicyConfig()
STEPS = 3
SHARED = "parallel-policy-float32"

# One variant per feature, a few of them combined; each under ~10 s cold on 2 cores.
DEFAULT_LAYOUTS = [
    Layout(tp=2, micro_batches=4),
    Layout(pp=2, micro_batches=4),
    Layout(dp=2, micro_batches=4),
    Layout(packing=True, micro_batches=4),
    Layout(tp=2, pp=2, micro_batches=4),
    Layout(tp=2, dp=2, packing=True, micro_batches=4),
]


def gate(golden, layout: Layout, cfg: PolicyConfig = CFG) -> None:
    """Train STEPS steps of ``layout`` on the golden's rollouts; check metrics and log probs."""
    batches = [
        golden.rollout(lambda step=step: make_rollout(cfg, step), step=step)
        for step in range(STEPS)
    ]
    for step, result in enumerate(run(layout, cfg, batches)):
        check_step(golden, result, step=step)


@pytest.mark.golden(shared=SHARED)
@pytest.mark.parametrize("layout", layout_params(DEFAULT_LAYOUTS))
def test_layout_matches_single_process(golden, layout):
    gate(golden, layout)
