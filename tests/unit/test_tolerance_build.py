"""The one builder of a golden's tolerance stack (``_internal/tolerance/build.py``): each rule
that decides which layers apply, and the per-step resolver with an envelope's bands."""

from __future__ import annotations

import pytest

from pytest_rollout_golden._internal.pytest_plugin.options import session_tolerances
from pytest_rollout_golden._internal.tolerance import envelope
from pytest_rollout_golden._internal.tolerance.build import Declared, Recorded, build
from pytest_rollout_golden._internal.tolerance.envelope import Band
from pytest_rollout_golden._internal.tolerance.spec import Layer, Tolerance

MARKER = Layer("@pytest.mark.golden(tolerances=)", {"kl": Tolerance(rtol=0.5, atol=0.0)})
CALIBRATED = Layer(
    "tolerances.json",
    {"kl": Tolerance(rtol=0.2, atol=0.0), "loss": Tolerance(rtol=0.3, atol=0.0)},
)


def test_the_layers_come_in_order_with_their_sources():
    session = session_tolerances(["kl:rtol=0.1,atol=0"], [], ["kl:rtol=0.3,atol=0"], [], "", "bf16")
    built = build(Declared(session, marker=[MARKER]), Recorded(CALIBRATED))
    found = [(role, layer.source) for role, layer in built.layers()]
    assert found[:7] == [
        ("marker", "@pytest.mark.golden(tolerances=)"),
        ("cli", "--golden-ignore"),
        ("cli", "--golden-tolerance"),
        ("calibrated", "tolerances.json"),
        ("ini", "ini golden_ignore"),
        ("ini", "ini golden_tolerances"),
        ("precision", "ini golden_precision = bf16"),
    ]
    assert [role for role, _ in found[7:]] == ["builtin", "builtin"]
    assert built.resolver().resolve("kl")[1] == "@pytest.mark.golden(tolerances=)"


@pytest.mark.parametrize(("precision", "source"), [("bf16", "marker precision"), (" ", "ini")])
def test_a_marker_precision_replaces_the_ini_one_and_an_empty_one_keeps_it(precision, source):
    session = session_tolerances([], [], [], [], "", "bf16")
    layer = dict(build(Declared(session, precision=precision)).layers())["precision"]
    assert layer.source.startswith(source)


@pytest.mark.parametrize(
    ("declared", "exact"),
    [
        (Declared(exact_run=True), True),  # --golden-exact
        (Declared(exact=True), True),  # the marker's exact=
        (Declared(layout={}, exact_run=True), False),  # a variant ignores --golden-exact
        (Declared(layout={}, exact=True), True),  # ... not its own marker
        (Declared(exact=True, certify=True), False),  # the oracle compares at its bound
    ],
)
def test_who_asks_for_bit_equality(declared, exact):
    assert build(declared).stack.exact is exact


@pytest.mark.parametrize("recorded", [Recorded(environment_changed=True), Recorded(fallback=True)])
def test_another_environment_or_the_fallback_lane_drops_bit_equality(recorded):
    assert build(Declared(exact=True)).resolver().resolve("kl")[1] == "exact lane"
    assert build(Declared(exact=True), recorded).resolver().resolve("kl")[1] != "exact lane"


def test_a_variant_resolves_its_variant_lane_under_the_marker():
    layout = {"pg": {"rtol": 0.1, "atol": 0.0}}
    built = build(Declared(marker=[MARKER], layout=layout))
    assert built.stack.variant
    assert built.resolver().resolve("pg")[1] == "variant lane"
    assert build(Declared(marker=[MARKER])).resolver().resolve("pg")[1] != "variant lane"


def test_the_oracle_leaves_out_the_calibrated_files_and_the_envelope():
    bands = envelope.Envelope({"loss": Band((0,), (1e-3,), (1e-3,), "float32", 1.0)})
    built = build(Declared(certify=True), Recorded(CALIBRATED, envelope=bands))
    assert built.envelope is None and built.stack.calibrated is None
    assert built.stack.certify and built.at(0) is built.resolver()


def test_a_step_with_a_band_resolves_it_over_the_calibrated_files():
    bands = envelope.Envelope({"loss": Band((0,), (1e-3,), (1e-3,), "float32", 1.0)})
    built = build(Declared(), Recorded(CALIBRATED, envelope=bands))
    assert built.at(1) is built.resolver()  # no band at step 1
    tol, source = built.at(0).resolve("loss")
    assert "atol from" in source and tol.atol > 1e-3  # the band is the atol
    assert built.at(0).resolve("kl")[1] == "tolerances.json"  # not in the band: the file's
    assert built.uncalibrated().resolve("kl")[1] != "tolerances.json"
