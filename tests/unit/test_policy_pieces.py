"""Pieces of the reference policy in one process: sequence splits, the MoE layer, its loss.

The float64 references here are written independently of the code under test: a plain
softmax router and a loop over tokens and slots.
"""

from __future__ import annotations

import torch

from pytest_rollout_golden.parallel import Layout
from pytest_rollout_golden.parallel.comm import make_groups
from pytest_rollout_golden.parallel.moe import RouterStats, aux_loss, moe_mlp
from pytest_rollout_golden.parallel.policy import (
    PolicyConfig,
    full_weights,
    make_micro_batch,
    make_rollout,
)

CFG = PolicyConfig(dtype="float64", experts=4)
BATCH = make_rollout(CFG, 0)


def test_ring_chunks_are_load_balanced_and_cover_the_sequence_once():
    mb = make_micro_batch(BATCH, [0, 1], CFG, packed=False, leak=False, layout=Layout(cp=2))
    assert [h.tolist() for h in mb.holds] == [[0, 1, 2, 9, 10, 11], [3, 4, 5, 6, 7, 8]]


def test_ulysses_pieces_are_contiguous():
    mb = make_micro_batch(BATCH, [0], CFG, packed=False, leak=False, layout=Layout(sp=2))
    assert [h.tolist() for h in mb.holds] == [list(range(6)), list(range(6, 12))]


def test_a_packed_row_is_padded_to_the_chunk_count_and_pads_see_only_themselves():
    rows = [0, 1, 2]
    plain = make_micro_batch(BATCH, rows, CFG, packed=True, leak=False)
    split = make_micro_batch(BATCH, rows, CFG, packed=True, leak=False, layout=Layout(cp=2))
    length, padded = plain.length, split.length
    assert padded % 4 == 0 and padded - length < 4
    assert torch.equal(split.allowed[0, :length, :length], plain.allowed[0])
    for pad in range(length, padded):
        assert split.allowed[0, pad].nonzero().flatten().tolist() == [pad]
        assert not split.allowed[0, :length, pad].any()
    assert not split.real[0, length:].any() and split.real[0, :length].all()
    # the predicting positions are the same positions of the longer row
    assert torch.equal(split.predict_at, plain.predict_at)


def moe_reference(x, real, w, prefix, cfg, capacity=None):
    """Token by token, slot by slot, in float64."""
    flat = x.reshape(-1, x.shape[-1]).double()
    out = torch.zeros_like(flat)
    seats = [0] * cfg.experts
    for n, token in enumerate(flat):
        if not real.reshape(-1)[n]:
            continue
        probs = torch.softmax(token @ w[prefix + "router"].double(), -1)
        top, chosen = probs.topk(cfg.top_k)
        gates = top / top.sum()
        for gate, e in zip(gates, chosen.tolist(), strict=True):
            seats[e] += 1
            if capacity is not None and seats[e] > capacity:
                continue
            up = w[f"{prefix}experts.{e}.e_up"].double()
            down = w[f"{prefix}experts.{e}.e_down"].double()
            out[n] += gate * (torch.nn.functional.silu(token @ up) @ down)
    return out.view_as(x)


def moe_case(cfg):
    g = make_groups(Layout(), 0)
    w = full_weights(cfg)
    x = torch.randn(
        3, 12, cfg.hidden, generator=torch.Generator().manual_seed(1), dtype=cfg.torch_dtype
    )
    real = torch.ones(3, 12, dtype=torch.bool)
    real[2, 7:] = False
    return g, w, x, real


def test_dropless_moe_matches_a_token_by_token_reference():
    g, w, x, real = moe_case(CFG)
    out = moe_mlp(x, real, w, "layers.0.", 0, CFG, g, RouterStats(4, 2))
    torch.testing.assert_close(
        out, moe_reference(x, real, w, "layers.0.", CFG), rtol=1e-12, atol=1e-12
    )
    assert not out[2, 7:].any()  # padding is never dispatched


def test_capacity_drops_the_assignments_beyond_each_experts_seats_in_token_order():
    cfg = PolicyConfig(dtype="float64", experts=4, capacity_factor=0.5)
    g, w, x, real = moe_case(cfg)
    capacity = -(-int(0.5 * int(real.sum()) * 2) // 4)
    out = moe_mlp(x, real, w, "layers.0.", 0, cfg, g, RouterStats(4, 2))
    expected = moe_reference(x, real, w, "layers.0.", cfg, capacity=capacity)
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    dropless = moe_mlp(x, real, w, "layers.0.", 0, CFG, g, RouterStats(4, 2))
    assert (out - dropless).abs().max() > 1e-3  # something was dropped


def test_aux_loss_is_experts_times_fraction_times_mean_probability_over_real_tokens():
    g, w, x, real = moe_case(CFG)
    w["layers.0.router"].requires_grad_(True)
    stats = RouterStats(4, 2)
    half = 2  # two micro-batches accumulate into one statistic
    moe_mlp(x[:half], real[:half], w, "layers.0.", 0, CFG, g, stats)
    moe_mlp(x[half:], real[half:], w, "layers.0.", 0, CFG, g, stats)
    tokens = x.reshape(-1, CFG.hidden)[real.reshape(-1)]
    probs = torch.softmax(tokens @ w["layers.0.router"].detach(), -1)
    counts = torch.bincount(probs.topk(2).indices.reshape(-1), minlength=4).double()
    fraction = counts / (2 * len(tokens))
    expected = 4 * float((fraction * probs.mean(0)).sum())
    share, value = aux_loss(stats, g, per_ep_rank=False)
    assert abs(value - expected) < 1e-12 and abs(float(share.detach()) - expected) < 1e-12
    share.backward()
    assert w["layers.0.router"].grad is not None  # the loss trains the router
