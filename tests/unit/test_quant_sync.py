"""The weight-sync round trip (quant/sync.py): correct refits pass in every format over
hypothesis-drawn weights (outliers, zero blocks, tiny values; the engine rounding its E8M0
scales up where the reference rounds down), and each wrong layout fails naming the parameter,
the first differing block and the layout that would match; the CPU reproduction of verl#7986
(an MXFP8 MoE refit whose fused gate/up halves land swapped, which a layer-set audit passes)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from hypothesis import (  # noqa: E402
    given,
    settings,
    strategies as st,
)

from pytest_rollout_golden.quant import (  # noqa: E402
    formats as F,
    manifest,
    sync,
)

EXPERTS = "model.layers.1.mlp.experts.gate_up_proj"


def encode(master: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    """What an engine stores for ``master`` sent in bf16: float8 codes and the scale tensor
    (E8M0 scales as their bytes, ``127 + log2 scale``; others float32), quantized by the
    reference (``fmt`` may round E8M0 scales otherwise than the check assumes)."""
    q = F.quantize(master.to(torch.bfloat16), fmt)
    dtype = torch.float8_e5m2 if q.format.element == "e5m2" else torch.float8_e4m3fn
    if q.format.scale == "e8m0":
        scale = (torch.frexp(q.scales)[1] - 1 + 127).to(torch.uint8)
    else:
        scale = q.scales.to(torch.float32)
    return q.codes.to(dtype), scale


def refit(
    master: dict[str, torch.Tensor], fmt: str, skip=("gate.weight", "norm", "embed", "lm_head")
):
    """An engine state dict: every matrix weight but the skipped as codes + ``_scale``."""
    out = {}
    for name, tensor in master.items():
        if tensor.ndim < 2 or any(s in name for s in skip):
            out[name] = tensor.to(torch.bfloat16)
            continue
        out[name], out[name + "_scale"] = encode(tensor, fmt)
    return out


def qwen2_moe() -> dict[str, torch.Tensor]:
    config = transformers.Qwen2MoeConfig(
        vocab_size=64, hidden_size=64, intermediate_size=64, moe_intermediate_size=32,
        shared_expert_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, mlp_only_layers=[0],
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.Qwen2MoeForCausalLM(config)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02)
    return model.state_dict()


# ---------------------------------------------------------------------- no false alarms


@st.composite
def weights(draw):
    """A float32 weight [E, rows, cols] or [rows, cols] with outliers, zero rows and tiny
    values (subnormal after scaling)."""
    experts = draw(st.sampled_from([None, 2]))
    rows = draw(st.integers(1, 9))
    cols = 32 * draw(st.integers(1, 5))
    shape = (rows, cols) if experts is None else (experts, rows, cols)
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(shape, generator=g) * draw(st.sampled_from([1e-6, 0.02, 1.0, 300.0]))
    flat = w.view(-1, cols)
    for row in draw(st.lists(st.integers(0, flat.shape[0] - 1), max_size=2)):
        flat[row] = 0.0  # zero blocks
    for at in draw(st.lists(st.integers(0, w.numel() - 1), max_size=3)):
        w.view(-1)[at] *= draw(st.sampled_from([1e3, 1e-30]))  # outliers, near-zero values
    return w


FORMATS = ["fp8_e4m3_tensor", "fp8_e5m2_tensor", "fp8_e4m3_block128", "mxfp8_e4m3"]


@settings(max_examples=60, deadline=None)
@given(w=weights(), fmt=st.sampled_from(FORMATS), rceil=st.booleans())
def test_a_correct_round_trip_never_fails(w, fmt, rceil):
    """0 false alarms: codes + scales, a Quantized, or the dequantized tensor, in every
    format; an MXFP8 engine may round its E8M0 scales up (NVIDIA's rceil)."""
    engine_fmt = f"{fmt}@rceil" if rceil and fmt.startswith("mxfp8") else fmt
    codes, scale = encode(w, engine_fmt)
    master = {"w": w}
    sync.check_round_trip(master, {"w": codes, "w_scale": scale}, formats=fmt)
    quantized = F.quantize(w.to(torch.bfloat16), engine_fmt)
    sync.check_round_trip(master, {"w": quantized}, formats=fmt)
    sync.check_round_trip(master, {"w": F.dequantize(quantized)}, formats=fmt)


def test_the_format_is_read_from_the_tensors():
    master = qwen2_moe()
    found = sync.check_round_trip(master, refit(master, "mxfp8_e4m3"))
    assert len(found.compared) == len(master)
    assert 0 < found.compared[EXPERTS] < 2**-4  # within e4m3's relative half step


# ---------------------------------------------------------------------- wrong layouts


def test_verl_7986_mxfp8_moe_refit_with_swapped_halves_passes_the_audit_fails_the_round_trip():
    """verl#7986: the refit wrote checkpoint-layout expert weights into a buffer the kernel
    had repacked (FlashInfer's W13 -> W31): the engine computes with gate and up swapped.
    The layer-set audit (which layers are MXFP8) is clean; the round trip is not."""
    master = qwen2_moe()
    engine = refit(master, "mxfp8_e4m3")
    rules = manifest.Rules("mxfp8", ignore=["mlp.gate", "lm_head", "embed_tokens",
                                            "shared_expert_gate"])  # fmt: skip
    audit = manifest.build(manifest.Rules("mxfp8", ignore=rules.ignore), engine, rules=rules,
                           same=True)  # fmt: skip
    assert audit.problems == []
    half = engine[EXPERTS].shape[-2] // 2
    for key in (EXPERTS, EXPERTS + "_scale"):  # what the kernel reads, in checkpoint layout
        engine[key] = torch.cat([engine[key][:, half:], engine[key][:, :half]], dim=-2)
    found = sync.round_trip(master, engine)
    assert [m.name for m in found.mismatches] == [EXPERTS]
    (m,) = found.mismatches
    assert 1.2 < m.relative < 1.6  # two independent halves swapped: about sqrt(2)
    text = found.describe()
    assert f"{EXPERTS} (mxfp8_e4m3): " in text
    assert "first differing block: expert 0, rows 0-0, cols 0-31" in text
    assert "matches with its two fused halves along dim -2 swapped (gate/up order" in text
    with pytest.raises(AssertionError, match="1 of 31 parameters beyond their bounds"):
        sync.check_round_trip(master, engine)


def test_experts_in_the_wrong_order_name_the_swap():
    master = qwen2_moe()
    engine = refit(master, "mxfp8_e4m3")
    for key in (EXPERTS, EXPERTS + "_scale"):
        engine[key] = engine[key][[0, 3, 2, 1]]
    (m,) = sync.round_trip(master, engine).mismatches
    assert m.first_block == "expert 1, rows 0-0, cols 0-31"
    assert m.matches == "matches if experts 1 and 3 are swapped"


def test_a_transposed_block_is_named():
    master = qwen2_moe()
    name = "model.layers.0.self_attn.o_proj.weight"
    engine = refit(master, "fp8_e4m3_block128")
    engine[name] = engine[name].T.contiguous()
    (m,) = sync.round_trip(master, engine).mismatches
    # one 128x128 tile covers the 64x64 matrix: one scale, read as tensorwise
    assert (m.name, m.format, m.matches) == (name, "fp8_e4m3_tensor", "matches transposed")
    assert m.first_block == "element (0, 1)"  # the diagonal survives a transpose


def test_a_transposed_matrix_of_another_shape_is_named():
    master = qwen2_moe()
    name = "model.layers.1.mlp.shared_expert.down_proj.weight"  # [64, 32]
    engine = refit(master, "mxfp8_e4m3")
    del engine[name + "_scale"]  # sent unquantized, transposed
    engine[name] = master[name].T.contiguous().to(torch.bfloat16)
    (m,) = sync.round_trip(master, engine).mismatches
    assert m.first_block == "the whole tensor: shape (32, 64) is the master's transposed"
    assert (m.format, m.matches) == ("bfloat16", "matches transposed")


def test_an_e8m0_nan_scale_fails():
    w = torch.randn(2, 32)
    codes, scale = encode(w, "mxfp8_e4m3")
    scale[1, 0] = 255
    (m,) = sync.round_trip({"w": w}, {"w": codes, "w_scale": scale}).mismatches
    assert m.first_block == "rows 1-1, cols 0-31"


def test_tensor_parallel_shards_concatenated_in_the_wrong_order():
    master = qwen2_moe()
    name = "model.layers.0.mlp.down_proj.weight"
    engine = refit(master, "mxfp8_e4m3")
    codes, scale = engine[name], engine[name + "_scale"]
    engine[name] = torch.cat(codes.chunk(2, dim=-1)[::-1], dim=-1)
    engine[name + "_scale"] = torch.cat(scale.chunk(2, dim=-1)[::-1], dim=-1)
    (m,) = sync.round_trip(master, engine, shards=2).mismatches
    assert m.matches == "matches with its 2 shards along dim -1 in the order [1, 0]"


def test_a_fused_qkv_split_in_the_wrong_order():
    torch.manual_seed(1)
    q, k, v = torch.randn(64, 64), torch.randn(32, 64), torch.randn(32, 64)
    master = {"qkv_proj.weight": torch.cat([q, k, v])}
    engine = {"qkv_proj.weight": torch.cat([k, q, v]).to(torch.bfloat16)}
    found = sync.round_trip(master, engine, splits={"qkv_proj.weight": (64, 32, 32)})
    (m,) = found.mismatches
    assert m.matches == "matches with its fused parts along dim -2 in the order [1, 0, 2]"
    assert m.format == "bfloat16"


def test_a_parameter_never_received_and_a_shape_that_cannot_match():
    master = {"a.weight": torch.ones(4, 32), "b.weight": torch.ones(4, 32)}
    found = sync.round_trip(master, [("a.weight", torch.ones(4, 32))])
    assert found.missing == ["b.weight"] and not found.ok
    assert "b.weight: the engine received no tensor of this name" in found.describe()
    with pytest.raises(ValueError, match=r"a.weight: the engine holds shape \(4, 31\)"):
        sync.round_trip(master, {"a.weight": torch.ones(4, 31), "b.weight": torch.ones(4, 32)})


def test_an_engine_rounding_its_scales_up_needs_the_factor_2():
    """NVIDIA's rceil E8M0 scale of a block with amax 1.9 is 2^-7, the OCP floor scale 2^-8:
    an element 2.5 subnormal steps high at the larger scale rounds (ties to even) by half a
    step of that scale, twice the reference's bound; the round trip allows it."""
    w = torch.zeros(1, 32)
    w[0, 0], w[0, 1] = 1.9, 5 * 2.0**-17  # 2.5 * 2^-9 (e4m3's smallest subnormal) * 2^-7
    q = F.quantize(w.to(torch.bfloat16), "mxfp8_e4m3@rceil")
    error = (F.dequantize(q) - w.double()).abs()[0, 1]
    bound = F.error_bound(w.to(torch.bfloat16).double(), "mxfp8_e4m3")[0, 1]
    assert 1.999 < float(error / bound) <= 2.0  # the bound holds a float64 rounding margin
    sync.check_round_trip({"w": w}, {"w": q}, formats="mxfp8_e4m3")
