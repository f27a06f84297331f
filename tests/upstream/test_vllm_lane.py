"""Runs ``test_vllm_classes.py`` in a subprocess with vLLM 0.33.0's folder first on the path.

vLLM lives in ``.venv/vllm033`` (``tests/upstream/requirements-vllm.txt``), not in the main
venv: where ``vllm`` is importable, TRL's ``GRPOTrainer`` imports vLLM's engine, which needs
xgrammar, and the TRL lanes would skip. In this process ``test_vllm_classes.py`` therefore
skips; here it must pass whole, without a skip (a skip there would hide a failure).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
VLLM033 = Path(os.environ.get("VLLM033_TARGET", REPO / ".venv" / "vllm033"))


def test_vllm_classes_pass_on_vllm_0_33():
    if not (VLLM033 / "vllm" / "outputs.py").is_file():
        pytest.skip(
            f"vLLM 0.33.0 is not installed in {VLLM033}; install it as "
            "tests/upstream/requirements-vllm.txt says"
        )
    path = os.pathsep.join([str(VLLM033), str(REPO), os.environ.get("PYTHONPATH", "")])
    command = [sys.executable, "-m", "pytest", str(HERE / "test_vllm_classes.py"), "-q", "-rs"]
    command += ["-p", "no:cacheprovider", "-p", "no:xdist", "-W", "ignore::DeprecationWarning"]
    done = subprocess.run(
        command, cwd=REPO, env={**os.environ, "PYTHONPATH": path},
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-2000:]
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert "skipped" not in summary and "passed" in summary, done.stdout[-3000:]
