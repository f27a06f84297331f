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

Needs trl and transformers: see ``tests/realtrainer/requirements-trl.txt``.
"""

from __future__ import annotations

import importlib.util
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
