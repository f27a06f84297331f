"""``golden.check_optimizer``: optimizer state recorded and compared by parameter name."""

from __future__ import annotations

OPTIMIZER = """
import torch

from pytest_rollout_golden import optimizer_state


class Actor(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.policy = torch.nn.Sequential(
            torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2)
        )

    def forward(self, x):
        return self.policy(x)


def build(values):
    torch.manual_seed(0)
    model = Actor()
    kind = values.get("optimizer", "adamw")
    if kind == "sgd":
        return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    amsgrad = values.get("amsgrad", False)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2, amsgrad=amsgrad)


def test_train(golden, values):
    model, opt = build(values)
    x = torch.linspace(-1, 1, 12).reshape(3, 4)
    for step in range(3):
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        if step == values.get("perturb_step"):
            moment = opt.state[model.policy[0].weight][values["entry"]].view(-1)
            moment[moment.abs().argmax()] *= 1 + values["by"]  # the largest element
        if step == values.get("reset_step"):
            for state in opt.state.values():
                state["exp_avg"].zero_()
                state["exp_avg_sq"].zero_()
        form = values.get("form", "optimizer")
        if form == "optimizer":
            golden.check_optimizer(opt, step=step, model=model)
        elif form == "state_dict":
            golden.check_optimizer(opt.state_dict(), step=step, model=model)
        else:
            named = optimizer_state(opt, model)
            for entry in values.get("drop", []):
                del named["policy.2.bias"][entry]
            golden.check_optimizer(named, step=step)
"""


def test_optimizer_state_record_replay_perturb_fail(project):
    project.write(OPTIMIZER)
    project.set_values()
    project.run().assert_outcomes(passed=1)
    files = sorted(p.name for p in project.golden_dir("test_train").glob("tensors-*"))
    assert files == [f"tensors-optimizer-step00000{s}.safetensors" for s in range(3)]
    project.run("--golden-strict").assert_outcomes(passed=1)
    for form in ("state_dict", "named"):
        project.set_values(form=form)
        project.run("--golden-strict").assert_outcomes(passed=1)

    project.set_values(perturb_step=1, entry="exp_avg", by=1e-3)
    result = project.run()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "golden mismatch: first divergence at step 1: optimizer/policy.0.weight/exp_avg *",
            "tensor 'optimizer/policy.0.weight/exp_avg' (step 1), allowed rtol=0.0001, atol=0, "
            "scale=recorded * (built-in default):",
            "    Mismatched elements: 1 / 32 *",
        ]
    )


def test_second_moment_is_held_to_twice_the_first_moments_rtol(project):
    project.write(OPTIMIZER)
    project.set_values()
    project.run().assert_outcomes(passed=1)
    project.set_values(perturb_step=0, entry="exp_avg_sq", by=1e-4)
    project.run("--golden-strict").assert_outcomes(passed=1)
    project.set_values(perturb_step=0, entry="exp_avg_sq", by=1e-3)
    result = project.run("--golden-strict")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["tensor 'optimizer/policy.0.weight/exp_avg_sq' (step 0), allowed rtol=0.0002, atol=0, *"]
    )


def test_moments_reset_to_zero_fail_naming_every_moment(project):
    project.write(OPTIMIZER)
    project.set_values()
    project.run().assert_outcomes(passed=1)
    project.set_values(reset_step=2)
    result = project.run()
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    for name in ("policy.0.weight", "policy.0.bias", "policy.2.weight", "policy.2.bias"):
        for entry in ("exp_avg", "exp_avg_sq"):
            assert f"tensor 'optimizer/{name}/{entry}' (step 2)" in out
    assert "optimizer/policy.0.weight/step" not in out  # the step count was kept


def test_a_missing_or_extra_state_entry_fails_naming_it(project):
    project.write(OPTIMIZER)
    project.set_values(form="named")
    project.run().assert_outcomes(passed=1)
    files = project.golden_files()

    project.set_values(form="named", drop=["exp_avg_sq"])
    result = project.run()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "tensor 'optimizer/policy.2.bias/exp_avg_sq' (step 0): recorded in the optimizer "
            "state but absent from it in this run*"
        ]
    )

    project.set_values(amsgrad=True)
    result = project.run()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "tensor 'optimizer/policy.0.weight/max_exp_avg_sq' (step 0): not in the recorded "
            "optimizer state (entries recorded for this parameter: exp_avg, exp_avg_sq, step)*"
        ]
    )
    assert project.golden_files() == files  # neither run recorded anything

    project.run("--update-golden").assert_outcomes(passed=1)
    project.run("--golden-strict").assert_outcomes(passed=1)


def test_sgd_momentum_buffer(project):
    project.write(OPTIMIZER)
    project.set_values(optimizer="sgd")
    project.run().assert_outcomes(passed=1)
    project.set_values(optimizer="sgd", perturb_step=2, entry="momentum_buffer", by=1e-3)
    result = project.run()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["tensor 'optimizer/policy.0.weight/momentum_buffer' (step 2)*"])
