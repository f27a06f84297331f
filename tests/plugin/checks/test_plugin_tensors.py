"""Tensor comparisons: n-d metrics and ``check_tensors`` per rank and micro-batch."""

from __future__ import annotations

import re

FORWARD = """
import torch


def test_forward(golden, values):
    for rank in range(2):
        for micro in range(2):
            lp = torch.arange(6, dtype=torch.float32).reshape(2, 3) / 10 - rank - micro
            if [rank, micro] == values.get("perturb"):
                lp[1, 2] += 0.5
            lp = lp.to(getattr(torch, values.get("dtype", "float32")))
            forward = {"log_probs": lp, "mask": torch.ones(2, 3, dtype=torch.bool)}
            for name in values.get("drop", []):
                del forward[name]
            if [rank, micro] not in values.get("skip", []):
                golden.check_tensors("actor", forward, rank=rank, micro=micro)
"""


def test_check_tensors_per_rank_and_micro_batch(project):
    project.write(FORWARD)
    project.set_values()
    project.run().assert_outcomes(passed=1)
    assert sorted(p.name for p in project.golden_dir("test_forward").glob("tensors-*")) == [
        f"tensors-actor-step000000-rank{r}-micro{m}.safetensors" for r in (0, 1) for m in (0, 1)
    ]
    files = project.golden_files()
    project.run().assert_outcomes(passed=1)
    project.run("--golden-strict").assert_outcomes(passed=1)

    project.set_values(perturb=[1, 0])
    result = project.run()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "golden mismatch: *1 of 8 checks failed*",
            "tensor 'actor/log_probs' (step 0, rank 1, micro 0), "
            "allowed rtol=0.0001, atol=1e-06, scale=recorded 1 (built-in default):",
            "    Mismatched elements: 1 / 6 (16.7%)",
            "    Greatest absolute difference: 0.5 at index (1, 2)*",
            "    Greatest relative difference: * at index (1, 2)*",
        ]
    )
    assert project.golden_files() == files


def test_check_tensors_dtype_shape_and_missing_entries(project):
    project.write(FORWARD)
    project.set_values()
    project.run().assert_outcomes(passed=1)

    project.set_values(dtype="bfloat16")
    result = project.run()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["*dtype torch.bfloat16 differs from the recorded torch.float32*"] * 4
    )

    project.set_values(drop=["mask"], skip=[[0, 1]])
    result = project.run()
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    dropped = re.findall(r"tensor 'actor/mask' \(step 0, rank \d, micro \d\): recorded but", out)
    assert len(dropped) == 3
    skipped = "tensor 'actor' (step 0, rank 0, micro 1): recorded but check_tensors was not called"
    assert skipped in out


def test_check_tensors_new_entries_record_or_fail_strictly(project):
    project.write(FORWARD)
    project.set_values(drop=["mask"])
    project.run().assert_outcomes(passed=1)
    files = project.golden_files()

    project.set_values()
    strict = project.run("--golden-strict")
    strict.assert_outcomes(failed=1)
    assert strict.stdout.str().count("tensor 'actor/mask' (step 0, rank") == 4
    assert "--update-golden" in strict.stdout.str()
    assert project.golden_files() == files

    project.run().assert_outcomes(passed=1)  # recorded next to the existing log_probs
    project.run("--golden-strict").assert_outcomes(passed=1)


def test_tensor_metric_mismatch_reports_count_and_index(project):
    project.write(
        """
        import torch


        def test_metric(golden, values):
            entropy = torch.tensor([[0.5, 0.25], [1.0, 2.0]], dtype=torch.float64)
            entropy[tuple(values["at"])] += values["by"]
            golden.check({"token_entropy": entropy, "mean": entropy.mean()})
        """
    )
    project.set_values(at=[0, 0], by=0.0)
    project.run().assert_outcomes(passed=1)

    project.set_values(at=[1, 0], by=-0.5)
    result = project.run()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "golden mismatch: *2 of 2 checks failed*",
            "  mean  *",
            "metric 'token_entropy' (step 0), allowed rtol=0.0001, atol=1e-08, "
            "scale=recorded 2 (built-in default for training values):",
            "    Mismatched elements: 1 / 4 (25.0%)",
            "    Greatest absolute difference: 0.5 at index (1, 0) (up to 0.0002 allowed)",
            "    Greatest relative difference: 0.5 at index (1, 0) "
            "(up to 0.0001 of max(|expected|, 2) allowed)",
        ]
    )
    row = project.mismatch_row(result, "mean")
    assert float(row["expected"]) == 0.9375 and float(row["actual"]) == 0.8125
