"""The precision manifest (quant/manifest.py) on a tiny Qwen2-MoE and Mixtral built from their
configs (real parameter names): whole-name pattern matching, scheme detection from tensors,
and the CPU reproductions of verl#7519 (a substring pattern) and NeMo-RL#3614 (routers
quantized by a skip list that missed their spellings)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from pytest_rollout_golden.quant import manifest as m  # noqa: E402


def qwen2_moe() -> dict[str, torch.Tensor]:
    """Layer 0 dense (``mlp.gate_proj``), layer 1 MoE (router ``mlp.gate``, fused experts)."""
    config = transformers.Qwen2MoeConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=32,
        shared_expert_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, mlp_only_layers=[0],
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.Qwen2MoeForCausalLM(config).to(torch.bfloat16)
    return model.state_dict()


def mixtral() -> dict[str, torch.Tensor]:
    config = transformers.MixtralConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
        num_experts_per_tok=2,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.MixtralForCausalLM(config).to(torch.bfloat16).state_dict()


def engine_holding(state: dict[str, torch.Tensor], rules: m.Rules) -> dict[str, torch.Tensor]:
    """What an engine loaded under ``rules`` holds: each selected weight as float8 e4m3 with
    the scale companion its scheme has (values are irrelevant to the manifest)."""
    out = {}
    for name, tensor in state.items():
        scheme, _ = rules.decide(name, tensor.ndim)
        if scheme == "bfloat16":
            out[name] = tensor
            continue
        out[name] = tensor.to(torch.float8_e4m3fn)
        rows, cols = tensor.shape[-2:]
        lead = tuple(tensor.shape[:-2])
        if scheme == "mxfp8":
            out[name + "_scale"] = torch.zeros(*lead, rows, cols // 32, dtype=torch.uint8)
        else:  # fp8-e4m3-block128
            blocks = (*lead, -(-rows // 128), -(-cols // 128))
            out[name + "_scale_inv"] = torch.ones(blocks)
    return out


# ---------------------------------------------------------------------- matching


@pytest.mark.parametrize(
    ("pattern", "name", "whole"),
    [
        ("mlp.gate", "model.layers.1.mlp.gate.weight", True),
        ("mlp.gate", "model.layers.0.mlp.gate_proj.weight", False),
        ("mlp.gate", "model.layers.0.mlp.gate_up_proj.weight", False),
        ("mlp.gate.", "model.layers.1.mlp.gate.weight", True),
        ("lm_head", "lm_head.weight", True),
        ("layers.*.mlp.gate", "model.layers.7.mlp.gate.weight", True),
        ("gate", "model.layers.0.block_sparse_moe.gate.weight", True),
        ("gate", "model.layers.0.mlp.shared_expert_gate.weight", False),
    ],
)
def test_patterns_match_whole_dotted_names(pattern: str, name: str, whole: bool):
    assert m.whole_match(pattern, name) is whole


def test_substring_only_lists_what_a_whole_match_would_not_select():
    names = list(qwen2_moe())
    found = m.substring_only(["mlp.gate", "lm_head"], names)
    assert set(found) == {"mlp.gate"}
    assert found["mlp.gate"] == ["model.layers.0.mlp.gate_proj.weight"]


# ---------------------------------------------------------------------- detection


def test_schemes_are_read_from_the_tensors():
    w = torch.zeros(256, 256)
    state = {
        "a.weight": w.to(torch.bfloat16),
        "b.weight": w.to(torch.float8_e4m3fn), "b.weight_scale": torch.ones(()),
        "c.weight": w.to(torch.float8_e4m3fn), "c.weight_scale_inv": torch.ones(2, 2),
        "d.weight": w.to(torch.float8_e4m3fn),
        "d.weight_scale": torch.zeros(256, 8, dtype=torch.float8_e8m0fnu),
        "e.weight": torch.zeros(256, 128, dtype=torch.uint8),
        "e.weight_scale": torch.zeros(256, 16).to(torch.float8_e4m3fn),
        "e.weight_scale_2": torch.ones(()), "e.input_scale": torch.ones(()),
        "f.weight": w.to(torch.float8_e5m2),
        "g.experts.w13_weight": torch.zeros(4, 64, 32).to(torch.float8_e4m3fn),
        "g.experts.w13_weight_scale": torch.zeros(4, 64, 1, dtype=torch.uint8),
    }  # fmt: skip
    found = {name: entry.scheme for name, entry in m.detect(state).items()}
    assert found == {
        "a.weight": "bfloat16", "b.weight": "fp8-e4m3", "c.weight": "fp8-e4m3-block128",
        "d.weight": "mxfp8", "e.weight": "nvfp4", "f.weight": "fp8-e5m2",
        "g.experts.w13_weight": "mxfp8",
    }  # fmt: skip
    assert "scale float32 [2, 2]" in m.detect(state)["c.weight"].rule


# ---------------------------------------------------------------------- the bug classes


IGNORE = ["lm_head", "embed_tokens", "mlp.gate", "shared_expert_gate"]  # norms: 1-D, never fp8


def test_verl_7519_a_substring_pattern_is_reported_naming_the_parameters():
    """verl#7519: the engine's filter tested ``"mlp.gate" in name``, so the dense MLP's
    ``gate_proj`` stayed bf16 in the rollout while training ran it in MXFP8."""
    state = qwen2_moe()
    trainer = m.Rules("mxfp8", ignore=IGNORE, source="megatron fp8 recipe")
    engine = m.Rules("mxfp8", ignore=IGNORE, match="substring", source="vllm ignored_layers")
    found = m.build(trainer, engine_holding(state, engine), rules=engine, same=True)
    layer = found.layers["model.layers.0.mlp.gate_proj.weight"]
    assert (layer["trainer"], layer["engine"]) == ("mxfp8", "bfloat16")
    substring = [p for p in found.problems if "matched by substring" in p]
    assert len(substring) == 1
    assert "'mlp.gate'" in substring[0] and "'model.layers.0.mlp.gate_proj.weight'" in substring[0]
    disagree = [p for p in found.problems if "same=True" in p]
    assert len(disagree) == 1 and "gate_proj" in disagree[0] and "mlp.gate" in disagree[0]


def test_verl_7519_fixed_whole_names_agree_and_nothing_is_reported():
    state = qwen2_moe()
    engine = m.Rules("mxfp8", ignore=IGNORE, source="vllm ignored_layers")
    trainer = m.Rules("mxfp8", ignore=IGNORE)
    found = m.build(trainer, engine_holding(state, engine), rules=engine, same=True)
    assert found.problems == []


def vllm_mixtral_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Mixtral's MoE under vLLM's module names: ``block_sparse_moe.gate`` for the router."""
    return {name.replace(".mlp.", ".block_sparse_moe."): t for name, t in state.items()}


SKIP = ["router", "mlp.gate.", "lm_head", "embed_tokens"]  # NeMo-RL#3614, before its fix


@pytest.mark.parametrize(
    ("build", "router"),
    [(qwen2_moe, "model.layers.1.mlp.shared_expert_gate.weight"),
     (lambda: vllm_mixtral_names(mixtral()), "model.layers.0.block_sparse_moe.gate.weight")],
    ids=["qwen2-moe-shared-expert-gate", "mixtral-block-sparse-moe-gate"],
)  # fmt: skip
def test_nemo_rl_3614_routers_quantized_by_a_skip_list_are_flagged(build, router):
    """NeMo-RL#3614: ``SKIP_WEIGHT_SUBSTRINGS`` held ``"router"`` and ``"mlp.gate."``, which
    miss Qwen2-MoE's separate ``shared_expert_gate`` and Mixtral's ``block_sparse_moe.gate``
    (vLLM's names): those routers were quantized."""
    state = build()
    rules = m.Rules("fp8-e4m3-block128", ignore=SKIP, match="substring",
                    source="SKIP_WEIGHT_SUBSTRINGS")  # fmt: skip
    found = m.build(state, rules=rules)
    routers = [p for p in found.problems if p.startswith("router")]
    assert routers == [
        f"router {router!r} is quantized on the engine side (fp8-e4m3-block128, by "
        "SKIP_WEIGHT_SUBSTRINGS: every matrix weight); routers stay in high precision unless "
        "declared: add its pattern to the ignore list, or pass "
        f"declared=[{router.removesuffix('.weight')!r}] if it is on purpose"
    ]
    declared = m.build(state, rules=rules, declared=[router.removesuffix(".weight")])
    assert not [p for p in declared.problems if p.startswith("router")]
    fixed = m.Rules("fp8-e4m3-block128", ignore=["gate", "shared_expert_gate", *SKIP[2:]])
    assert m.build(state, rules=fixed).problems == []


def test_a_regex_pattern_whose_dot_matches_any_character_is_reported():
    """prime-rl#2442: ``re.search("mlp.gate.", name)`` kept ``mlp.gate_proj`` in bf16."""
    rules = m.Rules("fp8-e4m3-block128", ignore=["mlp.gate."], match="regex", source="ignore")
    found = m.build(qwen2_moe(), rules=rules)
    (line,) = [p for p in found.problems if "matched by regex" in p]
    assert "'model.layers.0.mlp.gate_proj.weight'" in line


def test_norms_embeddings_and_the_head_quantized_are_flagged():
    found = m.build(qwen2_moe(), rules=m.Rules("fp8-e4m3"))
    kinds = {p.split(" ")[0] for p in found.problems}
    assert {"embedding", "output", "router"} <= kinds
    assert not any("layernorm" in p for p in found.problems)  # 1-D: never a matrix weight


def test_a_change_names_the_parameter_both_sides_and_the_rules():
    state = qwen2_moe()
    rules = m.Rules("mxfp8", ignore=IGNORE, source="vllm ignored_layers")
    recorded = m.build(state, rules=rules).to_json()
    moved = m.Rules("mxfp8", ignore=[*IGNORE, "o_proj"], source="vllm ignored_layers")
    (line,) = [c for c in m.changes(recorded, m.build(state, rules=moved)) if "layers.0" in c]
    assert line == (
        "'model.layers.0.self_attn.o_proj.weight' changed precision: engine: recorded mxfp8 "
        "(vllm ignored_layers: every matrix weight), now bfloat16 (vllm ignored_layers: "
        "ignore 'o_proj' (whole)); trainer unchanged: bfloat16"
    )
    assert m.changes(recorded, m.build(state, rules=rules)) == []


def test_bad_arguments_say_what_they_take():
    with pytest.raises(TypeError, match="list of patterns"):
        m.Rules("mxfp8", ignore="lm_head")
    with pytest.raises(ValueError, match="whole, substring, regex"):
        m.Rules("mxfp8", match="glob")
    with pytest.raises(TypeError, match="state dict, a module or a Rules"):
        m.build([1, 2], rules=m.Rules("mxfp8"))
