"""deterministic() applies inductor's deterministic mode without importing inductor."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def run(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_inductor_is_not_imported_and_its_setting_still_follows():
    # One fresh interpreter (importing torch costs seconds on a busy machine), three phases.
    out = run(
        """
        import sys, torch
        from pytest_rollout_golden import deterministic

        with deterministic(0):
            on = torch.are_deterministic_algorithms_enabled()
        print(on, torch.are_deterministic_algorithms_enabled(), "torch._inductor" in sys.modules)

        with deterministic(0):  # inductor imported inside: reads TORCHINDUCTOR_DETERMINISTIC
            import torch._inductor.config as cfg
            inside = cfg.deterministic
        print(inside, cfg.deterministic)

        with deterministic(0):  # inductor loaded before: switched directly, then restored
            inside = cfg.deterministic
        print(inside, cfg.deterministic)
        """
    )
    assert out.splitlines() == ["True False False", "True False", "True False"]
