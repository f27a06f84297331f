"""The exact lane on a GPU: record a CUDA training run, replay it bit for bit, catch one ulp.

A pytester project trains a small MLP with AdamW on CUDA in float32 and bfloat16 for three
steps, on a rollout batch that lives on the GPU. Recording and two replays under
``--golden-exact`` (bit equality) must agree: the plugin's deterministic settings (cuBLAS
workspace, deterministic algorithms, seeded generators) make the run reproducible, and the
store gives back the bf16 CUDA batch bit for bit, on the GPU. A learning rate 1% off must
fail the exact lane in both dtypes, naming the weights. Skipped without CUDA
(CI has none); run on a GPU machine with ``pytest tests/plugin/lanes/test_cuda_exact_lane.py``.
"""

from __future__ import annotations

from cuda_training import TRAIN, needs_cuda

pytestmark = needs_cuda("CUDA exact lane")

TRAINING = (
    """
import json, pathlib
import pytest
import torch

SCALE = json.loads(pathlib.Path("values.json").read_text()).get("lr_scale", 1.0)

def make_batch():
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(256, 64, device="cuda", generator=g)
    return {"x": x, "x_bf16": x.to(torch.bfloat16), "mask": x[:, 0] > 0}

@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_train(golden, dtype):
    batch = golden.rollout(make_batch)
    assert batch["x_bf16"].device.type == "cuda" and batch["x_bf16"].dtype == torch.bfloat16
    x = batch["x"] if dtype == "float32" else batch["x_bf16"]
    train(golden, x, batch["mask"], "cuda", getattr(torch, dtype), 1e-3 * SCALE)
"""
    + TRAIN
)


def test_a_cuda_training_run_replays_bit_for_bit_and_a_changed_lr_fails(project):
    project.write(TRAINING)
    project.set_values()
    project.run_subprocess("--update-golden").assert_outcomes(passed=2)
    for _ in range(2):
        project.run_subprocess("--golden-exact").assert_outcomes(passed=2)
    project.set_values(lr_scale=1.01)
    exact = project.run_subprocess("--golden-exact")
    exact.assert_outcomes(failed=2)
    assert "weights/w0" in exact.stdout.str()
