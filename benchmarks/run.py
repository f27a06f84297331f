"""Run every benchmark and print one Markdown report: ``python benchmarks/run.py [--quick]``.

Figures are ratios of measurements taken side by side in this run, never
absolute times checked by a test; the last table says which of the project's
targets this machine meets.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

import bench_bisect
import bench_certify
import bench_changepoints
import bench_compare
import bench_determinism
import bench_example
import bench_history
import bench_io
import bench_longrun
import bench_parallel
import bench_startup
import torch
from harness import table

SECTIONS = {
    "io": bench_io,
    "compare": bench_compare,
    "startup": bench_startup,
    "example": bench_example,
    "determinism": bench_determinism,
    "parallel": bench_parallel,
    "longrun": bench_longrun,
    "bisect": bench_bisect,
    "changepoints": bench_changepoints,
    "certify": bench_certify,
    "history": bench_history,
}
# Minutes of TRL training on CPU (and trl installed): only when named with --only.
OPT_IN = {"certify"}


def _load() -> str:
    """The 1-minute load average: other work on the machine makes every figure noisier."""
    return f"{os.getloadavg()[0]:.2f}" if hasattr(os, "getloadavg") else "n/a"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, few rounds (smoke)")
    parser.add_argument(
        "--only", choices=SECTIONS, action="append", help="run only these sections (repeatable)"
    )
    args = parser.parse_args()

    start = time.perf_counter()
    # One intra-op thread throughout: every candidate gets the same CPU, and on a small shared
    # machine a second OpenMP thread waiting for a busy core only adds noise.
    torch.set_num_threads(1)
    print(f"# pytest-rollout-golden benchmarks{' (--quick)' if args.quick else ''}\n")
    print(
        f"Python {platform.python_version()}, torch {torch.__version__}, {platform.machine()},"
        f" {os.cpu_count()} CPUs, {platform.system()} {platform.release()};"
        f" `torch.set_num_threads(1)`; load average at start {_load()}\n"
    )
    targets = []
    for name in args.only or [s for s in SECTIONS if s not in OPT_IN]:
        section = SECTIONS[name].run(args.quick)
        print(f"## {section.title}\n\n{section.body}\n", flush=True)
        targets += section.targets

    print("## Targets\n")
    print(table(["target", "measured", "verdict"], [t.row() for t in targets]))
    print(f"\nTotal benchmark time: {time.perf_counter() - start:.0f} s; load average {_load()}.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
