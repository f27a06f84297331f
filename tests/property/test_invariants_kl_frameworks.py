"""``check_kl_penalty`` on the KL arithmetic of AReaL, slime, NeMo-RL and TRL: output and
input clamps on every estimator, a float32 computation of float64 inputs, importance-weighted
KL; and the broken variants of each that it must catch."""

from __future__ import annotations

import kl_frameworks as fw
import pytest
import torch
from hunting import finds, hunt, passes as passes_settings
from hypothesis import given, strategies as st

from pytest_rollout_golden import reference as ref
from pytest_rollout_golden.invariants import check_kl_penalty, check_padding_invariance
from pytest_rollout_golden.strategies import kl_batches, rollout_batches

DTYPES = [torch.float64, torch.float32, torch.bfloat16]
SLIME = ["k1", "k2", "k3", "low_var_kl"]

passes = passes_settings(80)


def spike_batch(log_prob: float, ref_log_prob: float, dtype=torch.float64):
    """One spiking token beside an ordinary one."""
    return {
        "log_probs": torch.tensor([[log_prob, -1.0]], dtype=dtype),
        "ref_log_probs": torch.tensor([[ref_log_prob, -1.5]], dtype=dtype),
        "response_mask": torch.tensor([[True, True]]),
    }


# --------------------------------------------------------------------------- reference


@passes
@given(kl_batches(is_weights=True), st.sampled_from(["k1", "k2", "k3"]))
def test_reference_is_nemo_rl_calculate_kl_in_float64(batch, estimator):
    lp = batch["log_probs"].clone().requires_grad_(True)
    ratio = batch["is_weights"] * torch.exp(lp - lp.detach())
    theirs = fw.nemo_rl(estimator)(lp, batch["ref_log_probs"], ratio)
    ours = ref.kl_estimate(lp, batch["ref_log_probs"], estimator, input_clamp=20.0,
                           output_clamp=10.0, weights=ratio)  # fmt: skip
    # Equal up to float64 rounding (the reference's k3 is expm1(d) - d, NeMo-RL's exp(d) - 1 - d).
    torch.testing.assert_close(theirs, ours, rtol=1e-9, atol=1e-12)
    (g1,) = torch.autograd.grad(theirs.sum(), lp, retain_graph=True)
    (g2,) = torch.autograd.grad(ours.sum(), lp)
    torch.testing.assert_close(g1, g2, rtol=1e-9, atol=1e-12)


def test_kl_penalty_is_kl_estimate_with_verl_clamps():
    lp = torch.tensor([-26.0, -1.0, 0.0, -3.0], dtype=torch.float64)
    rp = torch.tensor([-1.0, -1.5, -30.0, -3.0], dtype=torch.float64)
    for estimator in ["k1", "k2", "k3", "k3+", "abs"]:
        clamps = {"input_clamp": 20.0, "output_clamp": 10.0} if "k3" in estimator else {}
        verl = ref.kl_penalty(lp, rp, estimator)
        assert torch.equal(verl, ref.kl_estimate(lp, rp, estimator, **clamps))
    assert float(ref.kl_penalty(lp, rp, "k3")[0]) == 10.0


# --------------------------------------------------------------------------- output clamps


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_output_clamp_of_every_estimator_is_expressible(estimator):
    # AReaL apply_clamp=True: logp - ref = -25 gives k1 -10, k2 10, k3 10.
    check_kl_penalty(fw.areal(estimator), spike_batch(-26.0, -1.0), estimator=estimator,
                     output_clamp=10.0)  # fmt: skip


def test_a_stated_output_clamp_rejects_the_unclamped_value():
    with pytest.raises(AssertionError, match=r"\[kl\.value\].*clamped to \[-10, 10\]"):
        check_kl_penalty(fw.areal("k1", apply_clamp=False), spike_batch(-26.0, -1.0),
                         estimator="k1", output_clamp=10.0)  # fmt: skip


@passes
@given(kl_batches(dtype=DTYPES), st.sampled_from(["k1", "k2", "k3"]))
def test_areal_clamped_estimators_pass(batch, estimator):
    check_kl_penalty(fw.areal(estimator), batch, estimator=estimator, output_clamp=10.0)


@passes
@given(kl_batches(dtype=DTYPES), st.sampled_from(["k1", "k2", "k3"]))
def test_nemo_rl_default_clamps_pass(batch, estimator):
    check_kl_penalty(fw.nemo_rl(estimator), batch, estimator=estimator, input_clamp=20.0,
                     output_clamp=10.0)  # fmt: skip


def test_clamp_values_must_be_positive():
    with pytest.raises(ValueError, match="output_clamp must be a number > 0"):
        check_kl_penalty(fw.areal("k1"), spike_batch(-2.0, -1.0), estimator="k1",
                         output_clamp=-10.0)  # fmt: skip


# --------------------------------------------------------------------------- dtypes


def test_float32_kl_of_float64_inputs_is_judged_at_float32():
    # slime and AReaL compute in float32 whatever the input: k3 at d = 1/16 is 0.00199446
    # with an absolute rounding error of exp(d) in float32, 1.6e-5 relative.
    check_kl_penalty(fw.slime("k3"), spike_batch(-1.0625, -1.0), estimator="k3")


@passes
@given(kl_batches(dtype=DTYPES), st.sampled_from(SLIME))
def test_slime_passes(batch, estimator):
    check_kl_penalty(fw.slime(estimator), batch, estimator=estimator)


def test_float16_computation_of_float64_inputs_is_caught():
    def half(log_prob, ref_log_prob):
        return (log_prob.half() - ref_log_prob.half()).double()

    with pytest.raises(AssertionError, match=r"\[kl\.value\]"):
        check_kl_penalty(half, spike_batch(-7.3, -0.1), estimator="k1")


# --------------------------------------------------------------------------- importance weights


@passes
@given(kl_batches(dtype=DTYPES, is_weights=True), st.sampled_from(["k1", "k2", "k3"]))
def test_nemo_rl_importance_weighted_kl_passes(batch, estimator):
    check_kl_penalty(fw.nemo_rl(estimator), batch, estimator=estimator, input_clamp=20.0,
                     output_clamp=10.0, weights="is_weights")  # fmt: skip


@passes
@given(kl_batches(dtype=DTYPES, is_weights=True), st.sampled_from(SLIME))
def test_slime_unbiased_kl_passes(batch, estimator):
    # float32 estimate times a float64 ratio: a float64 output of float32 precision.
    check_kl_penalty(fw.slime(estimator, weighted=True), batch, estimator=estimator,
                     weights="is_weights", compute_dtype=torch.float32)  # fmt: skip


def test_a_float32_computation_hidden_in_a_float64_output_is_reported_with_its_remedy():
    batch = {
        **spike_batch(-1.0625, -1.0),
        "is_weights": torch.tensor([[0.5, 2.0]], dtype=torch.float64),
    }
    fn = fw.slime("k3", weighted=True)
    with pytest.raises(
        AssertionError, match=r"agree at float32 precision.*compute_dtype=torch\.float32"
    ):
        check_kl_penalty(fn, batch, estimator="k3", weights="is_weights")
    check_kl_penalty(fn, batch, estimator="k3", weights="is_weights", compute_dtype=torch.float32)


@passes
@given(kl_batches(dtype=DTYPES, is_weights=True))
def test_trl_inline_kl_with_bias_correction_passes(batch):
    check_kl_penalty(fw.trl_inline(use_bias_correction_kl=True), batch, estimator="k3",
                     output_clamp=None, weights="is_weights")  # fmt: skip


@passes
@given(kl_batches(dtype=DTYPES))
def test_trl_inline_kl_passes(batch):
    check_kl_penalty(fw.trl_inline(), batch, estimator="k3", output_clamp=None)


@passes
@given(kl_batches(dtype=DTYPES, is_weights=True), st.sampled_from(["k1", "k3", "k3+"]))
def test_detached_weights_pass(batch, estimator):
    def fn(log_prob, ref_log_prob, weights):
        w = weights.detach()
        return ref.kl_estimate(log_prob, ref_log_prob, estimator, output_clamp=10.0, weights=w)

    check_kl_penalty(fn, batch, estimator=estimator, output_clamp=10.0, weights="is_weights",
                     weight_gradient=False)  # fmt: skip


def test_kl_batches_weights_are_the_policy_ratio_on_valid_tokens():
    @given(kl_batches(is_weights=True))
    @passes_settings(20)
    def run(batch):
        valid = ref.as_bool_mask(batch["response_mask"])
        ratio = (batch["log_probs"] - batch["old_log_probs"]).exp()
        assert torch.equal(batch["is_weights"][valid], ratio[valid])

    run()


# --------------------------------------------------------------------------- inputs


def test_a_batch_without_ref_log_probs_names_the_strategy():
    batch = {k: v for k, v in spike_batch(-2.0, -1.0).items() if k != "ref_log_probs"}
    with pytest.raises(ValueError, match=r"needs 'ref_log_probs'.*strategies\.kl_batches\(\)"):
        check_kl_penalty(fw.areal("k1"), batch, estimator="k1")


def test_a_missing_weights_field_names_the_strategy_option():
    with pytest.raises(ValueError, match=r"needs 'is_weights'.*kl_batches\(is_weights=True\)"):
        check_kl_penalty(fw.slime("k1", weighted=True), spike_batch(-2.0, -1.0),
                         estimator="k1", weights="is_weights")  # fmt: skip


def test_a_rollout_batch_is_refused_with_a_remedy():
    @given(rollout_batches())
    @passes_settings(1)
    def run(batch):
        with pytest.raises(ValueError, match=r"use strategies\.kl_batches\(\)"):
            check_kl_penalty(fw.areal("k1"), batch, estimator="k1")

    run()


# --------------------------------------------------------------------------- broken variants


WEIGHTED = {"is_weights": True}


def hunt_kl(fn, estimator, *, options=None, **check):
    @hunt
    @given(kl_batches(**(options or {})))
    def run(batch):
        check_kl_penalty(fn, batch, estimator=estimator, **check)

    return run


def test_finds_the_output_clamp_at_the_wrong_value():
    def fn(log_prob, ref_log_prob):
        return (log_prob - ref_log_prob).clamp(-5, 5)

    with finds("kl.value"):
        hunt_kl(fn, "k1", output_clamp=10.0)()


def test_finds_a_clamp_on_the_log_ratio_instead_of_the_output():
    # k3 with d clamped to ±10 before exp: e^10 - 11 where the output clamp gives 10.
    def fn(log_prob, ref_log_prob):
        d = (ref_log_prob - log_prob).clamp(-10, 10)
        return d.exp() - 1 - d

    with finds("kl.value"):
        hunt_kl(fn, "k3", output_clamp=10.0)()


def test_finds_the_output_clamp_applied_before_the_weight():
    def fn(log_prob, ref_log_prob, weights):
        d = ref_log_prob - log_prob
        return weights * (d.exp() - 1 - d).clamp(-10, 10)

    with finds("kl.value"):
        hunt_kl(fn, "k3", options={"is_weights": True}, output_clamp=10.0, weights="is_weights")()


def test_finds_the_forgotten_importance_weight():
    def fn(log_prob, ref_log_prob, ratio):
        return fw.slime("k3")(log_prob, ref_log_prob)

    with finds("kl.value"):
        hunt_kl(fn, "k3", options=WEIGHTED, weights="is_weights")()


def test_finds_a_weight_without_its_gradient():
    # slime's ratio exp(logp - old) carries a gradient; detaching it drops w·kl from it.
    def fn(log_prob, ref_log_prob, ratio):
        return fw.slime("k3", weighted=True)(log_prob, ref_log_prob, ratio.detach())

    with finds("kl.gradient"):
        hunt_kl(fn, "k3", options=WEIGHTED, weights="is_weights")()


def test_finds_the_weight_applied_twice():
    def fn(log_prob, ref_log_prob, weights):
        return weights * weights * ref.kl_penalty(log_prob, ref_log_prob, "k1")

    with finds("kl.value"):
        hunt_kl(fn, "k1", options={"is_weights": True}, weights="is_weights")()


def test_finds_a_float16_computation_of_float64_inputs():
    def fn(log_prob, ref_log_prob):
        d = ref_log_prob.half() - log_prob.half()
        return (d.exp() - 1 - d).clamp(-10, 10).double()

    with finds("kl"):
        hunt_kl(fn, "k3", output_clamp=10.0)()


def test_finds_a_missing_input_clamp():
    # NeMo-RL's input clamp shows with weights: w·k1 at a 25-nat spike is w·20, not w·25.
    with finds("kl.value"):
        hunt_kl(fw.nemo_rl("k1", input_clamp=None, output_clamp=None), "k1",
                options={"is_weights": True}, input_clamp=20.0, output_clamp=None,
                weights="is_weights")()  # fmt: skip


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_finds_a_missing_input_clamp_under_the_output_clamp(estimator):
    # NeMo-RL's defaults: k(clamp(d, ±20)) weighted, then clamped to ±10. kl_batches draws
    # small weights on spikes beyond 20 nats, so w·k stays under 10 and the input clamp shows.
    with finds("kl"):
        hunt_kl(fw.nemo_rl(estimator, input_clamp=None), estimator,
                options={"is_weights": True}, input_clamp=20.0, output_clamp=10.0,
                weights="is_weights")()  # fmt: skip


# --------------------------------------------------------------------------- conformance

MASKS = ["bool", "int64", "float"]


def configured_batches(family: str, dtype: torch.dtype, mask: str):
    """``(config, batch)``: a setting of ``family`` and a batch that fits it."""
    mask_dtype = {"bool": torch.bool, "int64": torch.int64, "float": dtype}[mask]
    return st.sampled_from(fw.FAMILIES[family]).flatmap(
        lambda config: kl_batches(dtype=dtype, mask_dtype=mask_dtype, **config.batches).map(
            lambda batch: (config, batch)
        )
    )


@pytest.mark.slow
@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("family", sorted(fw.FAMILIES))
def test_framework_kl_has_no_false_alarm(family, dtype, mask):
    # 300 derandomized examples per framework, dtype and mask type; each draws a setting.
    @passes_settings(300)
    @given(configured_batches(family, dtype, mask))
    def run(drawn):
        config, batch = drawn
        check_kl_penalty(config.fn, batch, estimator=config.estimator, **config.check)

    run()


# --------------------------------------------------------------------------- NeMo-RL's default


@passes
@given(kl_batches(dtype=DTYPES), st.sampled_from(["k1", "k2", "k3"]))
def test_nemo_rl_default_kl_passes_with_score_function(batch, estimator):
    check_kl_penalty(fw.nemo_rl_default(estimator), batch, estimator=estimator,
                     input_clamp=20.0, output_clamp=10.0, score_function=True)  # fmt: skip


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_nemo_rl_default_kl_checked_as_unweighted_names_score_function(estimator):
    @hunt
    @given(kl_batches())
    def run(batch):
        check_kl_penalty(fw.nemo_rl_default(estimator), batch, estimator=estimator,
                         input_clamp=20.0, output_clamp=10.0)  # fmt: skip

    with finds("kl.gradient") as caught:
        run()
    assert "pass score_function=True" in str(caught.value)


def test_finds_the_score_function_term_dropped():
    # exp(logp - logp).detach(): value 1, no gradient: the score-function term is lost.
    def fn(log_prob, ref_log_prob):
        return fw.nemo_rl("k3")(log_prob, ref_log_prob, torch.exp(log_prob - log_prob).detach())

    with finds("kl.gradient"):
        hunt_kl(fn, "k3", input_clamp=20.0, output_clamp=10.0, score_function=True)()


def test_score_function_takes_no_weights():
    with pytest.raises(ValueError, match="score_function=True"):
        check_kl_penalty(fw.nemo_rl_default("k1"), spike_batch(-2.0, -1.0), estimator="k1",
                         weights="is_weights", score_function=True)  # fmt: skip


# --------------------------------------------------------------------------- padding


def with_batches(configs, **options):
    """``(config, batch)``: one of ``configs`` and a ``kl_batches(**options)`` that fits it."""
    return st.sampled_from(configs).flatmap(
        lambda config: kl_batches(**options, **config.batches).map(lambda b: (config, b))
    )


@passes_settings(150)
@given(with_batches(fw.UNCLAMPED_K3, dtype=DTYPES))
def test_unclamped_k3_at_every_position_passes_on_the_padding_models_leave(drawn):
    # slime, AReaL and NeMo-RL without clamps, TRL: exp of the log ratio at every position,
    # masked afterwards. Padding log-probs are a model's (finite, ≤ 0): so is their exp.
    config, batch = drawn
    check_kl_penalty(config.fn, batch, estimator="k3", **config.check)


def test_unclamped_k3_is_flagged_on_extreme_garbage():
    # The opt-in garbage (positive "log-probs" of thousands) overflows exp before the mask.
    @hunt
    @given(with_batches(fw.UNCLAMPED_K3, garbage="extreme"))
    def run(drawn):
        config, batch = drawn
        check_kl_penalty(config.fn, batch, estimator="k3", **config.check)

    with finds("kl.finite") as caught:
        run()
    assert "exp of unmasked padding" in str(caught.value)


def kl_loss(masked_sum):
    """A KL term as TRL adds it to the loss: exact k3 at every position, then
    ``masked_sum(kl, mask)`` over the batch, divided by the number of valid tokens."""

    def loss_fn(batch, *, global_tokens, global_seqs):
        kl = fw.trl_inline()(batch["log_probs"], batch["ref_log_probs"])
        mask = batch["response_mask"].to(kl.dtype)
        return masked_sum(kl, mask) / global_tokens

    return loss_fn


@passes
@given(kl_batches(dtype=DTYPES))
def test_kl_term_masked_after_exp_is_padding_invariant(batch):
    check_padding_invariance(kl_loss(lambda kl, mask: (kl * mask).sum()), batch)


@pytest.mark.parametrize(
    "masked_sum",
    [
        pytest.param(lambda kl, mask: kl.sum(), id="padding-in-the-sum"),
        pytest.param(lambda kl, mask: (kl * mask.roll(1, dims=-1)).sum(), id="mask-shifted"),
    ],
)
def test_masking_bugs_are_caught_on_realistic_padding(masked_sum):
    @hunt
    @given(kl_batches())
    def run(batch):
        check_padding_invariance(kl_loss(masked_sum), batch)

    with finds("padding_invariance"):
        run()
