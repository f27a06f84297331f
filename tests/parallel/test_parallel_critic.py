"""The reference policy's value head (``PolicyConfig(critic=True)``) trains the same critic
step in every layout (float64, to 1e-12), and a critic normalized per micro-batch fails.

With the head on, each step also computes the clipped value loss of the head's predictions
against the batch's ``values`` and ``returns`` (``reference.value_token_losses``), token-mean
over the step, and records ``critic/vf_loss``, ``critic/vf_clipfrac``, ``critic/vpred_mean``
and ``critic/grad_norm``. The tolerance is the one ``test_parallel_policy.py`` holds the policy
to, for the same reason: in float64 the layouts differ by reduction order alone (~1e-15
relative). The fault ``critic-micro-norm`` (verl #6957) normalizes each micro-batch's value
loss by its own token count: one micro-batch on one rank computes the right step, so only the
layouts that cut the step (micro-batches, DP) show it, and there by far more than rounding.
Through a golden, ``check_step`` gates the critic's metrics and per-token ``critic/values``.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from test_parallel_policy import RTOL, assert_same_step

from pytest_rollout_golden import Golden, GoldenMismatch, Mode
from pytest_rollout_golden.parallel import Layout
from pytest_rollout_golden.parallel.policy import (
    CRITIC_METRICS,
    PolicyConfig,
    check_step,
    full_weights,
    make_rollout,
    run,
)
from pytest_rollout_golden.reference import value_loss

CRITIC64 = PolicyConfig(dtype="float64", critic=True)
BATCHES = [make_rollout(CRITIC64, step) for step in range(2)]
MOE_CRITIC64 = PolicyConfig(dtype="float64", experts=4, critic=True)
MOE_BATCHES = [make_rollout(MOE_CRITIC64, step) for step in range(2)]


@pytest.fixture(scope="module")
def single_process():
    return run(Layout(), CRITIC64, BATCHES)


@pytest.fixture(scope="module")
def moe_single_process():
    return run(Layout(), MOE_CRITIC64, MOE_BATCHES)


def assert_same_critic(actual, expected, what: str) -> None:
    """Every metric (the critic's included) and the per-token log probs and values."""
    assert_same_step(actual, expected, what)
    for a, e in zip(actual, expected, strict=True):
        torch.testing.assert_close(a.values, e.values, rtol=RTOL, atol=1e-13, msg=what)


def test_the_value_head_is_opt_in():
    plain, critic = PolicyConfig(), PolicyConfig(critic=True)
    assert not set(CRITIC_METRICS) & set(plain.metrics())
    assert set(CRITIC_METRICS) <= set(critic.metrics())
    weights, with_head = full_weights(plain), full_weights(critic)
    assert with_head.keys() - weights.keys() == {"value_head"}
    assert all(torch.equal(weights[k], with_head[k]) for k in weights)
    batch, critic_batch = make_rollout(plain, 0), make_rollout(critic, 0)
    assert critic_batch.keys() - batch.keys() == {"values", "returns"}
    assert all(torch.equal(batch[k], critic_batch[k]) for k in batch)


def test_critic_metrics_are_the_reference_value_loss_of_the_step(single_process):
    """Step 0's predictions are those of the initial weights, so the recorded metrics must be
    ``reference.value_loss`` of them, token-mean over the whole batch."""
    batch, first = BATCHES[0], single_process[0]
    mask = batch["response_mask"]
    loss, metrics = value_loss(
        first.values, batch["values"], batch["returns"], mask, cliprange_value=0.5
    )
    assert math.isclose(first.metrics["critic/vf_loss"], float(loss), rel_tol=1e-12)
    assert first.metrics["critic/vf_clipfrac"] == pytest.approx(metrics["critic/vf_clipfrac"])
    assert 0.05 < first.metrics["critic/vf_clipfrac"] < 0.95  # the clip binds, not everywhere
    mean = float(first.values[mask].mean())
    assert math.isclose(first.metrics["critic/vpred_mean"], mean, rel_tol=1e-12)
    assert (first.values[~mask] == 0).all() and (first.values[mask] != 0).all()
    assert first.metrics["critic/grad_norm"] > 0


@pytest.mark.parametrize(
    "layout",
    [
        Layout(tp=2, pp=2, micro_batches=2),
        Layout(dp=2, packing=True, micro_batches=2),
        Layout(cp=2, packing=True),
        Layout(sp=2, tp=2),
    ],
    ids=str,
)
def test_float64_critic_layouts_agree_with_single_process(single_process, layout):
    assert_same_critic(run(layout, CRITIC64, BATCHES), single_process, layout.id)


@pytest.mark.parametrize("layout", [Layout(cp=2, ep=2), Layout(pp=2, ep=2, max_tokens=10)], ids=str)
def test_float64_moe_critic_layouts_agree_with_single_process(moe_single_process, layout):
    assert_same_critic(run(layout, MOE_CRITIC64, MOE_BATCHES), moe_single_process, layout.id)


def test_per_micro_batch_critic_normalization_passes_in_one_process(single_process):
    assert_same_critic(
        run(Layout(fault="critic-micro-norm"), CRITIC64, BATCHES), single_process, "one process"
    )


@pytest.mark.parametrize(
    "fault",
    [
        Layout(micro_batches=4, fault="critic-micro-norm"),
        Layout(dp=2, fault="critic-micro-norm"),
    ],
    ids=str,
)
def test_per_micro_batch_critic_normalization_fails_the_layout(single_process, fault):
    """The logged ``critic/vf_loss`` keeps its scale (the metric is normalized by the step's
    tokens, as verl's average of micro-batch losses is); the head's gradient does not."""
    result = run(fault, CRITIC64, BATCHES)
    with pytest.raises(AssertionError, match="grad_norm at step 0"):
        assert_same_critic(result, single_process, fault.id)
    got, expected = result[0].metrics, single_process[0].metrics
    assert math.isclose(got["critic/vf_loss"], expected["critic/vf_loss"], rel_tol=RTOL)
    moved = abs(got["critic/grad_norm"] / expected["critic/grad_norm"] - 1)
    assert moved > 0.5, f"{fault.id} changed critic/grad_norm by only {moved:.2e}"


def test_a_critic_fault_needs_the_value_head():
    with pytest.raises(ValueError, match=r"PolicyConfig\(critic=True\)"):
        run(Layout(fault="critic-micro-norm"), PolicyConfig(), BATCHES[:1])


def gate(directory: Path, results, mode: Mode) -> None:
    with Golden(directory, mode=mode) as golden:
        for step, result in enumerate(results):
            check_step(golden, result, step=step)


def test_check_step_gates_the_critic_through_a_golden(tmp_path: Path, single_process):
    """The single-process run records the critic's metrics and per-token values; a layout
    replays them at the golden's defaults and the critic fault fails, naming both."""
    gate(tmp_path, single_process, Mode.AUTO)
    assert (tmp_path / "tensors-critic-step000001-rank0-micro0.safetensors").is_file()
    gate(tmp_path, run(Layout(dp=2, micro_batches=2), CRITIC64, BATCHES), Mode.STRICT)

    faulty = run(Layout(micro_batches=4, fault="critic-micro-norm"), CRITIC64, BATCHES)
    with pytest.raises(GoldenMismatch) as failed:
        gate(tmp_path, faulty, Mode.STRICT)
    message = str(failed.value)
    headline = "golden mismatch: first divergence at step 0: critic/grad_norm "
    assert message.startswith(headline), message
    assert "tensor 'critic/values' (step 1, rank 0, micro 0)" in message, message


CRITIC_GATE = """
import pytest
from pytest_rollout_golden.parallel import Layout, layout_params
from pytest_rollout_golden.parallel.policy import PolicyConfig, check_step, make_rollout, run

CFG = PolicyConfig(critic=True)
LAYOUTS = [
    Layout(tp=2, pp=2, micro_batches=2),
    Layout(dp=2, packing=True, micro_batches=2),
    Layout(micro_batches=4, fault="critic-micro-norm"),
]

@pytest.mark.golden(shared="parallel-critic-float32")
@pytest.mark.parametrize("layout", layout_params(LAYOUTS))
def test_gate(golden, layout):
    batches = [golden.rollout(lambda s=s: make_rollout(CFG, s), step=s) for s in range(3)]
    for step, result in enumerate(run(layout, CFG, batches)):
        check_step(golden, result, step=step)
"""


def test_float32_critic_layouts_replay_within_the_layout_lane_and_the_fault_fails(project):
    """In float32 the reference records, two layouts replay within the measured lane of the
    critic's metrics and values, and the critic fault fails beyond it."""
    project.write(CRITIC_GATE)
    result = project.run()
    result.assert_outcomes(passed=3, failed=1)
    assert "mb4-critic-micro-norm] against the golden of the reference" in result.stdout.str()
    row = project.mismatch_row(result, "critic/grad_norm")
    assert row["allowed"] == "rtol=1e-05, atol=1e-07 (variant lane)"
