"""Real-trainer lane: verl 0.7's legacy ``DataParallelPPOCritic`` under the golden plugin.

As the actor lane (``test_verl_actor_lane.py``) does for the actor: a throw-away pytest
project steps the critic of ``critic_harness.py`` for 3 steps, with ``golden.rollout``
around the rollout batch, ``golden.check`` on the metrics ``update_critic`` returns and
``golden.check_tensors`` on the rollout's values (``compute_values``, masked by
``response_mask``). The reference (micro-batch 8, padded, static batch,
seq-mean-token-mean) records the golden, every ``same_math`` param replays it.

The contract (under ``golden_metric_profile = verl``):

* same-math variants pass: micro-batch 8 -> 4, 8 -> 2, dynamic batch size, remove-padding;
* the micro-batch loss summed without its ``1/gradient_accumulation`` scale, each
  normalized by its own counts (verl #6957), fails on ``critic/grad_norm``;
* under verl's default ``loss_agg_mode=token-mean`` micro-batch 8 -> 4 is a real change on
  the legacy critic (it token-means per micro-batch, then averages) and fails.

The harness turns off the critic forward's ``torch.autocast(bfloat16)``, which verl 0.7
hard-codes (the actor takes ``fsdp_config.dtype``): on CPU it computes the linear layers in
bf16, and the values of the same weights then differ by 4e-3 between micro-batch sizes 8
and 4 at step 0, beyond the float32 defaults.
"""

from __future__ import annotations

import os
import time

import pytest
from lane_report import section, verdict_problems
from test_verl_actor_lane import HERE, REPO, VERL07

SAME_MATH = ["c_mb8", "c_mb4", "c_mb2", "c_dynbsz", "c_rmpad", "c_tm_mb8"]
# the failing params and the metric each must be reported on
MUST_FAIL = {
    "c_bug_mbnorm": "critic/grad_norm",  # per-micro-batch normalization (verl #6957)
    "c_tm_mb4": "critic/vf_loss",  # token-mean + micro-batch 4: real change on the legacy critic
}

INNER_TEST = """
import sys

import pytest

sys.path.insert(0, {harness_dir!r})
import critic_harness as H  # noqa: E402

from pytest_rollout_golden import same_math  # noqa: E402

CASES = same_math(
    {{name: H.ALL_CASES[name] for name in [*H.SAME_MATH, *H.BUGGED]}}, reference=H.REFERENCE
) + same_math(H.TOKEN_MEAN, reference=H.TOKEN_MEAN_REFERENCE)


@pytest.mark.parametrize("case", CASES)
def test_critic(golden, case):
    run = H.CriticRun(**case)
    for step in range(H.STEPS):
        batch = golden.rollout(lambda: H.make_batch(step), step=step)
        out = run.step(batch)
        golden.check(out.metrics, step=step)
        golden.check_tensors(
            "values", {{"values": out.old_log_prob}}, mask=out.response_mask, step=step
        )
"""


def test_verl_critic_lane(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """Record the references once, replay every variant and the bug once, check each verdict."""
    monkeypatch.delenv("CI", raising=False)
    paths = [str(VERL07), str(REPO), os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in paths if p))
    pytester.makeini("[pytest]\ngolden_metric_profile = verl\n")
    pytester.makepyfile(test_critic_lane=INNER_TEST.format(harness_dir=str(HERE)))
    common = ("-p", "no:cacheprovider", "-rA")

    start = time.perf_counter()
    record = pytester.runpytest_subprocess(*common, "--update-golden", "-k", "mb8", timeout=300)
    recorded = time.perf_counter()
    replay = pytester.runpytest_subprocess(*common, timeout=300)
    print(f"record {recorded - start:.1f}s, replay {time.perf_counter() - recorded:.1f}s")

    assert record.parseoutcomes().get("passed") == 2, "\n".join(record.outlines)
    problems = verdict_problems(replay, "test_critic", SAME_MATH, MUST_FAIL)
    # the gradient doubled by two micro-batches leads the headline
    headline = next(
        (x for x in section(replay, "test_critic", "c_bug_mbnorm") if "golden mismatch" in x), ""
    )
    if "first divergence at step 0: critic/grad_norm" not in headline:
        problems.append(f"[c_bug_mbnorm]: grad_norm does not lead the headline: {headline}")
    # vpred_mean and vf_clipfrac are means over micro-batches: listed, not passed silently
    reported = [x for x in replay.outlines if "not comparable across variants" in x]
    if not any("test_critic_lane.py::test_critic[c_mb4]" in x for x in reported):
        problems.append("the summary does not list [c_mb4]'s metrics as not comparable")
    outcomes = replay.parseoutcomes()
    counts = (outcomes.get("passed", 0), outcomes.get("failed", 0))
    if counts != (len(SAME_MATH), len(MUST_FAIL)):
        problems.append(f"replay: {counts} passed/failed, want {len(SAME_MATH), len(MUST_FAIL)}")
    assert not problems, "\n".join(problems) + "\n\nreplay output:\n" + "\n".join(replay.outlines)
