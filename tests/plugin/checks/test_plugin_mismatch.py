"""golden.check_mismatch through pytest: record -> replay -> grow the mismatch -> fail against
the golden; an absolute bound fails even while recording (metric, bound, source, worst
sequences and tokens); the bound's layers (call, marker, --golden-mismatch-bound, ini)."""

from __future__ import annotations

import pytest

# The engine's log probs are the trainer's plus `shift` on valid tokens (row 1 gets `spike`
# at position 2); padding holds inf / NaN garbage that must never matter.
SOURCE = """
import math

import pytest
import torch


def batch(v):
    train = torch.tensor([[-1.0, -0.5, -2.0, -0.1], [-0.3, -1.2, -0.8, -0.6]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    rollout = train + v.get("shift", 0.0)
    rollout[1, 2] += v.get("spike", 0.0)
    train = torch.where(mask.bool(), train, torch.tensor(math.inf))
    rollout = torch.where(mask.bool(), rollout, torch.tensor(math.nan))
    return train, rollout, mask


MARKER = {}


@pytest.mark.golden(mismatch_bounds=MARKER or None)
def test_gate(golden, values):
    train, rollout, mask = batch(values)
    golden.check_mismatch(train, rollout, mask, step=0, bounds=values.get("call"))
"""


def write(project, marker=None):
    source = SOURCE if marker is None else SOURCE.replace("MARKER = {}", f"MARKER = {marker!r}")
    project.write(source)


def test_record_replay_then_a_grown_mismatch_fails_against_the_golden(project):
    write(project)
    project.set_values(shift=0.001)
    project.run().assert_outcomes(passed=1)
    recorded = project.metrics("test_gate")["0"]
    assert "mismatch/gen_kl_error" in recorded and "mismatch/ratio_outside_fraction" in recorded
    assert project.run().assert_outcomes(passed=1) is None
    project.set_values(shift=0.001 + 5e-6)  # a same-math change: float32 noise of 5e-6 nats
    project.run().assert_outcomes(passed=1)
    project.set_values(shift=0.004)  # still within every bound, but 4x the recorded mismatch
    result = project.run()
    result.assert_outcomes(failed=1)
    row = project.mismatch_row(result, "mismatch/abs_logprob_diff_mean")
    assert "rtol=0.0001, atol=2e-05" in row["allowed"]
    assert "built-in default" in row["allowed"]


def test_a_bound_fails_while_recording_naming_metric_bound_source_and_location(project):
    write(project)
    project.set_values(shift=0.001, spike=0.5)
    result = project.run()
    result.assert_outcomes(failed=1)
    text = result.stdout.str()
    assert (
        "train-inference mismatch beyond its bound at step 0: mismatch/token_mult_prob_error = "
        in text
    )
    assert "bound mismatch/token_mult_prob_error <= 1.05 (NeMo-RL CI:" in text
    assert "bound mismatch/gen_kl_error <= 0.002 (NeMo-RL CI" in text
    assert "bound mismatch/abs_logprob_diff_mean <= 0.0104 (SkyRL CI" in text
    assert "worst sequences (mean |log_probs - rollout_log_probs|): row 1: " in text
    assert "worst tokens: (row 1, position 2): trainer -0.8" in text
    assert "--update-golden does not lift it" in text
    assert "If the new values are right" not in text
    assert not (project.golden / "test_it").exists()  # nothing recorded
    project.run("--update-golden").assert_outcomes(failed=1)  # re-recording does not lift it
    assert not (project.golden / "test_it").exists()


@pytest.mark.parametrize(
    ("how", "args"),
    [
        ("marker", ()),
        ("call", ()),
        ("cli", ("--golden-mismatch-bound", "token_mult_prob_error<=inf")),
        ("ini", ()),
    ],
)
def test_each_layer_can_loosen_a_default_bound(project, how, args):
    loose = {"token_mult_prob_error": 2.0, "gen_kl_error": 1.0, "k3_kl": 1.0}
    loose.update(abs_logprob_diff_mean=1.0, abs_logprob_diff_seq_mean=1.0)
    write(project, loose if how == "marker" else None)
    values = {"shift": 0.001, "spike": 0.5}
    if how == "call":
        values["call"] = loose
    if how == "cli":
        args = ()
        for name, bound in loose.items():
            args += ("--golden-mismatch-bound", f"{name}<={bound}")
    if how == "ini":
        lines = "".join(f"\n    {name}<={bound}" for name, bound in loose.items())
        project.pytester.makeini(f"[pytest]\ngolden_mismatch_bounds ={lines}\n")
    project.set_values(**values)
    project.run(*args).assert_outcomes(passed=1)


def test_a_tighter_bound_names_its_source_and_the_marker_wins_over_the_flag(project):
    write(project, {"k1_kl": 0.5})
    project.set_values(shift=0.001)
    result = project.run("--golden-mismatch-bound", "abs_logprob_diff_max<=1e-4")
    result.assert_outcomes(failed=1)
    assert "bound mismatch/abs_logprob_diff_max <= 0.0001 (--golden-mismatch-bound)" in (
        result.stdout.str()
    )
    # k1_kl = mean(-d) = -0.001: beyond the flag's -1, within the marker's 0.5, which wins
    result = project.run("--golden-mismatch-bound", "k1_kl<=-1", "--update-golden")
    result.assert_outcomes(passed=1)


def test_bad_bounds_are_usage_errors_naming_the_source(project):
    write(project)
    project.set_values(shift=0.001)
    result = project.run("--golden-mismatch-bound", "gen_kl_eror<=1")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*--golden-mismatch-bound: 'gen_kl_eror' is not a mismatch metric (did you mean*"]
    )
    project.pytester.makeini("[pytest]\ngolden_mismatch_bounds =\n    k3_kl=0.1\n")
    result = project.run()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*ini golden_mismatch_bounds: 'k3_kl=0.1' is not of the form*"])


def test_an_unknown_marker_bound_fails_the_test_naming_it(project):
    write(project, {"kl3": 0.1})
    project.set_values(shift=0.001)
    result = project.run()
    assert "mismatch_bounds=): 'kl3' is not a mismatch metric" in result.stdout.str() + (
        result.stderr.str()
    )
    assert result.ret != 0


def test_a_mask_that_selects_no_token_fails_as_check_tensors_does(project):
    """Every metric of an empty mask is 0: a regression in the masking code must not pass."""
    project.write(SOURCE.replace("return train, rollout, mask", "return train, rollout, 0 * mask"))
    project.set_values(shift=0.5)  # every bound would fail, were a token compared
    for args in ((), ("--golden-strict",)):
        result = project.run(*args)
        result.assert_outcomes(failed=1)
        result.stdout.fnmatch_lines(
            [
                "*'mismatch/response_mask' (step 0)*",
                "    the mask selects none of the 8 positions: nothing was compared*",
            ]
        )
        assert not (project.golden / "test_it").exists()  # zeros are never recorded


@pytest.mark.parametrize("bound", ["-inf", "nan"])
def test_a_bound_of_minus_inf_or_nan_is_refused_naming_the_source(project, bound):
    write(project)
    project.set_values(shift=0.001)
    result = project.run("--golden-mismatch-bound", f"k3_kl<={bound}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [f"*--golden-mismatch-bound 'k3_kl<={bound}': *or inf, which switches the bound off"]
    )
    project.set_values(shift=0.001, call={"k3_kl": float(bound)})
    result = project.run()
    result.assert_outcomes(failed=1)
    assert "golden.check_mismatch(bounds=) 'k3_kl': " in result.stdout.str()


def test_a_bound_switched_off_with_inf_is_listed(project):
    write(project)
    project.set_values(shift=0.001, spike=0.5, call={"token_mult_prob_error": float("inf")})
    result = project.run(
        "--golden-mismatch-bound", "gen_kl_error<=inf", "--golden-mismatch-bound", "k3_kl<=inf"
    )
    result.assert_outcomes(failed=1)  # abs_logprob_diff_mean is still bounded
    out = result.stdout.str()
    assert "bound mismatch/token_mult_prob_error" not in out
    assert "bound mismatch/gen_kl_error" not in out
    assert (
        "mismatch/gen_kl_error<=inf, mismatch/k3_kl<=inf (step 0; --golden-mismatch-bound: "
        "bound switched off)" in out
    )
    assert (
        "mismatch/token_mult_prob_error<=inf (step 0; golden.check_mismatch(bounds=): "
        "bound switched off)" in out
    )
