"""``@pytest.mark.golden_accumulation(step, batch, **settings)``: the micro-batch /
gradient-accumulation sweep (:func:`.check_accumulation_invariance`) as a marker, run once
the test body has passed.

``batch`` is the rollout to sweep: a generator (a callable of no arguments) or the batch
itself. In a test that uses the ``golden`` fixture a generator goes through
``golden.rollout(batch, name="accumulation")`` (``name=`` of the marker), so the sweep runs
on a recorded rollout of its own, as ``golden.check_accumulation`` in the body would; a
rollout name a test may fetch once per step, hence not the body's default ``"rollout"``.
"""

from __future__ import annotations

from typing import Any

import pytest

NAME = "golden_accumulation"
USAGE = f"@pytest.mark.{NAME}(step, batch, **settings)"
MARKER_DOC = (
    f"{NAME}(step, batch, name='accumulation', micro_batch_sizes=None, "
    "accumulation_steps=None, settings=None, rtol=None, atol=None): after the test passes, "
    "run step(batch, setting) in float64 over micro-batch and gradient-accumulation settings "
    "and require the same update (golden.check_accumulation); batch: a rollout generator "
    "(recorded as rollout `name` with the golden fixture) or the batch"
)


def sweep_marked(item: pytest.Item, golden: Any) -> None:
    """Run the sweep of ``item``'s marker, if it has one (``golden``: its fixture, or
    ``None``); raises AssertionError naming the setting pair where the update differs, and
    TypeError with the marker's usage where the marker lacks ``step`` or ``batch``."""
    marker = item.get_closest_marker(NAME)
    if marker is None:
        return
    options = dict(marker.kwargs)
    args = list(marker.args)
    for name in ("step", "batch"):
        if name not in options and args:
            options[name] = args.pop(0)
    if args or "step" not in options or "batch" not in options:
        raise TypeError(f"{item.nodeid}: {USAGE}: give the training step and the batch")
    step, batch = options.pop("step"), options.pop("batch")
    name = options.pop("name", "accumulation")
    if callable(batch):
        batch = golden.rollout(batch, name=name) if golden is not None else batch()
    from ...invariants.accumulation import check_accumulation_invariance

    check_accumulation_invariance(step, batch, **options)
