"""Unit tests of tolerance.py: Tolerance, parse_spec, Layer matching, the Stack's order,
partial entries and where each field comes from, the usage tracker, defaults."""

from __future__ import annotations

import dataclasses
import math
import re

import pytest

from pytest_rollout_golden._internal.tolerance.compare import compare_values
from pytest_rollout_golden._internal.tolerance.spec import (
    EXACT,
    IGNORE,
    Layer,
    Tolerance,
    dtype_default,
    ignore_and_tolerance_layers,
    parse_spec,
)
from pytest_rollout_golden._internal.tolerance.stack import (
    ORDER,
    Resolver,
    Stack,
    ToleranceUsage,
    builtin_layer,
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
    assert [layer.key(n) for n in ("actor/pg_loss", "actor/kl", "critic/pg_loss")] == [
        "actor/pg_loss",
        "actor/*",
        "pg_loss",
    ]


def test_usage_records_what_matched():
    layer = Layer("test", {"a": {"rtol": 1}, "b*": {"rtol": 1}, "never": {"rtol": 1}})
    usage = ToleranceUsage()
    usage.note(Resolver([layer]), "a")
    usage.note(Resolver([layer]), "bee")
    assert usage.unused(layer) == ["never"]


def test_layer_rejects_bad_entries_naming_the_source():
    with pytest.raises(ValueError, match=r"@pytest\.mark\.golden 'kl'"):
        Layer("@pytest.mark.golden", {"kl": {"rtl": 1}})


def test_resolver_first_layer_wins_then_the_training_default():
    high = Layer("high", {"kl": Tolerance(rtol=1, atol=0)})
    low = Layer("low", {"kl": Tolerance(rtol=2, atol=0), "loss": Tolerance(rtol=3, atol=0)})
    resolver = Resolver([high, low])
    assert resolver.resolve("kl") == (Tolerance(rtol=1), "high")
    assert resolver.resolve("loss") == (Tolerance(rtol=3), "low")
    assert resolver.resolve("other", ("float32",)) == (
        Tolerance(rtol=1e-4, atol=1e-8, scale="recorded"),
        "built-in default for training values",
    )
    usage = ToleranceUsage()
    usage.note(resolver, "kl")
    assert usage.unused(low) == ["loss"], "a shadowed entry still matched a metric"


def test_resolving_is_pure_usage_is_noted_only_by_note():
    layer = Layer("marker", {"kl": Tolerance(rtol=1)})
    resolver = Stack(marker=[layer]).resolver()
    usage = ToleranceUsage()
    resolver.resolve("kl")
    assert usage.unused(layer) == ["kl"]
    usage.note(resolver, "actor/kl")
    assert usage.unused(layer) == []
    assert usage.unused(Layer("marker", {"kl": Tolerance(rtol=1)})) == ["kl"], (
        "usage is per layer object: another test's marker with the same entry is not used"
    )


def test_the_call_layer_comes_before_every_other():
    stack = Stack(marker=[Layer("marker", {"kl": Tolerance(rtol=1, atol=0)})])
    top = stack.resolver().above(Layer("check", {"kl": Tolerance(rtol=9, atol=0)}))
    assert top.resolve("kl") == (Tolerance(rtol=9), "check")
    assert stack.resolver().resolve("kl") == (Tolerance(rtol=1), "marker")
    assert Stack(exact=True).resolver().above(top.layers[0]).resolve("kl")[1] == "exact lane"
    assert top.without(top.layers[0]).resolve("kl") == (Tolerance(rtol=1), "marker")


def test_exact_resolver_ignores_tolerances_but_notes_matches():
    layer = Layer("marker", {"kl": Tolerance(rtol=1)})
    resolver = Stack(marker=[layer], exact=True).resolver()
    assert resolver.resolve("kl") == (EXACT, "exact lane")
    usage = ToleranceUsage()
    usage.note(resolver, "kl")
    assert usage.unused(layer) == []


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
def test_builtin_defaults_fail_a_relative_change_of_1e_3_and_pass_same_math_noise(name, value):
    """Same-math float32 changes move training metrics by up to ~4e-5 relative (verl's
    actor, docs/numerics.md); a bug moves them by 1e-3 and more."""
    tol, source = Resolver([builtin_layer()]).resolve(name)
    assert source == "built-in default"
    assert not compare_values(value, value * (1 + 1e-3), tol, check_dtype=False).ok
    assert compare_values(value, value * (1 + 4e-5), tol, check_dtype=False).ok


def test_builtin_fraction_metrics_are_absolute():
    tol, _ = Resolver([builtin_layer()]).resolve("actor/pg_clipfrac")
    assert compare_values(0.0, 1e-8, tol, check_dtype=False).ok
    assert not compare_values(0.25, 0.25 + 1 / 512, tol, check_dtype=False).ok  # one token of 512


def test_the_stack_order_explicit_tolerances_then_lanes_then_files_then_defaults():
    """Each layer, removed from the top in turn, hands the decision to the one below it."""
    roles = [
        "marker",
        "across_variants",
        "cli",
        "calibrated_layout",
        "layout",
        "calibrated",
        "ini",
        "profile",
    ]

    def layer(role):
        return Layer(role, {"pg_loss": Tolerance(rtol=roles.index(role) + 1.0, atol=0.0)})

    sequences = ("marker", "cli", "ini", "profile")
    parts = {role: [layer(role)] if role in sequences else layer(role) for role in roles}
    for i, role in enumerate(roles):
        resolver = Stack(**{r: parts[r] for r in roles[i:]}, variant=True).resolver()
        assert resolver.resolve("pg_loss") == (Tolerance(rtol=i + 1.0, atol=0.0), role)
    every = Stack(**{r: parts[r] for r in roles}, variant=True).resolver()
    call = Layer("call", {"pg_loss": Tolerance(rtol=0.5, atol=0.0)})
    assert every.above(call).resolve("pg_loss") == (Tolerance(rtol=0.5, atol=0.0), "call")
    assert Stack(across_variants=parts["across_variants"]).resolver().resolve("pg_loss")[1] == (
        "built-in default"
    ), "the not-comparable lane applies to variants only"
    assert Stack().resolver().resolve("pg_loss") == (
        Tolerance(rtol=1e-4, atol=1e-8, scale="recorded"),
        "built-in default",
    )
    assert Stack().resolver().resolve("unknown", ("bfloat16",))[1] == (
        "torch.testing default for bfloat16"
    )


def test_an_exclusion_in_any_layer_beats_every_tolerance_and_the_exact_lane():
    marker = Layer("marker", {"*": Tolerance(rtol=1e-4)})
    ini = Layer("ini", {"pg_clipfrac": IGNORE})
    resolver = Stack(marker=[marker], ini=[ini], exact=True).resolver()
    assert resolver.resolve("pg_clipfrac") == (IGNORE, "ini")
    assert resolver.resolve("pg_loss")[1] == "exact lane"
    assert parse_spec("actor/*:ignore") == ("actor/*", IGNORE)
    assert IGNORE.describe() == "not compared"


# ------------------------------------------------ partial entries: which field comes from where


@pytest.mark.parametrize(
    ("entry", "given"),
    [
        ({"rtol": 1e-3}, {"rtol"}),
        ({"atol": 0.0}, {"atol"}),
        ({"equal_nan": True}, {"equal_nan"}),
        ({"rtol": 1e-3, "atol": 0, "exact": False}, {"rtol", "atol"}),
        ({"exact": True}, {"rtol", "atol", "equal_nan", "scale"}),
        ({"ignore": True}, {"rtol", "atol", "equal_nan", "scale"}),
        ({"scale": "recorded"}, {"scale"}),
        ({}, set()),
    ],
)
def test_a_tolerance_records_which_fields_were_given(entry, given):
    assert Tolerance.coerce(entry).given == given
    assert Tolerance(**entry).given == given
    spec = ",".join(f"{k}={str(v).lower()}" for k, v in entry.items()) or "rtol=0"
    assert parse_spec(f"m:{spec}")[1].given == (given or {"rtol"})


def test_a_lone_rtol_takes_atol_from_the_next_layer_down():
    marker = Layer("@pytest.mark.golden(tolerances=)", {"pg_loss": {"rtol": 1e-3}})
    tol, source = Stack(marker=[marker]).resolver().resolve("actor/pg_loss")
    assert (tol.rtol, tol.atol) == (1e-3, 1e-8)  # atol of the built-in pg_loss default
    assert source == (
        "rtol from @pytest.mark.golden(tolerances=); atol and scale from built-in default"
    )


def test_each_field_comes_from_the_highest_layer_that_names_it():
    cli = Layer("--golden-tolerance", {"kl": {"atol": 1e-4}})
    ini = Layer("ini golden_tolerances", {"kl": {"equal_nan": True}, "*": {"rtol": 2e-2}})
    tol, source = Stack(cli=[cli], ini=[ini]).resolver().resolve("kl")
    # A layer answers with its best match only: ini's "kl" (equal_nan), not its "*" glob.
    assert tol == Tolerance(rtol=1e-4, atol=1e-4, equal_nan=True, scale="recorded")
    assert source == (
        "rtol and scale from built-in default; atol from --golden-tolerance; "
        "equal_nan from ini golden_tolerances"
    )


def test_an_entry_naming_only_equal_nan_keeps_the_numbers_of_the_layers_below():
    marker = Layer("marker", {"kl": {"equal_nan": True}})
    tol, source = Stack(marker=[marker]).resolver().resolve("kl")
    # the built-in numbers of the log-ratio family
    assert tol == Tolerance(rtol=1e-4, atol=5e-7, equal_nan=True, scale="recorded")
    assert source == "rtol, atol and scale from built-in default; equal_nan from marker"


def test_fields_no_layer_names_come_from_the_training_default():
    marker = Layer("marker", {"my_metric": {"rtol": 0.1}})
    tol, source = Stack(marker=[marker]).resolver().resolve("my_metric", ("float32",))
    assert (tol.rtol, tol.atol, tol.scale) == (0.1, 1e-8, "recorded")
    assert source == "rtol from marker; atol and scale from built-in default for training values"


def test_a_complete_entry_decides_alone_as_before():
    """rtol and atol both given: equal_nan of a lower layer is not consulted (it is false)."""
    marker = Layer("marker", {"kl": {"rtol": 1e-3, "atol": 0.0}})
    ini = Layer("ini", {"kl": {"rtol": 1.0, "atol": 1.0, "equal_nan": True}})
    assert Stack(marker=[marker], ini=[ini]).resolver().resolve("kl") == (
        Tolerance(rtol=1e-3, atol=0.0, equal_nan=False),
        "marker",
    )


def test_exact_is_complete_on_top_and_fills_zeros_below_a_partial_entry():
    exact = Layer("ini", {"kl": {"exact": True}})
    assert Stack(ini=[exact]).resolver().resolve("kl") == (EXACT, "ini")
    marker = Layer("marker", {"kl": {"rtol": 1e-3}})
    tol, source = Stack(marker=[marker], ini=[exact]).resolver().resolve("kl")
    assert tol == Tolerance(rtol=1e-3, atol=0.0) and not tol.exact
    assert source == "rtol from marker; atol from ini"


def test_an_empty_entry_leaves_every_field_to_the_layers_below_but_counts_as_used():
    marker = Layer("marker", {"pg_loss": {}})
    resolver = Stack(marker=[marker]).resolver()
    assert resolver.resolve("pg_loss") == (
        Tolerance(rtol=1e-4, atol=1e-8, scale="recorded"),
        "built-in default",
    )
    usage = ToleranceUsage()
    usage.note(resolver, "pg_loss")
    assert usage.unused(marker) == []


# ------------------------------------------------------------------ the usage tracker


def test_session_usage_is_merged_by_label_across_processes():
    """pytest-xdist: each worker notes into its own tracker; the controller merges labels."""
    cli = Layer("--golden-tolerance", {"kl": {"rtol": 1}, "gradnorm": {"rtol": 1}})
    ini = Layer("ini golden_tolerances", {"pg_loss": {"rtol": 1}})
    worker = ToleranceUsage()
    worker.note(Stack(cli=[cli], ini=[ini]).resolver(), "actor/kl")
    assert worker.labels() == ["--golden-tolerance 'kl'", "built-in default 'kl'"]
    controller = ToleranceUsage()
    assert len(controller.unused_entries([cli, ini])) == 3
    controller.merge(worker.labels(), worker.names())
    assert controller.unused_entries([cli, ini]) == [
        ("--golden-tolerance 'gradnorm'", "gradnorm"),
        ("ini golden_tolerances 'pg_loss'", "pg_loss"),
    ]
    assert controller.names() == ["actor/kl"]


def test_a_level_from_user_input_is_its_exclusions_then_its_tolerances():
    ignore, tolerances = ignore_and_tolerance_layers(
        "--t", ["kl:rtol=1e-3", "pg_loss:atol=1e-6"], "--i", "clipfrac"
    )
    assert (ignore.source, tolerances.source) == ("--i", "--t")
    assert ignore.match("clipfrac") == IGNORE and ignore.match("kl") is None
    assert tolerances.match("kl").given == frozenset({"rtol"})
    assert (
        ignore_and_tolerance_layers("m", {"kl": {"rtol": 0.1}}, "mi", None)[1].match("kl").rtol
        == 0.1
    )


@pytest.mark.parametrize(
    ("specs", "ignored", "message"),
    [
        (["kl:rtol=x"], (), "--t: bad tolerance 'kl:rtol=x': rtol must be a number"),
        (["kl:rtol=1e-3"], ["kl"], "'kl' has a tolerance in --t and is ignored by --i"),
        ([], [""], "--i: takes metric or tensor names, got ''"),
        ([], [3], "--i: takes metric or tensor names, got 3"),
    ],
)
def test_a_level_names_its_source_when_it_cannot_be_used(specs, ignored, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        ignore_and_tolerance_layers("--t", specs, "--i", ignored)


def test_a_name_both_ignored_and_given_ignore_at_one_level_is_fine():
    assert ignore_and_tolerance_layers("--t", ["kl:ignore"], "--i", ["kl"])[0].match("kl") == IGNORE


# ------------------------------------------------ scale: rtol against a recorded magnitude


def test_scale_measures_rtol_against_a_magnitude_where_the_value_is_smaller():
    tol = Tolerance(rtol=1e-4, atol=0.0, scale=0.04)
    assert compare_values(0.001, 0.001 + 3e-6, tol, check_dtype=False).ok  # 4e-6 allowed
    assert not compare_values(0.001, 0.001 + 5e-6, tol, check_dtype=False).ok
    assert not compare_values(0.5, 0.5 * (1 + 2e-4), tol, check_dtype=False).ok  # |e| > scale


def test_recorded_scale_is_the_given_magnitude_or_the_tensors_largest_element():
    tol = Tolerance(rtol=1e-4, atol=0.0, scale="recorded")
    assert compare_values(0.001, 0.001 + 3e-6, tol, check_dtype=False, magnitude=0.04).ok
    assert not compare_values(0.001, 0.001 + 3e-6, tol, check_dtype=False).ok  # its own 0.001
    import torch

    log_probs = torch.tensor([-9.0, -0.01])  # normwise: every element against 9
    drifted = log_probs + torch.tensor([0.0, 5e-4])
    diff = compare_values(log_probs, drifted, tol, check_dtype=True)
    assert diff.ok and diff.scale == 9.0
    assert not compare_values(log_probs, log_probs * (1 + 1e-3), tol, check_dtype=True).ok


def test_excess_says_how_far_beyond_the_tolerance_a_value_is():
    tol = Tolerance(rtol=1e-3, atol=0.0)
    assert compare_values(1.0, 1.01, tol, check_dtype=False).excess == pytest.approx(10.0)
    assert compare_values(1.0, 1.0005, tol, check_dtype=False).excess == 0.0  # within: not measured
    assert compare_values(1.0, math.nan, tol, check_dtype=False).excess == math.inf
    assert compare_values(1.0, 1.0 + 1e-12, EXACT, check_dtype=False).excess == math.inf


@pytest.mark.parametrize(
    ("spec", "problem"),
    [("x:scale=big", "scale must be a number or 'recorded'"), ("x:scale=-1", "scale must be")],
)
def test_parse_spec_rejects_a_bad_scale(spec, problem):
    with pytest.raises(ValueError, match=problem):
        parse_spec(spec)


def test_parse_spec_reads_a_scale():
    assert parse_spec("pg_loss:rtol=1e-4,scale=recorded")[1].scale == "recorded"
    assert parse_spec("pg_loss:scale=1")[1] == Tolerance(scale=1.0)
    assert Tolerance(rtol=1e-4, scale=0.5).describe() == "rtol=0.0001, atol=0, scale=0.5"


# ------------------------------------------------ defaults that exclude: machine metrics, profiles


@pytest.mark.parametrize(
    "name",
    [
        "timing_s/gen",
        "timing_per_token_ms/gen",
        "perf/throughput",
        "perf/max_memory_allocated_gb",
        "perf/mfu/actor",
        "timing/generation",
        "time/step",
        "train_runtime",
        "train/train_samples_per_second",
        "step_time",
    ],
)
def test_timing_throughput_and_memory_are_never_compared_by_default(name):
    tol, source = Stack().resolver().resolve(name)
    assert tol.ignore and "measures the machine" in source


@pytest.mark.parametrize(
    "name",
    [
        "reward/throughput",
        "actor/memory_loss",
        "env/episode_seconds",
        "tokens_per_step",
        "reward/timing_s",
        "response_time",
        "mfu_reward",
    ],
)
def test_a_training_value_that_mentions_the_machine_is_compared(name):
    tol, source = Stack().resolver().resolve(name)
    assert not tol.ignore, source


def test_a_tolerance_above_a_default_exclusion_compares_the_metric_again():
    marker = Layer("marker", {"perf/throughput": {"rtol": 0.1, "atol": 0.0}})
    assert Stack(marker=[marker]).resolver().resolve("perf/throughput") == (
        Tolerance(rtol=0.1, atol=0.0),
        "marker",
    )
    user = Layer("ini golden_ignore", {"pg_loss": IGNORE})
    assert Stack(ini=[user]).resolver().resolve("pg_loss")[0].ignore, "a user's exclusion holds"


def test_a_profile_maps_framework_names_to_families_and_is_overridden_by_the_user():
    from pytest_rollout_golden._internal.tolerance.families import FAMILIES, profile_layers

    layers, across = profile_layers("verl")
    stack = Stack(profile=layers, across_variants=across)
    assert stack.resolver().resolve("actor/ppo_kl") == (
        FAMILIES["log_ratio"],
        "golden_metric_profile = verl",
    )
    assert stack.resolver().resolve("timing_s/update_actor")[0].ignore
    assert stack.resolver().resolve("actor/pg_clipfrac")[1] == "golden_metric_profile = verl"
    variant = stack.replace(variant=True).resolver()
    tol, source = variant.resolve("actor/pg_clipfrac")
    assert tol.ignore and source.startswith("not comparable across variants")
    assert variant.resolve("actor/pg_loss")[1] == "golden_metric_profile = verl"
    cli = Layer("--golden-tolerance", {"actor/ppo_kl": {"rtol": 1.0, "atol": 0.0}})
    assert stack.replace(cli=[cli]).resolver().resolve("actor/ppo_kl")[1] == "--golden-tolerance"


def test_an_unknown_profile_names_the_known_ones():
    from pytest_rollout_golden._internal.pytest_plugin.options import session_tolerances

    with pytest.raises(ValueError, match="unknown profile 'veRL2'; use one of megatron, openrlhf"):
        session_tolerances((), (), (), (), "veRL2")
    assert session_tolerances((), (), (), (), " VERL ").profile


def test_the_order_names_every_layer_of_a_stack_once():
    """Stack.resolver stacks the layers ORDER names (the docs print it): a layer left out of
    it would never be resolved."""
    switches = {"variant", "exact", "certify"}
    layers = {f.name for f in dataclasses.fields(Stack)} - switches
    names = [name for name, _ in ORDER]
    assert len(names) == len(set(names))
    assert set(names) == layers | {"builtin"}


def test_the_resolver_stacks_the_layers_in_the_order():
    """One layer per role, each naming ``x``: the resolver answers with each in ORDER's turn."""
    roles = [name for name, _ in ORDER if name != "builtin"]
    sequences = {"marker", "cli", "ini", "profile"}
    parts: dict[str, object] = {}
    for i, name in enumerate(roles):
        layer = Layer(name, {"x": Tolerance(rtol=0.01 * (i + 1), atol=0.0)})
        parts[name] = (layer,) if name in sequences else layer
    stack = Stack(variant=True, **parts)
    for name in roles:
        assert stack.resolver().resolve("x")[1] == name
        stack = stack.replace(**{name: () if name in sequences else None})
    assert stack.resolver().resolve("x")[1] == "built-in default for training values"
