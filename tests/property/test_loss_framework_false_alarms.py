"""No false alarms: ROLL's TOPR and Kimi k1.5, slime's and TRL's OPSM and TRL's ``grpo``
(dividing by every row) restated from their code, checked at their documented declarations,
300 derandomized examples per float dtype and mask type. ``pytest -m slow`` runs it."""

from __future__ import annotations

import policy_loss_frameworks as fw
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from pytest_rollout_golden.invariants import (
    check_kimi15,
    check_opsm_mask,
    check_ppo_clip,
    check_topr,
)
from pytest_rollout_golden.strategies import rollout_batches

EXAMPLES = 300
DTYPES = [torch.float64, torch.float32, torch.bfloat16]
MASKS = ["bool", "int", "float"]


def _topr(batch, weights):
    positive, negative = weights
    check_topr(fw.roll_topr(positive, negative), batch, positive_weight=positive,
               negative_weight=negative, agg_mode="token-mean")  # fmt: skip


def _kimi15(batch, tau):
    check_kimi15(fw.roll_kimi15(tau), batch, tau=tau, agg_mode="token-mean")


def _slime_opsm(batch, delta):
    check_opsm_mask(fw.slime_opsm(delta), batch, delta=delta)


def _trl_opsm(batch, delta):
    per_row = batch["advantages"][:, :1].expand_as(batch["log_probs"])
    check_opsm_mask(fw.trl_opsm(delta), {**batch, "advantages": per_row}, delta=delta)


def _trl_grpo(batch, epsilon):
    check_ppo_clip(fw.trl_grpo(epsilon, epsilon), batch, clip_ratio_low=epsilon, clip_ratio_c=None,
                   agg_mode="seq-mean-token-mean", seq_count="rows")  # fmt: skip


DELTAS = st.sampled_from([1e-4, 0.0, 0.05, 0.5])
FAMILIES = {
    "roll-topr": (st.sampled_from([(1.0, 1.0), (1.0, 0.5), (2.0, 1.0)]), _topr),
    "roll-kimi15": (st.sampled_from([0.1, 0.5, 2.0]), _kimi15),
    "slime-opsm": (DELTAS, _slime_opsm),
    "trl-opsm": (DELTAS, _trl_opsm),
    "trl-grpo-rows": (st.sampled_from([0.2, 0.28]), _trl_grpo),
}
"""family: (the declaration's settings, check at that declaration)"""


def false_alarms(family: str, dtype: torch.dtype, mask: str, examples: int) -> list[str]:
    """The checker's failures on ``examples`` derandomized batches of one family."""
    extra, check = FAMILIES[family]
    mask_dtype = {"bool": torch.bool, "int": torch.int64, "float": dtype}[mask]
    alarms: list[str] = []

    @settings(
        max_examples=examples,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(rollout_batches(dtype=dtype, mask_dtype=mask_dtype), extra)
    def run(batch, argument):
        try:
            check(batch, argument)
        except AssertionError as error:
            alarms.append(str(error).splitlines()[0])

    run()
    return alarms


@pytest.mark.slow
@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_no_false_alarms(family, dtype, mask):
    alarms = false_alarms(family, dtype, mask, EXAMPLES)
    assert not alarms, f"{len(alarms)} false alarms, first: {alarms[:3]}"
