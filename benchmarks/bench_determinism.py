"""The first ``deterministic()`` of a process, against ``torch.use_deterministic_algorithms``.

Each round starts two fresh interpreters that import torch and numpy and then
time their first entry into deterministic settings: one through
:func:`pytest_rollout_golden.deterministic`, one through torch's own switch
(which imports ``torch._inductor`` to set its ``deterministic`` flag). The order
alternates between rounds; figures are medians.
"""

from __future__ import annotations

import statistics
import subprocess
import sys

from harness import Section, Target, table

_PRELUDE = "import sys, time, torch, numpy\n"
CANDIDATES = {
    "pytest_rollout_golden.deterministic(0)": (
        "from pytest_rollout_golden import deterministic\n"
        "t = time.perf_counter()\n"
        "with deterministic(0):\n    pass\n"
    ),
    "torch.use_deterministic_algorithms(True) (what it called before)": (
        "t = time.perf_counter()\ntorch.use_deterministic_algorithms(True)\n"
    ),
}
_REPORT = "print(time.perf_counter() - t, 'torch._inductor' in sys.modules)\n"


def _first_entry(body: str) -> tuple[float, bool]:
    out = subprocess.run(
        [sys.executable, "-c", _PRELUDE + body + _REPORT], capture_output=True, text=True
    )
    if out.returncode:
        raise RuntimeError(out.stderr)
    seconds, inductor = out.stdout.split()
    return float(seconds), inductor == "True"


def run(quick: bool) -> Section:
    rounds = 3 if quick else 7
    times: dict[str, list[float]] = {name: [] for name in CANDIDATES}
    inductor: dict[str, bool] = {}
    for i in range(rounds):
        names = list(CANDIDATES) if i % 2 else list(CANDIDATES)[::-1]
        for name in names:
            seconds, inductor[name] = _first_entry(CANDIDATES[name])
            times[name].append(seconds)
    ours, torchs = (statistics.median(times[n]) for n in CANDIDATES)
    rows = [
        [name, f"{statistics.median(times[name]) * 1e3:.1f}", "yes" if inductor[name] else "no"]
        for name in CANDIDATES
    ]
    body = table(["first entry in a fresh process", "ms", "imports torch._inductor"], rows)
    body += (
        f"\n\nMedians of {rounds} rounds of fresh interpreters (torch and numpy imported before"
        f" the timer starts); ours takes {ours / torchs:.3f}× the time of torch's switch."
    )
    name = next(iter(CANDIDATES))
    targets = [
        Target(
            "the first deterministic() does not import torch._inductor",
            "imports it" if inductor[name] else "does not import it",
            not inductor[name],
        )
    ]
    return Section("The first deterministic() of a process", body, targets)
