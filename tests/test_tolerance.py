"""Unit tests of tolerance.py: Tolerance, parse_spec, Layer matching, Resolver order, defaults."""

from __future__ import annotations

import math

import pytest

from pytest_rollout_golden.compare import compare_values
from pytest_rollout_golden.tolerance import (
    EXACT,
    Layer,
    Resolver,
    Tolerance,
    builtin_layer,
    dtype_default,
    parse_spec,
)


@pytest.mark.parametrize(
    "fields",
    [{"rtol": -1e-3}, {"atol": -1.0}, {"rtol": math.nan}, {"atol": True}, {"rtol": "1e-3"}],
)
def test_tolerance_rejects_invalid_numbers(fields):
    with pytest.raises(ValueError, match="must be a number >= 0"):
        Tolerance(**fields)


def test_coerce_accepts_tolerances_and_dicts_only():
    tol = Tolerance(rtol=1e-3)
    assert Tolerance.coerce(tol) is tol
    assert Tolerance.coerce({"rtol": 1e-3, "equal_nan": True}) == Tolerance(1e-3, 0.0, True)
    with pytest.raises(ValueError, match=r"my layer: unknown field\(s\) \['rtl'\]"):
        Tolerance.coerce({"rtl": 1e-3}, what="my layer")
    with pytest.raises(TypeError, match="expected a Tolerance or a dict, got float"):
        Tolerance.coerce(1e-3)


def test_describe():
    assert Tolerance(rtol=3e-2, atol=1e-4).describe() == "rtol=0.03, atol=0.0001"
    assert "equal_nan" in Tolerance(equal_nan=True).describe()
    assert EXACT.describe() == "bit-exact"


@pytest.mark.parametrize(
    ("spec", "name", "tol"),
    [
        ("grad_norm:rtol=3e-2,atol=1e-4", "grad_norm", Tolerance(rtol=3e-2, atol=1e-4)),
        (" kl : rtol = 1e-3 ", "kl", Tolerance(rtol=1e-3)),
        ("actor/*:atol=1", "actor/*", Tolerance(atol=1.0)),
        ("x:rtol=0,equal_nan=true", "x", Tolerance(equal_nan=True)),
        ("x:exact=1", "x", Tolerance(exact=True)),
        ("ns:metric:rtol=1", "ns:metric", Tolerance(rtol=1.0)),
    ],
)
def test_parse_spec(spec, name, tol):
    assert parse_spec(spec) == (name, tol)


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ("grad_norm=1e-3", "expected METRIC:rtol=R,atol=A"),
        (":rtol=1", "expected METRIC"),
        ("x:", "expected METRIC"),
        ("x:rtol", "is not KEY=VALUE"),
        ("x:rtol=abc", "rtol must be a number"),
        ("x:rtol=-1", "must be a number >= 0"),
        ("x:equal_nan=maybe", "must be true or false"),
        ("x:tol=1", "unknown key 'tol'"),
    ],
)
def test_parse_spec_errors_name_the_spec(spec, problem):
    with pytest.raises(ValueError, match="bad tolerance") as info:
        parse_spec(spec)
    assert problem in str(info.value)


def test_layer_matches_exact_name_then_glob_then_last_component():
    exact, glob, base = Tolerance(rtol=1), Tolerance(rtol=2), Tolerance(rtol=3)
    layer = Layer("test", {"actor/pg_loss": exact, "actor/*": glob, "pg_loss": base})
    assert layer.match("actor/pg_loss") is exact
    assert layer.match("actor/kl") is glob
    assert layer.match("critic/pg_loss") is base
    assert layer.match("pg_loss") is base
    assert layer.match("critic/kl") is None
    assert layer.unused() == []


def test_layer_records_what_matched():
    layer = Layer("test", {"a": {"rtol": 1}, "b*": {"rtol": 1}, "never": {"rtol": 1}})
    layer.match("a")
    layer.match("bee")
    assert layer.unused() == ["never"]


def test_layer_rejects_bad_entries_naming_the_source():
    with pytest.raises(ValueError, match=r"@pytest\.mark\.golden 'kl'"):
        Layer("@pytest.mark.golden", {"kl": {"rtl": 1}})


def test_resolver_first_layer_wins_then_dtype_defaults():
    high = Layer("high", {"kl": Tolerance(rtol=1)})
    low = Layer("low", {"kl": Tolerance(rtol=2), "loss": Tolerance(rtol=3)})
    resolver = Resolver([high, low])
    assert resolver.resolve("kl") == (Tolerance(rtol=1), "high")
    assert resolver.resolve("loss") == (Tolerance(rtol=3), "low")
    assert resolver.resolve("other", ("float32",)) == (
        Tolerance(rtol=1.3e-6, atol=1e-5),
        "torch.testing default for float32",
    )
    assert low.unused() == [], "a shadowed entry still matched a metric"


def test_with_layer_puts_the_new_layer_first():
    base = Resolver([Layer("marker", {"kl": Tolerance(rtol=1)})])
    top = base.with_layer(Layer("check", {"kl": Tolerance(rtol=9)}))
    assert top.resolve("kl") == (Tolerance(rtol=9), "check")
    assert base.resolve("kl") == (Tolerance(rtol=1), "marker")


def test_exact_resolver_ignores_tolerances_but_notes_matches():
    layer = Layer("marker", {"kl": Tolerance(rtol=1)})
    assert Resolver([layer], exact=True).resolve("kl") == (EXACT, "exact lane")
    assert layer.unused() == []


@pytest.mark.parametrize(
    ("dtypes", "tol"),
    [
        (("float64",), Tolerance(rtol=1e-7, atol=1e-7)),
        (("float32", "bfloat16"), Tolerance(rtol=1.6e-2, atol=1e-5)),
        (("float16", "float32"), Tolerance(rtol=1e-3, atol=1e-5)),
        (("int64",), Tolerance()),
        (("bool", "int32"), Tolerance()),
    ],
)
def test_dtype_default_is_the_loosest_of_the_dtypes(dtypes, tol):
    assert dtype_default(dtypes)[0] == tol


@pytest.mark.parametrize(
    "name", ["pg_loss", "kl", "grad_norm", "actor/pg_loss", "actor/grad_norm", "critic/vf_loss"]
)
@pytest.mark.parametrize("value", [0.6931, 12.5, -0.013])
def test_builtin_defaults_fail_a_relative_change_of_1e_4_and_pass_rounding_noise(name, value):
    tol, source = Resolver([builtin_layer()]).resolve(name)
    assert source == "built-in default"
    assert not compare_values(value, value * (1 + 1e-4), tol, check_dtype=False).ok
    assert compare_values(value, value * (1 + 1e-7), tol, check_dtype=False).ok


def test_builtin_fraction_metrics_are_absolute():
    tol, _ = Resolver([builtin_layer()]).resolve("actor/pg_clipfrac")
    assert compare_values(0.0, 1e-8, tol, check_dtype=False).ok
    assert not compare_values(0.25, 0.25 + 1 / 512, tol, check_dtype=False).ok  # one token of 512


def test_layers_are_consulted_in_their_order_whatever_order_they_are_given_in():
    from pytest_rollout_golden.tolerance import CALIBRATED, CLI, MARKER

    cli = Layer("cli", {"kl": Tolerance(rtol=3e-1)}, order=CLI)
    calibrated = Layer("calibrated", {"kl": Tolerance(rtol=2e-1)}, order=CALIBRATED)
    marker = Layer("marker", {"kl": Tolerance(rtol=1e-1)}, order=MARKER)
    assert Resolver([cli, calibrated, builtin_layer()]).resolve("kl")[1] == "calibrated"
    resolver = Resolver([cli, builtin_layer()]).with_layer(calibrated)
    assert resolver.resolve("kl") == (Tolerance(rtol=2e-1), "calibrated")
    assert Resolver([calibrated, marker]).resolve("kl")[1] == "marker"
    check = Layer("check", {"kl": Tolerance(rtol=1e-2)})  # the default order: first of all
    assert resolver.with_layer(check).resolve("kl")[1] == "check"


def test_the_layout_lane_sits_below_the_marker_and_above_calibrated_tolerances():
    # A variant of parallel.variants() replays its reference layout's golden: the cross-layout
    # lane must beat the golden's calibrated (same-layout) spread, and the user's marker beats both.
    from pytest_rollout_golden.tolerance import CALIBRATED, LAYOUT, MARKER

    lane = Layer("layout lane", {"pg_loss": Tolerance(rtol=1e-4)}, order=LAYOUT)
    calibrated = Layer("calibrated", {"pg_loss": Tolerance(rtol=1e-7)}, order=CALIBRATED)
    marker = Layer("marker", {"pg_loss": Tolerance(rtol=1e-2)}, order=MARKER)
    assert Resolver([calibrated, lane, builtin_layer()]).resolve("pg_loss")[1] == "layout lane"
    assert Resolver([calibrated, lane, marker]).resolve("pg_loss")[1] == "marker"


def test_an_exclusion_in_any_layer_beats_every_tolerance_and_the_exact_lane():
    from pytest_rollout_golden.tolerance import IGNORE, INI, MARKER

    marker = Layer("marker", {"*": Tolerance(rtol=1e-4)}, order=MARKER)
    ini = Layer("ini", {"pg_clipfrac": IGNORE}, order=INI)
    resolver = Resolver([marker, ini, builtin_layer()], exact=True)
    assert resolver.resolve("pg_clipfrac") == (IGNORE, "ini")
    assert resolver.resolve("pg_loss")[1] == "exact lane"
    assert parse_spec("actor/*:ignore") == ("actor/*", IGNORE)
    assert IGNORE.describe() == "not compared"
