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

* **Context parallelism, ring** (``cp`` ranks). Every sequence is cut into ``2 * cp``
  chunks and rank ``r`` holds chunks ``r`` and ``2 * cp - 1 - r`` (Megatron's causal load
  balance); keys and values travel around the ring (:func:`.attention.ring_attention`).
* **Sequence parallelism, Ulysses** (``sp`` ranks). Rank ``r`` holds the ``r``-th of ``sp``
  contiguous pieces of every sequence; attention trades the sequence split for a head split
  by all-to-all (:func:`.attention.ulysses_attention`). A sequence split pads each row (or
  the packed row) to a multiple of its chunk count; a pad attends to itself only.
* **Mixture of experts, expert parallelism** (``cfg.experts > 0``; ``ep`` ranks). The MLP of
  every layer becomes a top-k routed MoE (:mod:`.moe`); each EP rank holds ``experts / ep``
  experts and is a data-parallel replica for everything else. The Switch load-balancing
  loss over every token of the step is added (``aux_coef``) and reported as ``aux_loss``.
* **Dynamic batch size** (``max_tokens``): micro-batches of at most that many response
  tokens. Ranks whose experts exchange tokens run the same number of micro-batches (the
  shorter lists get empty ones), as verl does by syncing the count over data ranks.

One step (:func:`train_step`): PPO-clip loss (:func:`~..reference.losses.ppo_clip_token_losses`)
plus a low-variance KL penalty against the reference log probs of the batch
(:func:`~..reference.losses.kl_penalty`), token-mean over the step, SGD update. Metrics:
``pg_loss``, ``kl``, ``entropy`` (token means over the step) and ``grad_norm`` (before the
update), ``aux_loss`` with experts, plus per-token ``log_probs`` of the policy that took
the step.

* **Value head** (opt-in: ``PolicyConfig(critic=True)``). A linear head ``hidden -> 1``
  on the final norm, at the positions that predict the response tokens (verl's critic reads
  ``values[:, -R - 1:-1]``), on the last pipeline stage and whole on every TP rank (its input
  is the replicated residual stream, so each TP rank computes the same values and their
  gradient; it is counted once in ``grad_norm``). The step adds ``vf_coef`` times the clipped
  value loss (:func:`~..reference.critic.value_token_losses`) of the head's predictions
  against the batch's ``values`` and ``returns``, token-mean over the step with the policy
  loss's normalizer, so DP, sequence splits and micro-batches add up as the policy loss does.
  Metrics ``critic/vf_loss``, ``critic/vf_clipfrac``, ``critic/vpred_mean`` (token means over
  the step) and ``critic/grad_norm`` (the head's gradient), plus per-token ``values``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from ..reference.advantages import gae_advantages, grpo_advantages
from ..reference.critic import CLIPFRAC_METRIC, value_token_losses
from ..reference.losses import aggregate_loss, kl_penalty, ppo_clip_token_losses
from .attention import dense_attention, ring_attention, ulysses_attention
from .batching import dp_shards, split_by_count, split_by_token_budget
from .comm import Groups, all_reduce, copy_to_tp, make_groups, reduce_from_tp, world_sum
from .launcher import device, launch
from .layout import CRITIC_FAULTS, Layout
from .moe import RouterStats, aux_loss, experts_of, moe_mlp

METRICS = ("pg_loss", "kl", "entropy", "grad_norm")
CRITIC_METRICS = ("critic/vf_loss", CLIPFRAC_METRIC, "critic/vpred_mean", "critic/grad_norm")
"""The value head's metrics (verl's critic names), recorded with ``PolicyConfig(critic=True)``."""


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
    experts: int = 0  # 0: dense MLP; else a top-k MoE in every layer
    top_k: int = 2
    expert_ffn: int = 32
    capacity_factor: float | None = None  # None: dropless
    aux_coef: float = 0.01
    critic: bool = False  # a value head trained beside the policy (off: the policy alone)
    vf_coef: float = 0.5
    cliprange_value: float = 0.5  # verl's default

    def metrics(self) -> tuple[str, ...]:
        """The step's metrics: :data:`METRICS`, ``aux_loss`` with experts, then
        :data:`CRITIC_METRICS` with the value head."""
        aux = ("aux_loss",) if self.experts else ()
        return (*METRICS, *aux, *(CRITIC_METRICS if self.critic else ()))

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
        if not cfg.experts:
            weights[f"layers.{i}.w_up"] = draw(h, f, scale=h**-0.5)
            weights[f"layers.{i}.w_down"] = draw(f, h, scale=f**-0.5)
            continue
        weights[f"layers.{i}.router"] = draw(h, cfg.experts, scale=h**-0.5)
        for e in range(cfg.experts):
            fe = cfg.expert_ffn
            weights[f"layers.{i}.experts.{e}.e_up"] = draw(h, fe, scale=h**-0.5)
            weights[f"layers.{i}.experts.{e}.e_down"] = draw(fe, h, scale=fe**-0.5)
    weights["norm_f"] = 1.0 + draw(h, scale=0.1)
    weights["head"] = draw(h, cfg.vocab, scale=h**-0.5)
    if cfg.critic:  # drawn last: every other weight is the same with or without the head
        weights["value_head"] = draw(h, scale=h**-0.5)
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
    """This rank's parameters: its stage's layers, column/row slices of the TP-split ones,
    the experts of its EP rank (experts are not split over TP)."""
    place = layout.place(rank)
    stage, tp_rank = place.pp, place.tp
    if cfg.heads % layout.tp or cfg.ffn % layout.tp or cfg.vocab % layout.tp:
        raise ValueError(f"heads, ffn and vocab must be divisible by tp={layout.tp}")
    layers = stage_layers(cfg, layout, stage)
    mine_experts = experts_of(place.ep, cfg.experts, layout.ep) if cfg.experts else range(0)
    mine = {}
    for name, value in weights.items():
        if name.startswith("layers.") and int(name.split(".")[1]) not in layers:
            continue
        if name in ("embed", "pos") and stage != 0:
            continue
        if name in ("norm_f", "head", "value_head") and stage != layout.pp - 1:
            continue
        if is_expert(name) and int(name.split(".")[3]) not in mine_experts:
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


def is_expert(name: str) -> bool:
    return ".experts." in name


# ---------------------------------------------------------------------- the model


@dataclass
class MicroBatch:
    """One micro-batch as the model sees it: ``[rows, L]`` token ids (one row when packed).

    ``L`` is padded to a multiple of the sequence split's chunk count; ``holds[r]`` lists
    the positions rank ``r`` of the sequence group holds (``[arange(L)]`` without a split).
    """

    input_ids: Tensor
    positions: Tensor
    allowed: Tensor  # [rows or 1, L, L] bool: which keys each query may attend to
    predict_at: Tensor  # flat index of the position predicting each valid response token
    targets: Tensor  # the token predicted there
    rows: list[int]  # rows of the step's batch, in order
    response_mask: Tensor  # [rows, R] of those rows
    real: Tensor  # [rows, L] bool: a token of the batch (not padding)
    holds: list[Tensor] = field(default_factory=list)

    @property
    def length(self) -> int:
        return int(self.input_ids.shape[1])


def make_micro_batch(
    batch: dict[str, Tensor],
    rows: list[int],
    cfg: PolicyConfig,
    *,
    packed: bool,
    leak: bool,
    layout: Layout | None = None,
) -> MicroBatch:
    """Padded (``[rows, P + R]``) or packed (``[1, Σ lengths]``) input for ``rows``, split
    over ``layout``'s sequence ranks.

    ``leak`` (fault ``packing-leak``) gives the packed row one causal mask over all of its
    sequences instead of one per sequence.
    """
    index = torch.tensor(rows, dtype=torch.long)
    ids, mask = batch["input_ids"][index], batch["response_mask"][index].bool()
    p, width = cfg.prompt_len, cfg.seq_len
    lengths = p + mask.sum(-1)  # prompt + valid response tokens of each row
    row_of, k = mask.nonzero(as_tuple=True)  # valid response token k of row row_of
    targets = ids[row_of, p + k]
    if not packed or not rows:
        positions = torch.arange(width).expand(len(rows), width)
        allowed = torch.ones(width, width, dtype=torch.bool).tril().expand(1, width, width)
        predict_at = row_of * width + p + k - 1
        real = positions < lengths.unsqueeze(1)
        mb = MicroBatch(ids, positions, allowed, predict_at, targets, rows, mask, real)
    else:
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
        real = torch.ones(1, tokens, dtype=torch.bool)
        mb = MicroBatch(flat, positions, allowed, predict_at, targets, rows, mask, real)
    return split_sequence(mb, layout or Layout())


def split_sequence(mb: MicroBatch, layout: Layout) -> MicroBatch:
    """Pad ``mb`` to a multiple of the sequence split's chunks and say who holds which.

    Ring (``cp``): ``2 * cp`` chunks, rank ``r`` holds chunks ``r`` and ``2 * cp - 1 - r``.
    Ulysses (``sp``): ``sp`` contiguous pieces. A pad (token 0, position 0) attends to
    itself only, and nothing attends to it.
    """
    chunks = 2 * layout.cp if layout.cp > 1 else layout.sp
    length = mb.length
    padded = -(-length // chunks) * chunks
    if padded != length:
        extra = padded - length
        rows = mb.input_ids.shape[0]
        mb.input_ids = torch.cat([mb.input_ids, mb.input_ids.new_zeros(rows, extra)], 1)
        mb.positions = torch.cat([mb.positions, mb.positions.new_zeros(rows, extra)], 1)
        mb.real = torch.cat([mb.real, mb.real.new_zeros(mb.real.shape[0], extra)], 1)
        allowed = torch.zeros(mb.allowed.shape[0], padded, padded, dtype=torch.bool)
        allowed[:, :length, :length] = mb.allowed
        allowed[:, torch.arange(length, padded), torch.arange(length, padded)] = True
        mb.allowed = allowed
        rows_of, at = mb.predict_at // length, mb.predict_at % length
        mb.predict_at = rows_of * padded + at
    pieces = torch.arange(padded).chunk(chunks)
    if layout.cp > 1:
        mb.holds = [torch.cat([pieces[r], pieces[chunks - 1 - r]]) for r in range(layout.cp)]
    else:
        mb.holds = list(pieces)
    return mb


def rms_norm(x: Tensor, weight: Tensor) -> Tensor:
    return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6) * weight


def transformer_layer(
    h: Tensor,
    w: dict[str, Tensor],
    i: int,
    cfg: PolicyConfig,
    mb: MicroBatch,
    g: Groups,
    stats: RouterStats,
) -> Tensor:
    """Pre-norm attention + MLP (or MoE) block over this rank's positions of ``mb``; this
    rank computes ``heads / tp`` heads and ``ffn / tp`` hidden units (experts: whole)."""
    p = f"layers.{i}."
    layout = g.layout
    skip_reduce = layout.fault == "no-tp-allreduce"
    reduce = (lambda x: x) if skip_reduce else (lambda x: reduce_from_tp(x, g))
    rows, length, _ = h.shape
    head_dim = cfg.hidden // cfg.heads
    local_heads = cfg.heads // layout.tp

    x = copy_to_tp(rms_norm(h, w[p + "norm1"]), g)
    q, k, v = (
        (x @ w[p + name]).view(rows, length, local_heads, head_dim) for name in ("wq", "wk", "wv")
    )
    allowed = mb.allowed.to(h.device)
    if layout.cp > 1:
        causal = layout.fault != "ring-no-causal"
        attended = ring_attention(q, k, v, allowed, mb.holds, g, causal_across_chunks=causal)
    elif layout.sp > 1:
        wrong = layout.fault == "ulysses-head-split"
        attended = ulysses_attention(q, k, v, allowed, g, wrong_split=wrong)
    else:
        attended = dense_attention(q, k, v, allowed)
    h = h + reduce(attended @ w[p + "wo"])  # row-parallel: partial sums until reduced

    if cfg.experts:  # experts are whole on every TP rank: no copy/reduce
        real = mb.real[:, mb.holds[g.place.seq]]
        return h + moe_mlp(rms_norm(h, w[p + "norm2"]), real, w, p, i, cfg, g, stats)
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
    h_or_ids: Tensor,
    w: dict[str, Tensor],
    cfg: PolicyConfig,
    mb: MicroBatch,
    g: Groups,
    stats: RouterStats,
) -> Tensor:
    """This stage's part of the forward: embeddings (first stage) and its layers, over the
    positions this rank holds."""
    if g.stage == 0:
        on = w["embed"].device
        held = mb.holds[g.place.seq]
        ids, positions = mb.input_ids[:, held], mb.positions[:, held]
        h = w["embed"][ids.to(on)] + w["pos"][positions.to(on)]
    else:
        h = h_or_ids
    for i in stage_layers(cfg, g.layout, g.stage):
        h = transformer_layer(h, w, i, cfg, mb, g, stats)
    return h


def predicted_here(mb: MicroBatch, g: Groups) -> tuple[Tensor, Tensor]:
    """Which of ``mb``'s predicted tokens this rank's positions predict, and where those
    positions lie in its ``[rows * held]`` activations."""
    held = mb.holds[g.place.seq]
    where = torch.full((mb.length,), -1, dtype=torch.long)
    where[held] = torch.arange(len(held))
    row, at = mb.predict_at // mb.length, mb.predict_at % mb.length
    local = where[at]
    mine = local >= 0
    return mine, (row * len(held) + local)[mine]


def predicting_hidden(
    h: Tensor, w: dict[str, Tensor], mb: MicroBatch, g: Groups
) -> tuple[Tensor, Tensor]:
    """Last stage: the final norm of ``h`` at this rank's predicting positions, and the mask
    of their tokens among ``mb``'s."""
    mine, flat = predicted_here(mb, g)
    return rms_norm(h, w["norm_f"]).reshape(-1, h.shape[-1])[flat.to(h.device)], mine


def head_log_probs(
    h: Tensor, w: dict[str, Tensor], mb: MicroBatch, g: Groups
) -> tuple[Tensor, Tensor, Tensor]:
    """Last stage: final norm, vocab-parallel head at this rank's predicting positions.

    Returns log probs and entropies of those tokens and the mask of them among ``mb``'s.
    """
    x, mine = predicting_hidden(h, w, mb, g)
    local_logits = copy_to_tp(x, g) @ w["head"]
    log_probs, entropy = vocab_parallel_log_probs(local_logits, mb.targets[mine].to(h.device), g)
    return log_probs, entropy, mine


def value_predictions(h: Tensor, w: dict[str, Tensor], mb: MicroBatch, g: Groups) -> Tensor:
    """Last stage: the value head's prediction at each of this rank's predicting positions
    (the head is whole on every TP rank: no collective)."""
    x, _ = predicting_hidden(h, w, mb, g)
    return x @ w["value_head"]


# ---------------------------------------------------------------------- one training step


def _picked(
    batch: dict[str, Tensor], mb: MicroBatch, mine: Tensor, keys: tuple[str, ...], like: Tensor
) -> list[Tensor]:
    """The batch's per-token ``keys`` at the valid tokens of ``mb`` this rank predicts."""
    index = torch.tensor(mb.rows, dtype=torch.long)
    return [batch[k][index][mb.response_mask][mine].to(like) for k in keys]


def _token_losses(
    log_probs: Tensor, batch: dict[str, Tensor], mb: MicroBatch, cfg: PolicyConfig, mine: Tensor
) -> tuple[Tensor, Tensor]:
    """Per valid token this rank predicts: PPO-clip loss and k3 KL, from the batch's old and
    ref log probs."""
    keys = ("old_log_probs", "ref_log_prob", "advantages")
    old, ref, adv = _picked(batch, mb, mine, keys, log_probs)
    pg, _, _ = ppo_clip_token_losses(
        log_probs, old, adv, clip_ratio_low=cfg.clip_low, clip_ratio_high=cfg.clip_high
    )
    return pg, kl_penalty(log_probs, ref, "low_var_kl")


def _micro_loss(
    h: Tensor,
    w: dict[str, Tensor],
    batch: dict[str, Tensor],
    cfg: PolicyConfig,
    g: Groups,
    mb: MicroBatch,
    normalizer: Tensor,
) -> tuple[Tensor, Tensor, Tensor]:
    """Last stage: ``mb``'s share of the step's loss (token sums over ``normalizer``), its
    metric sums (``pg, kl, entropy``, then ``vf, clipped, vpred`` with the value head) and its
    per-token outputs ``[log_probs(, values)]`` over every token of ``mb`` (zero where another
    sequence rank predicts)."""
    log_probs, entropy, mine = head_log_probs(h, w, mb, g)
    pg, kl = _token_losses(log_probs, batch, mb, cfg, mine)
    per_token = (pg + cfg.kl_coef * kl).unsqueeze(0)
    ones = torch.ones_like(per_token)
    loss = aggregate_loss(per_token, ones, "token-mean", global_tokens=normalizer)
    sums, outputs = [pg.sum(), kl.sum(), entropy.sum()], [log_probs]
    if cfg.critic:
        vpreds = value_predictions(h, w, mb, g)
        values, returns = _picked(batch, mb, mine, ("values", "returns"), vpreds)
        vf, clipped = value_token_losses(
            vpreds, values, returns, cliprange_value=cfg.cliprange_value
        )
        vf_normalizer = normalizer
        if g.layout.fault == "critic-micro-norm":  # each micro-batch's own token-mean, summed
            vf_normalizer = normalizer.new_tensor(mb.targets.numel())
        vf_loss = aggregate_loss(vf.unsqueeze(0), ones, "token-mean", global_tokens=vf_normalizer)
        loss = loss + cfg.vf_coef * vf_loss
        sums += [vf.sum(), clipped.to(vf.dtype).sum(), vpreds.sum()]
        outputs.append(vpreds)
    every = log_probs.new_zeros(len(outputs), mb.targets.numel())
    every[:, mine.to(every.device)] = torch.stack(outputs).detach()
    return loss, torch.stack(sums).detach().double(), every


def default_splits(layout: Layout, response_mask: Tensor) -> list[list[list[int]]]:
    """Rows of each data rank's micro-batches (data rank ``dp_rank * ep + ep_rank``):
    contiguous shards, then ``micro_batches`` contiguous pieces or, with ``max_tokens``,
    greedy pieces within the token budget."""
    out = []
    for shard in dp_shards(int(response_mask.shape[0]), layout.data_ranks):
        if layout.max_tokens is None:
            pieces = split_by_count(len(shard), layout.micro_batches)
        else:
            rows = torch.tensor(shard, dtype=torch.long)
            pieces = split_by_token_budget(response_mask[rows], layout.max_tokens)
        out.append([[shard[i] for i in piece] for piece in pieces])
    return out


def aligned(splits: list[list[list[int]]], layout: Layout) -> list[list[list[int]]]:
    """Ranks of one expert-parallel group exchange tokens in every micro-batch, so they run
    the same number: the shorter lists get empty micro-batches."""
    if layout.ep == 1:
        return splits
    out = [list(micro) for micro in splits]
    for start in range(0, layout.data_ranks, layout.ep):
        group = range(start, start + layout.ep)
        most = max(len(out[i]) for i in group)
        for i in group:
            out[i] += [[] for _ in range(most - len(out[i]))]
    return out


def gpipe_forward_backward(
    w: dict[str, Tensor],
    batch: dict[str, Tensor],
    cfg: PolicyConfig,
    g: Groups,
    micros: list[MicroBatch],
    global_tokens: Tensor,
) -> tuple[Tensor, list[tuple[MicroBatch, Tensor]], float]:
    """GPipe: every micro-batch's forward, then every backward in reverse order.

    Gradients accumulate in ``w[...].grad``. Returns the step's metric pieces of this rank
    (the sums of :func:`_micro_loss` over global tokens; zeros but on the last stage), each
    micro-batch's per-token ``[log_probs(, values)]`` (last stage; every token, from every
    sequence rank) and the load-balancing loss of this stage's layers (0.0 without experts).
    """
    layout = g.layout
    last = g.stage == layout.pp - 1
    prev_rank = g.stage_ranks[g.stage - 1] if g.stage > 0 else None
    next_rank = g.stage_ranks[g.stage + 1] if not last else None
    saved: list[tuple[Tensor | None, Tensor, bool]] = []  # (input, output or loss, empty)
    sums = torch.zeros(6 if cfg.critic else 3, dtype=torch.float64, device=device())
    outputs: list[tuple[MicroBatch, Tensor]] = []
    stats = RouterStats(cfg.experts, cfg.top_k)
    for mb in micros:
        empty = not mb.rows
        h_in = None
        if prev_rank is not None:  # activations of the previous stage
            shape = (mb.input_ids.shape[0], len(mb.holds[g.place.seq]), cfg.hidden)
            h_in = torch.zeros(shape, dtype=cfg.torch_dtype, device=device())
            if not empty:
                dist.recv(h_in, src=prev_rank)
            h_in.requires_grad_(True)
        h = stage_forward(mb.input_ids if h_in is None else h_in, w, cfg, mb, g, stats)
        if not last:
            if not empty:
                dist.send(h.detach().contiguous(), dst=next_rank)
            saved.append((h_in, h, empty))
            continue
        normalizer = global_tokens
        if layout.fault == "micro-mean":  # each micro-batch's own mean, averaged: wrong
            normalizer = normalizer.new_tensor(mb.targets.numel() * len(micros) * layout.data_ranks)
        loss, pieces, every = _micro_loss(h, w, batch, cfg, g, mb, normalizer)
        sums += pieces / normalizer.double().clamp(min=1)
        saved.append((h_in, loss, empty))
        outputs.append((mb, every))

    aux_value = 0.0
    if cfg.experts:
        share, aux_value = aux_loss(stats, g, per_ep_rank=layout.fault == "ep-local-aux")
        (cfg.aux_coef / cfg.layers * share).backward(retain_graph=True)
    for h_in, out, empty in reversed(saved):
        if last:
            out.backward()
        else:  # gradient of this stage's output, from the next stage
            grad = torch.zeros_like(out)
            if not empty:
                dist.recv(grad, src=next_rank)
            out.backward(grad)
        if h_in is not None and not empty:
            dist.send(h_in.grad.contiguous(), dst=prev_rank)
    if outputs and g.seq is not None:  # every sequence rank predicts some tokens
        flat = all_reduce(torch.cat([values for _, values in outputs], dim=1), g.seq)
        sizes = [values.shape[1] for _, values in outputs]
        outputs = list(zip([mb for mb, _ in outputs], flat.split(sizes, dim=1), strict=True))
    return sums, outputs, aux_value / cfg.layers


def _grads(w: dict[str, Tensor], names: list[str]) -> list[Tensor]:
    """Gradients of ``names`` (zero where a parameter took no part, e.g. an idle expert)."""
    return [w[n].grad if w[n].grad is not None else torch.zeros_like(w[n]) for n in names]


def reduce_gradients(w: dict[str, Tensor], g: Groups) -> None:
    """Sum the gradients over the ranks holding the same parameters (one all-reduce of one
    flat buffer each for dense and expert parameters).

    Each data rank's loss is already divided by the global token count, so the pieces add
    up to the full batch's gradient: a sum, not a mean.
    """
    dense = [n for n in w if not is_expert(n)]
    experts = [n for n in w if is_expert(n)]
    for names, group in ((dense, g.data), (experts, g.expert_data)):
        if not names:
            continue
        flat = all_reduce(torch.cat([grad.reshape(-1) for grad in _grads(w, names)]), group)
        if g.layout.fault == "dp-double-norm":  # averaged on top of the global normalizer
            flat /= g.layout.dp
        for n, grad in zip(names, flat.split([w[n].numel() for n in names]), strict=True):
            w[n].grad = grad.view_as(w[n])


def grad_norm(w: dict[str, Tensor], g: Groups) -> float:
    """L2 norm of the whole model's gradient, each parameter element counted once.

    A rank counts a parameter when it is the first of the ranks holding a copy: dp and
    sequence rank 0, TP rank 0 unless the parameter is TP-split, EP rank 0 unless it is an
    expert's. The squares are then summed over every rank.
    """
    square = torch.zeros((), dtype=torch.float64, device=device())
    place = g.place
    if place.dp == 0 and place.seq == 0:
        for name, p in w.items():
            if (is_tp_split(name) or place.tp == 0) and (is_expert(name) or place.ep == 0):
                square += p.grad.double().square().sum()
    return float(world_sum(square, g.layout).sqrt())


def train_step(
    w: dict[str, Tensor],
    batch: dict[str, Tensor],
    cfg: PolicyConfig,
    g: Groups,
    splits: list[list[list[int]]] | None = None,
) -> dict[str, Any]:
    """One PPO step of this rank's shard; returns metrics and per-token log probs (and values,
    with the value head) on the last stage.

    ``splits[data_rank]`` lists the rows of each of that data rank's micro-batches
    (default: :func:`default_splits`).
    """
    layout = g.layout
    mask = batch["response_mask"]
    micro_rows = aligned(splits or default_splits(layout, mask), layout)[g.data_rank]
    shard_rows = [row for rows in micro_rows for row in rows]
    leak = layout.fault == "packing-leak"
    micros = [
        make_micro_batch(batch, rows, cfg, packed=layout.packing, leak=leak, layout=layout)
        for rows in micro_rows
    ]
    # The token-mean's normalizer is the step's valid-token count (every rank has the batch).
    global_tokens = mask.sum().to(device(), torch.float64)

    sums, outputs, aux = gpipe_forward_backward(w, batch, cfg, g, micros, global_tokens)
    reduce_gradients(w, g)
    norms = {"grad_norm": grad_norm(w, g)}
    if "value_head" in w:  # whole on each last-stage rank, its gradient summed over data ranks
        norms["critic/grad_norm"] = float(w["value_head"].grad.double().norm())
    with torch.no_grad():  # SGD
        for p in w.values():
            p -= cfg.lr * p.grad
            p.grad = None
    all_reduce(sums, g.data)
    place = g.place
    owner = place.dp == place.seq == place.tp == place.ep == 0
    mine = torch.tensor(aux if owner else 0.0, dtype=torch.float64, device=device())
    aux_total = world_sum(mine, layout)

    result: dict[str, Any] = {"rank": g.rank, "last_stage": g.stage == layout.pp - 1}
    if result["last_stage"]:
        names = ("pg_loss", "kl", "entropy", *CRITIC_METRICS[:3])
        values = {**dict(zip(names, sums.tolist(), strict=False)), **norms}  # 3 or 6 sums
        values["aux_loss"] = float(aux_total)
        result["metrics"] = {name: values[name] for name in cfg.metrics()}
        result["rows"] = shard_rows
        result["log_probs"] = _padded([(mb, every[0]) for mb, every in outputs], cfg).cpu()
        if cfg.critic:
            result["values"] = _padded([(mb, every[1]) for mb, every in outputs], cfg).cpu()
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
    """Metrics of one step and per-token log probs ``[B, R]`` of the whole batch (and the
    value head's predictions, ``values``, with ``PolicyConfig(critic=True)``)."""

    metrics: dict[str, float]
    log_probs: Tensor
    response_mask: Tensor | None = None
    values: Tensor | None = None


def run(
    layout: Layout,
    cfg: PolicyConfig,
    batches: list[dict[str, Tensor]],
    *,
    splits: list[list[list[int]]] | None = None,
    timeout: float = 120.0,
) -> list[StepResult]:
    """Train ``len(batches)`` steps on ``layout`` (real processes) and reassemble the results.

    ``splits`` overrides how rows are cut into data-rank shards and micro-batches (every
    step). A fault of the value head (:data:`~.layout.CRITIC_FAULTS`) needs ``cfg.critic``.
    """
    if layout.fault in CRITIC_FAULTS and not cfg.critic:
        raise ValueError(
            f"fault {layout.fault!r} is planted in the value head's loss, which this policy "
            "does not have: run it with PolicyConfig(critic=True)"
        )
    per_rank = launch(train, layout, layout, cfg, batches, splits, timeout=timeout)
    out = []
    for step, batch in enumerate(batches):
        shards = [r["steps"][step] for r in per_rank if r["steps"][step]["last_stage"]]
        shards = [s for s in shards if layout.place(s["rank"]).tp == 0]
        shards = [s for s in shards if layout.place(s["rank"]).seq == 0]
        mask = batch["response_mask"]
        outputs = {
            key: torch.zeros(mask.shape[0], cfg.response_len, dtype=cfg.torch_dtype)
            for key in ("log_probs", "values")
            if key in shards[0]
        }
        for s in shards:
            for key, whole in outputs.items():
                whole[torch.tensor(s["rows"], dtype=torch.long)] = s[key]
        metrics = shards[0]["metrics"]
        out.append(StepResult(metrics, outputs["log_probs"], mask, outputs.get("values")))
    return out


def check_step(
    golden: Any, result: StepResult, *, step: int, reference: Layout | None = None
) -> None:
    """Gate one step: every metric, and per-token log probs (``policy/log_probs``) and, with
    the value head, values (``critic/values``) by (data rank, micro-batch).

    Ranks and micro-batches are those of the *reference* layout (one of each by default):
    a variant's per-token outputs are reassembled into the whole batch first and cut the way
    the reference cuts it, so that every layout checks the same tensors.
    """
    reference = reference or Layout()
    golden.check(result.metrics, step=step)
    mask = result.response_mask
    if mask is None:
        mask = torch.ones(result.log_probs.shape, dtype=torch.bool)
    for data_rank, micros in enumerate(default_splits(reference, mask)):
        for micro, piece in enumerate(micros):
            rows = torch.tensor(piece, dtype=torch.long)
            where = {"step": step, "rank": data_rank, "micro": micro}
            golden.check_tensors("policy", {"log_probs": result.log_probs[rows]}, **where)
            if result.values is not None:
                golden.check_tensors("critic", {"values": result.values[rows]}, **where)


# ---------------------------------------------------------------------- rollouts


def make_rollout(
    cfg: PolicyConfig, step: int, *, prompts: int = 4, group: int = 2
) -> dict[str, Tensor]:
    """A verl-style batch of ``prompts × group`` responses of random lengths for ``step``.

    Token ids and rewards are random; ``ref_log_prob`` is the initial policy's log prob (the
    reference model) and ``old_log_probs`` that plus noise, as if from a rollout engine.
    With the value head, ``values`` are the initial head's predictions plus noise (as if from
    an older critic; wide enough that the value clip binds on part of the tokens) and
    ``returns`` their GAE returns (gamma 1, lambda 0.95); both drawn after everything else,
    so the other fields are those of the batch without the head.
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
    ref, values = initial_outputs(cfg, batch)
    noise = 0.05 * torch.randn(ref.shape, generator=g, dtype=torch.float64)
    dtype = cfg.torch_dtype
    batch["ref_log_prob"] = ref
    batch["old_log_probs"] = ((ref.double() + noise) * mask).to(dtype)
    batch["advantages"] = grpo_advantages(rewards, mask, uid).to(dtype)
    if values is not None:
        noise = 0.5 * torch.randn(values.shape, generator=g, dtype=torch.float64)
        old_values = (values.double() + noise) * mask
        _, returns = gae_advantages(rewards, old_values, mask, gamma=1.0, lam=0.95)
        batch["values"], batch["returns"] = old_values.to(dtype), returns.to(dtype)
    return batch


def initial_outputs(cfg: PolicyConfig, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor | None]:
    """``[B, R]`` log probs of the initial weights and, with the value head, its values
    (world size 1, padded, no gradient)."""
    layout = Layout()
    g = make_groups(layout, 0)
    w = shard_weights(full_weights(cfg), cfg, layout, 0)
    rows = list(range(int(batch["response_mask"].shape[0])))
    mb = make_micro_batch(batch, rows, cfg, packed=False, leak=False)
    stats = RouterStats(cfg.experts, cfg.top_k)
    with torch.no_grad():
        h = stage_forward(mb.input_ids, w, cfg, mb, g, stats)
        log_probs, _, _ = head_log_probs(h, w, mb, g)
        values = value_predictions(h, w, mb, g) if cfg.critic else None
    out = _padded([(mb, log_probs)], cfg)
    return out, None if values is None else _padded([(mb, values)], cfg)
