"""Real-trainer lane: verl 0.7's legacy ``DataParallelPPOActor`` under the golden plugin.

A throw-away pytest project (pytester) holds one parametrized test that steps the
actor of ``actor_harness.py`` for 3 steps, with ``golden.rollout`` around the rollout
batch, ``golden.check`` on the metrics ``update_policy`` returns and
``golden.check_tensors`` on the old log-probs (masked by ``response_mask``). Its
params are declared with ``same_math``: the reference (micro-batch 8, padded, static
batch, seq-mean-token-mean) records the golden, every other param replays it.

The contract this module encodes (under ``golden_metric_profile = verl``):

* same-math variants pass: micro-batch 8 -> 4, 8 -> 2, dynamic batch size, remove-padding;
* seeded bugs fail, naming the metric that shows them: a dropped grad-accum scale
  (``actor/grad_norm``), a dynamic-batch weight of ``1/len(micro_batches)``
  (``actor/pg_loss``), a per-micro-batch token-mean policy loss (``actor/pg_loss``),
  a backward loss 1e-3 relative too large (``actor/grad_norm``: 1e-3 errors must fail);
* under ``loss_agg_mode=token-mean`` micro-batch 8 -> 4 is a real change on the legacy
  actor (it token-means per micro-batch) and fails (``actor/pg_loss``).

Both inner runs are subprocesses with verl 0.7 first on ``PYTHONPATH``, so verl 0.7
never meets the verl 0.9.1 of the main venv: one run records the references
(``--update-golden -k mb8``), one replays everything.
"""

from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path

import pytest
from lane_report import section, verdict_problems

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
VERL07 = Path(os.environ.get("VERL07_TARGET", REPO / ".venv" / "verl07"))
REQUIREMENTS = "tests/realtrainer/requirements-verl.txt"

if not (VERL07 / "verl" / "workers" / "actor" / "dp_actor.py").is_file():
    pytest.skip(
        f"verl 0.7 (legacy dp_actor) is not installed in {VERL07}; install it as "
        f"{REQUIREMENTS} says",
        allow_module_level=True,
    )
if importlib.util.find_spec("transformers") is None:
    pytest.skip(
        "transformers is not installed; pip install --no-deps -r "
        "tests/realtrainer/requirements-trl.txt",
        allow_module_level=True,
    )

SAME_MATH = ["mb8", "mb4", "mb2", "dynbsz", "rmpad", "tm_mb8"]
# the failing params and the metric each must be reported on
MUST_FAIL = {
    "bug_gradaccum": "actor/grad_norm",  # (a) loss not divided by the micro-batch count
    "bug_dynweight": "actor/pg_loss",  # (b) dynamic batch weight 1/len(micro_batches)
    "bug_microtokmean": "actor/pg_loss",  # (c) per-micro-batch token-mean policy loss
    "bug_loss1e-3": "actor/grad_norm",  # backward loss 1e-3 relative too large
    "tm_mb4": "actor/pg_loss",  # token-mean + micro-batch 4: real change on legacy actor
}

INNER_TEST = """
import sys

import pytest

sys.path.insert(0, {harness_dir!r})
import actor_harness as H  # noqa: E402

from pytest_rollout_golden import same_math  # noqa: E402

CASES = same_math(
    {{name: H.ALL_CASES[name] for name in [*H.SAME_MATH, *H.BUGGED]}}, reference=H.REFERENCE
) + same_math(H.TOKEN_MEAN, reference=H.TOKEN_MEAN_REFERENCE)


@pytest.mark.parametrize("case", CASES)
def test_actor(golden, case):
    run = H.ActorRun(**case)
    for step in range(H.STEPS):
        batch = golden.rollout(lambda: H.make_batch(step), step=step)
        out = run.step(batch)
        golden.check(out.metrics, step=step)
        golden.check_tensors(
            "old_log_prob", {{"log_probs": out.old_log_prob}}, mask=out.response_mask, step=step
        )
"""


def test_verl_actor_lane(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """Record the references once, replay every variant and bug once, check each verdict."""
    monkeypatch.delenv("CI", raising=False)
    paths = [str(VERL07), str(REPO), os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in paths if p))
    pytester.makeini("[pytest]\ngolden_metric_profile = verl\n")
    pytester.makepyfile(test_verl_lane=INNER_TEST.format(harness_dir=str(HERE)))
    common = ("-p", "no:cacheprovider", "-rA")

    start = time.perf_counter()
    record = pytester.runpytest_subprocess(*common, "--update-golden", "-k", "mb8", timeout=300)
    recorded = time.perf_counter()
    replay = pytester.runpytest_subprocess(*common, timeout=300)
    print(f"record {recorded - start:.1f}s, replay {time.perf_counter() - recorded:.1f}s")

    assert record.parseoutcomes().get("passed") == 2, "\n".join(record.outlines)
    problems = verdict_problems(replay, "test_actor", SAME_MATH, MUST_FAIL)
    # the one metric that shows a dropped scale leads the headline (ranked by severity)
    headline = next(
        (x for x in section(replay, "test_actor", "bug_gradaccum") if "golden mismatch" in x), ""
    )
    if "first divergence at step 0: actor/grad_norm" not in headline:
        problems.append(f"[bug_gradaccum]: grad_norm does not lead the headline: {headline}")
    # per-micro-batch means are reported as not comparable across variants, not as passing
    reported = [x for x in replay.outlines if "not comparable across variants" in x]
    if not any("test_verl_lane.py::test_actor[mb4]" in x for x in reported):
        problems.append("the summary does not list [mb4]'s metrics as not comparable")
    outcomes = replay.parseoutcomes()
    counts = (outcomes.get("passed", 0), outcomes.get("failed", 0))
    if counts != (len(SAME_MATH), len(MUST_FAIL)):
        problems.append(f"replay: {counts} passed/failed, want {len(SAME_MATH), len(MUST_FAIL)}")
    assert not problems, "\n".join(problems) + "\n\nreplay output:\n" + "\n".join(replay.outlines)
