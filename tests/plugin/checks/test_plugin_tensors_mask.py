"""``check_tensors(..., mask=)``: padding is stored but never compared (issue 10, item 6)."""

from __future__ import annotations

MASKED = """
import torch


def test_forward(golden, values):
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])  # right-padded responses
    lp = torch.tensor([[-0.5, -1.0, -1.5, 0.0], [-0.25, -0.75, 0.0, 0.0]])
    lp = torch.where(mask.bool(), lp, torch.tensor(values.get("pad", 0.0)))
    if values.get("drift"):
        lp[1, 1] += values["drift"]
    logits = lp[..., None].expand(2, 4, 3).clone()
    golden.check_tensors(
        "actor",
        {"log_probs": lp, "logits": logits},
        mask=mask if values.get("masked", True) else None,
    )
"""


def test_padding_garbage_passes_with_a_mask_and_fails_without(project):
    project.write(MASKED)
    project.set_values(pad=123.0)
    project.run().assert_outcomes(passed=1)
    stored = project.golden_files()

    project.set_values(pad=-7.5)  # other garbage on the padding
    project.run().assert_outcomes(passed=1)
    project.run("--golden-strict").assert_outcomes(passed=1)
    assert project.golden_files() == stored

    project.set_values(pad=-7.5, masked=False)
    result = project.run()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "tensor 'actor/log_probs' (step 0), allowed *:",
            "    Mismatched elements: 3 / 8 (37.5%)",
        ]
    )
    assert "mask applied" not in result.stdout.str()

    project.set_values(pad=-7.5, drift=0.5)  # a real drift on a valid position still fails
    result = project.run()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "tensor 'actor/log_probs' (step 0), allowed *:",
            "    mask applied: 5 of 8 positions compared, padding ignored",
            "    Mismatched elements: 1 / 5 (20.0%)",
            "    Greatest absolute difference: 0.5 at index (1, 1)*",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "tensor 'actor/logits' (step 0), allowed *:",
            "    mask applied: 15 of 24 positions compared, padding ignored",
            "    Mismatched elements: 3 / 15 (20.0%)",
        ]
    )


def test_a_mask_that_does_not_fit_names_the_tensor_and_the_fix(project):
    project.write(
        """
import torch


def test_forward(golden, values):
    mask = torch.tensor(values["mask"])
    golden.check_tensors("actor", {"logits": torch.zeros(2, 4, 3)}, mask=mask)
"""
    )
    project.set_values(mask=[[1, 1, 0, 0, 0], [1, 0, 0, 0, 0]])
    result = project.run()
    result.assert_outcomes(failed=1)
    assert (  # not fnmatch: [batch, tokens] would be a character class
        "ValueError: check_tensors('actor', mask=): the mask's shape (2, 5) does not fit "
        "'logits' of shape (2, 4, 3): its dimensions must match the tensor's leading ones "
        "(or be 1), e.g. a [batch, tokens] response_mask for [batch, tokens, ...] tensors"
    ) in result.stdout.str()
    project.set_values(mask=[[[0.5]]])
    result = project.run()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["*ValueError: check_tensors('actor', mask=): the mask must be bool or hold only 0 and 1*"]
    )
    assert not project.golden.exists()


def test_compare_values_with_a_mask_ignores_nan_and_inf_on_padding_in_both_lanes():
    import torch

    from pytest_rollout_golden._internal.golden.messages import difference_detail
    from pytest_rollout_golden._internal.tolerance.compare import compare_values
    from pytest_rollout_golden._internal.tolerance.spec import Tolerance

    mask = torch.tensor([True, True, False])
    recorded = torch.tensor([1.0, 2.0, float("nan")])
    for padding in (float("-inf"), float("nan"), 3.0):
        replayed = torch.tensor([1.0, 2.0, padding])
        for tol in (Tolerance(1e-5, 1e-8), Tolerance(exact=True)):
            assert compare_values(recorded, replayed, tol, check_dtype=True, mask=mask).ok
            if not (tol.exact and padding != padding):  # the exact lane matches NaN with NaN
                assert not compare_values(recorded, replayed, tol, check_dtype=True).ok
    drifted = torch.tensor([1.0, 2.5, 0.0])
    diff = compare_values(recorded, drifted, Tolerance(exact=True), check_dtype=True, mask=mask)
    assert not diff.ok
    assert difference_detail(diff).splitlines()[:2] == [
        "mask applied: 2 of 3 positions compared, padding ignored",
        "Mismatched elements: 1 / 2 (50.0%)",
    ]


VACUOUS = """
import torch


def test_forward(golden, values):
    log_probs = torch.tensor([[-1.0, -2.0, -3.0], [-4.0, -5.0, -6.0]]) * values["scale"]
    mask = torch.tensor(values["mask"], dtype=torch.bool)
    golden.check_tensors("actor", {"log_probs": log_probs}, mask=mask)
"""


def test_a_mask_that_selects_nothing_fails_naming_the_tensor_and_the_counts(project):
    """A regression in the user's masking code must not turn the gate off silently."""
    project.write(VACUOUS)
    project.set_values(scale=1.0, mask=[[1, 1, 0], [1, 0, 0]])
    project.run().assert_outcomes(passed=1)
    project.set_values(scale=100.0, mask=[[0, 0, 0], [0, 0, 0]])
    result = project.run("--golden-strict")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "tensor 'actor/log_probs' (step 0), allowed *:",
            "    the mask selects none of the 6 positions: nothing was compared*",
        ]
    )
