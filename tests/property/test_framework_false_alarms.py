"""No false alarms: the checkers on correct functions with the arithmetic of AReaL, slime,
ROLL, NeMo-RL and TRL (GAE, whitening, rejection sampling, IS weights and composites), 300
derandomized examples per float dtype and mask type. ``pytest -m slow`` runs it."""

from __future__ import annotations

import functools

import frameworks as fw
import guarded
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings, strategies as st

from pytest_rollout_golden import invariants, reference as ref
from pytest_rollout_golden.reference.masking import as_bool_mask
from pytest_rollout_golden.strategies import (
    is_thresholds,
    rollout_batches,
    rs_configs,
    value_batches,
)

EXAMPLES = 300
DTYPES = [torch.float64, torch.float32, torch.bfloat16]
MASKS = ["bool", "int", "float"]
GAE_PARAMS = st.sampled_from([(1.0, 0.95), (0.99, 1.0), (0.9, 0.8)])


def _gae(gae, whiten=None, **options):
    def check(batch, params):
        gamma, lam = params
        fn = functools.partial(gae, gamma=gamma, lam=lam)
        if whiten is not None:
            assume(int(as_bool_mask(batch["response_mask"]).sum()) >= 2)
            fn = fw.whitened(fn, whiten)
        invariants.check_gae(fn, batch, gamma=gamma, lam=lam, whiten=whiten is not None, **options)

    return check


def _rs(batch, config):
    invariants.check_rs_mask(fw.roll_rs_mask, batch, criterion=config[0], threshold=config[1])


def _exact_is(batch, config):
    level, threshold, normalize = config
    fn = guarded.is_weights(level, threshold, normalize, delta=1e-8, clamp=False)
    invariants.check_is_weights(
        fn, fw.scaled_down(batch, 30.0), level=level, threshold=threshold, batch_normalize=normalize
    )


def _nemo_composite(batch, bounds):
    lower, upper = bounds
    fn = fw.nemo_seq_mask_tis(2.0, lower, upper)
    spec = ("seq_mean_k1", f"{lower!r}_{upper!r}")
    invariants.check_is_weights(fn, batch, level="token", threshold=2.0, rs_filter=spec)


def _areal_composite(batch, bounds):
    lower, upper = bounds
    fn = fw.areal_agg_sum(lower, upper)
    spec = ("seq_sum_k1", f"{lower!r}_{upper!r}")
    invariants.check_is_weights(fn, batch, level="geometric", threshold=None, rs_filter=spec)


BOUNDS = st.tuples(st.integers(2, 15), st.integers(9, 32)).map(lambda p: (p[0] / 16, p[1] / 8))
IS_CONFIGS = st.tuples(
    st.sampled_from(ref.IS_LEVELS),
    st.one_of(st.none(), is_thresholds(one_sided=True)),
    st.booleans(),
)

# family: (batches from (dtype, mask dtype), extra argument, check)
FAMILIES = {
    "gae-areal": (
        lambda d, m: value_batches(dtype=d, mask_dtype=m),
        GAE_PARAMS,
        _gae(fw.areal_gae),
    ),
    "gae-slime-steps": (
        lambda d, m: value_batches(dtype=d, mask_dtype=m, hole_values=True),
        GAE_PARAMS,
        _gae(fw.slime_gae, masked_tokens="step"),
    ),
    "gae-roll-masked-values": (
        lambda d, m: value_batches(dtype=d, mask_dtype=m, holes=False),
        GAE_PARAMS,
        _gae(fw.roll_gae),
    ),
    "gae-trl-whiten": (
        lambda d, m: value_batches(dtype=d, mask_dtype=m),
        GAE_PARAMS,
        _gae(fw.areal_gae, fw.trl_whiten),
    ),
    "gae-nemo-whiten": (
        lambda d, m: value_batches(dtype=d, mask_dtype=m),
        GAE_PARAMS,
        _gae(fw.areal_gae, fw.nemo_whiten),
    ),
    "rs-roll-exact": (
        lambda d, m: rollout_batches(dtype=d, mask_dtype=m),
        rs_configs(max_parts=2, one_sided=True),
        _rs,
    ),
    "is-exact-underflow": (
        lambda d, m: rollout_batches(dtype=d, mask_dtype=m),
        IS_CONFIGS,
        _exact_is,
    ),
    "is-nemo-seq-mask-tis": (
        lambda d, m: rollout_batches(dtype=d, mask_dtype=m),
        BOUNDS,
        _nemo_composite,
    ),
    "is-areal-agg-sum": (
        lambda d, m: rollout_batches(dtype=d, mask_dtype=m),
        BOUNDS,
        _areal_composite,
    ),
}


def false_alarms(family: str, dtype: torch.dtype, mask: str, examples: int) -> list[str]:
    """The checker's failures on ``examples`` derandomized batches of one family."""
    batches, extra, check = FAMILIES[family]
    mask_dtype = {"bool": torch.bool, "int": torch.int64, "float": dtype}[mask]
    alarms: list[str] = []

    @settings(
        max_examples=examples,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(batches(dtype, mask_dtype), extra)
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
