"""The float64 oracle through the plugin: ``golden.precision`` / ``dtype`` / ``autocast()``
follow the declared precision and become float64 under ``--golden-certify``; the reference
records its float64 values into the lane ``float64-oracle``, same-math variants replay them
and a variant that computes something else fails "not the same math"; ``--golden-calibrate``
certifies the variants first and its variant lane trusts only certified ones, so a x1.001
variant never widens the lane (1, 2 or 3 variants; bf16 and float32) and fails afterwards."""

from __future__ import annotations

import json
import re

import pytest

# A GRPO-style loop in the declared precision: an embedding and a linear head under
# golden.autocast(), micro-batched gradient accumulation over a token-mean loss, Adam.
# ``values`` plants a bug in one variant: a loss scaled by (1 + bug).
LOOP = """
import pytest
import torch
from pytest_rollout_golden import same_math

def make_rollout(step):
    g = torch.Generator().manual_seed(step)
    return {
        "tokens": torch.randint(0, 50, (8, 12), generator=g),
        "mask": torch.rand(8, 12, generator=g) > 0.2,
        "old_log_probs": -3 * torch.rand(8, 12, generator=g),
        "rewards": torch.rand(8, generator=g),
    }

@pytest.mark.parametrize("mb", same_math(MICRO, ids=lambda v: f"mb{v}"))
def test_train(golden, values, mb):
    torch.manual_seed(0)
    emb = torch.nn.Embedding(50, 32).to(golden.dtype)
    head = torch.nn.Linear(32, 50).to(golden.dtype)
    params = [*emb.parameters(), *head.parameters()]
    opt = torch.optim.Adam(params, lr=1e-2)
    scale = 1 + values.get(f"mb{mb}", 0.0)
    for step in range(3):
        batch = golden.rollout(lambda: make_rollout(step), step=step)
        r = batch["rewards"].view(-1, 4)
        adv = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-6)).view(-1, 1)
        tokens = batch["mask"].sum()
        opt.zero_grad()
        total = 0.0
        for i in range(0, 8, mb):
            rows = slice(i, i + mb)
            with golden.autocast():
                logits = head(torch.tanh(emb(batch["tokens"][rows])))
            logp = torch.log_softmax(logits.to(golden.dtype), -1)
            logp = logp.gather(-1, batch["tokens"][rows, :, None])[..., 0]
            ratio = torch.exp(logp - batch["old_log_probs"][rows])
            loss = -(adv[rows] * ratio * batch["mask"][rows]).sum() / tokens * scale
            loss.backward()
            total = total + loss.detach()
        grad_norm = torch.nn.utils.clip_grad_norm_(params, 1e9)
        opt.step()
        golden.check({"loss": total, "grad_norm": grad_norm}, step=step)
"""
BF16 = "[pytest]\ngolden_precision = bf16\n"


def loop(project, micro=(8, 4, 2), ini=BF16):
    project.pytester.makeini(ini)
    project.write(LOOP.replace("MICRO", repr(list(micro))))
    project.set_values()
    return project


def test_certify_records_the_oracle_lane_and_a_variant_that_is_not_the_same_math_fails(project):
    loop(project)
    # bf16: mb2 fails at the defaults
    project.run("--update-golden").assert_outcomes(passed=2, failed=1)
    result = project.run("--golden-certify")
    result.assert_outcomes(passed=3)
    assert "(lane float64-oracle):" in result.stdout.str()
    oracle = project.golden_dir("test_train[mb8]") / "@lanes" / "float64-oracle"
    steps = json.loads((oracle / "metrics.json").read_text())["steps"]
    assert sorted(steps) == ["0", "1", "2"] and set(steps["0"]) == {"loss", "grad_norm"}

    project.set_values(mb4=1e-3)
    result = project.run("--golden-certify")
    result.assert_outcomes(passed=2, failed=1)
    out = result.stdout.str()
    assert "not the same math: grad_norm differs by 1.0e-03 in float64 at step 0" in out
    assert "float64 oracle bound (--golden-certify)" in out
    row = project.mismatch_row(result, "loss")
    assert row["allowed"].startswith("rtol=1e-06, atol=1e-12")
    assert 'record it by running the reference: `pytest --golden-certify -k "mb8"`' in out


def test_the_oracle_runs_in_float64_and_the_declared_run_in_its_precision(project):
    project.pytester.makeini(BF16)
    project.write(
        """
import torch

def test_x(golden, values):
    batch = golden.rollout(lambda: {"x": torch.ones(2, 3), "ids": torch.arange(2)})
    seen = {
        "precision": golden.precision,
        "certifying": golden.certifying,
        "dtype": str(golden.dtype),
        "compute": str(golden.compute_dtype),
        "default": str(torch.get_default_dtype()),
        "batch": str(batch["x"].dtype),
        "ids": str(batch["ids"].dtype),
    }
    with torch.autocast("cpu", dtype=torch.bfloat16):  # an outer autocast of the trainer
        with golden.autocast():
            seen["matmul"] = str((batch["x"] @ batch["x"].T).dtype)
    (__import__("pathlib").Path(str(values.get("out")))).write_text(__import__("json").dumps(seen))
    golden.check({"x": batch["x"].sum()})
"""
    )
    out = project.path / "seen.json"
    project.set_values(out=str(out))
    project.run().assert_outcomes(passed=1)
    assert json.loads(out.read_text()) == {
        "precision": "bf16",
        "certifying": False,
        "dtype": "torch.float32",
        "compute": "torch.bfloat16",
        "default": "torch.float32",
        "batch": "torch.float32",
        "ids": "torch.int64",
        "matmul": "torch.bfloat16",
    }
    project.run("--golden-certify").assert_outcomes(passed=1)
    assert json.loads(out.read_text()) == {
        "precision": "float64",
        "certifying": True,
        "dtype": "torch.float64",
        "compute": "torch.float64",
        "default": "torch.float64",
        "batch": "torch.float64",
        "ids": "torch.int64",
        "matmul": "torch.float64",  # the outer autocast does not lower the oracle
    }


def test_certify_needs_recorded_inputs_and_in_ci_a_recorded_oracle(project, monkeypatch):
    loop(project)
    result = project.run("--golden-certify")
    result.assert_outcomes(failed=3)
    assert "holds no recorded rollout for the float64 oracle to replay" in result.stdout.str()
    project.run("--update-golden")
    monkeypatch.setenv("CI", "true")
    result = project.run("--golden-certify")
    result.assert_outcomes(failed=3)
    out = result.stdout.str()
    assert "has no float64 oracle (@lanes/float64-oracle); record it with `pytest" in out
    monkeypatch.delenv("CI")
    project.run("--golden-certify").assert_outcomes(passed=3)
    monkeypatch.setenv("CI", "true")
    project.run("--golden-certify").assert_outcomes(passed=3)  # CI replays the oracle


def test_certify_and_calibrate_exclude_each_other(project):
    loop(project)
    result = project.run("--golden-certify", "--golden-calibrate", "2")
    assert "--golden-calibrate certifies the same_math() variants in float64 itself" in (
        result.stderr.str()
    )


def _calibrated(project) -> dict:
    """tolerances.json of the golden; none where calibration kept every default."""
    path = project.golden_dir("test_train[mb8]") / "tolerances.json"
    return json.loads(path.read_text()) if path.exists() else {}


@pytest.mark.parametrize(
    ("micro", "ini"),
    [
        ((8, 4), BF16),  # one variant, and it is the bug
        ((8, 4, 2), BF16),
        ((8, 4, 2, 1), BF16),
        ((8, 4, 2), "[pytest]\n"),  # float32
    ],
    ids=["bf16-1-variant", "bf16-2-variants", "bf16-3-variants", "float32-2-variants"],
)
def test_a_bug_among_the_variants_never_widens_the_lane_and_fails_after(project, micro, ini):
    loop(project, micro, ini)
    project.run("--update-golden")
    project.set_values(mb4=1e-3)
    result = project.run("--golden-calibrate", "2")
    out = result.stdout.str()
    assert (
        "test_it.py::test_train[mb4]: not the same math: grad_norm differs by 1.0e-03 in "
        "float64 at step 0: left out of the variant lane on every value"
    ) in out
    content = _calibrated(project)
    if len(micro) > 2:  # one variant alone, left out, measures no variant lane
        certificate = content["variants"]["test_it.py::test_train[mb4]"]["certificate"]
        assert certificate["verdict"] == "not the same math"
    for name, spread in content.get("layout_spreads", {}).items():
        assert spread["rel_spread"] < 1e-3 / 2, name  # the 1e-3 is in no spread
    result = project.run("--golden-strict")
    result.assert_outcomes(passed=len(micro) - 1, failed=1)  # only the bug fails
    assert "FAILED test_it.py::test_train[mb4]" in result.stdout.str()
    project.set_values()
    project.run("--golden-strict").assert_outcomes(passed=len(micro))


def test_certified_bf16_variants_pass_after_calibration_without_a_written_tolerance(project):
    loop(project)
    project.run("--update-golden").assert_outcomes(passed=2, failed=1)
    result = project.run("--golden-calibrate", "2")
    out = result.stdout.str()
    for variant in ("mb4", "mb2"):  # float64 reordering: ~1e-16, some 1e-10 x the bound
        assert re.search(
            rf"test_it\.py::test_train\[{variant}\]: certified same math in float64 \(within "
            r"[\d.]+e-1\d x the bound\): kept in the variant lane on every value",
            out,
        ), out
    result = project.run("--golden-strict")
    result.assert_outcomes(passed=3)
    assert "tolerances looser than the defaults, from calibrated files:" in result.stdout.str()


def test_code_that_cannot_run_in_float64_is_not_certified_and_says_so(project):
    loop(project)
    source = (project.path / "test_it.py").read_text()
    project.write(
        source.replace(
            "    torch.manual_seed(0)\n",
            "    torch.manual_seed(0)\n"
            "    if golden.certifying:\n"
            "        raise RuntimeError('no float64 kernel for this op')\n",
        )
    )
    project.run("--update-golden")
    result = project.run("--golden-calibrate", "2", "-rs")
    # the oracle runs skip; mb2's bf16 runs still fail the defaults, as without calibration
    result.assert_outcomes(passed=4, failed=2, skipped=3)
    out = result.stdout.str()
    assert "float64 oracle: its float64 run could not run: RuntimeError: no float64 kernel" in out
    assert (
        "test_it.py::test_train[mb4]: not certified (its float64 run could not run: "
        "RuntimeError: no float64 kernel for this op): judged by the outlier rule"
    ) in out


def test_regenerating_the_inputs_leaves_the_oracle_stale_and_says_how_to_recertify(project):
    loop(project, ini="[pytest]\n")
    project.run("--update-golden").assert_outcomes(passed=3)
    project.run("--golden-certify").assert_outcomes(passed=3)
    source = (project.path / "test_it.py").read_text()
    project.write(source.replace("manual_seed(step)", "manual_seed(step + 100)"))  # new rollouts
    project.run("--update-golden", "--golden-regenerate", "-k", "mb8").assert_outcomes(
        passed=1, deselected=2
    )
    result = project.run("--golden-certify", "-k", "mb8")
    result.assert_outcomes(failed=1, deselected=2)
    out = result.stdout.str()
    assert "the float64 oracle was computed on other inputs than the golden holds" in out
    assert "`pytest --golden-certify --update-golden`" in out
    project.run("--golden-certify", "--update-golden").assert_outcomes(passed=3)
    project.run("--golden-certify").assert_outcomes(passed=3)
