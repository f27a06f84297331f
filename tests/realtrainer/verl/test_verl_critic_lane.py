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

import pytest
from lane_report import Lane, run_lane
from test_verl_actor_lane import REPO, VERL07

SAME_MATH = ["c_mb8", "c_mb4", "c_mb2", "c_dynbsz", "c_rmpad", "c_tm_mb8"]
# the failing params and the metric each must be reported on
MUST_FAIL = {
    "c_bug_mbnorm": "critic/grad_norm",  # per-micro-batch normalization (verl #6957)
    "c_tm_mb4": "critic/vf_loss",  # token-mean + micro-batch 4: real change on the legacy critic
}


def test_verl_critic_lane(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """Record the references once, replay every variant and the bug once, check each verdict."""
    lane = Lane(
        harness="critic_harness", run="CriticRun", test="test_critic",
        tensor=("values", "values"), same_math=SAME_MATH, must_fail=MUST_FAIL,
        headline=("c_bug_mbnorm", "critic/grad_norm"),  # the gradient doubled by two micro-batches
        not_comparable="c_mb4",  # vpred_mean and vf_clipfrac are means over micro-batches
    )  # fmt: skip
    run_lane(pytester, monkeypatch, lane, [VERL07, REPO])
