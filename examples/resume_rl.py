"""The tiny GRPO loop of tiny_rl.py as a job that checkpoints and resumes, standing in for a
user's trainer and its own save and load code.

``python resume_rl.py --steps 0:3 --save ckpt.pt --out first.safetensors`` trains steps 0-2
and saves a checkpoint; ``python resume_rl.py --steps 3:6 --resume ckpt.pt --out
second.safetensors`` is the restarted job. ``--out`` holds each step's metrics and optimizer
state by parameter name, for the test to check against the golden. ``--forget-optimizer``
resumes the weights but not the optimizer: the Adam moments start again from zero (the
defect of NeMo-RL #3171).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch
from tiny_rl import TrainConfig, generate_rollout, make_trainer, ppo_step

from pytest_rollout_golden import optimizer_state, save_batch


# --8<-- [start:train]
def train(
    start: int,
    stop: int,
    *,
    resume: Path | None = None,
    save: Path | None = None,
    forget_optimizer: bool = False,
    lr: float = TrainConfig.lr,
) -> dict[str, Any]:
    """Steps ``start`` to ``stop - 1``: ``{"step<N>": {"metrics": ..., "optimizer": ...}}``."""
    model, ref, optimizer = make_trainer()
    for group in optimizer.param_groups:
        group["lr"] = lr
    if resume is not None:  # the user's own load
        checkpoint = torch.load(resume, weights_only=True)
        model.load_state_dict(checkpoint["model"])
        if not forget_optimizer:
            optimizer.load_state_dict(checkpoint["optimizer"])
    records = {}
    for step in range(start, stop):
        batch = generate_rollout(step=step)  # rollouts of the initial policy: the same every run
        metrics = ppo_step(model, ref, optimizer, batch, TrainConfig())
        records[f"step{step}"] = {
            "metrics": metrics,
            "optimizer": optimizer_state(optimizer, model),
        }
    if save is not None:  # the user's own save
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, save)
    return records


# --8<-- [end:train]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", required=True, help="START:STOP")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--resume", type=Path)
    parser.add_argument("--save", type=Path)
    parser.add_argument("--forget-optimizer", action="store_true")
    args = parser.parse_args()
    start, stop = (int(s) for s in args.steps.split(":"))
    records = train(
        start, stop, resume=args.resume, save=args.save, forget_optimizer=args.forget_optimizer
    )
    save_batch(args.out, records)


if __name__ == "__main__":
    main()
