"""TRL's real GRPOTrainer and RLOOTrainer through the plugin: same-math variants pass, seeded
bugs fail.

An inner project (pytester, one subprocess per run: TRL and transformers cannot be imported
twice in one process) trains a tiny Qwen2 with ``GRPOTrainer``/``RLOOTrainer`` on CPU
(``grpo_harness.py``), records what the engine and the reward function return with
``golden.rollout`` (advantages, KL and log-probs are recomputed by TRL on replay, so bugs there
are caught) and checks the logged training metrics per step with ``golden.check`` under
``golden_metric_profile = trl``. The reference of each lane records
with ``--update-golden``; then one replay run covers every variant: the same-math ones must
pass, every seeded bug must fail naming the metric that shows it.

A second project (``CERTIFY_INNER``) runs bf16 dapo as TRL defaults it, following the golden's
precision (float64 under the oracle): ``--golden-calibrate`` with a x1.001 loss and a
per-micro-batch token mean declared ``same_math()`` must certify only the same-math variants,
keep the bugs out of the variant lane, and a strict replay must fail exactly the bugs.

Needs trl and transformers: see ``tests/realtrainer/requirements-trl.txt``.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

REQUIREMENTS = "tests/realtrainer/requirements-trl.txt"


def _missing(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is None
    except (ImportError, ValueError):  # ValueError: sys.modules[module] is None
        return True


if any(_missing(m) for m in ("trl", "transformers", "datasets", "accelerate")):
    pytest.skip(
        "TRL lane: trl/transformers/datasets/accelerate not installed; "
        f"pip install --no-deps -r {REQUIREMENTS}",
        allow_module_level=True,
    )

HERE = Path(__file__).resolve().parent

INNER = """
import sys

import pytest

sys.path.insert(0, {harness!r})

from grpo_harness import Knobs, make_trainer, quiet, training_metrics

from pytest_rollout_golden import same_math


DAPO = {{
    "b8ga1": Knobs(loss_type="dapo"),
    "b4ga2": Knobs(loss_type="dapo", batch=4, ga=2),
    "b2ga4": Knobs(loss_type="dapo", batch=2, ga=4),
    "b4ga2-dropga": Knobs(loss_type="dapo", batch=4, ga=2, bug="drop_ga_scale"),
    "b4ga2-mbmean": Knobs(loss_type="dapo", batch=4, ga=2, bug="microbatch_token_mean"),
    "padloss": Knobs(loss_type="dapo", bug="loss_on_padding"),
    "klsign": Knobs(loss_type="dapo", bug="kl_sign"),
    "betaignored": Knobs(loss_type="dapo", bug="beta_ignored"),
    "advnostd": Knobs(loss_type="dapo", bug="advantage_no_std"),
    "x1.001": Knobs(loss_type="dapo", bug="loss_x1.001"),
}}
GRPO = {{
    "b8ga1": Knobs(loss_type="grpo"),
    "b4ga2": Knobs(loss_type="grpo", batch=4, ga=2),
    "b4ga2-dropga": Knobs(loss_type="grpo", batch=4, ga=2, bug="drop_ga_scale"),
}}
BNPO = {{
    "b8ga1": Knobs(loss_type="bnpo"),
    "b4ga2": Knobs(loss_type="bnpo", batch=4, ga=2),  # per-micro-batch token-mean: real change
}}
# RLOO's loss is -mean(A) of centred advantages: zero up to rounding (~1e-8); the trl profile
# holds it against the scale of its terms (|A| ~ 1), not its recorded magnitude
RLOO = {{
    "b8ga1": Knobs(algo="rloo", normalize_advantages=True),
    "b4ga2": Knobs(algo="rloo", normalize_advantages=True, batch=4, ga=2),
    "b2ga4": Knobs(algo="rloo", normalize_advantages=True, batch=2, ga=4),
    "x1.001": Knobs(algo="rloo", normalize_advantages=True, bug="loss_x1.001"),
    "padloss": Knobs(algo="rloo", normalize_advantages=True, bug="loss_on_padding"),
    "klsign": Knobs(algo="rloo", normalize_advantages=True, bug="kl_sign"),
    "advnostd": Knobs(algo="rloo", normalize_advantages=True, bug="advantage_no_std"),
    "b4ga2-dropga": Knobs(
        algo="rloo", normalize_advantages=True, batch=4, ga=2, bug="drop_ga_scale"
    ),
}}
RLOO_RAW = {{
    "b8ga1": Knobs(algo="rloo"),
    "b4ga2": Knobs(algo="rloo", batch=4, ga=2),
    "b2ga4": Knobs(algo="rloo", batch=2, ga=4),
}}
# TRL's default bf16=True (CPU autocast), declared with precision="bf16"
BF16 = {{
    "b8ga1": Knobs(loss_type="dapo", bf16=True),
    "b4ga2": Knobs(loss_type="dapo", bf16=True, batch=4, ga=2),
    "b2ga4": Knobs(loss_type="dapo", bf16=True, batch=2, ga=4),
    "b4ga2-dropga": Knobs(loss_type="dapo", bf16=True, batch=4, ga=2, bug="drop_ga_scale"),
    "x1.001": Knobs(loss_type="dapo", bf16=True, bug="loss_x1.001"),
}}
# two optimizer steps per generated batch: old_per_token_logps in the batch, clipping active
MU2 = {{
    "b8ga1": Knobs(loss_type="dapo", num_iterations=2, steps=4),
    "b4ga2": Knobs(loss_type="dapo", num_iterations=2, steps=4, batch=4, ga=2),
    "noclip": Knobs(loss_type="dapo", num_iterations=2, steps=4, bug="no_clip"),
}}


def train(golden, knobs, model_dir, out):
    trainer = make_trainer(
        knobs,
        model_dir,
        out,
        rollout=lambda step, generate, name: golden.rollout(generate, step=step, name=name),
        on_step=lambda step, logs: golden.check(training_metrics(logs), step=step),
    )
    with quiet():
        trainer.train()


@pytest.mark.parametrize("knobs", same_math(DAPO))
def test_dapo(golden, knobs, model_dir, tmp_path):
    train(golden, knobs, model_dir, tmp_path)


@pytest.mark.parametrize("knobs", same_math(GRPO))
def test_grpo(golden, knobs, model_dir, tmp_path):
    train(golden, knobs, model_dir, tmp_path)


@pytest.mark.parametrize("knobs", same_math(BNPO))
def test_bnpo(golden, knobs, model_dir, tmp_path):
    train(golden, knobs, model_dir, tmp_path)


@pytest.mark.parametrize("knobs", same_math(RLOO))
def test_rloo(golden, knobs, model_dir, tmp_path):
    train(golden, knobs, model_dir, tmp_path)


@pytest.mark.parametrize("knobs", same_math(RLOO_RAW))
def test_rloo_raw(golden, knobs, model_dir, tmp_path):
    train(golden, knobs, model_dir, tmp_path)


@pytest.mark.golden(precision="bf16")
@pytest.mark.parametrize("knobs", same_math(BF16))
def test_bf16(golden, knobs, model_dir, tmp_path):
    train(golden, knobs, model_dir, tmp_path)


@pytest.mark.parametrize("knobs", same_math(MU2))
def test_mu2(golden, knobs, model_dir, tmp_path):
    train(golden, knobs, model_dir, tmp_path)
"""

INNER_CONFTEST = """
import pathlib
import sys

import pytest

sys.path.insert(0, {harness!r})


@pytest.fixture(scope="session")
def model_dir():
    from grpo_harness import build_model_dir

    return build_model_dir(pathlib.Path(__file__).parent / "model")
"""

# test id -> (passes?, metrics its failure must name)
EXPECTED = {
    "test_dapo[b8ga1]": (True, ()),
    "test_dapo[b4ga2]": (True, ()),
    "test_dapo[b2ga4]": (True, ()),
    "test_dapo[b4ga2-dropga]": (False, ("grad_norm", "loss")),
    "test_dapo[b4ga2-mbmean]": (False, ("loss", "grad_norm")),
    "test_dapo[padloss]": (False, ("loss", "grad_norm")),
    "test_dapo[klsign]": (False, ("loss",)),
    "test_dapo[betaignored]": (False, ("loss",)),
    "test_dapo[advnostd]": (False, ("loss", "grad_norm")),
    "test_dapo[x1.001]": (False, ("loss",)),
    "test_grpo[b8ga1]": (True, ()),
    "test_grpo[b4ga2]": (True, ()),
    "test_grpo[b4ga2-dropga]": (False, ("grad_norm", "loss")),
    "test_bnpo[b8ga1]": (True, ()),
    "test_bnpo[b4ga2]": (False, ("loss",)),
    "test_rloo[b8ga1]": (True, ()),
    "test_rloo[b4ga2]": (True, ()),
    "test_rloo[b2ga4]": (True, ()),
    "test_rloo[x1.001]": (False, ("grad_norm",)),
    "test_rloo[padloss]": (False, ("loss", "grad_norm")),
    "test_rloo[klsign]": (False, ("grad_norm",)),
    "test_rloo[advnostd]": (False, ("grad_norm",)),
    "test_rloo[b4ga2-dropga]": (False, ("grad_norm",)),
    "test_rloo_raw[b8ga1]": (True, ()),
    "test_rloo_raw[b4ga2]": (True, ()),
    "test_rloo_raw[b2ga4]": (True, ()),
    "test_bf16[b8ga1]": (True, ()),
    "test_bf16[b4ga2]": (True, ()),
    "test_bf16[b2ga4]": (True, ()),
    "test_bf16[b4ga2-dropga]": (False, ("grad_norm", "loss")),
    "test_bf16[x1.001]": (False, ("loss",)),
    "test_mu2[b8ga1]": (True, ()),
    "test_mu2[b4ga2]": (True, ()),
    "test_mu2[noclip]": (False, ("loss",)),
}
REFERENCES = [t for t in EXPECTED if t.endswith("[b8ga1]")]


def _sections(text: str) -> dict[str, str]:
    """Failure section of each test id (``____ test_x[id] ____`` headers)."""
    parts = re.split(r"^_{3,} (test_\w+\[[^\]]*\]) _{3,}$", text, flags=re.M)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def test_trl_grpo_lane(pytester: pytest.Pytester):
    """Record the references, replay every variant (one test: two subprocesses in all)."""
    pytester.makeini(
        "[pytest]\ngolden_dir = golden\ngolden_metric_profile = trl\n"
        "filterwarnings = ignore::FutureWarning\n"  # transformers: gradient_checkpointing
    )
    pytester.makeconftest(INNER_CONFTEST.format(harness=str(HERE)))
    pytester.makepyfile(test_lane=INNER.format(harness=str(HERE)))
    record = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--update-golden", "-k", "b8ga1", timeout=600
    )
    assert record.ret == 0, record.stdout.str()[-5000:]
    record.assert_outcomes(passed=len(REFERENCES), deselected=len(EXPECTED) - len(REFERENCES))
    replay = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-v", timeout=600)
    text = replay.stdout.str()
    outcomes = {
        m.group(1): m.group(2)
        for m in re.finditer(r"test_lane\.py::(\S+) (PASSED|FAILED|ERROR|SKIPPED)", text)
    }
    sections = _sections(text)
    problems = []
    for test_id, (passes, metrics) in EXPECTED.items():
        outcome = outcomes.get(test_id)
        if passes and outcome != "PASSED":
            problems.append(f"{test_id}: a same-math variant {outcome}\n{sections.get(test_id)}")
        elif not passes and outcome != "FAILED":
            problems.append(f"{test_id}: a seeded bug {outcome}")
        elif not passes and not re.search(
            rf"^E?\s*{re.escape(metrics[0])}\s", sections[test_id], flags=re.M
        ):
            problems.append(f"{test_id}: failed without naming {metrics[0]}\n{sections[test_id]}")
    assert not problems, "\n\n".join(problems)


# TRL's default bf16=True, declared with ini golden_precision = bf16. The knobs follow the
# golden's precision: under the float64 oracle (--golden-certify, calibration's first run)
# a float64 model with autocast off, else float32 master weights under bf16 autocast.
CERTIFY_INNER = """
import sys

import pytest

sys.path.insert(0, {harness!r})

from grpo_harness import Knobs, make_trainer, quiet, training_metrics

from pytest_rollout_golden import same_math

VARIANTS = {{
    "b8ga1": {{}},
    "b4ga2": {{"batch": 4, "ga": 2}},
    "b2ga4": {{"batch": 2, "ga": 4}},
    "x1.001": {{"bug": "loss_x1.001"}},
    "b4ga2-mbmean": {{"batch": 4, "ga": 2, "bug": "microbatch_token_mean"}},
    "b4ga2-dropga": {{"batch": 4, "ga": 2, "bug": "drop_ga_scale"}},
}}


def knobs_for(golden, variant):
    dtype = "float64" if golden.precision == "float64" else "float32"
    return Knobs(loss_type="dapo", dtype=dtype, bf16=not golden.certifying, **variant)


@pytest.mark.parametrize("variant", same_math(VARIANTS))
def test_bf16(golden, variant, model_dir, tmp_path):
    trainer = make_trainer(
        knobs_for(golden, variant),
        model_dir,
        tmp_path,
        rollout=lambda step, generate, name: golden.rollout(generate, step=step, name=name),
        on_step=lambda step, logs: golden.check(training_metrics(logs), step=step),
    )
    with quiet():
        trainer.train()
"""
CERTIFY_INI = (
    "[pytest]\ngolden_dir = golden\ngolden_metric_profile = trl\n"
    "golden_precision = bf16\nfilterwarnings = ignore::FutureWarning\n"
)
CERTIFIED = ("b4ga2", "b2ga4")
NOT_SAME_MATH = ("x1.001", "b4ga2-mbmean", "b4ga2-dropga")


def _run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-v", *args, timeout=600)


def _outcomes(result: pytest.RunResult) -> dict[str, str]:
    return {
        m.group(1): m.group(2)
        for m in re.finditer(
            r"test_lane\.py::(\S+) (PASSED|FAILED|ERROR|SKIPPED)", result.stdout.str()
        )
    }


def _certified_distances(tolerances: dict) -> dict[str, float]:
    """Per value, the largest distance of a certified variant to the reference (what the
    certified variants alone spread the lane by)."""
    found: dict[str, float] = {}
    for record in tolerances["variants"].values():
        if record["certificate"]["verdict"] != "certified":
            continue
        for name, measured in record["distances"].items():
            found[name] = max(found.get(name, 0.0), measured["distance"])
    return found


def test_trl_bf16_calibration_trusts_only_certified_variants(pytester: pytest.Pytester):
    """bf16 GRPO (dapo): record the reference, calibrate with a x1.001 loss, a per-micro-batch
    token mean and a dropped accumulation scale declared same_math(): the float64 oracle
    certifies b4ga2 and b2ga4, finds the bugs not the same math and keeps them out of the lane;
    a strict replay passes the certified variants with no written tolerance and fails each
    bug."""
    pytester.makeini(CERTIFY_INI)
    pytester.makeconftest(INNER_CONFTEST.format(harness=str(HERE)))
    pytester.makepyfile(test_lane=CERTIFY_INNER.format(harness=str(HERE)))
    record = _run(pytester, "--update-golden", "-k", "b8ga1")
    assert record.ret == 0, record.stdout.str()[-5000:]

    calibrate = _run(pytester, "--golden-calibrate", "2")
    text = calibrate.stdout.str()
    for variant in CERTIFIED:
        assert f"test_lane.py::test_bf16[{variant}]: certified same math in float64" in text, text
    for variant in NOT_SAME_MATH:
        assert f"test_lane.py::test_bf16[{variant}]: not the same math: " in text, text
    path = pytester.path / "golden" / "test_lane" / "test_bf16[b8ga1]" / "tolerances.json"
    tolerances = json.loads(path.read_text())
    # the lane pools the reference and the certified variants only: on CPU the runs of one
    # test are bit-equal, so each compared spread is a certified variant's distance, no more
    certified = _certified_distances(tolerances)
    for name, spread in tolerances["layout_spreads"].items():
        if spread.get("kept") == "not compared":  # kl, entropy, clip_ratio/* (trl profile)
            continue
        assert spread["rel_spread"] <= certified.get(name, 0.0), (name, spread, certified)

    strict = _outcomes(_run(pytester, "--golden-strict"))
    expected = {f"test_bf16[{v}]": "PASSED" for v in ("b8ga1", *CERTIFIED)}
    expected.update({f"test_bf16[{v}]": "FAILED" for v in NOT_SAME_MATH})
    assert strict == expected
