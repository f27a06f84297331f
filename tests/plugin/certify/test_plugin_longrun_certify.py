"""A long bf16 run whose step holds two Adam updates, calibrated with a same-math micro-batch
variant (issue 43 item 5): the variant passes after calibration, and the bugs introduced after
it (a loss x1.001, per-micro-batch token means, gradients divided by the accumulation steps
twice) fail in the float64 oracle, the gate CI runs for certified variants
(`pytest --golden-certify`, docs/guide/long-runs.md), whatever the bf16 band lets pass."""

from __future__ import annotations

import pytest

# Each step: a rollout of 8 rows cut into two optimizer updates of 4 rows, each accumulated
# over micro-batches of `mb` rows under golden.autocast(), a token-mean loss over the update.
# ``values[bug]`` plants a bug in the variant (mb2) only: in the reference (one micro-batch per
# update) per-micro-batch means and a second division by accumulation steps change nothing.
LOOP = """
import pytest
import torch
from pytest_rollout_golden import same_math

def make_rollout(step):
    g = torch.Generator().manual_seed(step)
    return {
        "tokens": torch.randint(0, 50, (8, 12), generator=g),
        "mask": torch.rand(8, 12, generator=g) > torch.rand(8, 1, generator=g),
        "old_log_probs": -3 * torch.rand(8, 12, generator=g),
        "rewards": torch.rand(8, generator=g),
    }

@pytest.mark.parametrize("mb", same_math([4, 2], ids=lambda v: f"mb{v}"))
def test_train(golden, values, mb):
    torch.manual_seed(0)
    emb = torch.nn.Embedding(50, 32).to(golden.dtype)
    head = torch.nn.Linear(32, 50).to(golden.dtype)
    params = [*emb.parameters(), *head.parameters()]
    opt = torch.optim.Adam(params, lr=1e-2)
    bug = values.get("bug") if mb == 2 else None
    accumulation = 4 // mb
    for step in range(12):
        batch = golden.rollout(lambda: make_rollout(step), step=step)
        r = batch["rewards"].view(-1, 4)
        adv = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-6)).view(-1, 1)
        total, norms = 0.0, []
        for update in (range(0, 4), range(4, 8)):  # two optimizer updates per step
            opt.zero_grad()
            tokens = batch["mask"][update.start : update.stop].sum()
            for i in range(update.start, update.stop, mb):
                rows = slice(i, i + mb)
                with golden.autocast():
                    logits = head(torch.tanh(emb(batch["tokens"][rows])))
                logp = torch.log_softmax(logits.to(golden.dtype), -1)
                logp = logp.gather(-1, batch["tokens"][rows, :, None])[..., 0]
                ratio = torch.exp(logp - batch["old_log_probs"][rows])
                per_token = adv[rows] * ratio * batch["mask"][rows]
                if bug == "token_mean":  # each micro-batch's own token mean, averaged
                    loss = -per_token.sum() / batch["mask"][rows].sum() / accumulation
                else:
                    loss = -per_token.sum() / tokens
                if bug == "accumulation":  # divided by the accumulation steps once more
                    loss = loss / accumulation
                loss.backward()
                total = total + loss.detach() * (1.001 if bug == "x1.001" else 1.0)
            norms.append(torch.nn.utils.clip_grad_norm_(params, 1e9))
            opt.step()
        golden.check({"loss": total / 2, "grad_norm": norms[0], "grad_norm_2": norms[1]}, step=step)
"""
BF16 = "[pytest]\ngolden_precision = bf16\n"


@pytest.fixture
def calibrated(project):
    project.pytester.makeini(BF16)
    project.write(LOOP)
    project.set_values()
    project.run("--update-golden")
    result = project.run("--golden-calibrate", "3")
    assert "certified same math in float64" in result.stdout.str(), result.stdout.str()
    project.run("--golden-certify").assert_outcomes(passed=2)  # the oracle lane, committed
    return project


@pytest.mark.parametrize("bug", ["x1.001", "token_mean", "accumulation"])
def test_a_bug_after_calibration_fails_the_float64_oracle_ci_runs(calibrated, bug, monkeypatch):
    monkeypatch.setenv("CI", "true")
    result = calibrated.run()
    result.assert_outcomes(passed=2)  # the same-math variant: no false alarm
    (line,) = [x for x in result.outlines if "test_train[mb2] (12 steps)" in x]
    assert "`pytest --golden-certify` in CI gates it in float64" in line, line
    calibrated.run("--golden-certify").assert_outcomes(passed=2)  # nor in float64
    calibrated.set_values(bug=bug)
    bf16 = calibrated.run()
    result = calibrated.run("--golden-certify")
    result.assert_outcomes(passed=1, failed=1)
    out = result.stdout.str()
    assert "test_train[mb2]" in out and "float64 oracle bound (--golden-certify)" in out, out
    beyond = [line for line in out.splitlines() if "first divergence" in line]
    in_bf16 = [line for line in bf16.stdout.str().splitlines() if "first divergence" in line]
    print(f"\nMEASURED {bug}: bf16 run {bf16.parseoutcomes()} {in_bf16[:1]}; oracle {beyond[:1]}")
