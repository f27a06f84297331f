"""golden.check_precision through pytest: record -> replay passes -> one layer's precision
changes on the engine side -> fails naming it, both sides and the rule -> --update-golden ->
passes; a substring pattern fails whatever the golden says and records nothing; a recorded
manifest no longer checked is missing."""

from __future__ import annotations

import json

import pytest

# Parameter names and shapes of a tiny Qwen2-MoE (transformers' Qwen2MoeForCausalLM, layer 0
# dense, layer 1 MoE), written out so the inner runs need not import transformers.
SOURCE = """
import torch

from pytest_rollout_golden.quant.manifest import Rules

SHAPES = {
    "model.embed_tokens.weight": (64, 32),
    "model.layers.0.self_attn.o_proj.weight": (32, 32),
    "model.layers.0.mlp.gate_proj.weight": (64, 32),
    "model.layers.0.mlp.up_proj.weight": (64, 32),
    "model.layers.0.input_layernorm.weight": (32,),
    "model.layers.1.self_attn.o_proj.weight": (32, 32),
    "model.layers.1.mlp.gate.weight": (4, 32),
    "model.layers.1.mlp.experts.gate_up_proj": (4, 64, 32),
    "model.norm.weight": (32,),
    "lm_head.weight": (64, 32),
}


def test_manifest(golden, values):
    golden.check({"loss": 0.5})
    if values.get("skip"):
        return
    trainer = {name: torch.zeros(shape, dtype=torch.bfloat16) for name, shape in SHAPES.items()}
    engine = Rules("mxfp8", ignore=values["ignore"], match=values.get("match", "whole"),
                   source="vllm ignored_layers")
    golden.check_precision(trainer, rules=engine)
"""

IGNORE = ["lm_head", "embed_tokens", "mlp.gate"]


@pytest.fixture
def manifest_project(project):
    project.write(SOURCE)
    project.set_values(ignore=IGNORE)
    return project


def recorded(project) -> dict:
    path = project.golden_dir("test_manifest") / "precision-precision.json"
    return json.loads(path.read_text())["layers"]


def test_record_replay_change_fail_update(manifest_project):
    project = manifest_project
    project.run().assert_outcomes(passed=1)
    layers = recorded(project)
    assert layers["model.layers.0.self_attn.o_proj.weight"]["engine"] == "mxfp8"
    assert layers["model.layers.1.mlp.gate.weight"]["engine_rule"] == (
        "vllm ignored_layers: ignore 'mlp.gate' (whole)"
    )
    replay = project.run()
    replay.assert_outcomes(passed=1)
    assert project.counts(replay)["replayed"] == 1

    project.set_values(ignore=[*IGNORE, "layers.0.self_attn.o_proj"])
    result = project.run()
    result.assert_outcomes(failed=1)
    text = result.stdout.str()
    assert "precision/precision: 1 of 10 parameters changed precision since recorded:" in text
    assert (
        "'model.layers.0.self_attn.o_proj.weight' changed precision: engine: recorded mxfp8 "
        "(vllm ignored_layers: every matrix weight), now bfloat16 (vllm ignored_layers: "
        "ignore 'layers.0.self_attn.o_proj' (whole)); trainer unchanged: bfloat16"
    ) in text
    assert "If the new values are right, run `pytest --update-golden`" in text
    assert recorded(project)["model.layers.0.self_attn.o_proj.weight"]["engine"] == "mxfp8"

    update = project.run("--update-golden")
    update.assert_outcomes(passed=1)
    assert (
        "precision/precision (step 0): 1 of 10 parameters changed precision" in update.stdout.str()
    )
    assert recorded(project)["model.layers.0.self_attn.o_proj.weight"]["engine"] == "bfloat16"
    project.run().assert_outcomes(passed=1)


def test_a_substring_pattern_fails_even_while_recording(manifest_project):
    project = manifest_project
    project.set_values(ignore=IGNORE, match="substring")
    result = project.run()
    result.assert_outcomes(failed=1)
    text = result.stdout.str()
    assert (
        "precision/precision: pattern 'mlp.gate' (vllm ignored_layers, matched by substring) "
        "selects 1 parameter(s) that a whole-module-name match would not: "
        "'model.layers.0.mlp.gate_proj.weight'"
    ) in text
    assert not (project.golden_dir("test_manifest") / "precision-precision.json").exists()


def test_a_recorded_manifest_not_checked_is_missing(manifest_project):
    project = manifest_project
    project.run().assert_outcomes(passed=1)
    project.set_values(skip=True)
    result = project.run()
    result.assert_outcomes(failed=1)
    assert "recorded but check_precision was not called" in result.stdout.str()


def test_routers_quantized_fail_unless_declared(manifest_project):
    project = manifest_project
    project.set_values(ignore=["lm_head", "embed_tokens"])
    result = project.run()
    result.assert_outcomes(failed=1)
    assert (
        "router 'model.layers.1.mlp.gate.weight' is quantized on the engine side (mxfp8, by "
        "vllm ignored_layers: every matrix weight)"
    ) in result.stdout.str()


def test_a_manifest_never_recorded_is_missing_under_ci(manifest_project, monkeypatch):
    project = manifest_project
    project.set_values(skip=True)
    project.run().assert_outcomes(passed=1)  # a golden of the metric alone
    project.set_values(ignore=IGNORE)
    monkeypatch.setenv("CI", "1")
    result = project.run()
    result.assert_outcomes(failed=1)
    assert (
        "precision/precision: the golden holds no precision manifest precision-precision.json; "
        "run `pytest --update-golden`"
    ) in result.stdout.str()
