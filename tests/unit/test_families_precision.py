"""Declared training precision and centred losses in the built-in tolerances."""

from __future__ import annotations

import pytest

from pytest_rollout_golden._internal.pytest_plugin.options import session_tolerances
from pytest_rollout_golden._internal.tolerance.families import precision_layer


def _resolve(name: str, **session: str):
    stack = session_tolerances(
        [], [], [], [], session.get("profile", ""), session.get("precision", "")
    )
    return stack.resolver().resolve(name, ("float64",))


def test_bf16_loosens_grad_norm_only_and_names_its_source():
    tol, source = _resolve("actor/grad_norm", precision="bf16")
    assert (tol.rtol, tol.scale) == (2e-3, "recorded")
    assert source == "ini golden_precision = bf16"
    for name in ("pg_loss", "kl", "entropy", "log_probs"):
        assert _resolve(name, precision="bf16") == _resolve(name)
    assert _resolve("grad_norm", precision="float32") == _resolve("grad_norm")


def test_a_users_tolerance_wins_over_the_precision():
    stack = session_tolerances(["grad_norm:rtol=1e-4"], [], [], [], "", "bfloat16")
    tol, source = stack.resolver().resolve("grad_norm", ("float64",))
    assert tol.rtol == 1e-4 and source.startswith("rtol from --golden-tolerance")


def test_an_unknown_precision_is_refused_naming_the_known_ones():
    with pytest.raises(ValueError, match=r"ini golden_precision: unknown precision 'fp8'.*bf16"):
        precision_layer("fp8", "ini golden_precision")


def test_the_trl_profile_floors_loss_at_the_rounding_of_its_terms():
    tol, source = _resolve("loss", profile="trl")
    assert (tol.rtol, tol.atol, tol.scale) == (1e-4, 1e-6, "recorded")
    assert source == "golden_metric_profile = trl"
    assert _resolve("loss")[0].atol == 1e-8  # without the profile: the loss family's floor
