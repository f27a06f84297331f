"""Parallel layouts of a real (tiny) transformer gated against one golden.

``variants()`` parametrizes over tensor-, pipeline- and data-parallel sizes, sequence
packing and micro-batches. The reference layout (one process, padded, one micro-batch)
records the golden; every other layout trains on real torch.distributed processes, replays
the recorded rollouts and must reproduce pg_loss, kl, entropy, grad_norm and the per-token
log probs of three steps within the measured layout lane. The golden is the one
``tests/test_parallel_gate.py`` uses: ``shared=`` names it from any file.
"""

from __future__ import annotations

import pytest

from pytest_rollout_golden.parallel import variants
from pytest_rollout_golden.parallel.policy import PolicyConfig, check_step, make_rollout, run

CFG = PolicyConfig()


@pytest.mark.golden(shared="parallel-policy-float32")
@pytest.mark.parametrize(
    "layout", variants(tp=[1, 2], pp=[1], dp=[1, 2], packing=[False, True], micro_batches=[2])
)
def test_parallel_layout_matches_single_process(golden, layout):
    batches = [golden.rollout(lambda s=s: make_rollout(CFG, s), step=s) for s in range(3)]
    for step, result in enumerate(run(layout, CFG, batches)):
        check_step(golden, result, step=step)
