"""The long-run harness the long-runs guide's tables come from (``benchmarks/longrun``), run
small: one seed of 12 float32 steps of the reference policy, through ``gates.py``.

In float32 same-math noise is ~1e-7 and every seeded defect is 1e-3 or more, so on any seed
every unchanged and same-math replay passes every gate and every defect fails one: a harness
or a gate that stops telling them apart fails here before its numbers reach the docs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LONGRUN = ROOT / "benchmarks" / "longrun"
DEFECTS = ("loss_x1.001", "logprob_gap_3x", "kl_3x")


def _run(*args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _replay_column(table: str) -> dict[str, str]:
    """Each row's ``replay (all)`` cell of ``gates.py``'s table, by run label."""
    lines = [line for line in table.splitlines() if line.startswith("| ")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    column = header.index("replay (all)")
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]
    return {row[0]: row[column] for row in rows}


def test_the_harness_gates_pass_same_math_runs_and_fail_each_defect(tmp_path):
    out = tmp_path / "traces.json"
    _run(
        str(LONGRUN / "traces.py"),
        *("--out", str(out), "--seeds", "1", "--steps", "12", "--jobs", "1"),
        *("--settings", "policy-float32"),
    )
    how = json.loads(out.read_text())["how"]
    assert how["policy"]["lr"] == 0.02, how
    replay = _replay_column(_run(str(LONGRUN / "gates.py"), str(out)))
    defects = {label for label in replay if label.split("+")[-1] in DEFECTS}
    assert len(defects) == 6, replay  # each defect on the reference and on a variant
    assert {label: replay[label] for label in defects} == dict.fromkeys(defects, "1/1")
    passing = {label: cell for label, cell in replay.items() if label not in defects}
    assert "unchanged-threads3" in passing and "mb8" in passing, replay
    assert passing == dict.fromkeys(passing, "0/1")
