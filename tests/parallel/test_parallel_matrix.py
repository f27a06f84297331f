"""The full variant matrix (32 layouts, world size up to 8) against the shared golden of
test_parallel_gate.py. Slow on 2 cores:
``pytest tests/parallel/test_parallel_matrix.py -m slow``."""

from __future__ import annotations

import pytest
from test_parallel_gate import SHARED, gate

from pytest_rollout_golden.parallel import variants


@pytest.mark.slow
@pytest.mark.golden(shared=SHARED)
@pytest.mark.parametrize("layout", variants())
def test_full_matrix_matches_single_process(golden, layout):
    gate(golden, layout)
