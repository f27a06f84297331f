"""Every parallel layout of the reference policy gates against one golden: the single-process run.

The reference layout (tp1-pp1-dp1-padded-mb1) records the shared golden
``golden/@shared/parallel-policy-float32`` (rollouts of three steps, every metric of each
step, per-token log probs); every other layout runs on real ``torch.distributed`` processes,
replays those rollouts and must reproduce the metrics within the measured layout lane. The
default run covers one variant per parallelism feature (world size <= 4); the full matrix
of ``variants()`` is in ``test_parallel_matrix.py`` behind ``-m slow``.

The MoE policy (4 experts, top-2, aux loss) has its own golden,
``golden/@shared/parallel-moe-float32``, recorded the same way by the single-process
layout and replayed by ring (cp) and Ulysses (sp) sequence splits, expert parallelism and a
dynamic token budget.
"""

from __future__ import annotations

import pytest

from pytest_rollout_golden.parallel import Layout, layout_params, variants
from pytest_rollout_golden.parallel.policy import PolicyConfig, check_step, make_rollout, run

CFG = PolicyConfig()
STEPS = 3
SHARED = "parallel-policy-float32"
MOE = PolicyConfig(experts=4)
MOE_SHARED = "parallel-moe-float32"

# One variant per feature, a few of them combined; each under ~10 s cold on 2 cores.
DEFAULT_LAYOUTS = [
    Layout(tp=2, micro_batches=4),
    Layout(pp=2, micro_batches=4),
    Layout(dp=2, micro_batches=4),
    Layout(packing=True, micro_batches=4),
    Layout(tp=2, pp=2, micro_batches=4),
    Layout(tp=2, dp=2, packing=True, micro_batches=4),
    Layout(cp=2, micro_batches=2),
    Layout(sp=2, packing=True),
    Layout(max_tokens=16),
]

# The four layouts of the acceptance line, then Ulysses and a token budget with EP.
MOE_LAYOUTS = [
    *variants(tp=[1], pp=[1], dp=[1], cp=[1, 2], ep=[1, 2]),
    *layout_params([Layout(sp=2, ep=2, packing=True), Layout(ep=2, max_tokens=16)])[1:],
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


@pytest.mark.golden(shared=MOE_SHARED)
@pytest.mark.parametrize("layout", MOE_LAYOUTS)
def test_moe_layout_matches_single_process(golden, layout):
    gate(golden, layout, MOE)
