"""rollout-golden diff, show and verify on a golden with a per-step envelope (envelope.json)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_rollout_golden import Golden, Mode
from pytest_rollout_golden.cli import main
from pytest_rollout_golden.errors import GoldenMismatch

STEPS = 12
# The runs agreed closely at the first half of the steps, then drifted apart.
BELOW = [1e-5] * 6 + [1e-3] * 6
ABOVE = [2e-5] * 6 + [5e-4] * 6


def values(step: int, bias: float = 0.0) -> dict[str, float]:
    return {"loss": 1.0 + 0.01 * step + bias, "kl": 0.01}


def record(directory: Path, bias: float = 0.0) -> None:
    with Golden(directory, mode=Mode.AUTO) as golden:
        for step in range(STEPS):
            golden.check(values(step, bias), step=step)


def envelope_document(below=BELOW, above=ABOVE) -> dict:
    from pytest_rollout_golden._internal.tolerance.envelope import document

    band = {"steps": list(range(STEPS)), "below": below, "above": above, "dtype": "float64"}
    how = {"runs": 3, "perturbations": ["threads"], "tests": ["t.py::test"]}
    return document({"same layout": {"loss": {**band, "runs": 3}}}, how)


def calibrate(directory: Path, envelope: dict | None = None) -> None:
    """Give the golden a tolerances.json loose enough for every step, and an envelope."""
    from pytest_rollout_golden._internal.tolerance.calibration import FORMAT, write

    doc = {"format": FORMAT, "version": 1, "how": {}, "spreads": {},
           "tolerances": {"loss": {"rtol": 2e-3, "atol": 1e-8}}}  # fmt: skip
    write(directory, doc, envelope=envelope or envelope_document())


def replay_verdicts(directory: Path, bias: float) -> dict[int, str]:
    """Per step, what replaying ``directory`` with the biased values says of ``loss``."""
    verdicts = {}
    with pytest.raises(GoldenMismatch), Golden(directory, mode=Mode.AUTO) as golden:
        for step in range(STEPS):
            for c in golden.check(values(step, bias), step=step):
                if c.name == "loss":
                    verdicts[step] = str(c.verdict)
    return verdicts


def test_diff_applies_the_envelope_per_step_and_agrees_with_replay(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    record(a)
    record(b, bias=8e-4)
    calibrate(a)
    code = main(["diff", str(a), str(b), "--no-config", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 1
    [golden] = out["goldens"]
    assert not golden["problems"]  # envelope.json is no file to diff (B has none)
    rows = {m["step"]: m for m in golden["metrics"] if m["name"] == "loss"}
    band = "rtol and scale from built-in default; atol from envelope (envelope.json)"
    assert rows[0]["source"] == band and not rows[0]["ok"]
    assert rows[11]["source"] == band and rows[11]["ok"]
    assert golden["first_divergence"]["loss"] == 0
    diff_verdicts = {step: "pass" if row["ok"] else "fail" for step, row in rows.items()}
    assert diff_verdicts == replay_verdicts(a, bias=8e-4)
    assert set(diff_verdicts.values()) == {"pass", "fail"}
    # A --tolerance on the command line stands above the envelope, as in the plugin.
    assert main(["diff", str(a), str(b), "--no-config", "--tolerance", "loss:rtol=1e-3"]) == 0


def test_show_summarises_the_envelope(tmp_path, capsys):
    record(tmp_path / "a")
    calibrate(tmp_path / "a")
    assert main(["show", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    assert (
        "per-step envelope (envelope.json): from 3 runs, margin x2 (more from fewer than 8 "
        "distinct runs), smooth 3 steps each side\n" in out
    )
    assert "  same layout:\n    loss: 12 steps (0-11), 3 runs, half-width up to 0.001, " in out
    assert "bias bound none" in out
    assert "across variants" not in out and "not comparable" not in out
    assert main(["show", str(tmp_path / "a"), "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    loss = {"steps": 12, "first": 0, "last": 11, "runs": 3, "widest": 1e-3, "bias_bound": None}
    loss.update(distinct=None, margin=None)  # a file without the per-step counts
    assert document["envelope"] == {
        "margin": 2.0,
        "smooth": 3,
        "runs": 3,
        "lanes": {"same layout": {"loss": loss}},
        "drifting": {},
    }


def test_show_lists_both_lanes_and_the_values_not_comparable_across_variants(tmp_path, capsys):
    from pytest_rollout_golden._internal.tolerance.calibration import write

    record(tmp_path / "a")
    doc = envelope_document()
    variants = {**doc["metrics"]["loss"], "runs": 5, "above": [2e-3] * STEPS}
    variants["distinct"] = [3] * 5 + [2] * (STEPS - 5)
    doc["layout_metrics"] = {"loss": {**variants, "bias": {"runs": [0.01, -0.02], "bound": 0.06}}}
    doc["layout_drifting"] = {"kl": {"widest": 3.5, "trends": {"growth": 1.2}}}
    write(tmp_path / "a", None, envelope=doc)  # the digest in the manifest matches it
    assert main(["show", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    assert (
        "  same layout:\n"
        "    loss: 12 steps (0-11), 3 runs, half-width up to 0.001, bias bound none\n"
        "  across variants:\n"
        "    loss: 12 steps (0-11), 5 runs (2 distinct at the fewest, margin x8.72), "
        "half-width up to 0.002, bias bound 0.06\n"
        "  not comparable across variants: kl (3.5x)\n"
    ) in out
    assert main(["show", str(tmp_path / "a"), "--json"]) == 0
    envelope = json.loads(capsys.readouterr().out)["envelope"]
    assert set(envelope["lanes"]) == {"same layout", "across variants"}
    assert envelope["lanes"]["across variants"]["loss"]["widest"] == 2e-3
    assert envelope["lanes"]["across variants"]["loss"]["bias_bound"] == 0.06
    assert envelope["drifting"] == {"kl": {"widest": 3.5}}


def test_show_of_a_golden_without_an_envelope_says_nothing_of_one(tmp_path, capsys):
    record(tmp_path / "a")
    assert main(["show", str(tmp_path / "a")]) == 0
    assert "envelope" not in capsys.readouterr().out
    assert main(["show", str(tmp_path / "a"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["envelope"] is None


@pytest.mark.parametrize("verb", ["verify", "diff"])
def test_an_edited_envelope_fails_naming_file_metric_and_step(tmp_path, capsys, verb):
    a, b = tmp_path / "a", tmp_path / "b"
    record(a)
    record(b)
    wide = [*BELOW[:3], 1.5, *BELOW[4:]]  # 1.5 > 1 x the largest |loss| (1.11)
    calibrate(a, envelope_document(below=wide))  # the digest in the manifest matches it
    args = [verb, str(a)] + ([str(b), "--no-config"] if verb == "diff" else [])
    code = main(args)
    out = capsys.readouterr()
    message = out.out + out.err
    assert code == (1 if verb == "verify" else 2)
    assert str(a / "envelope.json") in message
    assert "metric 'loss' at step 3: width 1.5 is beyond" in message
