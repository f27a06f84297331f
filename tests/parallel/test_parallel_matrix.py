"""The full variant matrices against the shared goldens of test_parallel_gate.py: the
standard one (32 layouts, world size up to 8) on the dense policy and the round-two one
(48 layouts: TP, ring and Ulysses sequence splits, EP, packing, a token budget) on the MoE
policy. Slow on 2 cores: ``pytest tests/parallel/test_parallel_matrix.py -m slow``."""

from __future__ import annotations

import pytest
from test_parallel_gate import MOE, MOE_SHARED, SHARED, gate

from pytest_rollout_golden.parallel import variants

ROUND2 = variants(
    tp=[1, 2], cp=[1, 2], sp=[1, 2], ep=[1, 2], packing=[False, True], max_tokens=[None, 16]
)


@pytest.mark.slow
@pytest.mark.golden(shared=SHARED)
@pytest.mark.parametrize("layout", variants())
def test_full_matrix_matches_single_process(golden, layout):
    gate(golden, layout)


@pytest.mark.slow
@pytest.mark.golden(shared=MOE_SHARED)
@pytest.mark.parametrize("layout", ROUND2)
def test_round_two_matrix_matches_single_process(golden, layout):
    gate(golden, layout, MOE)
