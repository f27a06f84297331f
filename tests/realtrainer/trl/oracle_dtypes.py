"""The dtypes inside TRL's GRPOTrainer when it runs as the golden's float64 oracle does.

A bf16 reference (TRL's default ``bf16=True``) records its rollouts; the replay then runs
like ``--golden-certify``: torch's default dtype float64, the recorded floating tensors cast to
float64, ``Knobs(dtype="float64", bf16=False)``. Prints the dtype of every tensor on the way
from the model to the logged metrics (MEASURED.md, "The float64 oracle on bf16 GRPO").

    PYTHONPATH=. .venv/bin/python tests/realtrainer/trl/oracle_dtypes.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import grpo_harness as h
import torch


def observe(trainer, seen: dict[str, set[str]]) -> None:
    """Wrap the trainer's log-prob, scoring, loss and clipping calls to note dtypes."""

    def note(key, value):
        seen.setdefault(key, set()).add(str(getattr(value, "dtype", type(value).__name__)))

    logps, score = (
        trainer._get_per_token_logps_and_entropies,
        trainer._generate_and_score_completions,
    )
    loss, clip = trainer._compute_loss, trainer.accelerator.clip_grad_norm_

    def observe_logps(*args, **kwargs):
        out = logps(*args, **kwargs)
        note(f"per-token logps ({'grad' if torch.is_grad_enabled() else 'no_grad'})", out[0])
        note("per-token entropies", out[1])
        return out

    def observe_score(inputs):
        batch = score(inputs)
        for key in ("advantages", "old_per_token_logps", "ref_per_token_logps"):
            if batch.get(key) is not None:
                note(key, batch[key])
        return batch

    def observe_loss(model, inputs):
        out = loss(model, inputs)
        note("loss", out)
        return out

    def observe_clip(*args, **kwargs):
        for p in trainer.model.parameters():
            note("parameters", p)
            if p.grad is not None:
                note("gradients", p.grad)
        out = clip(*args, **kwargs)
        note("grad_norm", out)
        return out

    trainer._get_per_token_logps_and_entropies = observe_logps
    trainer._generate_and_score_completions = observe_score
    trainer._compute_loss = observe_loss
    trainer.accelerator.clip_grad_norm_ = observe_clip


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = h.build_model_dir(Path(tmp) / "model")
        recorder = h.Recorder()
        h.train(h.Knobs(bf16=True), model_dir, Path(tmp) / "reference", recorder)
        torch.set_default_dtype(torch.float64)

        def rollout(step, generate, name):
            batch = recorder(step, generate, name)
            return {k: v.double() if v.is_floating_point() else v for k, v in batch.items()}

        seen: dict[str, set[str]] = {}
        trainer = h.make_trainer(h.Knobs(dtype="float64"), model_dir, Path(tmp) / "oracle", rollout)
        if trainer.ref_model is not None:
            seen["reference model parameters"] = {str(next(trainer.ref_model.parameters()).dtype)}
        observe(trainer, seen)
        with h.quiet():
            trainer.train()
    for key, dtypes in seen.items():
        print(f"{key:32s} {', '.join(sorted(dtypes))}")


if __name__ == "__main__":
    main()
