"""A mixture-of-experts MLP with a top-k router, split over expert-parallel ranks.

Per token: ``probs = softmax(x W_router)``, the ``top_k`` experts by probability, gates
renormalized over them (Mixtral's rule), output ``Σ_j gate_j · expert_j(x)`` summed in
slot order. Each expert is ``silu(x W_up) W_down`` and lives on rank ``e // (E / ep)`` of
the expert-parallel group: tokens travel there by one all-to-all and back by another.
Padding tokens are never dispatched (their output is zero), so padded and packed batches
route the same tokens.

``capacity_factor``: each expert takes at most ``ceil(factor · tokens · top_k / E)``
assignments of a rank's micro-batch, first come first served; the rest are dropped. The
tokens a rank holds depend on the layout, so with a capacity the step is only invariant
across layouts that keep the data split (TP and PP). ``None`` is dropless.

Load balancing (Switch Transformer): ``aux = E · Σ_e f_e · P_e`` per MoE layer, with
``f_e`` the fraction of assignments routed to expert ``e`` and ``P_e`` its mean router
probability, both over every real token of the step: :class:`RouterStats` collects them
over the micro-batches, :func:`aux_loss` all-reduces them once every forward of the stage
is done. A perfectly balanced router gives 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .comm import Groups, all_reduce, all_to_all, exchange_counts


def experts_of(rank: int, experts: int, ep: int) -> range:
    """The experts expert-parallel rank ``rank`` holds (contiguous, equal counts)."""
    if experts % ep:
        raise ValueError(f"{experts} experts cannot be split over ep={ep} ranks")
    per = experts // ep
    return range(rank * per, (rank + 1) * per)


@dataclass
class RouterStats:
    """Per MoE layer of this stage: router probability sums (with their graph) and
    assignment counts over this rank's real tokens, accumulated over micro-batches."""

    experts: int
    top_k: int
    probs: dict[int, Tensor] = field(default_factory=dict)
    counts: dict[int, Tensor] = field(default_factory=dict)
    tokens: dict[int, Tensor] = field(default_factory=dict)

    def add(self, layer: int, probs: Tensor, chosen: Tensor) -> None:
        """``probs[tokens, E]`` and ``chosen[tokens, top_k]`` of the real tokens."""
        counts = torch.bincount(chosen.reshape(-1), minlength=self.experts).double()
        tokens = torch.tensor(float(probs.shape[0]), dtype=torch.float64, device=probs.device)
        if layer in self.probs:
            probs_sum = self.probs[layer] + probs.sum(0)
            counts, tokens = self.counts[layer] + counts, self.tokens[layer] + tokens
        else:
            probs_sum = probs.sum(0)
        self.probs[layer], self.counts[layer], self.tokens[layer] = probs_sum, counts, tokens


def moe_mlp(
    x: Tensor,
    real: Tensor,
    w: dict[str, Tensor],
    prefix: str,
    layer: int,
    cfg: Any,
    g: Groups,
    stats: RouterStats,
) -> Tensor:
    """``x[rows, L, hidden]`` through the MoE layer; ``real[rows, L]`` marks real tokens."""
    rows, length, hidden = x.shape
    flat = x.reshape(-1, hidden)
    n, k, experts = flat.shape[0], cfg.top_k, cfg.experts
    probs = (flat @ w[prefix + "router"]).softmax(-1)
    top, chosen = probs.topk(k, dim=-1)
    gates = top / top.sum(-1, keepdim=True)
    real = real.reshape(-1).to(flat.device)
    stats.add(layer, probs[real], chosen[real])

    keep = real.unsqueeze(1).expand(n, k).clone()
    if cfg.capacity_factor is not None:
        capacity = math.ceil(cfg.capacity_factor * int(real.sum()) * k / experts)
        onehot = F.one_hot(chosen.reshape(-1), experts) * keep.reshape(-1, 1)
        seat = (onehot.cumsum(0) * onehot).sum(-1).reshape(n, k)  # 1-based, in (token, slot)
        keep &= seat <= capacity
    slots = keep.reshape(-1).nonzero().squeeze(1)  # token * k + slot, kept ones
    expert = chosen.reshape(-1)[slots]
    ep, per = g.layout.ep, experts // g.layout.ep
    owner = expert // per
    order = torch.argsort(owner * experts + expert, stable=True)
    send = torch.bincount(owner, minlength=ep)
    recv = exchange_counts(send, g.ep)
    send_list, recv_list = send.tolist(), recv.tolist()
    arrived = all_to_all(flat[slots[order] // k], g.ep, send_list, recv_list)
    arrived_expert = all_to_all(expert[order], g.ep, send_list, recv_list)

    by_expert = torch.argsort(arrived_expert, stable=True)
    outputs = []
    for e in experts_of(g.place.ep, experts, ep):  # in expert order, as by_expert sorts
        tokens = arrived[by_expert[arrived_expert[by_expert] == e]]
        up, down = w[f"{prefix}experts.{e}.e_up"], w[f"{prefix}experts.{e}.e_down"]
        outputs.append(F.silu(tokens @ up) @ down)
    done = torch.cat(outputs)[torch.argsort(by_expert)]
    returned = all_to_all(done, g.ep, recv_list, send_list)[torch.argsort(order)]
    per_slot = torch.zeros(n * k, hidden, dtype=x.dtype, device=x.device).index_put(
        (slots,), returned
    )
    out = (per_slot.view(n, k, hidden) * gates.unsqueeze(-1)).sum(1)
    return out.view(rows, length, hidden)


def aux_loss(stats: RouterStats, g: Groups, *, per_ep_rank: bool) -> tuple[Tensor, float]:
    """The load-balancing loss of this stage's MoE layers, summed over layers.

    Returns this rank's differentiable share (the shares add up over the data ranks to
    the step's loss, because the gradient of ``P_e`` is the sum of per-token terms) and
    the value itself. ``per_ep_rank`` is the bug of fault ``ep-local-aux``: statistics of
    each expert-parallel rank's own tokens, averaged over those ranks.
    """
    group = g.expert_data if per_ep_rank else g.data
    share = torch.zeros((), dtype=torch.float64, device=_device(stats))
    value = 0.0
    for layer in sorted(stats.probs):
        counts = all_reduce(stats.counts[layer].clone(), group)
        tokens = all_reduce(stats.tokens[layer].clone(), group)
        fraction = counts / (tokens * stats.top_k)
        probs_sum = stats.probs[layer]
        mean_probs = all_reduce(probs_sum.detach().double().clone(), group) / tokens
        layer_value = stats.experts * float((fraction * mean_probs).sum())
        layer_share = stats.experts * (fraction * probs_sum.double()).sum() / tokens
        if per_ep_rank:
            mine = torch.tensor(layer_value, dtype=torch.float64, device=share.device)
            ep_values = all_reduce(mine, g.ep)
            layer_value, layer_share = float(ep_values) / g.layout.ep, layer_share / g.layout.ep
        value += layer_value
        share = share + layer_share
    return share, value


def _device(stats: RouterStats) -> Any:
    return next(iter(stats.counts.values())).device if stats.counts else "cpu"
