"""A tiny but complete GRPO/PPO loop, standing in for a user's RL framework.

The rollout samples responses from a small causal policy (the "inference
engine", with its own bf16 copy of the weights so that rollout and trainer log
probs differ as they do with vLLM), scores them and computes group-relative
advantages. The trainer runs a PPO-clip step with a low-variance KL penalty and
token-mean loss aggregation over micro-batches. Everything runs on the CPU in
well under a second per step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

VOCAB, HIDDEN, PROMPT_LEN, RESPONSE_LEN, EOS = 48, 32, 4, 12, 0


class TinyPolicy(nn.Module):
    """Embedding, a causal running mean over positions, and a linear head."""

    def __init__(self, seed: int = 0):
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.embed = nn.Parameter(torch.randn(VOCAB, HIDDEN, generator=generator) * 0.5)
        self.mix = nn.Parameter(torch.randn(HIDDEN, HIDDEN, generator=generator) / HIDDEN**0.5)
        self.head = nn.Parameter(torch.randn(HIDDEN, VOCAB, generator=generator) / HIDDEN**0.5)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, L, VOCAB]`` for the next token at every position."""
        h = self.embed[input_ids]
        steps = torch.arange(1, input_ids.shape[1] + 1, dtype=h.dtype).view(1, -1, 1)
        context = h.cumsum(dim=1) / steps
        return torch.tanh(context @ self.mix) @ self.head


def token_log_probs(model: nn.Module, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Log probability and entropy of every response token, ``[B, RESPONSE_LEN]`` each."""
    logits = model(input_ids[:, :-1])[:, PROMPT_LEN - 1 :].float()
    log_probs = logits.log_softmax(-1)
    targets = input_ids[:, PROMPT_LEN:]
    chosen = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    return chosen, entropy


@torch.no_grad()
def generate_rollout(
    model: nn.Module | None = None, *, step: int = 0, prompts: int = 4, group: int = 4
) -> dict[str, torch.Tensor]:
    """Sample ``prompts × group`` responses and score them: a verl-style rollout batch."""
    model = model if model is not None else TinyPolicy()
    generator = torch.Generator().manual_seed(1000 + step)
    engine = TinyPolicy()
    engine.load_state_dict(model.state_dict())
    engine = engine.to(torch.bfloat16)  # the inference engine runs in bf16

    prompt = torch.randint(1, VOCAB, (prompts, PROMPT_LEN), generator=generator)
    ids = prompt.repeat_interleave(group, dim=0)
    for _ in range(RESPONSE_LEN):
        probs = engine(ids)[:, -1].float().softmax(-1)
        ids = torch.cat([ids, torch.multinomial(probs, 1, generator=generator)], dim=1)
    responses = ids[:, PROMPT_LEN:]
    ended = (responses == EOS).int().cumsum(dim=1)
    response_mask = (ended - (responses == EOS).int()) == 0  # keep tokens up to the first EOS
    rollout_log_probs, _ = token_log_probs(engine, ids)

    # Reward: how many response tokens are even, scaled to [0, 1].
    score = ((responses % 2 == 0) & response_mask).sum(1).float() / RESPONSE_LEN
    token_level_rewards = torch.zeros_like(rollout_log_probs)
    last = response_mask.sum(1).clamp(min=1) - 1
    token_level_rewards[torch.arange(len(ids)), last] = score
    return {
        "input_ids": ids,
        "prompts": prompt.repeat_interleave(group, dim=0),
        "responses": responses,
        "response_mask": response_mask,
        "rollout_log_probs": rollout_log_probs.float(),
        "token_level_rewards": token_level_rewards,
        "uid": torch.arange(prompts).repeat_interleave(group),
    }


def grpo_advantages(rewards: torch.Tensor, mask: torch.Tensor, uid: torch.Tensor) -> torch.Tensor:
    """GRPO: per-group ``(score - mean) / (std + 1e-6)``, broadcast over response tokens."""
    score = (rewards * mask).sum(-1)
    normalized = torch.zeros_like(score)
    for group in uid.unique():
        members = uid == group
        values = score[members]
        std = values.std() if values.numel() > 1 else torch.tensor(1.0)
        normalized[members] = (values - values.mean()) / (std + 1e-6)
    return normalized.unsqueeze(-1) * mask


@dataclass
class TrainConfig:
    clip_low: float = 0.2
    clip_high: float = 0.28
    kl_coef: float = 0.01
    lr: float = 1e-2
    micro_batches: int = 1
    aggregation: str = "token-mean"  # or "sample-fraction", the classic micro-batch bug


def ppo_step(
    model: nn.Module,
    ref: nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: dict,
    cfg: TrainConfig,
) -> dict[str, float]:
    """One PPO-clip update over ``cfg.micro_batches`` micro-batches; returns the step's metrics."""
    mask = batch["response_mask"].float()
    with torch.no_grad():
        old_log_probs, _ = token_log_probs(model, batch["input_ids"])
        ref_log_probs, _ = token_log_probs(ref, batch["input_ids"])
    advantages = grpo_advantages(batch["token_level_rewards"], mask, batch["uid"])
    global_tokens = mask.sum()
    batch_size = mask.shape[0]

    optimizer.zero_grad()
    sums = {"pg_loss": 0.0, "kl": 0.0, "entropy": 0.0, "pg_clipfrac": 0.0}
    for index in torch.arange(batch_size).chunk(cfg.micro_batches):
        m = mask[index]
        log_probs, entropy = token_log_probs(model, batch["input_ids"][index])
        ratio = torch.exp((log_probs - old_log_probs[index]).clamp(-20, 20))
        adv = advantages[index]
        unclipped = -adv * ratio
        clipped = -adv * ratio.clamp(1 - cfg.clip_low, 1 + cfg.clip_high)
        pg = torch.maximum(unclipped, clipped)
        delta = (ref_log_probs[index] - log_probs).clamp(-20, 20)
        kl = (delta.exp() - delta - 1).clamp(-10, 10)
        per_token = pg + cfg.kl_coef * kl
        if cfg.aggregation == "token-mean":
            weight = 1.0 / global_tokens  # the global normalizer: pieces sum to the full mean
            loss = (per_token * m).sum() * weight
        else:  # each micro-batch's own token mean, weighted by its share of samples (wrong)
            loss = (per_token * m).sum() / m.sum().clamp(min=1) * (len(index) / batch_size)
            weight = 1.0 / global_tokens
        loss.backward()
        with torch.no_grad():
            sums["pg_loss"] += float((pg * m).sum() * weight)
            sums["kl"] += float((kl * m).sum() * weight)
            sums["entropy"] += float((entropy * m).sum() * weight)
            sums["pg_clipfrac"] += float(((clipped > unclipped).float() * m).sum() * weight)
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=10.0)
    optimizer.step()
    return {**sums, "grad_norm": float(grad_norm), "response_length": float(mask.sum(1).mean())}


def make_trainer(seed: int = 0) -> tuple[nn.Module, nn.Module, torch.optim.Optimizer]:
    """The policy, a frozen reference copy, and an Adam optimizer."""
    model, ref = TinyPolicy(seed), TinyPolicy(seed)
    ref.requires_grad_(False)
    return model, ref, torch.optim.Adam(model.parameters(), lr=TrainConfig.lr)
