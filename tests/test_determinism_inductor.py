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


def test_first_deterministic_does_not_import_inductor():
    out = run(
        """
        import sys, torch
        from pytest_rollout_golden import deterministic
        with deterministic(0):
            on = torch.are_deterministic_algorithms_enabled()
        print(on, torch.are_deterministic_algorithms_enabled(), "torch._inductor" in sys.modules)
        """
    )
    assert out == "True False False"


def test_inductor_imported_inside_the_context_is_deterministic_then_restored():
    out = run(
        """
        import torch
        from pytest_rollout_golden import deterministic
        with deterministic(0):
            import torch._inductor.config as cfg
            inside = cfg.deterministic
        print(inside, cfg.deterministic)
        """
    )
    assert out == "True False"


def test_inductor_imported_before_is_switched_and_restored():
    out = run(
        """
        import torch
        import torch._inductor.config as cfg
        from pytest_rollout_golden import deterministic
        before = cfg.deterministic
        with deterministic(0):
            inside = cfg.deterministic
        print(before, inside, cfg.deterministic)
        """
    )
    assert out == "False True False"
