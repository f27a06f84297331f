"""Whether the reference policy's bf16 forward depends on the micro-batch size, on this CPU.

    python benchmarks/longrun/forward_paths.py [--seeds 5]

For each seed, the log probs of the first batch of ``traces.py``'s policy family at the
initial weights, computed in micro-batches of 16, 8, 4 and 2 rows, against the float64 ones:
their mean absolute error and their mean error (a shift every token shares), pure bf16 and
bf16 autocast. Rows of the same dtype with equal numbers took the same kernels; a micro-batch
size whose mean error differs from the others' rounds the whole batch another way, which the
long-run gates see as a constant bias (docs/guide/long-runs.md, "Measured").
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import traces

MICRO = (1, 2, 4, 8)  # micro-batches per batch


def log_probs(dtype: str, seed: int, micro: int) -> torch.Tensor:
    """The first batch's log probs (float64), computed ``micro`` micro-batches at a time."""
    family = traces.PolicyFamily(dtype, seed, 1)
    batch, model = family.batches()[0], family.new_model()
    rows = batch["response_mask"].shape[0]
    with torch.no_grad():
        parts = [
            family.log_probs(model, batch, part, lambda w: w)[0].double()
            for part in traces.micro_batches(rows, micro, reverse=False)
        ]
    return torch.cat(parts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    args = parser.parse_args()
    torch.use_deterministic_algorithms(True)
    print("| seed | dtype | rows per micro-batch | mean abs error | mean error |")
    print("| --: | :-- | --: | --: | --: |")
    for seed in range(args.seeds):
        exact = log_probs("float64", seed, 1)
        for dtype in ("bfloat16", "autocast"):
            for micro in MICRO:
                error = log_probs(dtype, seed, micro) - exact
                rows = traces.PROMPTS * traces.GROUP // micro
                print(
                    f"| {seed} | {dtype} | {rows} | {float(error.abs().mean()):.3e} "
                    f"| {float(error.mean()):+.3e} |"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
