"""verl 0.7's legacy ``DataParallelPPOCritic`` on CPU, for the real-trainer lane.

Runs, as ``actor_harness.py`` does (whose CPU shims, rollout batch, tiny Qwen2 config and
``BatchRun`` it uses), only in a process whose ``sys.path`` puts the verl 0.7 target dir
first. The critic is a tiny
``Qwen2ForTokenClassification`` with one label (verl's ``AutoModelForTokenClassification``
critic: ``output.logits`` are the values); its forward runs under verl's own
``torch.autocast(bfloat16)``, which on CPU computes the linear layers in bf16.

One step is what verl's ``RayPPOTrainer`` does for the critic: ``compute_values`` (the
rollout's values, masked), GAE (``compute_gae_advantage_return``, γ = 1, λ = 0.95) on the
batch's rewards, then ``update_critic``; its metrics (``critic/vf_loss``, ``vf_clipfrac``,
``vpred_mean``, ``grad_norm``) reduced by ``reduce_metrics``.

Seeded bug (``bug=``), a patch of verl's own ``update_critic`` for one critic instance:

* ``"micro_batch_norm"``: the micro-batch loss is no longer scaled by
  ``1/gradient_accumulation``, so each micro-batch's loss, normalized by its own counts,
  is summed: the gradient grows with the number of micro-batches (verl #6957). The logged
  ``critic/vf_loss`` keeps its scale; ``critic/grad_norm`` shows it.
"""

from __future__ import annotations

from typing import Any

import torch
from actor_harness import (
    BatchRun,
    StepOutput,
    install_cpu_shims,
    make_batch,
    patched_method,
    qwen2_config,
    same_math_cases,
    token_mean_cases,
)

__all__ = ["ALL_CASES", "BUGGED", "SAME_MATH", "STEPS", "CriticRun", "make_batch"]

BUGS = ("micro_batch_norm",)

# The legacy critic's forward hard-codes ``torch.autocast(dtype=torch.bfloat16)`` where the
# actor takes ``fsdp_config.dtype``; on CPU that runs the linear layers in bf16, whose
# rounding moves with the micro-batch's shape. Autocast off: float32, as the actor lane runs.
_FLOAT32_FORWARD = (
    r"torch\.autocast\(device_type=self\.device_name, dtype=torch\.bfloat16\)",
    "torch.autocast(device_type=self.device_name, enabled=False)",
)

_BUG_EDITS = {
    "micro_batch_norm": [
        (
            r"(loss_scale_factor = 1 / self\.gradient_accumulation\s+)"
            r"loss = vf_loss \* loss_scale_factor",
            r"\1loss = vf_loss",
        )
    ],
}


def tiny_qwen2_critic(seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """A ``Qwen2ForTokenClassification`` in ``dtype`` with one label, hidden 64, 2 layers."""
    from transformers import Qwen2ForTokenClassification

    # classifier_dropout 0: as verl's fsdp_workers builds its critic
    config = qwen2_config(num_labels=1, classifier_dropout=0.0)
    torch.manual_seed(seed)
    return Qwen2ForTokenClassification(config).to(dtype)


class CriticRun(BatchRun):
    """One tiny critic + AdamW + verl 0.7 ``DataParallelPPOCritic``, stepped on rollouts."""

    def __init__(
        self,
        *,
        ppo_micro_batch_size_per_gpu: int = 8,
        use_dynamic_bsz: bool = False,
        max_token_len: int = 48,
        use_remove_padding: bool = False,
        loss_agg_mode: str = "seq-mean-token-mean",
        ppo_mini_batch_size: int = 8,
        cliprange_value: float = 0.5,
        grad_clip: float = 1.0,
        lr: float = 1e-3,
        bug: str | None = None,
        seed: int = 0,
        dtype: torch.dtype = torch.float32,
    ):
        install_cpu_shims()
        from verl.workers.config import FSDPEngineConfig
        from verl.workers.config.critic import FSDPCriticConfig, FSDPCriticModelCfg
        from verl.workers.critic.dp_critic import DataParallelPPOCritic

        super().__init__(bug, BUGS, ppo_micro_batch_size_per_gpu, use_dynamic_bsz, max_token_len)
        model = FSDPCriticModelCfg(
            path="unused",  # the critic module is built here, from a config
            use_remove_padding=use_remove_padding,
            fsdp_config=FSDPEngineConfig(dtype="float32"),
        )
        config = FSDPCriticConfig(
            strategy="fsdp",
            rollout_n=4,
            ppo_mini_batch_size=ppo_mini_batch_size,
            ppo_micro_batch_size_per_gpu=ppo_micro_batch_size_per_gpu,
            use_dynamic_bsz=use_dynamic_bsz,
            ppo_max_token_len_per_gpu=max_token_len,
            loss_agg_mode=loss_agg_mode,
            cliprange_value=cliprange_value,
            grad_clip=grad_clip,
            ppo_epochs=1,
            shuffle=False,
            model=model,
            model_config=object(),  # HFModelConfig would load `path`; the critic never reads it
        )
        self.model = tiny_qwen2_critic(seed, dtype)
        self.optimizer = self.adamw(self.model, lr)
        self.critic = DataParallelPPOCritic(config, self.model, self.optimizer)
        self.critic._forward_micro_batch = patched_method(
            self.critic, "_forward_micro_batch", [_FLOAT32_FORWARD]
        )
        if bug is not None:
            self.critic.update_critic = patched_method(
                self.critic, "update_critic", _BUG_EDITS[bug]
            )

    def step(self, batch: dict[str, torch.Tensor]) -> StepOutput:
        """compute_values, GAE, update_critic; reduced metrics and the rollout's values."""
        from verl.trainer.ppo.core_algos import compute_gae_advantage_return
        from verl.utils.metric import reduce_metrics

        data = self._dataproto(batch)
        values = self.critic.compute_values(data)
        mask = data.batch["response_mask"]
        _, returns = compute_gae_advantage_return(
            token_level_rewards=data.batch["token_level_scores"],
            values=values,
            response_mask=mask,
            gamma=1.0,
            lam=0.95,
        )
        data.batch["values"] = values
        data.batch["returns"] = returns
        raw = self.critic.update_critic(data)
        metrics = {k: float(v) for k, v in reduce_metrics(raw).items()}
        return StepOutput(
            metrics=metrics, old_log_prob=values.detach().clone(), response_mask=mask.bool()
        )


# ---------------------------------------------------------------------- the cases

REFERENCE = "c_mb8"
TOKEN_MEAN_REFERENCE = "c_tm_mb8"

SAME_MATH = same_math_cases("c_")
# the seeded bug, declared as a variant of the reference: it must fail
BUGGED: dict[str, dict[str, Any]] = {
    "c_bug_mbnorm": {"ppo_micro_batch_size_per_gpu": 4, "bug": "micro_batch_norm"},
}
# verl's default token-mean: the legacy critic divides per micro-batch (a real change)
TOKEN_MEAN = token_mean_cases("c_")
ALL_CASES = {**SAME_MATH, **BUGGED, **TOKEN_MEAN}
STEPS = 3
