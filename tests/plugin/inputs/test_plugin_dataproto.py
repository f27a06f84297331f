"""Rollout batches through pytest: DataProto-like round trips, bit-exactness, refused values."""

from __future__ import annotations

import pytest

DATAPROTO = """
import dataclasses
import math

import numpy as np
import torch


@dataclasses.dataclass
class DataProto:
    batch: dict
    non_tensor_batch: dict
    meta_info: dict


def objects(*items):
    out = np.empty(len(items), dtype=object)
    for i, item in enumerate(items):
        out[i] = item
    return out


def make():
    g = torch.Generator().manual_seed(0)
    # bf16 bit patterns: a NaN with a payload, -0.0, the smallest subnormal, +inf, then noise
    special = torch.tensor([0x7FC1, -0x8000, 0x0001, 0x7F80], dtype=torch.int16)
    noise = torch.randn(6, generator=g).to(torch.bfloat16).view(torch.int16)
    return DataProto(
        batch={
            "responses": torch.randint(0, 32000, (2, 5), generator=g),
            "old_log_probs": torch.cat([special, noise]).view(torch.bfloat16).reshape(2, 5),
            "attention_mask": torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool),
            "token_level_scores": torch.randn(2, 5, generator=g, dtype=torch.float16),
        },
        non_tensor_batch={
            "uid": objects("3f2a-uid", "3f2a-uid"),
            "raw_prompt": objects([{"role": "user", "content": "2+2?"}], []),
            "acc": np.array([0.5, 1.0], dtype=np.float32),
        },
        meta_info={
            "temperature": 0.7,
            "eos_token_id": [2, 32000],
            "global_steps": 3,
            "validate": None,
            "note": float("nan"),
            "pair": (1, "x"),
        },
    )


def bits(t):
    return t.view(torch.int16) if t.dtype in (torch.bfloat16, torch.float16) else t


def test_rollout(golden, generated):
    expected = make()
    batch = golden.rollout(lambda: generated("rollout", make()))
    assert type(batch) is DataProto
    assert list(batch.batch) == list(expected.batch)
    for key, want in expected.batch.items():
        got = batch.batch[key]
        assert (got.dtype, got.shape) == (want.dtype, want.shape), key
        assert torch.equal(bits(got), bits(want)), key
    assert list(batch.non_tensor_batch) == list(expected.non_tensor_batch)
    for key, want in expected.non_tensor_batch.items():
        got = batch.non_tensor_batch[key]
        assert isinstance(got, np.ndarray) and got.dtype == want.dtype, key
        assert got.shape == want.shape and got.tolist() == want.tolist(), key
    note = batch.meta_info.pop("note")
    assert isinstance(note, float) and math.isnan(note)
    expected.meta_info.pop("note")
    assert batch.meta_info == expected.meta_info
    assert type(batch.meta_info["pair"]) is tuple
"""


@pytest.mark.parametrize("import_mode", ["prepend", "importlib"])
def test_dataproto_round_trip_is_bit_exact(project, import_mode):
    project.write(DATAPROTO)
    project.run(f"--import-mode={import_mode}").assert_outcomes(passed=1)
    assert project.calls() == ["rollout"]
    result = project.run(f"--import-mode={import_mode}")
    result.assert_outcomes(passed=1)
    assert project.calls() == [], "the replayed batch is the recorded one, not a regenerated one"


def test_save_batch_and_load_batch_outside_a_test(project):
    project.write(
        DATAPROTO
        + """

def test_api(tmp_path):
    from pytest_rollout_golden import load_batch, save_batch

    save_batch(tmp_path / "batch.safetensors", make())
    loaded = load_batch(tmp_path / "batch.safetensors")
    assert type(loaded) is DataProto
    assert torch.equal(bits(loaded.batch["old_log_probs"]), bits(make().batch["old_log_probs"]))
    assert loaded.non_tensor_batch["uid"].tolist() == ["3f2a-uid", "3f2a-uid"]
"""
    )
    project.run("-k", "test_api").assert_outcomes(passed=1, deselected=1)


@pytest.mark.parametrize(
    ("generate", "path", "type_name"),
    [
        ('{"meta": {"tokenizer": object()}}', "['meta']['tokenizer']", "builtins.object"),
        ('{"rows": [1, 2, {3, 4}]}', "['rows'][2]", "builtins.set"),
        (
            'DataProto({"x": torch.ones(2)}, {}, {"sampler": lambda: 0})',
            "['meta_info']['sampler']",
            "builtins.function",
        ),
    ],
)
def test_unsupported_value_is_refused_at_record_time(project, generate, path, type_name):
    project.write(
        f"""
        import dataclasses

        import torch


        @dataclasses.dataclass
        class DataProto:
            batch: dict
            non_tensor_batch: dict
            meta_info: dict


        def test_rollout(golden):
            golden.rollout(lambda: {generate})
        """
    )
    result = project.run()
    result.assert_outcomes(failed=1)
    message = f"UnsupportedValueError: value at {path} has type {type_name}, which cannot be"
    assert message in result.stdout.str()
    assert project.golden_files() == {}


def test_unsupported_metric_is_refused_with_its_name(project):
    project.write(
        """
        def test_metric(golden):
            golden.check({"pg_loss": 0.5, "reward": "high"}, step=2)
        """
    )
    result = project.run()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["E  *UnsupportedValueError: metric 'reward' at step 2: *str*"])
    assert project.golden_files() == {}
