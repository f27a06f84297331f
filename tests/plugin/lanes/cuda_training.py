"""Shared by the CUDA lane tests: their skip without CUDA and the training loop of their
inner projects (a small MLP, AdamW, gradient clipping, three steps, each step's loss, gradient
norm and first weight checked)."""

from __future__ import annotations

import pytest
import torch


def needs_cuda(what: str) -> pytest.MarkDecorator:
    """Skip, saying that ``what`` was NOT exercised, on a machine without CUDA (CI has none)."""
    return pytest.mark.skipif(
        not torch.cuda.is_available(),
        reason=f"{what} NOT exercised: needs a CUDA device, this machine has none",
    )


TRAIN = """
def train(golden, x, mask, device, dtype, lr):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64)
    ).to(device, dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    for step in range(3):
        out = model(x).float()
        loss = (out.pow(2).mean(-1) * mask).sum() / mask.sum()
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        golden.check({"loss": loss.item(), "grad_norm": norm.item()}, step=step)
        golden.check_tensors("weights", {"w0": model[0].weight.detach()}, step=step)
"""
