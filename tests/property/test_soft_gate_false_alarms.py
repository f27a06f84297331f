"""No false alarms from the SAPO checker on AReaL's ``sapo_loss_fn`` (transcribed in
``soft_gate_frameworks.py``): 300 derandomized examples per float dtype and mask type, at
AReaL's defaults and at temperatures far apart. ``pytest -m slow`` runs it."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st
from soft_gate_frameworks import areal_sapo_loss

from pytest_rollout_golden import invariants
from pytest_rollout_golden.strategies import rollout_batches

EXAMPLES = 300
DTYPES = [torch.float64, torch.float32, torch.bfloat16]
MASKS = ["bool", "int", "float"]
TAUS = st.sampled_from([{"tau_pos": 1.0, "tau_neg": 1.05}, {"tau_pos": 0.5, "tau_neg": 4.0}])


def areal_sapo(taus):
    def loss_fn(batch, *, global_tokens, global_seqs):
        inputs = (batch[k] for k in ("log_probs", "old_log_probs", "advantages", "response_mask"))
        return areal_sapo_loss(*inputs, **taus)

    return loss_fn


def sapo_false_alarms(dtype: torch.dtype, mask: str, examples: int) -> tuple[int, list[str]]:
    """Calls made and the checker's failures on ``examples`` derandomized batches. AReaL
    exponentiates the log ratio at every position before masking, as real batches allow
    (their padding log probs are log probs): garbage goes into the advantages' padding."""
    mask_dtype = {"bool": torch.bool, "int": torch.int64, "float": dtype}[mask]
    calls, alarms = [0], []

    @settings(
        max_examples=examples,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(rollout_batches(dtype=dtype, mask_dtype=mask_dtype, garbage={"advantages"}), TAUS)
    def run(batch, taus):
        calls[0] += 1
        try:
            invariants.check_sapo(areal_sapo(taus), batch, agg_mode="token-mean", **taus)
        except AssertionError as error:
            alarms.append(str(error).splitlines()[0])

    run()
    return calls[0], alarms


@pytest.mark.slow
@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_areal_sapo_no_false_alarms(dtype, mask):
    calls, alarms = sapo_false_alarms(dtype, mask, EXAMPLES)
    assert calls == EXAMPLES
    assert not alarms, f"{len(alarms)} false alarms in {calls} calls, first: {alarms[:3]}"


def test_areal_sapo_passes_a_few():
    calls, alarms = sapo_false_alarms(torch.float32, "bool", 20)
    assert (calls, alarms) == (20, [])
