"""The bitwise train–inference lane of ``golden.check_bitwise``: the trainer's log probs must
equal the engine's in every bit, and a must-fail control must show that the comparison can
fail.

A bitwise gate that passes proves nothing until it has been seen failing: a test whose two
sides share one code path (the engine's log probs copied into the trainer's, batch
invariance never switched off) passes forever. The control is the same comparison with the
property removed (batch invariance off, a perturbation the user names); it must produce at
least one difference. Verdicts, per call:

=====================  ====================  ==================================================
lane                   control               result
=====================  ====================  ==================================================
differs                any                   fail, naming the first (sample, token), both
                                             values, their bits, the ULP distance, the count
equal                  differs               pass (the summary-free evidence: "control fired")
equal                  equal                 fail: inconclusive, the control did not fire
equal                  none declared         pass, listed as not compared: no control
=====================  ====================  ==================================================

The lane holds whatever the golden says (nothing is recorded), in every mode; the float64
oracle (``--golden-certify``) does not run it, since the engine's recorded log probs were
never float64.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..results import Comparison, Verdict
from ..wording import nothing_selected
from .messages import BITWISE_KINDS

LANE_KIND, CONTROL_KIND = BITWISE_KINDS
PREFIX = "bitwise/"
AXES = ("sample", "token", "entry")
NO_CONTROL = (
    "no must-fail control declared: a bitwise pass is not shown able to fail; pass "
    "control= (the trainer's log probs with batch invariance off)"
)
ORACLE = "the float64 oracle does not run the bitwise lane (the engine's values are not float64)"


def comparisons(
    name: str,
    trainer: Any,
    engine: Any,
    mask: Any,
    *,
    step: int,
    control: Any,
    locate: Callable[[], Any] | None,
) -> list[Comparison]:
    """The lane's and its control's verdicts for one call of ``check_bitwise``."""
    from ... import bitwise
    from ...reference.masking import as_bool_mask

    lane = PREFIX + name
    if mask is not None and not bool(as_bool_mask(mask.detach()).any()):
        text = nothing_selected(mask.numel(), "check_bitwise")
        return [Comparison(lane, step, Verdict.FAIL, kind=LANE_KIND, detail=text)]
    difference = bitwise.compare(trainer, engine, mask)
    out = [_lane(lane, step, difference, locate)]
    if control is None:
        uncontrolled = Comparison(
            lane + "/control", step, Verdict.IGNORED, kind=CONTROL_KIND,
            tolerance_source=NO_CONTROL,
        )  # fmt: skip
        return [*out, uncontrolled]
    produced = control() if callable(control) else control
    out.append(_control(lane, step, bitwise.compare(produced, engine, mask)))
    return out


def _lane(lane: str, step: int, difference: Any, locate: Callable[[], Any] | None) -> Comparison:
    """The lane's verdict: every compared bit equal, or the first difference (and, given
    ``locate``, the first module whose output differs)."""
    if difference.equal:
        detail = difference.describe(axes=AXES)
        return Comparison(lane, step, Verdict.PASS, kind=LANE_KIND, detail=detail)
    lines = [
        f"bitwise train-inference lane broken at step {step}: {lane}: "
        + difference.describe(axes=AXES)
    ]
    if locate is not None:
        found = locate()
        lines.append(
            "    " + (found.describe() if found else "no module's output differs in the hooks")
        )
    lines.append(
        "    the trainer must reproduce the engine's values bit for bit (same kernels, batch "
        "invariance on both sides); a tolerance cannot widen this lane"
    )
    return Comparison(
        lane, step, Verdict.FAIL, kind=LANE_KIND, actual=difference.differing,
        detail="\n".join(lines),
    )  # fmt: skip


def _control(lane: str, step: int, difference: Any) -> Comparison:
    """The control's verdict: it must differ from the engine somewhere."""
    name = lane + "/control"
    if not difference.equal:
        detail = f"the control fired: {difference.describe(('control', 'engine'), AXES)}"
        return Comparison(name, step, Verdict.PASS, kind=CONTROL_KIND, detail=detail)
    detail = (
        f"inconclusive at step {step}: the control did not fire: {lane}'s control equals the "
        f"engine in all {difference.compared} compared values, so this lane's pass cannot be "
        "told from a comparison that cannot fail; make the control compute differently "
        "(batch invariance off, another batch size), or check that the two sides do not "
        "share one tensor"
    )
    return Comparison(name, step, Verdict.FAIL, kind=CONTROL_KIND, detail=detail)


def oracle_skipped(name: str, step: int) -> Comparison:
    """The lane, not run in the float64 oracle."""
    return Comparison(PREFIX + name, step, Verdict.IGNORED, kind=LANE_KIND, tolerance_source=ORACLE)
