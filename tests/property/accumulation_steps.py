"""Reference training steps for the accumulation sweep (float64), correct and broken.

A tiny policy (an embedding of the context token, a linear head over the vocabulary) takes
policy-gradient steps on ragged batches: ``loss = -A · log π(response token)`` over the valid
tokens of the response mask, per-sample advantages broadcast over the tokens (verl's layout).
:class:`TokenMeanStep` is the correct loop; every other class changes one piece of it, the way
a framework got it wrong (or right, differently).
"""

from __future__ import annotations

import torch
from torch import Tensor

from pytest_rollout_golden.invariants import AccumulationSetting

VOCAB, HIDDEN, LR = 7, 3, 0.1


class TinyPolicy(torch.nn.Module):
    """Log probabilities of ``responses`` given ``input_ids``, one token at a time."""

    def __init__(self, dtype: torch.dtype):
        super().__init__()
        generator = torch.Generator().manual_seed(0)  # the same initial model every call
        self.embedding = torch.nn.Parameter(torch.randn(VOCAB, HIDDEN, generator=generator))
        self.head = torch.nn.Parameter(torch.randn(HIDDEN, VOCAB, generator=generator))
        self.to(dtype)

    def forward(self, input_ids: Tensor, responses: Tensor) -> Tensor:
        logits = torch.tanh(self.embedding[input_ids]) @ self.head
        return logits.log_softmax(-1).gather(-1, responses.unsqueeze(-1)).squeeze(-1)


def ragged_batch(seed: int, *, rows: tuple[int, ...] = tuple(range(2, 9))) -> dict[str, Tensor]:
    """A batch of ``B`` rows (drawn from ``rows``), padded length ``T`` in ``[1, 8]``, row
    lengths in ``[0, T]`` (at least one valid token), per-sample advantages in ``[-2, 2]``
    broadcast over the row; padding holds other token ids and the row's advantage."""
    g = torch.Generator().manual_seed(seed)
    size = rows[int(torch.randint(len(rows), (1,), generator=g))]
    width = int(torch.randint(1, 9, (1,), generator=g))
    lengths = torch.randint(0, width + 1, (size,), generator=g)
    lengths[int(torch.randint(size, (1,), generator=g))] = max(int(lengths.max()), 1)
    mask = torch.arange(width) < lengths.unsqueeze(-1)
    advantages = (torch.rand(size, 1, generator=g, dtype=torch.float64) * 4 - 2).expand(-1, width)
    return {
        "input_ids": torch.randint(VOCAB, (size, width), generator=g),
        "responses": torch.randint(VOCAB, (size, width), generator=g),
        "response_mask": mask,
        "advantages": advantages.contiguous(),
    }


def distinct_batch(seed: int) -> dict[str, Tensor]:
    """A ragged batch on which every bug below changes the math: 4, 6 or 8 rows (micro-batches
    of two rows exist), two rows of different lengths, no two equal advantages."""
    batch = ragged_batch(seed, rows=(4, 6, 8))
    mask = batch["response_mask"]
    if mask.shape[1] < 2:
        batch = {k: torch.cat([v, v[:, :1]], dim=1) for k, v in batch.items()}
        mask = batch["response_mask"]
    mask[0], mask[1] = True, torch.arange(mask.shape[1]) < 1
    size = mask.shape[0]
    spread = torch.linspace(-1.5, 1.7, size, dtype=torch.float64)
    order = torch.randperm(size, generator=torch.Generator().manual_seed(seed))
    batch["advantages"] = spread[order].unsqueeze(-1).expand_as(mask).contiguous()
    return batch


class TokenMeanStep:
    """Correct: token-mean over the optimizer step's tokens, each micro-batch's sum divided
    by that global count, so the accumulated gradient is the full step's."""

    def __call__(self, batch: dict[str, Tensor], setting: AccumulationSetting) -> dict[str, Tensor]:
        model = TinyPolicy(setting.dtype)
        optimizer = torch.optim.SGD(model.parameters(), lr=LR)
        losses = []
        for micro_batches in setting.schedule():  # one optimizer step each
            optimizer.zero_grad()
            step_rows = [r for rows in micro_batches for r in rows]
            total = 0.0
            for index, rows in enumerate(micro_batches):
                micro = {k: v[list(rows)] for k, v in batch.items()}
                micro["advantages"] = self.advantages(batch, step_rows, index, setting)
                loss = self.micro_loss(model, micro, batch, step_rows, setting)
                self.backward(model, loss, index, setting)
                total += float(loss.detach())
            losses.append(total)
            optimizer.step()
        return {
            **{f"grad/{n}": p.grad.clone() for n, p in model.named_parameters()},
            **{f"param/{n}": p.detach().clone() for n, p in model.named_parameters()},
            "loss": torch.tensor(losses, dtype=setting.dtype).mean(),
        }

    def token_losses(self, model: TinyPolicy, micro: dict[str, Tensor]) -> Tensor:
        """Per-token loss, zero on padding."""
        log_probs = model(micro["input_ids"], micro["responses"])
        return torch.where(micro["response_mask"], -micro["advantages"] * log_probs, 0.0)

    def micro_loss(self, model, micro, batch, step_rows, setting) -> Tensor:
        step_tokens = int(batch["response_mask"][step_rows].sum())
        return self.token_losses(model, micro).sum() / max(step_tokens, 1)

    def advantages(self, batch, step_rows, index, setting) -> Tensor:
        """This micro-batch's advantages: the same rows as its log probs."""
        size = setting.micro_batch_size
        return batch["advantages"][step_rows[index * size : (index + 1) * size]]

    def backward(self, model, loss: Tensor, index: int, setting) -> None:
        loss.backward()


class LocalMeanRescaledStep(TokenMeanStep):
    """Correct, verl's form: the micro-batch's own token mean times its share of the step's
    tokens."""

    def micro_loss(self, model, micro, batch, step_rows, setting):
        tokens = int(micro["response_mask"].sum())
        step_tokens = max(int(batch["response_mask"][step_rows].sum()), 1)
        mean = self.token_losses(model, micro).sum() / max(tokens, 1)
        return mean * tokens / step_tokens


class TrainerDividesStep(TokenMeanStep):
    """Correct, TRL's form: the loss normalized by the step's tokens per accumulation step
    (``num_items_in_batch / gradient_accumulation_steps``), then divided by the accumulation
    steps before backward."""

    def micro_loss(self, model, micro, batch, step_rows, setting):
        step_tokens = max(int(batch["response_mask"][step_rows].sum()), 1)
        items = step_tokens / setting.accumulation_steps
        return self.token_losses(model, micro).sum() / items / setting.accumulation_steps


class SeqMeanTokenMeanStep(TokenMeanStep):
    """Correct: each sequence's token mean, averaged over the step's sequences that have a
    valid token."""

    def micro_loss(self, model, micro, batch, step_rows, setting):
        per_row = self.token_losses(model, micro).sum(-1)
        row_tokens = micro["response_mask"].sum(-1).clamp(min=1)
        step_seqs = max(int(batch["response_mask"][step_rows].any(-1).sum()), 1)
        return (per_row / row_tokens).sum() / step_seqs


CORRECT = [TokenMeanStep, LocalMeanRescaledStep, TrainerDividesStep, SeqMeanTokenMeanStep]


class DoubleDivisionStep(TokenMeanStep):
    """Bug (a): the global token-mean divided by the accumulation steps once more."""

    def micro_loss(self, model, micro, batch, step_rows, setting):
        return super().micro_loss(model, micro, batch, step_rows, setting) / (
            setting.accumulation_steps
        )


class SampleWeightedMeanStep(TokenMeanStep):
    """Bug (b): each micro-batch's token mean weighted by its share of the step's samples;
    wrong when micro-batches hold different token counts."""

    def micro_loss(self, model, micro, batch, step_rows, setting):
        tokens = int(micro["response_mask"].sum())
        mean = self.token_losses(model, micro).sum() / max(tokens, 1)
        return mean * micro["response_mask"].shape[0] / len(step_rows)


class UnscaledSumStep(TokenMeanStep):
    """Bug (e): TRL's form without the trainer's division by the accumulation steps: every
    gradient ``k`` times too large."""

    def micro_loss(self, model, micro, batch, step_rows, setting):
        step_tokens = max(int(batch["response_mask"][step_rows].sum()), 1)
        return self.token_losses(model, micro).sum() / (step_tokens / setting.accumulation_steps)


class ZeroGradInLoopStep(TokenMeanStep):
    """Bug (c): ``zero_grad`` before every micro-batch's backward: only the last one counts."""

    def backward(self, model, loss, index, setting):
        model.zero_grad()
        loss.backward()


class LastMicroBatchLostStep(TokenMeanStep):
    """Bug (c'): the last micro-batch of every optimizer step is never back-propagated."""

    def backward(self, model, loss, index, setting):
        if index < setting.accumulation_steps - 1 or setting.accumulation_steps == 1:
            loss.backward()


class InterleavedAdvantagesStep(TokenMeanStep):
    """Bug (d): advantages sharded interleaved (rows ``i, i + k, ...``) while the log probs
    take contiguous blocks: misaligned whenever a micro-batch holds two or more rows."""

    def advantages(self, batch, step_rows, index, setting):
        return batch["advantages"][step_rows[index :: setting.accumulation_steps]]


BROKEN = {
    "a_double_division": DoubleDivisionStep,
    "b_sample_weighted_mean": SampleWeightedMeanStep,
    "c_zero_grad_in_loop": ZeroGradInLoopStep,
    "c_last_micro_batch_lost": LastMicroBatchLostStep,
    "d_interleaved_advantages": InterleavedAdvantagesStep,
    "e_unscaled_sum": UnscaledSumStep,
}
