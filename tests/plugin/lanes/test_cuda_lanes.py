"""Lanes on a GPU: one golden holds a CPU lane and a CUDA lane over the same inputs.

A pytester project trains a small bf16 MLP for three steps on a rollout batch recorded on the
CPU and put on the test's device with ``golden.rollout(..., device=)``. The CPU lane records
the golden; a run on CUDA with ``--golden-lane auto`` records its own lane beside it from the
same inputs (``generate`` is not called); the two lanes hold different bf16 numbers (each
platform rounds its own way), and each replays bit for bit on its own device. Skipped
without CUDA (CI has none); run by ``.ci/device-checks`` on a GPU machine.
"""

from __future__ import annotations

import json

from cuda_training import TRAIN, needs_cuda

pytestmark = needs_cuda("CUDA lanes")

TRAINING = (
    """
import json, pathlib
import torch

DEVICE = json.loads(pathlib.Path("values.json").read_text())["device"]

def make_batch():
    with open("calls.log", "a") as log:
        log.write("generate\\n")
    g = torch.Generator().manual_seed(0)
    return {"x": torch.randn(256, 64, generator=g), "mask": torch.rand(256, generator=g) > 0.3}

def test_train(golden):
    batch = golden.rollout(make_batch, device=DEVICE)
    assert batch["x"].device.type == DEVICE
    train(golden, batch["x"].to(torch.bfloat16), batch["mask"], DEVICE, torch.bfloat16, 1e-3)
"""
    + TRAIN
)


def test_a_cpu_lane_and_a_cuda_lane_replay_each_on_its_own_device(project):
    project.write(TRAINING)
    project.set_values(device="cpu")
    project.run_subprocess("--golden-lane", "cpu").assert_outcomes(passed=1)
    assert project.calls() == ["generate"]
    directory = project.golden_dir("test_train")

    project.set_values(device="cuda")
    recorded = project.run_subprocess("--golden-lane", "auto")
    recorded.assert_outcomes(passed=1)
    assert project.calls() == [], "a lane replays the recorded inputs"
    (lane,) = [p.name for p in (directory / "@lanes").iterdir()]
    assert lane.startswith("cuda-sm")
    manifest = json.loads((directory / "@lanes" / lane / "manifest.json").read_text())
    assert manifest["lane"] == lane and manifest["fingerprint"]["capability"]
    lanes = [directory, directory / "@lanes" / lane]
    weights = [sorted(d.glob("tensors-weights-*")) for d in lanes]
    assert len(weights[0]) == len(weights[1]) == 3
    differ = [a.read_bytes() != b.read_bytes() for a, b in zip(*weights, strict=True)]
    metrics = [json.loads((d / "metrics.json").read_text()) for d in lanes]
    assert any(differ) or metrics[0] != metrics[1], "bf16 rounds differently on each platform"

    for device, name in (("cuda", "auto"), ("cpu", "cpu")):
        project.set_values(device=device)
        exact = project.run_subprocess("--golden-strict", "--golden-exact", "--golden-lane", name)
        exact.assert_outcomes(passed=1)
