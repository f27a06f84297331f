"""Resume equivalence (examples/test_resume_golden.py): a job restarted from its checkpoint in
a fresh process replays the uninterrupted run's golden; a resume that resets the Adam moments
fails at the first step after it, naming the optimizer state."""

from __future__ import annotations

import re
from pathlib import Path

EXAMPLES = Path(__file__).parents[3] / "examples"

RESUME = """
import pytest

from pytest_rollout_golden import same_math
from resume_job import run_job


@pytest.mark.parametrize("resume", same_math({"uninterrupted": None, "resumed": 3}))
def test_job(golden, tmp_path, resume, values):
    records = run_job(tmp_path, resume, *values.get("args", []))
    for step in range(6):
        golden.check(records[f"step{step}"]["metrics"], step=step)
        golden.check_optimizer(records[f"step{step}"]["optimizer"], step=step)
"""


def test_a_resume_that_resets_the_moments_fails_at_the_first_step_after_it(project):
    for name in ("tiny_rl", "resume_rl"):
        (project.path / f"{name}.py").write_text((EXAMPLES / f"{name}.py").read_text())
    # another module name: the outer session may have imported the original
    job = (EXAMPLES / "test_resume_golden.py").read_text()
    (project.path / "resume_job.py").write_text(job)
    project.write(RESUME)
    project.set_values()
    result = project.run()
    result.assert_outcomes(passed=2)
    assert project.counts(result) == {"replayed": 1, "recorded": 1, "updated": 0, "failed": 0}

    project.set_values(args=["--forget-optimizer"])
    result = project.run("-k", "resumed")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    headline = next(line for line in out.splitlines() if line.startswith("golden mismatch:"))
    assert headline.startswith("golden mismatch: first divergence at step 3: optimizer/")
    for name in ("embed", "mix", "head"):
        assert f"tensor 'optimizer/{name}/exp_avg' (step 3)" in out
        assert f"tensor 'optimizer/{name}/exp_avg_sq' (step 3)" in out
    assert re.search(r"\n  optimizer/embed/step +3 +4\.0 +1\.0 ", out)  # the count restarted
    assert not any(f"  {m}  3 " in out for m in ("pg_loss", "kl", "entropy", "grad_norm"))
