"""The reference policy computes the same step in every layout (float64, to ~1e-12).

Each layout runs on real torch.distributed processes (gloo); the single-process run is the
reference. In float64 the only differences are reduction order (~1e-15 relative), so a
tolerance of 1e-12 leaves room for that and nothing else. Hypothesis drives random
micro-batch, DP-shard and packing splits through the same model. The MoE policy (4 experts,
top-2) is held to the same standard across ring and Ulysses sequence splits, expert
parallelism and dynamic batch size; each deliberate fault moves the step by >= 1e-3.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from pytest_rollout_golden.parallel import Layout
from pytest_rollout_golden.parallel.policy import PolicyConfig, make_micro_batch, make_rollout, run

CFG64 = PolicyConfig(dtype="float64")
BATCHES = [make_rollout(CFG64, step) for step in range(2)]
MOE64 = PolicyConfig(dtype="float64", experts=4)
MOE_BATCHES = [make_rollout(MOE64, step) for step in range(2)]
RTOL = 1e-12


@pytest.fixture(scope="module")
def single_process():
    return run(Layout(), CFG64, BATCHES)


@pytest.fixture(scope="module")
def moe_single_process():
    return run(Layout(), MOE64, MOE_BATCHES)


def assert_same_step(actual, expected, what: str) -> None:
    for step, (a, e) in enumerate(zip(actual, expected, strict=True)):
        assert a.metrics.keys() == e.metrics.keys()
        for name in e.metrics:
            assert math.isclose(a.metrics[name], e.metrics[name], rel_tol=RTOL, abs_tol=1e-14), (
                f"{what}: {name} at step {step}: {a.metrics[name]!r} != {e.metrics[name]!r}"
            )
        torch.testing.assert_close(a.log_probs, e.log_probs, rtol=RTOL, atol=1e-13, msg=what)


@pytest.mark.parametrize(
    "layout",
    [
        Layout(tp=2),
        Layout(pp=2, micro_batches=4),
        Layout(dp=2, packing=True, micro_batches=4),
        Layout(tp=2, pp=2, micro_batches=2),
        Layout(tp=2, dp=2, packing=True),
        Layout(cp=2),
        Layout(cp=2, packing=True, micro_batches=2),
        Layout(cp=2, tp=2, pp=2),
        Layout(sp=2),
        Layout(sp=2, tp=2, packing=True),
        Layout(max_tokens=12),
        Layout(max_tokens=20, dp=2, packing=True),
    ],
    ids=str,
)
def test_float64_layouts_agree_with_single_process(single_process, layout):
    assert_same_step(run(layout, CFG64, BATCHES), single_process, layout.id)


@pytest.mark.parametrize(
    "layout",
    [
        Layout(ep=2),
        Layout(cp=2, ep=2),
        Layout(sp=2, ep=2, packing=True),
        Layout(tp=2, ep=2, micro_batches=2),
        Layout(pp=2, ep=2, max_tokens=10),
        Layout(dp=2, ep=2, max_tokens=16),
    ],
    ids=str,
)
def test_float64_moe_layouts_agree_with_single_process(moe_single_process, layout):
    assert_same_step(run(layout, MOE64, MOE_BATCHES), moe_single_process, layout.id)


@pytest.mark.parametrize(
    "fault",
    [
        Layout(tp=2, fault="no-tp-allreduce"),
        Layout(micro_batches=4, fault="micro-mean"),
        Layout(dp=2, fault="dp-double-norm"),
        Layout(packing=True, micro_batches=2, fault="packing-leak"),
        Layout(cp=2, fault="ring-no-causal"),
        Layout(cp=2, packing=True, fault="ring-no-causal"),
        Layout(sp=2, fault="ulysses-head-split"),
        Layout(max_tokens=12, fault="micro-mean"),
    ],
    ids=str,
)
def test_each_fault_moves_the_step_far_beyond_rounding(single_process, fault):
    result = run(fault, CFG64, BATCHES)
    worst = max(
        abs(a.metrics[n] - e.metrics[n]) / abs(e.metrics[n])
        for a, e in zip(result, single_process, strict=True)
        for n in ("pg_loss", "grad_norm")
    )
    assert worst > 1e-3, f"{fault.id} changed pg_loss/grad_norm by only {worst:.2e}"


def test_packed_micro_batch_is_block_diagonal_with_restarting_positions():
    batch = BATCHES[0]
    rows = [0, 1, 2]
    mb = make_micro_batch(batch, rows, CFG64, packed=True, leak=False)
    lengths = (CFG64.prompt_len + batch["response_mask"][rows].sum(-1)).tolist()
    assert mb.input_ids.shape == (1, sum(lengths))
    starts = [0, lengths[0], lengths[0] + lengths[1]]
    assert mb.positions[0, starts].tolist() == [0, 0, 0]
    # the first token of the second sequence sees only itself
    assert mb.allowed[0, starts[1]].nonzero().flatten().tolist() == [starts[1]]
    leaky = make_micro_batch(batch, rows, CFG64, packed=True, leak=True)
    assert leaky.allowed[0, starts[1]].sum() == starts[1] + 1


@st.composite
def splits(draw, size: int = 8):
    """Rows permuted, cut into 1-2 non-empty DP shards, each cut into non-empty micro-batches."""
    order = draw(st.permutations(range(size)))
    dp = draw(st.sampled_from([1, 2]))
    cut = draw(st.integers(1, size - 1)) if dp == 2 else size
    shards = [order[:cut], order[cut:]] if dp == 2 else [order]
    out = []
    for shard in shards:
        bounds = (
            sorted(draw(st.sets(st.integers(1, len(shard) - 1), max_size=3)))
            if len(shard) > 1
            else []
        )
        edges = [0, *bounds, len(shard)]
        out.append([list(shard[a:b]) for a, b in itertools.pairwise(edges)])
    return dp, draw(st.booleans()), out


@settings(max_examples=12, deadline=None)
@given(case=splits())
def test_random_splits_give_the_single_process_step(single_process, case):
    dp, packing, split = case
    layout = Layout(dp=dp, packing=packing)
    result = run(layout, CFG64, BATCHES, splits=split)
    assert_same_step(result, single_process, f"{layout.id} splits={split}")


def test_per_ep_rank_router_statistics_move_the_aux_loss(moe_single_process):
    """The aux loss is a small part of the objective (aux_coef 0.01), so its own metric is
    where the bug shows: computed per EP rank, it differs by far more than rounding."""
    result = run(Layout(ep=2, fault="ep-local-aux"), MOE64, MOE_BATCHES)
    moved = max(
        abs(a.metrics["aux_loss"] - e.metrics["aux_loss"]) / e.metrics["aux_loss"]
        for a, e in zip(result, moe_single_process, strict=True)
    )
    assert moved > 1e-3, f"ep-local-aux changed aux_loss by only {moved:.2e}"
