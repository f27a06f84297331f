"""Train–inference mismatch metrics: formulas against a plain-Python float64 oracle and the
frameworks' own code (transcribed), padding that never leaks, masks of every dtype, the
trainer-side log probs under a temperature, the bounds grammar, and the checker against
deliberately broken implementations."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from pytest_rollout_golden import mismatch
from pytest_rollout_golden._internal.tolerance.mismatch_bounds import (
    DEFAULT_BOUNDS,
    METRIC_NAMES,
    Bound,
    layer,
    parse_spec,
    resolve,
    session_bounds,
)
from pytest_rollout_golden.invariants import check_mismatch_metrics
from pytest_rollout_golden.strategies import rollout_batches

# --------------------------------------------------------------------------- oracle


def oracle(train, rollout, mask, c=2.0):
    """Every metric from Python floats, token by token (no torch reductions)."""
    rows = []
    for b in range(len(mask)):
        d = [float(train[b][t]) - float(rollout[b][t]) for t in range(len(mask[b])) if mask[b][t]]
        lp = [float(train[b][t]) for t in range(len(mask[b])) if mask[b][t]]
        rp = [float(rollout[b][t]) for t in range(len(mask[b])) if mask[b][t]]
        if d:
            rows.append((d, lp, rp))
    tokens = [x for d, _, _ in rows for x in d]
    n = len(tokens)

    def mean(values):
        values = list(values)
        return math.fsum(values) / len(values) if values else 0.0

    def k3(x):
        return math.expm1(x) - x

    def clamp(x):
        return max(-20.0, min(20.0, x))

    diffs = [mean(rp) - mean(lp) for _, lp, rp in rows]
    return {
        "token_mult_prob_error": mean(math.exp(abs(x)) for x in tokens),
        "abs_logprob_diff_mean": mean(abs(x) for x in tokens),
        "abs_logprob_diff_max": max((abs(x) for x in tokens), default=0.0),
        "abs_logprob_diff_seq_mean": mean(mean(abs(x) for x in d) for d, _, _ in rows),
        "k1_kl": mean(-x for x in tokens),
        "k3_kl": mean(k3(clamp(x)) for x in tokens),
        "gen_kl_error": mean(k3(x) for x in tokens),
        "policy_kl_error": mean(k3(-x) for x in tokens),
        "log_ppl_diff": mean(diffs),
        "log_ppl_abs_diff": mean(abs(x) for x in diffs),
        "ppl_ratio": mean(math.exp(x) for x in diffs),
        "chi2_token": mean(math.exp(2 * clamp(x)) for x in tokens) - 1.0 if n else 0.0,
        "seq_abs_logprob_diff_max": max((mean(abs(x) for x in d) for d, _, _ in rows), default=0),
        "seq_k3_kl_max": max((mean(k3(x) for x in d) for d, _, _ in rows), default=0.0),
        "seq_token_mult_prob_error_max": max(
            (mean(math.exp(abs(x)) for x in d) for d, _, _ in rows), default=0.0
        ),
        "ratio_outside_fraction": mean(1.0 if abs(x) > math.log(c) else 0.0 for x in tokens),
    }


def as_lists(batch):
    valid = batch["response_mask"] != 0
    return (
        batch["old_log_probs"].double().tolist(),
        batch["rollout_log_probs"].double().tolist(),
        valid.tolist(),
    )


@settings(max_examples=150, deadline=None)
@given(rollout_batches(dtype=[torch.float64, torch.float32]))
def test_every_metric_matches_the_float64_oracle_on_batches_with_garbage_padding(batch):
    got = mismatch.metrics(
        batch["old_log_probs"], batch["rollout_log_probs"], batch["response_mask"]
    )
    want = oracle(*as_lists(batch))
    assert list(got) == list(METRIC_NAMES)
    for name in METRIC_NAMES:
        # float64 sums of up to 72 terms as large as exp(50) (the 25-nat spikes): 1e-12 rel
        assert got[name] == pytest.approx(want[name], rel=1e-12, abs=1e-14), name


def nemo_rl(gen, train, mask):
    """NeMo-RL's ClippedPGLossFn metrics, transcribed (calculate_kl k3 without clamps)."""
    mask = mask.to(gen.dtype)

    def masked_mean(values, m):
        return torch.sum(values * m) / (torch.sum(m) + 1e-8)

    def calculate_kl(logprobs, logprobs_reference):
        logr = logprobs_reference - logprobs
        return torch.exp(logr) - 1 - logr

    gen, train = torch.where(mask.bool(), gen, 0.0), torch.where(mask.bool(), train, 0.0)
    return {
        "token_mult_prob_error": masked_mean(torch.exp(torch.abs(gen - train) * mask), mask),
        "gen_kl_error": masked_mean(calculate_kl(gen, train), mask),
        "policy_kl_error": masked_mean(calculate_kl(train, gen), mask),
    }


@settings(max_examples=60, deadline=None)
@given(rollout_batches(dtype=torch.float64, extreme_ratios=False))
def test_the_nemo_rl_metrics_are_those_of_its_code(batch):
    train, gen, mask = batch["old_log_probs"], batch["rollout_log_probs"], batch["response_mask"]
    ours = mismatch.metrics(train, gen, mask)
    theirs = nemo_rl(gen, train, mask)
    for name, value in theirs.items():
        # NeMo-RL divides by (count + 1e-8): 1e-8 relative at one valid token
        assert ours[name] == pytest.approx(float(value), rel=2e-8), name


def prime_rl(trainer_logprobs, inference_logprobs, loss_mask):
    """Prime-RL's mismatch KL, transcribed (prime_rl/trainer/rl/loss.py, token_mismatch_kl)."""
    loss_mask = loss_mask.bool()
    log_importance_ratio = trainer_logprobs - inference_logprobs
    token_mismatch_kl = torch.exp(log_importance_ratio) - log_importance_ratio - 1
    return token_mismatch_kl[loss_mask].sum() / torch.clamp_min(loss_mask.sum(), 1)


@settings(max_examples=60, deadline=None)
@given(rollout_batches(dtype=torch.float64))
def test_gen_kl_error_is_prime_rl_s_mismatch_kl(batch):
    train, engine, mask = batch["old_log_probs"], batch["rollout_log_probs"], batch["response_mask"]
    ours = mismatch.metrics(train, engine, mask)["gen_kl_error"]
    assert ours == pytest.approx(float(prime_rl(train, engine, mask)), rel=1e-12)


def test_the_sign_convention_is_prime_rl_s_r_minus_log_r_minus_1():
    # trainer log prob -1, engine -2: r = pi_train / pi_engine = e, d = log r = 1
    one = mismatch.metrics(torch.tensor([[-1.0]]), torch.tensor([[-2.0]]), torch.tensor([[1]]))
    r = math.e
    assert one["gen_kl_error"] == pytest.approx(r - math.log(r) - 1, rel=1e-15)
    assert one["k3_kl"] == one["gen_kl_error"]
    assert one["policy_kl_error"] == pytest.approx(1 / r - math.log(1 / r) - 1, rel=1e-15)
    assert one["k1_kl"] == -1.0  # verl rollout_corr/kl = mean(rollout - old)
    assert one["log_ppl_diff"] == -1.0  # rollout log ppl (2) - training log ppl (1)... signed
    assert one["token_mult_prob_error"] == pytest.approx(r)
    assert one["ratio_outside_fraction"] == 1.0  # e > 2


def test_k3_kl_is_gen_kl_error_with_verl_s_clamp():
    got = mismatch.metrics(torch.tensor([[-30.0]]), torch.tensor([[-1.0]]), torch.tensor([[True]]))
    assert got["gen_kl_error"] == pytest.approx(math.expm1(-29.0) + 29.0)
    assert got["k3_kl"] == pytest.approx(math.expm1(-20.0) + 20.0)


@pytest.mark.parametrize("fill", [math.inf, -math.inf, math.nan, 1e30])
@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.int64, torch.float32])
def test_padding_never_leaks_and_every_mask_dtype_agrees(fill, mask_dtype):
    train = torch.tensor([[-1.0, -0.5, fill], [-2.0, fill, fill]])
    rollout = torch.tensor([[-1.1, -0.4, -fill], [-2.3, 0.0, fill]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]]).to(mask_dtype)
    got = mismatch.metrics(train, rollout, mask)
    clean = mismatch.metrics(train.nan_to_num(0, 0, 0), rollout.nan_to_num(0, 0, 0), mask != 0)
    assert got == clean
    assert all(math.isfinite(v) for v in got.values())


def test_a_non_finite_valid_token_shows_instead_of_vanishing():
    got = mismatch.metrics(
        torch.tensor([[-1.0, -math.inf]]), torch.tensor([[-1.0, -2.0]]), torch.tensor([[1, 1]])
    )
    assert got["abs_logprob_diff_max"] == math.inf
    assert not DEFAULT_BOUNDS["gen_kl_error"].holds(got["gen_kl_error"])
    nan = mismatch.metrics(torch.tensor([[math.nan]]), torch.tensor([[-1.0]]), torch.tensor([[1]]))
    assert not DEFAULT_BOUNDS["token_mult_prob_error"].holds(nan["token_mult_prob_error"])


def test_an_empty_mask_gives_zeros_and_shapes_must_agree():
    empty = mismatch.metrics(
        torch.zeros(2, 3), torch.ones(2, 3), torch.zeros(2, 3, dtype=torch.bool)
    )
    assert set(empty.values()) == {0.0}
    with pytest.raises(ValueError, match="one shape"):
        mismatch.metrics(torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3))
    with pytest.raises(ValueError, match="ratio_bound"):
        mismatch.metrics(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), ratio_bound=1.0)


def test_locate_names_the_worst_sequences_and_tokens():
    train = torch.tensor([[-1.0, -1.0, 9.0], [-1.0, -4.0, -1.0]])
    rollout = torch.tensor([[-1.1, -1.0, 0.0], [-1.0, -1.0, -1.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    where = mismatch.locate(train, rollout, mask, count=2)
    assert [b for b, _, _ in where.sequences] == [1, 0]
    assert where.sequences[0] == (1, pytest.approx(1.0), 3)
    assert where.tokens[0] == (1, 1, -4.0, -1.0, -3.0)
    assert where.tokens[1][:2] == (0, 0)


# --------------------------------------------------------------------------- temperature


def test_trainer_log_probs_at_the_engine_temperature_show_no_mismatch():
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 11, dtype=torch.float64) * 3
    temperature = 0.6
    engine_lp = torch.log_softmax(logits / temperature, dim=-1)
    tokens = torch.distributions.Categorical(logits=logits / temperature).sample()
    rollout = engine_lp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    mask = torch.ones(3, 5, dtype=torch.bool)
    same = mismatch.sampled_log_probs(logits, tokens, temperature=temperature)
    assert mismatch.metrics(same, rollout, mask)["abs_logprob_diff_max"] < 1e-12
    raw = mismatch.sampled_log_probs(logits, tokens)  # temperature applied on one side only
    assert mismatch.metrics(raw, rollout, mask)["abs_logprob_diff_mean"] > 0.1
    assert same.dtype == torch.float64
    assert mismatch.sampled_log_probs(logits.bfloat16(), tokens).dtype == torch.float32
    with pytest.raises(ValueError, match="temperature"):
        mismatch.sampled_log_probs(logits, tokens, temperature=0.0)
    with pytest.raises(ValueError, match="vocab"):
        mismatch.sampled_log_probs(logits, tokens[:, :3])


# --------------------------------------------------------------------------- bounds


def test_bound_specs_parse_and_name_their_mistakes():
    assert parse_spec("gen_kl_error<=0.001", "cli") == ("gen_kl_error", 0.001)
    assert parse_spec(" mismatch/k3_kl <= inf ", "cli") == ("k3_kl", math.inf)
    with pytest.raises(ValueError, match=r"METRIC<=VALUE"):
        parse_spec("gen_kl_error=0.001", "ini golden_mismatch_bounds")
    with pytest.raises(ValueError, match=r"did you mean 'gen_kl_error'"):
        parse_spec("gen_kl_eror<=1", "--golden-mismatch-bound")
    with pytest.raises(ValueError, match="not a number"):
        parse_spec("k3_kl<=small", "x")
    with pytest.raises(ValueError, match="NaN"):
        layer({"k3_kl": float("nan")}, "marker")
    with pytest.raises(ValueError, match="a bound must be a number"):
        layer({"k3_kl": True}, "marker")
    with pytest.raises(ValueError, match="must be a dict"):
        session_bounds(["k3_kl<=1"], [], [])  # type: ignore[arg-type]


def test_layers_stack_marker_over_cli_over_ini_over_defaults_and_inf_switches_one_off():
    bounds = session_bounds(
        {"k3_kl": 0.5},
        ["k3_kl<=0.2", "gen_kl_error<=0.02"],
        ["gen_kl_error<=0.01", "chi2_token<=1", "# a comment", "token_mult_prob_error<=inf"],
    )
    assert bounds["k3_kl"] == Bound(0.5, "@pytest.mark.golden(mismatch_bounds=)")
    assert bounds["gen_kl_error"] == Bound(0.02, "--golden-mismatch-bound")
    assert bounds["chi2_token"] == Bound(1.0, "ini golden_mismatch_bounds")
    assert bounds["token_mult_prob_error"] == Bound(math.inf, "ini golden_mismatch_bounds")
    assert bounds["token_mult_prob_error"].off and bounds["token_mult_prob_error"].holds(1e300)
    assert bounds["abs_logprob_diff_mean"] == DEFAULT_BOUNDS["abs_logprob_diff_mean"]
    called = resolve(layer({"k3_kl": math.inf}, "call"), base=bounds)
    assert {name for name, bound in called.items() if bound.off} == {
        "k3_kl",
        "token_mult_prob_error",
    }
    assert all(source.value > 0 and source.source for source in DEFAULT_BOUNDS.values())
    assert set(DEFAULT_BOUNDS) <= set(METRIC_NAMES)


# --------------------------------------------------------------------------- the checker


def masked_mean(values, mask, dim=None):
    """NeMo-RL / verl style: sum(values * mask) / (count + 1e-8), padding zeroed first."""
    m = mask.to(values.dtype)
    values = torch.where(mask != 0, values, torch.zeros_like(values))
    if dim is None:
        return (values * m).sum() / (m.sum() + 1e-8)
    return (values * m).sum(dim) / (m.sum(dim) + 1e-8)


def correct(train, rollout, mask):
    """A user's own implementation, in the inputs' dtype, written independently."""
    d = torch.where(mask != 0, train - rollout, torch.zeros_like(train))
    rows = (mask != 0).any(-1)
    return {
        "train/token_mult_prob_error": masked_mean(torch.exp(d.abs()), mask),
        "train/gen_kl_error": masked_mean(torch.exp(d) - 1 - d, mask),
        "train/policy_kl_error": masked_mean(torch.exp(-d) - 1 + d, mask),
        "mismatch_kl": masked_mean(torch.exp(d) - d - 1, mask),
        "train_rollout_logprob_abs_diff": masked_mean(d.abs(), mask, dim=-1)[rows].mean(),
        "abs_logprob_diff_mean": masked_mean(d.abs(), mask),
    }


@settings(max_examples=80, deadline=None)
@given(rollout_batches(dtype=[torch.float64, torch.float32], extreme_ratios=False))
def test_the_checker_accepts_a_correct_implementation_in_float32_and_float64(batch):
    check_mismatch_metrics(correct, batch)


def batch_of(*, rows=((1, 1, 1, 0), (1, 0, 0, 0)), dtype=torch.float64):
    mask = torch.tensor(rows, dtype=torch.int64)
    train = torch.tensor([[-1.0, -0.2, -3.0, 55.0], [-0.7, 1e3, -8.0, 4.0]], dtype=dtype)
    rollout = torch.tensor([[-1.5, -0.1, -2.0, -9.0], [-0.4, -3.0, 7.0, 2.0]], dtype=dtype)
    return {"old_log_probs": train, "rollout_log_probs": rollout, "response_mask": mask}


def padding_leak(train, rollout, mask):
    return {"abs_logprob_diff_mean": (train - rollout).abs().mean()}


def reverse_kl(train, rollout, mask):  # gen and train swapped: KL(P_train || P_gen)
    d = torch.where(mask != 0, train - rollout, 0.0)
    return {"gen_kl_error": masked_mean(torch.exp(-d) - 1 + d, mask)}


def multiply_by_mask(train, rollout, mask):  # NaN * 0 is NaN
    m = mask.to(train.dtype)
    return {"token_mult_prob_error": (torch.exp((train - rollout).abs() * m) * m).sum() / m.sum()}


def exp_of_mean(train, rollout, mask):
    d = torch.where(mask != 0, train - rollout, 0.0)
    return {"token_mult_prob_error": torch.exp(masked_mean(d.abs(), mask))}


def token_mean_for_slime(train, rollout, mask):  # slime averages per sample first
    d = torch.where(mask != 0, train - rollout, 0.0)
    return {"train_rollout_logprob_abs_diff": masked_mean(d.abs(), mask)}


def index_with_the_mask(train, rollout, mask):  # an int mask indexes rows 0 and 1
    return {"abs_logprob_diff_max": (train - rollout)[mask].abs().max()}


@pytest.mark.parametrize(
    ("fn", "invariant"),
    [
        (padding_leak, "mismatch.reference_agreement"),
        (reverse_kl, "mismatch.reference_agreement"),
        (exp_of_mean, "mismatch.reference_agreement"),
        (token_mean_for_slime, "mismatch.reference_agreement"),
        (multiply_by_mask, "mismatch.nonfinite_padding"),
        (index_with_the_mask, "mismatch.reference_agreement"),
    ],
)
def test_the_checker_catches_each_broken_implementation(fn, invariant):
    with pytest.raises(AssertionError, match=rf"^\[{invariant}\]"):
        check_mismatch_metrics(fn, batch_of())


def test_the_checker_catches_padding_that_leaks_only_when_it_changes():
    def leaks_via_garbage(train, rollout, mask):
        d = torch.where(mask != 0, train - rollout, 0.0)
        value = masked_mean(d.abs(), mask) + 0 * (train - rollout)[mask == 0].sum()
        return {"abs_logprob_diff_mean": value + 1e-3 * train[mask == 0].abs().max().tanh()}

    with pytest.raises(AssertionError, match=r"\[mismatch\.(padding_independence|reference)"):
        check_mismatch_metrics(leaks_via_garbage, batch_of())


def test_the_checker_catches_a_mask_dtype_bug_and_unknown_names():
    def bool_only(train, rollout, mask):
        d = (train - rollout).abs()
        if mask.dtype == torch.bool:
            return {"abs_logprob_diff_mean": d[mask].mean()}
        return {"abs_logprob_diff_mean": d.mean()}

    batch = batch_of()
    batch["response_mask"] = batch["response_mask"].bool()
    with pytest.raises(AssertionError, match=r"^\[mismatch\.mask_dtype\]"):
        check_mismatch_metrics(bool_only, batch)
    with pytest.raises(AssertionError, match=r"^\[mismatch\.names\]"):
        check_mismatch_metrics(lambda *a: {"loss": 1.0}, batch_of())
    check_mismatch_metrics(
        lambda t, r, m: {"my_mult": correct(t, r, m)["train/token_mult_prob_error"]},
        batch_of(),
        names={"my_mult": "token_mult_prob_error"},
    )


@given(st.data())
@settings(max_examples=30, deadline=None)
def test_the_checker_catches_a_padding_leak_on_generated_batches(data):
    batch = data.draw(rollout_batches(dtype=torch.float64, allow_empty_rows=False))
    valid = batch["response_mask"] != 0
    if bool(valid.all()):
        return
    with pytest.raises(AssertionError, match=r"^\[mismatch\."):
        check_mismatch_metrics(padding_leak, batch)


def test_the_checker_refuses_a_batch_without_a_valid_token():
    """Every metric of an empty mask is 0: checking it would pass any implementation."""
    batch = batch_of(rows=((0, 0, 0, 0), (0, 0, 0, 0)))
    with pytest.raises(ValueError, match=r"the mask selects none of the 8 positions"):
        check_mismatch_metrics(padding_leak, batch)
