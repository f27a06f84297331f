"""``optimizer_state``: torch.optim state named by parameter, from every form it is given in,
and the tolerances its entries resolve to."""

from __future__ import annotations

import pytest
import torch

from pytest_rollout_golden import optimizer_state
from pytest_rollout_golden._internal.golden.optimizer import flat
from pytest_rollout_golden._internal.tolerance.stack import Stack


def trained(
    optimizer: str = "adamw", steps: int = 2
) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    if optimizer == "sgd":
        opt: torch.optim.Optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    elif optimizer == "sgd-no-momentum":
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(steps):
        model(torch.ones(2, 3)).sum().backward()
        opt.step()
        opt.zero_grad()
    return model, opt


NAMES = ["0.weight", "0.bias", "2.weight", "2.bias"]


def test_adam_state_is_named_by_parameter_identity():
    model, opt = trained()
    state = optimizer_state(opt, model)
    assert list(state) == NAMES
    assert all(list(entries) == ["exp_avg", "exp_avg_sq", "step"] for entries in state.values())
    assert state["2.weight"]["exp_avg"] is not opt.state[model[2].weight]["exp_avg"]
    assert torch.equal(state["2.weight"]["exp_avg"], opt.state[model[2].weight]["exp_avg"])
    assert float(state["0.bias"]["step"]) == 2.0
    model(torch.ones(2, 3)).sum().backward()
    opt.step()  # updates the state in place: the named state is a copy taken before
    assert float(state["0.bias"]["step"]) == 2.0


def test_parameter_order_of_the_optimizer_does_not_change_the_names():
    model, _ = trained(steps=0)
    params = list(model.parameters())
    opt = torch.optim.Adam([{"params": params[2:]}, {"params": params[:2], "lr": 0.0}])
    model(torch.ones(2, 3)).sum().backward()
    opt.step()
    state = optimizer_state(opt, model)
    assert torch.equal(state["0.weight"]["exp_avg"], opt.state[params[0]]["exp_avg"])
    assert sorted(state) == sorted(NAMES)


def test_every_form_gives_the_same_named_state():
    model, opt = trained()
    by_model = optimizer_state(opt, model)
    forms = {
        "pairs": optimizer_state(opt, model.named_parameters()),
        "mapping": optimizer_state(opt, dict(model.named_parameters())),
        "state_dict": optimizer_state(opt.state_dict(), model),
        "named": optimizer_state(by_model),
        "by name keys": optimizer_state({"state": by_model, "param_groups": [{}]}),
    }
    for form, state in forms.items():
        assert flat(state).keys() == flat(by_model).keys(), form
        assert all(torch.equal(flat(state)[k], v) for k, v in flat(by_model).items()), form


def test_an_optimizer_built_from_named_parameters_needs_no_model():
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.Adam(model.named_parameters())
    model(torch.ones(1, 2)).sum().backward()
    opt.step()
    assert list(optimizer_state(opt)) == ["weight", "bias"]
    assert list(optimizer_state(opt.state_dict())) == ["weight", "bias"]


def test_sgd_momentum_and_entries_without_a_value():
    model, opt = trained("sgd")
    assert all(list(e) == ["momentum_buffer"] for e in optimizer_state(opt, model).values())
    model, opt = trained("sgd-no-momentum")
    assert all(e == {} for e in optimizer_state(opt, model).values())  # momentum_buffer: None


def test_master_weights_and_numbers_become_entries():
    model, opt = trained()
    masters = {n: p.detach().double() for n, p in model.named_parameters()}
    state = optimizer_state(opt, model, master_weights=masters)
    assert state["0.weight"]["master_weight"].dtype == torch.float64
    named = optimizer_state({"w": {"step": 3, "exp_avg": torch.zeros(2)}})
    assert named["w"]["step"].dtype == torch.int64 and int(named["w"]["step"]) == 3


def test_what_cannot_be_named_is_an_error_saying_what_to_pass():
    _, opt = trained()
    with pytest.raises(TypeError, match="pass model="):
        optimizer_state(opt)
    with pytest.raises(TypeError, match="needs model= to name"):
        optimizer_state(opt.state_dict())
    with pytest.raises(ValueError, match=r"parameter #0 of the optimizer \(shape \(4, 3\)\)"):
        optimizer_state(opt, torch.nn.Linear(3, 4))
    with pytest.raises(ValueError, match="numbers 4 parameters, model= has 2"):
        optimizer_state(opt.state_dict(), torch.nn.Linear(3, 4))
    with pytest.raises(TypeError, match=r"expected a torch\.optim optimizer"):
        optimizer_state([1, 2])
    with pytest.raises(TypeError, match="maps each parameter name"):
        optimizer_state({"w": torch.zeros(2)})
    with pytest.raises(TypeError, match="'w/exp_avg': expected a tensor or a number"):
        optimizer_state({"w": {"exp_avg": "zeros"}})


@pytest.mark.parametrize(
    ("name", "rtol", "atol", "scale"),
    [
        ("optimizer/policy.layers.0.weight/exp_avg", 1e-4, 0.0, "recorded"),
        ("optimizer/0.weight/momentum_buffer", 1e-4, 0.0, "recorded"),
        ("optimizer/0.weight/exp_avg_sq", 2e-4, 0.0, "recorded"),
        ("optimizer/0.weight/max_exp_avg_sq", 2e-4, 0.0, "recorded"),
        ("optimizer/0.weight/step", 0.0, 0.0, 0.0),
        ("optimizer/0.weight/master_weight", 1e-4, 1e-8, "recorded"),
    ],
)
def test_optimizer_entries_resolve_to_their_families(name, rtol, atol, scale):
    tol, source = Stack().resolver().resolve(name, ("float32",))
    assert (tol.rtol, tol.atol, tol.scale) == (rtol, atol, scale)
    assert "built-in default" in source


def test_an_empty_state_is_refused_unless_the_golden_holds_that_step(tmp_path):
    from pytest_rollout_golden import Golden, GoldenMismatch

    model, opt = trained(steps=0)
    empty = r"step 0: the optimizer holds no state.*after optimizer"
    with pytest.raises(ValueError, match=empty), Golden(tmp_path) as golden:
        golden.check_optimizer(opt, step=0, model=model)
    model, opt = trained(steps=1)
    with Golden(tmp_path) as golden:
        golden.check_optimizer(opt, step=0, model=model)
    model, opt = trained(steps=0)  # the state was never restored: every entry is missing
    with pytest.raises(GoldenMismatch, match=r"12 of 12 checks failed"), Golden(tmp_path) as g:
        g.check_optimizer(opt, step=0, model=model)
