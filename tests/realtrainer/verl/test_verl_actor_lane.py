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
from pathlib import Path

import pytest
from lane_report import Lane, run_lane

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


def test_verl_actor_lane(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """Record the references once, replay every variant and bug once, check each verdict."""
    lane = Lane(
        harness="actor_harness", run="ActorRun", test="test_actor",
        tensor=("old_log_prob", "log_probs"), same_math=SAME_MATH, must_fail=MUST_FAIL,
        # the one metric that shows a dropped scale leads the headline (ranked by severity)
        headline=("bug_gradaccum", "actor/grad_norm"),
        not_comparable="mb4",  # per-micro-batch means: reported, not passed silently
        certify=True,
    )  # fmt: skip
    run_lane(pytester, monkeypatch, lane, [VERL07, REPO])
