"""The precision a golden test runs in and the float64 oracle's bound: names, dtypes, the
autocast context, the float64 cast of a rollout, and the resolver's certify mode."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pytest_rollout_golden._internal.golden import precision
from pytest_rollout_golden._internal.tolerance.families import CERTIFY, CERTIFY_SOURCE
from pytest_rollout_golden._internal.tolerance.spec import EXACT_VALUES, IGNORE, Layer, Tolerance
from pytest_rollout_golden._internal.tolerance.stack import Stack


@pytest.mark.parametrize(
    ("declared", "name", "weights", "compute"),
    [
        ("", "float32", torch.float32, torch.float32),
        ("bfloat16", "bf16", torch.float32, torch.bfloat16),
        ("float64", "float64", torch.float64, torch.float64),
    ],
)
def test_a_precision_names_its_dtypes(declared, name, weights, compute):
    assert precision.canonical(declared) == name
    assert precision.weight_dtype(declared) == weights
    assert precision.compute_dtype(declared) == compute


def test_autocast_lowers_only_bf16_and_the_oracle_is_never_lowered():
    x = torch.ones(2, 2)
    with precision.autocast("bf16"):
        assert (x @ x).dtype == torch.bfloat16
    with torch.autocast("cpu", dtype=torch.bfloat16), precision.autocast("float64"):
        assert (x @ x).dtype == torch.float32


def test_the_default_dtype_is_float64_while_certifying_and_restored_after():
    with precision.default_dtype("float64"):
        assert torch.get_default_dtype() == torch.float64
        with precision.default_dtype("bf16"):
            assert torch.get_default_dtype() == torch.float64
    assert torch.get_default_dtype() == torch.float32


def test_a_rollout_is_cast_to_float64_exactly_and_integers_stay():
    batch = {
        "lp": torch.tensor([-0.1, -2.5], dtype=torch.bfloat16),
        "ids": torch.tensor([1, 2]),
        "np": np.array([0.5], dtype=np.float32),
        "rows": [torch.tensor([1.0 / 3.0])],
        "text": "kept",
    }
    cast = precision.as_float64(batch)
    assert cast["lp"].dtype == torch.float64 and cast["lp"].tolist() == batch["lp"].tolist()
    assert cast["ids"].dtype == torch.int64
    assert cast["np"].dtype == np.float64 and cast["rows"][0].dtype == torch.float64
    assert cast["rows"][0].item() == batch["rows"][0].item()  # exact
    assert cast["text"] == "kept"


def test_certify_replaces_every_floating_tolerance_but_keeps_exclusions_and_integers():
    marker = Layer("marker", {"loss": Tolerance(rtol=0.5, atol=1.0), "clip": IGNORE})
    resolver = Stack(marker=[marker], certify=True).resolver()
    assert resolver.resolve("loss", ("float32",)) == (CERTIFY, CERTIFY_SOURCE)
    assert resolver.resolve("clip", ("float32",))[0] == IGNORE
    assert resolver.resolve("count", ("int64",))[0] == EXACT_VALUES
    assert Stack(marker=[marker]).resolver().resolve("loss")[0].rtol == 0.5


def test_a_value_checked_below_float64_in_the_oracle_is_named():
    (note,) = precision.lower_precision_note({"loss": "float32", "n": "int64", "g": "float64"})
    assert note.startswith("checked below float64 in the float64 oracle: loss (float32);")
    assert precision.lower_precision_note({"g": "float64"}) == []


def test_the_oracle_lane_is_not_a_lane_a_user_can_name():
    from pytest_rollout_golden._internal.golden.lanes import lane_problem

    assert "--golden-certify" in lane_problem("float64-oracle")
    assert lane_problem("float64") is None


def test_a_certificate_gives_a_certified_variants_distance_in_units_of_the_bound():
    """A certified variant that is not bit-equal is "within x the bound", not "identical"
    (a passing comparison's ``excess`` is 0 whatever its distance)."""
    from pytest_rollout_golden._internal.results import Comparison, Verdict
    from pytest_rollout_golden._internal.tolerance.calibration import certificate

    def compared(name, expected, actual):
        diff = abs(actual - expected)
        return Comparison(
            name,
            0,
            Verdict.PASS,
            expected=expected,
            actual=actual,
            abs_diff=diff,
            tolerance=CERTIFY,
            excess=0.0,
            scale=abs(expected),
        )

    found = certificate([compared("loss", 2.0, 2.0), compared("grad_norm", 2.0, 2.0 + 4e-8)])
    assert found == {"verdict": "certified", "largest": pytest.approx(4e-8 / (1e-12 + 2e-6))}
    assert certificate([compared("loss", 2.0, 2.0)]) == {"verdict": "certified", "largest": 0.0}
