"""A small decoder-only transformer, trained one PPO step at a time with real TP, PP and DP.

Read it as a model of how the parallel layouts of Megatron-style trainers work; every
layout computes the same step as one process, up to the order of floating-point sums.

* **Tensor parallelism** (``tp`` ranks). Attention heads and the MLP's hidden units are split
  across ranks. ``wq/wk/wv``, ``w_up`` and the LM head are *column-parallel* (each rank holds
  a slice of the output features); ``wo`` and ``w_down`` are *row-parallel* (a slice of the
  input features, so each rank computes a partial sum, completed by an all-reduce). Two
  autograd functions make the gradients right: :class:`_CopyToTP` (identity forward,
  all-reduce backward) in front of a column-parallel layer and :class:`_ReduceFromTP`
  (all-reduce forward, identity backward) behind a row-parallel one. The LM head is split
  over the vocabulary and the log-softmax and entropy are computed without gathering it:
  an all-reduced max and an all-reduced sum of exponentials give ``log Z``.
* **Pipeline parallelism** (``pp`` stages). The layers are split into contiguous stages
  (embeddings on the first, final norm, head and loss on the last). The schedule is
  **GPipe**: every micro-batch's forward first, activations sent to the next stage with
  ``send``/``recv``, then every backward in reverse order, gradients of the activations
  sent back.
* **Data parallelism** (``dp`` replicas). Each replica trains on a contiguous shard of the
  rows. The loss of each micro-batch is divided by the number of valid tokens of the whole
  step (all-reduced over the replicas), so the pieces *add up* to the full-batch token-mean;
  gradients are therefore summed (not averaged) over replicas.
* **Sequence packing**. Padding is removed and a micro-batch's sequences are concatenated
  into one row; position ids restart at every sequence and attention is block-diagonal
  causal (from ``cu_seqlens``), so each token sees exactly what it sees when padded.

One step (:func:`train_step`): PPO-clip loss (:func:`~..reference.losses.ppo_clip_token_losses`)
plus a low-variance KL penalty against the reference log probs of the batch
(:func:`~..reference.losses.kl_penalty`), token-mean over the step, SGD update. Metrics:
``pg_loss``, ``kl``, ``entropy`` (token means over the step) and ``grad_norm`` (before the
update), plus per-token ``log_probs`` of the policy that took the step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from ..reference.advantages import grpo_advantages
from ..reference.losses import aggregate_loss, kl_penalty, ppo_clip_token_losses
from .batching import dp_shards, split_by_count
from .launcher import device, launch
from .layout import Layout

METRICS = ("pg_loss", "kl", "entropy", "grad_norm")


@dataclass(frozen=True)
class PolicyConfig:
    """Model size, training hyper-parameters and the dtype everything is computed in."""

    vocab: int = 32
    hidden: int = 32
    heads: int = 4
    ffn: int = 64
    layers: int = 2
    prompt_len: int = 4
    response_len: int = 8
    dtype: str = "float32"
    lr: float = 0.5
    clip_low: float = 0.2
    clip_high: float = 0.28
    kl_coef: float = 0.05
    seed: int = 0

    @property
    def seq_len(self) -> int:
        return self.prompt_len + self.response_len

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)


# ---------------------------------------------------------------------- weights

COLUMN = ("wq", "wk", "wv", "w_up", "head")  # split along output features
ROW = ("wo", "w_down")  # split along input features


def full_weights(cfg: PolicyConfig) -> dict[str, Tensor]:
    """The unsharded weights, drawn in float64 from ``cfg.seed`` then cast to ``cfg.dtype``."""
    g = torch.Generator().manual_seed(cfg.seed)

    def draw(*shape: int, scale: float) -> Tensor:
        return torch.randn(*shape, generator=g, dtype=torch.float64) * scale

    h, f = cfg.hidden, cfg.ffn
    weights = {"embed": draw(cfg.vocab, h, scale=1.0), "pos": draw(cfg.seq_len, h, scale=0.1)}
    for i in range(cfg.layers):
        weights[f"layers.{i}.norm1"] = 1.0 + draw(h, scale=0.1)
        for name in ("wq", "wk", "wv", "wo"):
            weights[f"layers.{i}.{name}"] = draw(h, h, scale=h**-0.5)
        weights[f"layers.{i}.norm2"] = 1.0 + draw(h, scale=0.1)
        weights[f"layers.{i}.w_up"] = draw(h, f, scale=h**-0.5)
        weights[f"layers.{i}.w_down"] = draw(f, h, scale=f**-0.5)
    weights["norm_f"] = 1.0 + draw(h, scale=0.1)
    weights["head"] = draw(h, cfg.vocab, scale=h**-0.5)
    return {k: v.to(cfg.torch_dtype) for k, v in weights.items()}


def stage_layers(cfg: PolicyConfig, layout: Layout, stage: int) -> range:
    """The transformer layers pipeline stage ``stage`` holds (contiguous, equal counts)."""
    if cfg.layers % layout.pp:
        raise ValueError(f"{cfg.layers} layers cannot be split into {layout.pp} stages")
    per = cfg.layers // layout.pp
    return range(stage * per, (stage + 1) * per)


def shard_weights(
    weights: dict[str, Tensor], cfg: PolicyConfig, layout: Layout, rank: int
) -> dict[str, Tensor]:
    """This rank's parameters: its stage's layers, column/row slices of the TP-split ones."""
    _, stage, tp_rank = layout.coords(rank)
    if cfg.heads % layout.tp or cfg.ffn % layout.tp or cfg.vocab % layout.tp:
        raise ValueError(f"heads, ffn and vocab must be divisible by tp={layout.tp}")
    layers = stage_layers(cfg, layout, stage)
    mine = {}
    for name, value in weights.items():
        if name.startswith("layers.") and int(name.split(".")[1]) not in layers:
            continue
        if name in ("embed", "pos") and stage != 0:
            continue
        if name in ("norm_f", "head") and stage != layout.pp - 1:
            continue
        kind = name.rsplit(".", 1)[-1]
        if kind in COLUMN:
            value = value.chunk(layout.tp, dim=1)[tp_rank]
        elif kind in ROW:
            value = value.chunk(layout.tp, dim=0)[tp_rank]
        mine[name] = value.clone().to(device()).requires_grad_(True)
    return mine


def is_tp_split(name: str) -> bool:
    return name.rsplit(".", 1)[-1] in COLUMN + ROW


# ---------------------------------------------------------------------- process groups


@dataclass
class Groups:
    """This rank's coordinates and process groups (``None`` where the group has one rank)."""

    layout: Layout
    rank: int
    tp: Any = None
    dp: Any = None
    model: Any = None  # the tp x pp ranks of one data-parallel replica
    dp_rank: int = 0
    stage: int = 0
    tp_rank: int = 0
    stage_ranks: list[int] = field(default_factory=list)  # global rank of each stage, my tp/dp


_GROUPS: dict[tuple[int, int, int], dict[str, Any]] = {}


def make_groups(layout: Layout, rank: int) -> Groups:
    """Process groups of ``layout``; created once per (tp, pp, dp) and process (collectively)."""
    dp_rank, stage, tp_rank = layout.coords(rank)
    stage_ranks = [layout.rank_of(dp_rank, s, tp_rank) for s in range(layout.pp)]
    groups = Groups(layout, rank, None, None, None, dp_rank, stage, tp_rank, stage_ranks)
    if layout.world_size == 1:
        return groups
    key = (layout.tp, layout.pp, layout.dp)
    if key not in _GROUPS:  # every rank creates every group, in the same order
        made: dict[str, Any] = {}
        for d in range(layout.dp):
            for s in range(layout.pp):
                ranks = [layout.rank_of(d, s, t) for t in range(layout.tp)]
                made[f"tp{d}.{s}"] = dist.new_group(ranks) if layout.tp > 1 else None
        for s in range(layout.pp):
            for t in range(layout.tp):
                ranks = [layout.rank_of(d, s, t) for d in range(layout.dp)]
                made[f"dp{s}.{t}"] = dist.new_group(ranks) if layout.dp > 1 else None
        for d in range(layout.dp):
            ranks = [layout.rank_of(d, s, t) for s in range(layout.pp) for t in range(layout.tp)]
            made[f"model{d}"] = dist.new_group(ranks) if len(ranks) > 1 else None
        _GROUPS[key] = made
    made = _GROUPS[key]
    groups.tp = made[f"tp{dp_rank}.{stage}"]
    groups.dp = made[f"dp{stage}.{tp_rank}"]
    groups.model = made[f"model{dp_rank}"]
    return groups


def all_reduce(x: Tensor, group: Any, op: Any = None) -> Tensor:
    """In-place all-reduce (sum by default); a no-op without a group."""
    if group is not None:
        dist.all_reduce(x, op=op or dist.ReduceOp.SUM, group=group)
    return x


class _CopyToTP(torch.autograd.Function):
    """In front of a column-parallel layer: identity forward, all-reduce of the grad backward.

    Each TP rank's slice contributes part of the input's gradient; the sum is the gradient.
    """

    @staticmethod
    def forward(ctx: Any, x: Tensor, group: Any) -> Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return all_reduce(grad.contiguous().clone(), ctx.group), None


class _ReduceFromTP(torch.autograd.Function):
    """Behind a row-parallel layer: all-reduce of the partial sums forward, identity backward."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, group: Any) -> Tensor:
        return all_reduce(x.contiguous().clone(), group)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return grad, None


def copy_to_tp(x: Tensor, g: Groups) -> Tensor:
    return x if g.tp is None else _CopyToTP.apply(x, g.tp)


def reduce_from_tp(x: Tensor, g: Groups) -> Tensor:
    return x if g.tp is None else _ReduceFromTP.apply(x, g.tp)


# ---------------------------------------------------------------------- the model


@dataclass
class MicroBatch:
    """One micro-batch as the model sees it: ``[rows, L]`` token ids (one row when packed)."""

    input_ids: Tensor
    positions: Tensor
    allowed: Tensor  # [rows or 1, L, L] bool: which keys each query may attend to
    predict_at: Tensor  # flat index of the position predicting each valid response token
    targets: Tensor  # the token predicted there
    rows: list[int]  # rows of the step's batch, in order
    response_mask: Tensor  # [rows, R] of those rows


def make_micro_batch(
    batch: dict[str, Tensor], rows: list[int], cfg: PolicyConfig, *, packed: bool, leak: bool
) -> MicroBatch:
    """Padded (``[rows, P + R]``) or packed (``[1, Σ lengths]``) input for ``rows``.

    ``leak`` (fault ``packing-leak``) gives the packed row one causal mask over all of its
    sequences instead of one per sequence.
    """
    index = torch.tensor(rows, dtype=torch.long)
    ids, mask = batch["input_ids"][index], batch["response_mask"][index].bool()
    p, width = cfg.prompt_len, cfg.seq_len
    lengths = p + mask.sum(-1)  # prompt + valid response tokens of each row
    row_of, k = mask.nonzero(as_tuple=True)  # valid response token k of row row_of
    targets = ids[row_of, p + k]
    if not packed:
        positions = torch.arange(width).expand(len(rows), width)
        allowed = torch.ones(width, width, dtype=torch.bool).tril().expand(1, width, width)
        predict_at = row_of * width + p + k - 1
        return MicroBatch(ids, positions, allowed, predict_at, targets, rows, mask)
    cu_seqlens = torch.zeros(len(rows) + 1, dtype=torch.long)
    cu_seqlens[1:] = lengths.cumsum(0)
    tokens = int(cu_seqlens[-1])
    flat = torch.cat([ids[i, : int(n)] for i, n in enumerate(lengths)]).unsqueeze(0)
    segment = torch.repeat_interleave(torch.arange(len(rows)), lengths)
    positions = (torch.arange(tokens) - cu_seqlens[segment]).unsqueeze(0)
    causal = torch.ones(tokens, tokens, dtype=torch.bool).tril()
    same_sequence = segment.unsqueeze(0) == segment.unsqueeze(1)
    allowed = (causal if leak else causal & same_sequence).unsqueeze(0)
    predict_at = cu_seqlens[row_of] + p + k - 1
    return MicroBatch(flat, positions, allowed, predict_at, targets, rows, mask)


def rms_norm(x: Tensor, weight: Tensor) -> Tensor:
    return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6) * weight


def transformer_layer(
    h: Tensor, w: dict[str, Tensor], i: int, cfg: PolicyConfig, mb: MicroBatch, g: Groups
) -> Tensor:
    """Pre-norm attention + MLP block; this rank computes ``heads / tp`` heads and
    ``ffn / tp`` hidden units."""
    p = f"layers.{i}."
    skip_reduce = g.layout.fault == "no-tp-allreduce"
    reduce = (lambda x: x) if skip_reduce else (lambda x: reduce_from_tp(x, g))
    rows, length, _ = h.shape
    head_dim = cfg.hidden // cfg.heads
    local_heads = cfg.heads // g.layout.tp

    x = copy_to_tp(rms_norm(h, w[p + "norm1"]), g)
    q, k, v = (
        (x @ w[p + name]).view(rows, length, local_heads, head_dim).transpose(1, 2)
        for name in ("wq", "wk", "wv")
    )
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(head_dim)
    scores = scores.masked_fill(~mb.allowed.to(h.device).unsqueeze(1), float("-inf"))
    attended = (scores.softmax(-1) @ v).transpose(1, 2).reshape(rows, length, -1)
    h = h + reduce(attended @ w[p + "wo"])  # row-parallel: partial sums until reduced

    x = copy_to_tp(rms_norm(h, w[p + "norm2"]), g)
    return h + reduce(torch.nn.functional.silu(x @ w[p + "w_up"]) @ w[p + "w_down"])


def vocab_parallel_log_probs(
    local_logits: Tensor, targets: Tensor, g: Groups
) -> tuple[Tensor, Tensor]:
    """Log prob of ``targets`` and entropy, from this rank's slice of the vocabulary.

    ``log p(t) = l_t - m - log Σ_v exp(l_v - m)`` where ``m`` (max) and the sum are
    all-reduced over the TP group and ``l_t`` comes from the rank holding ``t``. The
    entropy ``log Z - Σ_v p_v (l_v - m)`` is a metric and carries no gradient.
    """
    local_vocab = local_logits.shape[-1]
    start = g.tp_rank * local_vocab
    with torch.no_grad():
        m = all_reduce(local_logits.max(-1).values.clone(), g.tp, dist.ReduceOp.MAX)
    shifted = local_logits - m.unsqueeze(-1)
    sum_exp = reduce_from_tp(shifted.exp().sum(-1), g)
    mine = (targets >= start) & (targets < start + local_vocab)
    local_index = (targets - start).clamp(0, local_vocab - 1).unsqueeze(-1)
    picked = shifted.gather(-1, local_index).squeeze(-1) * mine
    log_z = sum_exp.log()
    log_probs = reduce_from_tp(picked, g) - log_z
    with torch.no_grad():
        expected = all_reduce((shifted.exp() * shifted).sum(-1), g.tp) / sum_exp
        entropy = log_z - expected
    return log_probs, entropy.detach()


def stage_forward(
    h_or_ids: Tensor, w: dict[str, Tensor], cfg: PolicyConfig, mb: MicroBatch, g: Groups
) -> Tensor:
    """This stage's part of the forward: embeddings (first stage) and its layers."""
    if g.stage == 0:
        on = w["embed"].device
        h = w["embed"][h_or_ids.to(on)] + w["pos"][mb.positions.to(on)]
    else:
        h = h_or_ids
    for i in stage_layers(cfg, g.layout, g.stage):
        h = transformer_layer(h, w, i, cfg, mb, g)
    return h


def head_log_probs(
    h: Tensor, w: dict[str, Tensor], mb: MicroBatch, g: Groups
) -> tuple[Tensor, Tensor]:
    """Last stage: final norm, vocab-parallel head at the predicting positions only."""
    x = rms_norm(h, w["norm_f"]).reshape(-1, h.shape[-1])[mb.predict_at.to(h.device)]
    local_logits = copy_to_tp(x, g) @ w["head"]
    return vocab_parallel_log_probs(local_logits, mb.targets.to(h.device), g)


# ---------------------------------------------------------------------- one training step


def _token_losses(
    log_probs: Tensor, batch: dict[str, Tensor], mb: MicroBatch, cfg: PolicyConfig
) -> tuple[Tensor, Tensor]:
    """Per valid token: PPO-clip loss and k3 KL, from the batch's old/ref log probs."""
    index = torch.tensor(mb.rows, dtype=torch.long)
    valid = mb.response_mask
    old, ref, adv = (
        batch[k][index][valid].to(log_probs)
        for k in ("old_log_probs", "ref_log_prob", "advantages")
    )
    pg, _, _ = ppo_clip_token_losses(
        log_probs, old, adv, clip_ratio_low=cfg.clip_low, clip_ratio_high=cfg.clip_high
    )
    return pg, kl_penalty(log_probs, ref, "low_var_kl")


def default_splits(layout: Layout, size: int) -> list[list[list[int]]]:
    """Rows of each DP rank's micro-batches: contiguous shards, then contiguous micro-batches."""
    return [
        [[shard[i] for i in piece] for piece in split_by_count(len(shard), layout.micro_batches)]
        for shard in dp_shards(size, layout.dp)
    ]


def gpipe_forward_backward(
    w: dict[str, Tensor],
    batch: dict[str, Tensor],
    cfg: PolicyConfig,
    g: Groups,
    micros: list[MicroBatch],
    global_tokens: Tensor,
) -> tuple[Tensor, list[tuple[MicroBatch, Tensor]]]:
    """GPipe: every micro-batch's forward, then every backward in reverse order.

    Gradients accumulate in ``w[...].grad``. The last stage returns the step's metric pieces
    (``[pg, kl, entropy]`` sums over global tokens of this DP rank) and each micro-batch's
    per-token log probs; other stages return zeros and nothing.
    """
    layout = g.layout
    last = g.stage == layout.pp - 1
    prev_rank = g.stage_ranks[g.stage - 1] if g.stage > 0 else None
    next_rank = g.stage_ranks[g.stage + 1] if not last else None
    saved: list[tuple[Tensor | None, Tensor]] = []  # (input activation, output or loss)
    sums = torch.zeros(3, dtype=torch.float64, device=device())
    log_probs_out: list[tuple[MicroBatch, Tensor]] = []
    for mb in micros:
        h_in = None
        if prev_rank is not None:  # activations of the previous stage
            h_in = torch.empty((*mb.input_ids.shape, cfg.hidden), dtype=cfg.torch_dtype)
            h_in = h_in.to(device())
            dist.recv(h_in, src=prev_rank)
            h_in.requires_grad_(True)
        h = stage_forward(mb.input_ids if h_in is None else h_in, w, cfg, mb, g)
        if not last:
            dist.send(h.detach().contiguous(), dst=next_rank)
            saved.append((h_in, h))
            continue
        log_probs, entropy = head_log_probs(h, w, mb, g)
        pg, kl = _token_losses(log_probs, batch, mb, cfg)
        per_token = (pg + cfg.kl_coef * kl).unsqueeze(0)
        ones = torch.ones_like(per_token)
        normalizer = global_tokens
        if layout.fault == "micro-mean":  # each micro-batch's own mean, averaged: wrong
            normalizer = ones.sum() * len(micros) * layout.dp
        loss = aggregate_loss(per_token, ones, "token-mean", global_tokens=normalizer)
        with torch.no_grad():
            pieces = torch.stack([pg.sum(), kl.sum(), entropy.sum()]).double()
            sums += pieces / normalizer.double()
        saved.append((h_in, loss))
        log_probs_out.append((mb, log_probs.detach()))

    for h_in, out in reversed(saved):
        if last:
            out.backward()
        else:  # gradient of this stage's output, from the next stage
            grad = torch.empty_like(out)
            dist.recv(grad, src=next_rank)
            out.backward(grad)
        if h_in is not None:
            dist.send(h_in.grad.contiguous(), dst=prev_rank)
    return sums, log_probs_out


def reduce_gradients(w: dict[str, Tensor], g: Groups) -> None:
    """Data parallelism: sum the replicas' gradients (one all-reduce of one flat buffer).

    Each replica's loss is already divided by the global token count, so the pieces add up
    to the full batch's gradient: a sum, not a mean.
    """
    flat = all_reduce(torch.cat([p.grad.reshape(-1) for p in w.values()]), g.dp)
    if g.layout.fault == "dp-double-norm":  # averaged on top of the global normalizer: wrong
        flat /= g.layout.dp
    for p, grad in zip(w.values(), flat.split([p.numel() for p in w.values()]), strict=True):
        p.grad = grad.view_as(p)


def grad_norm(w: dict[str, Tensor], g: Groups) -> float:
    """L2 norm of the whole model's gradient.

    TP-split parameters count on every TP rank, replicated ones on TP rank 0 only; the
    squares are then summed over the tp x pp ranks of this replica.
    """
    square = torch.zeros((), dtype=torch.float64, device=device())
    for name, p in w.items():
        if is_tp_split(name) or g.tp_rank == 0:
            square += p.grad.double().square().sum()
    return float(all_reduce(square, g.model).sqrt())


def train_step(
    w: dict[str, Tensor],
    batch: dict[str, Tensor],
    cfg: PolicyConfig,
    g: Groups,
    splits: list[list[list[int]]] | None = None,
) -> dict[str, Any]:
    """One PPO step of this rank's shard; returns metrics and per-token log probs (last stage).

    ``splits[dp_rank]`` lists the rows of each of this rank's micro-batches (default:
    :func:`default_splits`); every DP rank needs at least one row.
    """
    layout = g.layout
    size = int(batch["response_mask"].shape[0])
    micro_rows = (splits or default_splits(layout, size))[g.dp_rank]
    shard_rows = [row for rows in micro_rows for row in rows]
    leak = layout.fault == "packing-leak"
    micros = [
        make_micro_batch(batch, rows, cfg, packed=layout.packing, leak=leak) for rows in micro_rows
    ]
    # The token-mean's normalizer is the step's valid-token count over every DP replica.
    tokens = batch["response_mask"][torch.tensor(shard_rows, dtype=torch.long)].sum()
    global_tokens = all_reduce(tokens.to(device(), torch.float64), g.dp)

    sums, log_probs = gpipe_forward_backward(w, batch, cfg, g, micros, global_tokens)
    reduce_gradients(w, g)
    norm = grad_norm(w, g)
    with torch.no_grad():  # SGD
        for p in w.values():
            p -= cfg.lr * p.grad
            p.grad = None
    all_reduce(sums, g.dp)

    result: dict[str, Any] = {"rank": g.rank, "last_stage": g.stage == layout.pp - 1}
    if result["last_stage"]:
        result["metrics"] = {
            **dict(zip(("pg_loss", "kl", "entropy"), sums.tolist(), strict=True)),
            "grad_norm": norm,
        }
        result["rows"] = shard_rows
        result["log_probs"] = _padded(log_probs, cfg).cpu()
    return result


def _padded(pieces: list[tuple[MicroBatch, Tensor]], cfg: PolicyConfig) -> Tensor:
    """Per-token values of the micro-batches back in ``[shard rows, R]``, zero on padding."""
    rows = [mb.response_mask for mb, _ in pieces]
    out = torch.zeros(sum(r.shape[0] for r in rows), cfg.response_len, dtype=cfg.torch_dtype)
    start = 0
    for mb, values in pieces:
        n = mb.response_mask.shape[0]
        out[start : start + n][mb.response_mask] = values.cpu().to(out.dtype)
        start += n
    return out


def train(
    rank: int,
    layout: Layout,
    cfg: PolicyConfig,
    batches: list[dict[str, Tensor]],
    splits: list[list[list[int]]] | None = None,
) -> dict[str, Any]:
    """What :func:`launch` runs on each rank: ``len(batches)`` training steps."""
    g = make_groups(layout, rank)
    w = shard_weights(full_weights(cfg), cfg, layout, rank)
    steps = [train_step(w, batch, cfg, g, splits) for batch in batches]
    return {"rank": rank, "steps": steps}


@dataclass
class StepResult:
    """Metrics of one step and per-token log probs ``[B, R]`` of the whole batch."""

    metrics: dict[str, float]
    log_probs: Tensor


def run(
    layout: Layout,
    cfg: PolicyConfig,
    batches: list[dict[str, Tensor]],
    *,
    splits: list[list[list[int]]] | None = None,
    timeout: float = 120.0,
) -> list[StepResult]:
    """Train ``len(batches)`` steps on ``layout`` (real processes) and reassemble the results.

    ``splits`` overrides how rows are cut into DP shards and micro-batches (every step).
    """
    per_rank = launch(train, layout, layout, cfg, batches, splits, timeout=timeout)
    out = []
    for step in range(len(batches)):
        shards = [r["steps"][step] for r in per_rank if r["steps"][step]["last_stage"]]
        shards = [s for s in shards if layout.coords(s["rank"])[2] == 0]
        size = int(batches[step]["response_mask"].shape[0])
        log_probs = torch.zeros(size, cfg.response_len, dtype=cfg.torch_dtype)
        for s in shards:
            log_probs[torch.tensor(s["rows"], dtype=torch.long)] = s["log_probs"]
        out.append(StepResult(shards[0]["metrics"], log_probs))
    return out


def check_step(
    golden: Any, result: StepResult, *, step: int, reference: Layout | None = None
) -> None:
    """Gate one step: every metric, and per-token log probs by (DP rank, micro-batch).

    Ranks and micro-batches are those of the *reference* layout (one of each by default):
    a variant's log probs are reassembled into the whole batch first and cut the way the
    reference cuts it, so that every layout checks the same tensors.
    """
    reference = reference or Layout()
    golden.check(result.metrics, step=step)
    size = result.log_probs.shape[0]
    for dp_rank, shard in enumerate(dp_shards(size, reference.dp)):
        for micro, piece in enumerate(split_by_count(len(shard), reference.micro_batches)):
            rows = torch.tensor([shard[i] for i in piece], dtype=torch.long)
            golden.check_tensors(
                "policy",
                {"log_probs": result.log_probs[rows]},
                step=step,
                rank=dp_rank,
                micro=micro,
            )


# ---------------------------------------------------------------------- rollouts


def make_rollout(
    cfg: PolicyConfig, step: int, *, prompts: int = 4, group: int = 2
) -> dict[str, Tensor]:
    """A verl-style batch of ``prompts × group`` responses of random lengths for ``step``.

    Token ids and rewards are random; ``ref_log_prob`` is the initial policy's log prob (the
    reference model) and ``old_log_probs`` that plus noise, as if from a rollout engine.
    """
    g = torch.Generator().manual_seed(10_000 + 1_000 * cfg.seed + step)
    size = prompts * group
    ids = torch.randint(1, cfg.vocab, (size, cfg.seq_len), generator=g)
    ids[:, : cfg.prompt_len] = ids[::group, : cfg.prompt_len].repeat_interleave(group, 0)
    lengths = torch.randint(1, cfg.response_len + 1, (size,), generator=g)
    mask = torch.arange(cfg.response_len).unsqueeze(0) < lengths.unsqueeze(1)
    ids[:, cfg.prompt_len :][~mask] = 0
    uid = torch.arange(prompts).repeat_interleave(group)
    rewards = torch.zeros(size, cfg.response_len, dtype=torch.float64)
    rewards[torch.arange(size), lengths - 1] = torch.rand(size, generator=g, dtype=torch.float64)
    batch = {"input_ids": ids, "response_mask": mask, "uid": uid}
    ref = single_process_log_probs(cfg, batch)
    noise = 0.05 * torch.randn(ref.shape, generator=g, dtype=torch.float64)
    dtype = cfg.torch_dtype
    batch["ref_log_prob"] = ref
    batch["old_log_probs"] = ((ref.double() + noise) * mask).to(dtype)
    batch["advantages"] = grpo_advantages(rewards, mask, uid).to(dtype)
    return batch


def single_process_log_probs(cfg: PolicyConfig, batch: dict[str, Tensor]) -> Tensor:
    """``[B, R]`` log probs of the initial weights (world size 1, padded, no gradient)."""
    layout = Layout()
    g = make_groups(layout, 0)
    w = shard_weights(full_weights(cfg), cfg, layout, 0)
    rows = list(range(int(batch["response_mask"].shape[0])))
    mb = make_micro_batch(batch, rows, cfg, packed=False, leak=False)
    with torch.no_grad():
        log_probs, _ = head_log_probs(stage_forward(mb.input_ids, w, cfg, mb, g), w, mb, g)
    return _padded([(mb, log_probs)], cfg)
