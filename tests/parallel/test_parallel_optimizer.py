"""FSDP2 (``fully_shard``) on gloo ranks: its DTensor optimizer state, gathered by
``optimizer_state`` on every rank, replays the golden of the single-process optimizer.

The functions launched live at the top level of this module: workers import them by name.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from pytest_rollout_golden import Golden, GoldenMismatch, Mode, optimizer_state
from pytest_rollout_golden.parallel import launch

STEPS = 3
ROWS = 8


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def train(rank: int, world_size: int, reset_at: int | None) -> list[dict[str, Any]]:
    """``STEPS`` AdamW steps, the batch's rows split over the ranks; each step's named
    optimizer state (``reset_at``: zero the moments after that step)."""
    model = _model()
    if world_size > 1:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    states = []
    for step in range(STEPS):
        x = torch.randn(ROWS, 6, generator=g)
        rows = x.chunk(world_size)[rank]
        model(rows).pow(2).mean().backward()  # FSDP averages the ranks' gradients
        opt.step()
        opt.zero_grad()
        if step == reset_at:
            for state in opt.state.values():
                state["exp_avg"].zero_()
        states.append(optimizer_state(opt, model))  # a collective: every rank gathers
    return states


def gate(directory: Path, states: list[dict[str, Any]], mode: Mode) -> None:
    with Golden(directory, mode=mode) as golden:
        for step, state in enumerate(states):
            golden.check_optimizer(state, step=step)


def test_fsdp2_dtensor_state_is_gathered_and_named():
    ranks = launch(train, 2, 2, None)
    assert ranks[0][0].keys() == {"0.weight", "0.bias", "2.weight", "2.bias"}
    first = ranks[0][-1]["0.weight"]
    assert type(first["exp_avg"]) is torch.Tensor and first["exp_avg"].shape == (16, 6)
    for name, entries in ranks[0][-1].items():  # every rank gathered the same full tensors
        for entry, value in entries.items():
            assert torch.equal(value, ranks[1][-1][name][entry]), f"{name}/{entry}"


def test_fsdp2_replays_the_single_process_golden_and_a_reset_fails(tmp_path: Path):
    gate(tmp_path, train(0, 1, None), Mode.AUTO)
    gate(tmp_path, launch(train, 2, 2, None)[0], Mode.STRICT)

    with pytest.raises(GoldenMismatch) as failed:
        gate(tmp_path, launch(train, 2, 2, 1)[1], Mode.STRICT)
    message = str(failed.value)
    assert message.startswith("golden mismatch: first divergence at step 1: optimizer/")
    names = set(re.findall(r"tensor '(optimizer/[^']+)' \(step 1\)", message))
    assert names == {f"optimizer/{p}/exp_avg" for p in ("0.weight", "0.bias", "2.weight", "2.bias")}
