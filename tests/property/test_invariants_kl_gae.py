"""The KL-penalty and GAE checkers: the reference passes, broken implementations are caught."""

from __future__ import annotations

import pytest
import torch
from hunting import finds, hunt, passes as passes_settings
from hypothesis import given, strategies as st

from pytest_rollout_golden import reference as ref
from pytest_rollout_golden.invariants import check_gae, check_kl_penalty
from pytest_rollout_golden.reference.masking import as_bool_mask
from pytest_rollout_golden.strategies import kl_batches, value_batches

DTYPES = [torch.float64, torch.float32, torch.bfloat16]
ESTIMATORS = [*ref.KL_ESTIMATORS, *(name + "+" for name in ref.KL_ESTIMATORS)]

passes = passes_settings(80)


# --------------------------------------------------------------------------- KL


@passes
@given(kl_batches(dtype=DTYPES), st.sampled_from(ESTIMATORS))
def test_reference_kl_passes(batch, estimator):
    def fn(log_prob, ref_log_prob):
        return ref.kl_penalty(log_prob, ref_log_prob, estimator)

    check_kl_penalty(fn, batch, estimator=estimator)


@passes
@given(kl_batches(dtype=DTYPES, garbage={"advantages"}), st.sampled_from(ESTIMATORS))
def test_exact_k3_passes_without_garbage_in_log_probs(batch, estimator):
    # TRL exponentiates every position: fine, as long as padding log-probs are log-probs.
    def fn(log_prob, ref_log_prob):
        return ref.kl_penalty(log_prob, ref_log_prob, estimator, clamp=False)

    check_kl_penalty(fn, batch, estimator=estimator)


def trl_k3(log_prob, ref_log_prob):
    """TRL's GRPO: exact k3, no clamp."""
    return torch.exp(ref_log_prob - log_prob) - (ref_log_prob - log_prob) - 1


def test_exact_k3_passes_on_a_spike():
    batch = {
        "log_probs": torch.tensor([[-26.0, -1.0]], dtype=torch.float64),
        "ref_log_probs": torch.tensor([[-1.0, -1.5]], dtype=torch.float64),
        "response_mask": torch.tensor([[True, True]]),
    }
    check_kl_penalty(trl_k3, batch, estimator="k3")


def broken(estimator_fn, estimator, **options):
    @hunt
    @given(kl_batches(**options))
    def run(batch):
        check_kl_penalty(estimator_fn, batch, estimator=estimator)

    return run


def test_finds_k3_with_the_log_ratio_reversed():
    def fn(log_prob, ref_log_prob):
        return ref.kl_penalty(ref_log_prob, log_prob, "k3")

    with finds("kl.value"):
        broken(fn, "k3")()


def test_finds_k2_without_the_half():
    def fn(log_prob, ref_log_prob):
        return (log_prob - ref_log_prob).square()

    with finds("kl.value"):
        broken(fn, "k2")()


@pytest.mark.parametrize("estimator", ["k1+", "k3+", "abs+"])
def test_finds_plus_form_without_straight_through(estimator):
    def fn(log_prob, ref_log_prob):
        return ref.kl_penalty(log_prob, ref_log_prob, estimator[:-1])

    with finds("kl.gradient") as caught:
        broken(fn, estimator)()
    assert "k2's gradient" in str(caught.value)


def test_finds_plus_form_with_k2_value():
    def fn(log_prob, ref_log_prob):
        return ref.kl_penalty(log_prob, ref_log_prob, "k2")

    with finds("kl.value"):
        broken(fn, "k3+")()


def test_finds_k3_gradient_through_a_detached_exp():
    def fn(log_prob, ref_log_prob):
        d = ref_log_prob - log_prob
        return (torch.exp(d).detach() - d - 1).clamp(-10, 10)

    with finds("kl.gradient"):
        broken(fn, "k3")()


def test_finds_k3_exponentiating_padding_on_extreme_garbage():
    # Positive "log-probs" of thousands, which no model produces, overflow exp: opt-in only.
    with finds("kl.finite"):
        broken(trl_k3, "k3", garbage="extreme")()


# --------------------------------------------------------------------------- GAE


def reference_gae(gamma, lam, whiten=False):
    def fn(rewards, values, mask, last_values=None):
        return ref.gae_advantages(
            rewards, values, mask, gamma=gamma, lam=lam, last_values=last_values, whiten=whiten
        )

    return fn


def verl_style_gae(gamma, lam):
    """verl's loop (masked tokens skipped by mask arithmetic), without its whitening."""

    def fn(rewards, values, mask):
        m = as_bool_mask(mask).to(values.dtype)
        next_value = torch.zeros_like(values[:, 0])
        running = torch.zeros_like(values[:, 0])
        out = []
        for t in reversed(range(rewards.shape[-1])):
            delta = rewards[:, t] + gamma * next_value - values[:, t]
            candidate = delta + gamma * lam * running
            next_value = values[:, t] * m[:, t] + (1 - m[:, t]) * next_value
            running = candidate * m[:, t] + (1 - m[:, t]) * running
            out.append(running)
        advantages = torch.stack(out[::-1], dim=1)
        return advantages * m, (advantages + values) * m

    return fn


GAMMAS = st.sampled_from([1.0, 0.99, 0.5])
LAMS = st.sampled_from([1.0, 0.95, 0.25])


@passes
@given(value_batches(dtype=DTYPES, bootstrap=True), GAMMAS, LAMS, st.booleans())
def test_reference_gae_passes(batch, gamma, lam, whiten):
    check_gae(reference_gae(gamma, lam, whiten), batch, gamma=gamma, lam=lam, whiten=whiten)


@passes
@given(value_batches(dtype=DTYPES), GAMMAS, LAMS)
def test_verl_style_gae_passes(batch, gamma, lam):
    check_gae(verl_style_gae(gamma, lam), batch, gamma=gamma, lam=lam)


def hunt_gae(fn, **options):
    @hunt
    @given(value_batches(**options))
    def run(batch):
        check_gae(fn, batch, gamma=0.9, lam=0.5)

    return run


def test_finds_masked_tokens_treated_as_steps():
    def fn(rewards, values, mask):
        full = torch.ones_like(values, dtype=torch.bool)
        advantages, returns = ref.gae_advantages(rewards, values, full, gamma=0.9, lam=0.5)
        valid = as_bool_mask(mask)
        return advantages * valid, returns * valid

    with pytest.raises(AssertionError, match=r"\[gae\.(reference_agreement|padding_indep)"):
        hunt_gae(fn, padding="left")()


def test_finds_gamma_and_lambda_swapped():
    with finds("gae.reference_agreement"):
        hunt_gae(reference_gae(0.5, 0.9), garbage=False)()


def test_finds_returns_from_whitened_advantages():
    def fn(rewards, values, mask):
        advantages, _ = ref.gae_advantages(rewards, values, mask, gamma=0.9, lam=0.5, whiten=True)
        return advantages, ref.masked_fill_zero(advantages + values, mask)

    @hunt
    @given(value_batches())
    def run(batch):
        check_gae(fn, batch, gamma=0.9, lam=0.5, whiten=True)

    with finds("gae.returns"):
        run()


def test_finds_ignored_bootstrap():
    def fn(rewards, values, mask, last_values):
        return ref.gae_advantages(rewards, values, mask, gamma=0.9, lam=0.5)

    with finds("gae.reference_agreement"):
        hunt_gae(fn, bootstrap=True)()


def test_finds_next_value_read_from_padding():
    # The textbook loop over every position: after a right-padded row's last valid token it
    # bootstraps from the garbage value of the first padding position.
    def fn(rewards, values, mask):
        valid = as_bool_mask(mask)
        running = torch.zeros_like(values[:, 0])
        out = torch.zeros_like(values)
        for t in reversed(range(values.shape[-1])):
            nxt = values[:, t + 1] if t + 1 < values.shape[-1] else torch.zeros_like(running)
            delta = rewards[:, t] + 0.9 * nxt - values[:, t]
            running = torch.where(valid[:, t], delta + 0.45 * running, torch.zeros_like(running))
            out[:, t] = running
        return out, (out + values) * valid

    with pytest.raises(AssertionError, match=r"\[gae\.(reference_agreement|padding_indep)"):
        hunt_gae(fn, padding="right", holes=False)()
