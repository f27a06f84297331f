"""The texts of a golden's failures and refusals: the mismatch message with its rows and
notes, why a value was not compared, missing recordings, lanes and oracles, and the
notes on calibration that a failure carries.

Torch-free. The records come from :mod:`..results`, the numbers of one comparison from
:class:`..tolerance.compare.Difference`; nothing here decides what passed, only how it reads.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ...errors import REMEDY_UPDATE
from ...store.location import MANIFEST, TOLERANCES
from ..results import Comparison, Outcome, Verdict
from ..wording import display, is_nan, nothing_selected, number, plural, steps, table, where

if TYPE_CHECKING:
    from ..tolerance.compare import Difference

ALLOW_NAN = (
    "NaN equals NaN only where the tolerance sets equal_nan "
    "(e.g. --golden-tolerance NAME:equal_nan=true); fix the NaN, or allow it"
)


DROPPED = f"if it was dropped on purpose, {REMEDY_UPDATE}"


IF_RIGHT = f"If the new values are right, {REMEDY_UPDATE}."


NO_GOLDEN = "no golden exists yet"
_CHANGED = (Verdict.NEW, Verdict.UPDATED)  # what an update lists


# ---------------------------------------------------------------------- the mismatch message


def difference_detail(d: Difference) -> str:
    """The text of a comparison's outcome (:func:`.compare.compare_values`): why nothing
    was compared, or where the values differ beyond tolerance, as torch.testing says it;
    empty for a pass and for a number (its table row says it all)."""
    if not d.compared:
        return "not compared"
    if d.problem == "shape":
        return f"shape {d.shapes[1]} differs from the recorded {d.shapes[0]}"
    if d.problem == "dtype":
        return f"dtype {d.dtypes[1]} differs from the recorded {d.dtypes[0]}"
    if d.problem == "nothing selected":
        return nothing_selected(d.positions, "the tensor out of check_tensors")
    if d.ok or not d.shapes[0]:
        return ""
    lines = []
    if d.masked:
        lines.append(
            f"mask applied: {d.numel} of {d.positions} positions compared, padding ignored"
        )
    lines.append(
        f"Mismatched elements: {d.mismatched} / {d.numel} ({100.0 * d.mismatched / d.numel:.1f}%)"
    )
    if d.nan_vs_value:
        lines.append(
            f"NaN against a number at {d.nan_vs_value} element(s), first at index {d.first_nan}"
        )
    if d.nan_vs_nan:
        lines.append(
            f"NaN against NaN at {d.nan_vs_nan} element(s) (equal_nan is off): {ALLOW_NAN}"
        )
    allowed_abs, allowed_rel = _allowed_differences(d)
    lines.append(
        f"Greatest absolute difference: {d.abs_diff:.6g} at index {d.abs_index} "
        f"(up to {allowed_abs} allowed)"
    )
    lines.append(
        f"Greatest relative difference: {d.rel_diff:.6g} at index {d.rel_index} "
        f"(up to {allowed_rel} allowed)"
    )
    return "\n".join(lines)


def _allowed_differences(d: Difference) -> tuple[str, str]:
    """The absolute and relative difference allowed, as the detail of a tensor states them
    (under a scale, the absolute one where the greatest difference is)."""
    tol = d.tolerance
    assert tol is not None
    if tol.exact:
        return "0 (bit-exact)", "0 (bit-exact)"
    if d.scale:
        return f"{d.allowed_there:.3g}", f"{tol.rtol:.3g} of max(|expected|, {d.scale:.3g})"
    return f"{tol.atol:.3g}", f"{tol.rtol:.3g}"


def allowed(c: Comparison) -> str:
    """The "allowed" cell of a comparison: its tolerance and where it came from."""
    if not c.tolerance:
        return "-"
    text = c.tolerance.describe()
    if c.scale is not None and c.tolerance.scale == "recorded":  # the number it stood for
        text = text.replace("scale=recorded", f"scale=recorded {number(c.scale, 3)}")
    if c.tolerance.exact or not c.tolerance_source:
        return text
    return f"{text} ({c.tolerance_source})"


def by_severity(failures: Iterable[Comparison]) -> list[Comparison]:
    """Failures, farthest beyond their tolerance first (NaN and bit-exact misses lead)."""
    return sorted(failures, key=lambda c: -(math.inf if c.excess is None else c.excess))


def beyond(c: Comparison) -> str:
    """How far beyond its tolerance a failed value is: ``"12x"``, ``"inf"``, ``"NaN"`` (a NaN
    on either side: no distance to measure) or ``-``."""
    if c.excess is None:
        return "-"
    if is_nan(c.expected) or is_nan(c.actual):
        return "NaN"
    return "inf" if math.isinf(c.excess) else f"{c.excess:.3g}x"


def by_step(failures: Iterable[Comparison]) -> list[Comparison]:
    """Failures in step order, farthest beyond their tolerance first within a step: the
    first row is the first divergence the headline names."""
    return sorted(by_severity(failures), key=lambda c: c.step)


_HEADLINE_NAMES = 3  # names of the first divergent step in the headline before "and N more"


def first_divergence(failures: list[Comparison]) -> str:
    """``"first divergence at step 2: grad_norm 40x beyond tolerance, pg_loss 3x; "``:
    the first step beyond tolerance and what diverged there, farthest beyond first (empty
    when nothing drifted)."""
    drifted = [c for c in failures if c.verdict == Verdict.FAIL and c.kind not in SERIES_KINDS]
    if not drifted:
        return ""
    step = min(c.step for c in drifted)
    first: dict[str, Comparison] = {}
    for c in by_severity(drifted):
        if c.step == step:
            first.setdefault(c.name, c)
    parts = [name if c.excess is None else f"{name} {beyond(c)}" for name, c in first.items()]
    if next(iter(first.values())).excess is not None:
        parts[0] += " beyond tolerance"
    more = f" and {len(parts) - _HEADLINE_NAMES} more" if len(parts) > _HEADLINE_NAMES else ""
    return f"first divergence at step {step}: {', '.join(parts[:_HEADLINE_NAMES])}{more}; "


BOUND_REMEDY = (
    "A mismatch bound holds whatever the golden says (--update-golden does not lift it): "
    "fix the trainer or the engine, or set the bound for this test with "
    "@pytest.mark.golden(mismatch_bounds={metric: bound}) (or --golden-mismatch-bound, "
    "ini golden_mismatch_bounds; inf switches one off)."
)


BOUND_KIND = "mismatch bound"
"""The kind of a :class:`Comparison` against an absolute train–inference mismatch bound."""


def mismatch_bound_exceeded(
    name: str,
    value: float,
    bound: float,
    source: str,
    step: int,
    sequences: Sequence[tuple[int, float, int]],
    tokens: Sequence[tuple[int, int, float, float, float]],
) -> str:
    """The failure of a mismatch metric beyond its bound: the metric, the bound and its
    source, then where the batch disagrees most (see :class:`.mismatch.Locations`)."""
    lines = [
        f"train-inference mismatch beyond its bound at step {step}: {name} = {number(value, 6)}"
        f", bound {name} <= {number(bound)} ({source})"
    ]
    if sequences:
        parts = [
            f"row {b}: {number(mean, 4)} over {plural(n, 'token')}" for b, mean, n in sequences
        ]
        lines.append(
            "    worst sequences (mean |log_probs - rollout_log_probs|): " + "; ".join(parts)
        )
    if tokens:
        parts = [
            f"(row {b}, position {t}): trainer {number(lp, 6)}, engine {number(rp, 6)}, "
            f"difference {number(d, 4)}"
            for b, t, lp, rp, d in tokens
        ]
        lines.append("    worst tokens: " + "; ".join(parts))
    return "\n".join(lines)


TREND_REMEDY = (
    "A trend bound holds whatever the golden says (--update-golden does not lift it): fix "
    "what drifts over the run, or set the bound for this test with "
    "@pytest.mark.golden(trends={metric: 'growth<=4'}) (or --golden-trend METRIC:STAT<=VALUE, "
    "ini golden_trends; inf switches one off)."
)


TREND_KIND = "trend"
"""The kind of a :class:`Comparison` of a statistic over a run against its bound (trends.py)."""


BIAS_KIND = "bias"
"""The kind of a :class:`Comparison` of a replay's mean deviation over its steps (envelope.py)."""


SERIES_KINDS = (TREND_KIND, BIAS_KIND)  # gates over a whole run, not one step


BITWISE_KINDS = ("bitwise lane", "bitwise control")  # golden/bitwise_lane.py: exact, no golden


PRECISION_KINDS = ("precision manifest", "precision audit")  # golden/precision_lane.py


def bias_beyond(name: str, mean: float, steps_: Sequence[int], bound: float, source: str) -> str:
    """The failure of a replay whose metric deviates from the golden the same way over its
    steps: the mean deviation in units of each step's band, and the bound."""
    return (
        f"bias over {steps(steps_)}: {name} deviates from the golden by {mean:+.3g} of its "
        f"band on average (sign(golden) x (actual - golden) / allowed, over "
        f"{plural(len(steps_), 'step')}), bound {number(bound, 12)} ({source}); a change that "
        "moves every step the same way, which each step's band alone lets pass"
    )


class TrendView(Protocol):
    """What the texts read of one statistic of a series (:class:`.trends.Trend`)."""

    @property
    def statistic(self) -> str: ...
    @property
    def value(self) -> float | None: ...
    @property
    def steps(self) -> Sequence[int]: ...
    @property
    def why(self) -> str: ...
    @property
    def windows(self) -> tuple[tuple[Sequence[int], float], tuple[Sequence[int], float]] | None: ...


def trend_beyond(
    metric: str, trend: TrendView, bound: float, source: str, recorded: TrendView | None
) -> str:
    """The failure of a statistic over a run beyond its bound: the statistic, the bound
    and its source; the windows of a growth; the recorded golden's own statistic."""
    stat, nan = trend.statistic, f" ({trend.why})" if trend.why else ""
    lines = [
        f"trend beyond its bound over {steps(trend.steps)}: {metric} {stat} = "
        f"{number(trend.value, 4)}{nan}, bound {stat} <= {number(bound, 12)} ({source})"
    ]
    parts = []
    if trend.windows is not None:
        (first, m1), (last, m2) = trend.windows
        parts.append(
            f"mean {number(m1, 4)} over {steps(first)} -> {number(m2, 4)} over {steps(last)}"
        )
    if recorded is not None:
        value = recorded.why if recorded.value is None else number(recorded.value, 4)
        parts.append(f"recorded: {stat} {value}")
    return "\n".join(lines + (["    " + "; ".join(parts)] if parts else []))


def trends_beyond(failures: list[Comparison]) -> str:
    """``"trend beyond its bound: kl growth 3.1 > 2; "``: the trends and biases a run failed
    (empty when none)."""
    out = ""
    for kind, one, many in (
        (TREND_KIND, "trend beyond its bound", "trends beyond their bounds"),
        (BIAS_KIND, "bias beyond its bound", "biases beyond their bounds"),
    ):
        failed = by_severity(c for c in failures if c.verdict == Verdict.FAIL and c.kind == kind)
        if not failed:
            continue
        parts = [f"{c.name} {number(c.actual, 4)} > {number(c.bound, 12)}" for c in failed]
        more = f" and {len(parts) - _HEADLINE_NAMES} more" if len(parts) > _HEADLINE_NAMES else ""
        title = one if len(parts) == 1 else many
        out += f"{title}: {', '.join(parts[:_HEADLINE_NAMES])}{more}; "
    return out


def typo_hint(name: str, unrecorded: list[str]) -> str:
    """``"this run checked 'pg_los' ... "`` when a never-recorded name looks like ``name``."""
    import difflib  # only when a metric went unchecked

    close = difflib.get_close_matches(name, unrecorded, n=1, cutoff=0.6)
    if not close:
        return ""
    return (
        f"this run checked {close[0]!r} at this step, which was never recorded: "
        f"a misspelt or renamed metric (did you mean {name!r}?); "
    )


def unused_tolerance(test_id: str, source: str, name: str) -> str:
    """The warning about a tolerance entry (of layer ``source``) that named nothing checked."""
    return (
        f"{test_id}: {source} gives a tolerance for {name!r}, "
        "but no metric or tensor of that name was checked"
    )


def never_recorded_metric(step_key: str, recorded: Mapping[str, Any] | None, remedy: str) -> str:
    """Why a checked metric has no recorded value: ``recorded`` holds the golden's metrics
    by step (``None``: no golden exists yet)."""
    if recorded is None:
        where = NO_GOLDEN
    elif step_key not in recorded:
        where = f"step {step_key} was never recorded (recorded steps: {sorted(map(int, recorded))})"
    else:
        where = f"never recorded at step {step_key}"
    return f"{where}; {remedy}"


def never_recorded_tensors(name: str, step: int, steps: list[int] | None, remedy: str) -> str:
    """Why a checked tensor has no recorded value: ``steps`` are those recorded for
    ``check_tensors(name)`` (``None``: its file exists, without this tensor)."""
    if steps is None:
        return f"never recorded in this file; {remedy}"
    listing = f"recorded steps: {steps}" if steps else f"no {name!r} tensors were recorded"
    return f"step {step} was never recorded ({listing}); {remedy}"


OPTIMIZER_ENTRY_ABSENT = (
    "recorded in the optimizer state but absent from it in this run (a state not saved, or "
    f"not restored at resume?); {DROPPED}"
)


def optimizer_entry_extra(recorded: Iterable[str]) -> str:
    """Why an optimizer state entry the recorded state does not hold fails (``recorded``:
    the entries recorded for its parameter)."""
    listing = ", ".join(sorted(recorded)) or "none"
    return (
        f"not in the recorded optimizer state (entries recorded for this parameter: "
        f"{listing}); if the optimizer changed on purpose, {REMEDY_UPDATE}"
    )


def missing_input(
    what: str,
    step: int,
    recorded: Iterable[int],
    directory: Path,
    remedy: str,
    why: str = "",
    recorder: str | None = None,
) -> str:
    """A rollout step the golden does not hold, in a run that may not record it."""
    steps = sorted(set(recorded))
    listing = f"recorded steps: {steps}" if steps else "nothing of it was recorded"
    why = why or "Recording is off (--golden-strict or CI)"
    if recorder is not None:
        why = f"This test only replays the golden of {recorder}"
    return (
        f"{what} at step {step} is not in the golden {display(directory)} ({listing}). "
        f"{why}; {remedy}."
    )


def manifestless(directory: Path, files: Sequence[str]) -> str:
    """What is wrong with a golden directory whose manifest is gone, and the remedies
    (to follow the directory's name)."""
    shown = ", ".join(files[:5]) + (f" and {len(files) - 5} more" if len(files) > 5 else "")
    return (
        f"holds golden files ({shown}) but no {MANIFEST}: it was deleted or never committed, "
        "so nothing there can be verified, and nothing was recorded over them; restore "
        f"{MANIFEST} from version control (e.g. `git checkout -- "
        f"{display(directory / MANIFEST)}`), or run `pytest --update-golden` to re-record "
        "this golden deliberately"
    )


def missing_recording(test_id: str, recorder: str, directory: Path, remedy: str) -> str:
    """A replay-only golden (recorded by test ``recorder``) that does not exist."""
    return (
        f"{test_id} only replays the golden of {recorder}, but "
        f"{display(directory)} does not exist; {remedy}."
    )


CERTIFY_COMMAND = "pytest --golden-certify"


def not_same_math(failures: list[Comparison], message: str) -> str:
    """A variant's mismatch against its reference's float64 oracle: ``message`` headed by
    the first value that differs, its step and size ("not the same math: grad_norm differs
    by 1.0e-03 in float64 at step 0")."""
    drifted = [c for c in failures if c.verdict == Verdict.FAIL]
    if not drifted:
        return message
    first = by_step(drifted)[0]
    size = first.rel_diff if first.rel_diff is not None else first.abs_diff
    by = "" if size is None else f" by {size:.1e}"
    return (
        f"not the same math: {first.name} differs{by} in float64 at step {first.step} "
        f"({beyond(first)} the float64 bound, where reordering moves a value by ~1e-15); "
        "this variant computes something else than its reference: fix it, or stop "
        "declaring it same_math()\n" + message
    )


def oracle_without_inputs(test_id: str, directory: Path) -> str:
    """``--golden-certify`` on a golden never recorded: the oracle replays recorded inputs."""
    return (
        f"{test_id}: {display(directory)} holds no recorded rollout for the float64 oracle to "
        "replay; record the golden first (`pytest --update-golden`, without --golden-certify), "
        f"then `{CERTIFY_COMMAND}`"
    )


def oracle_missing(test_id: str, directory: Path, remedy: str) -> str:
    """A golden without its float64 oracle lane, where this run cannot record it."""
    how = (
        remedy
        if remedy != REMEDY_UPDATE
        else (
            f"record it with `{CERTIFY_COMMAND}` (without CI=true or --golden-strict), then commit "
            "the golden/ directory"
        )
    )
    return (
        f"{test_id}: golden {display(directory)} has no float64 oracle "
        f"(@lanes/float64-oracle); {how}"
    )


def oracle_on_other_inputs(directory: Path, stale: Sequence[str]) -> str:
    """A float64 oracle computed on inputs re-recorded since."""
    return (
        f"{display(directory)}: the float64 oracle was computed on other inputs than the golden "
        f"holds ({', '.join(stale)} changed since); re-record it: "
        f"`{CERTIFY_COMMAND} --update-golden`, then commit the golden/ directory."
    )


def derived_fields_note(name: str, fields: Sequence[str]) -> str:
    """A recorded rollout that holds fields the trainer computes (advantages, returns, kl)."""
    return (
        f"rollout {name!r}: recorded with {', '.join(fields)}, which look computed by the "
        "trainer, not returned by the engine; replayed, their code is never tested: record "
        "the engine's output and compute them in the test (docs/guide/recording.md, "
        "'Where to record')"
    )


def lane_missing(directory: Path, lane: Any, recorded: Sequence[str | None]) -> str:
    """A golden without this run's lane (a :class:`~.lanes.LaneSetting`), in strict mode."""
    held = ", ".join(name or "(unnamed)" for name in recorded)
    text = (
        f"golden {display(directory)} has no lane {lane.name!r} ({lane.source}); it holds "
        f"lane {held}. Record this lane on this hardware: `pytest --update-golden "
        f"--golden-lane {lane.name}` (or the tests without CI=true), then commit the golden/ "
        "directory"
    )
    if lane.fallback is None:
        return (
            text + "; or compare against a recorded lane with ini `golden_lane_fallback = "
            "NAME` and `golden_lane_fallback_tolerances`."
        )
    return text + f"; the fallback lane {lane.fallback!r} (golden_lane_fallback) is not recorded."


def lane_on_other_inputs(directory: Path, lane: str, stale: Sequence[str]) -> str:
    """A lane whose values were computed on inputs that have since been re-recorded."""
    return (
        f"{display(directory)}: the values of lane {lane!r} were computed on other "
        f"inputs than the golden holds ({', '.join(stale)} changed since); re-record this lane "
        f"on its hardware: `pytest --update-golden --golden-lane {lane}`, then commit the "
        "golden/ directory."
    )


def lane_linked(link: Path, lane: str) -> str:
    """A lane's folder, or an entry of it, that is a symbolic link (never followed)."""
    return (
        f"{display(link)} is a symbolic link to {os.path.realpath(link)}; a lane's values are "
        "read and written only in its own folder, never through a link. Remove the link "
        f"(`rm {display(link)}`), then record the lane on its hardware: `pytest "
        f"--update-golden --golden-lane {lane}`, and commit the golden/ directory."
    )


def regenerate_in_lane(
    directory: Path, lane: str | None, base: str | None, others: Sequence[str]
) -> str:
    """``--golden-regenerate`` where new inputs would orphan another lane's values."""
    if lane != base:
        return (
            f"golden {display(directory)}: --golden-regenerate re-records the inputs, which "
            f"belong to its base lane {base!r}, not to lane {lane!r}; regenerate them with "
            f"`--golden-lane {base}` on that hardware, then re-record every other lane."
        )
    return (
        f"golden {display(directory)}: --golden-regenerate would re-record the inputs that "
        f"lane {', '.join(others)} was computed on; record without --golden-regenerate, or "
        f"delete {display(directory / '@lanes')} first and record those lanes again on their "
        "hardware."
    )


def input_outside_base_lane(name: str, step: int, directory: Path, lane: str | None) -> str:
    """A rollout step the golden's inputs lack, asked for in a lane that cannot record inputs."""
    return (
        f"rollout {name!r} step {step} is not among the inputs of golden {display(directory)}, "
        f"and lane {lane!r} records values only: inputs are recorded in the golden's base lane "
        "(`rollout-golden show` names it); record the step there, then this lane."
    )


def lane_suffix(outcome: Outcome) -> str:
    """`` (lane NAME)`` after a golden's path where the run used lanes."""
    name = outcome.lane.get("name")
    return f" (lane {name})" if name else ""


def lane_note(lane: Mapping[str, Any]) -> str | None:
    """The summary line of a golden compared against a fallback lane (``None``: it was not)."""
    if not lane.get("fallback"):
        return None
    return (
        f"lane {lane['name']!r} is not recorded: compared against lane {lane['fallback']!r} "
        "(golden_lane_fallback) under golden_lane_fallback_tolerances"
    )


def mismatch_message(
    outcome: Outcome,
    failures: list[Comparison],
    *,
    recorder: str | None = None,
    remedy: str = "",
    notes: Sequence[str] = (),
) -> str:
    """The text of a GoldenMismatch: one table of scalar rows, then tensor details.

    ``recorder``: the test that records this golden when this one only replays it;
    ``remedy`` then says how to record it. ``notes``: lines on what the recorded values
    stand for (see :func:`stand_in_note`).
    """
    missing = [c for c in failures if c.verdict == Verdict.MISSING]
    no_golden = [c for c in missing if c.detail.startswith(NO_GOLDEN)]
    if failures and len(no_golden) == len(failures) and recorder is None:
        names = ", ".join(dict.fromkeys(c.name for c in no_golden))
        remedy_text = no_golden[0].detail.removeprefix(NO_GOLDEN).removeprefix("; ")
        return (
            f"golden missing: {NO_GOLDEN} at {display(outcome.directory)} for the "
            f"{plural(len(no_golden), 'value')} this test checked ({names}); {remedy_text}"
        )
    lines = [
        f"golden mismatch: {first_divergence(failures)}{trends_beyond(failures)}{len(failures)} of "
        f"{plural(len(outcome.comparisons), 'check')} failed (golden {display(outcome.directory)})"
    ]
    if recorder is not None:
        lines.append(f"{outcome.test} against the golden of {recorder}")
    elif outcome.recorded_by:
        lines.append(f"{outcome.test} replayed the golden recorded by {outcome.recorded_by}")
    lines += _scalar_rows(failures)
    lines += _detailed_failures(failures)
    lines += [f"{c.kind} {c.name!r} ({where(c)}): {c.detail}" for c in missing]
    lines += _mismatch_notes(outcome, notes)
    kinds = {c.kind for c in failures}
    if BOUND_KIND in kinds:
        lines.append(BOUND_REMEDY)
    if TREND_KIND in kinds:
        lines.append(TREND_REMEDY)
    if kinds <= {BOUND_KIND, TREND_KIND, *BITWISE_KINDS, PRECISION_KINDS[1]}:  # golden-free gates
        return "\n".join(lines)
    if recorder is not None:
        lines.append(
            f"This test never records: fix it, or if the reference itself changed on purpose, "
            f"{remedy}."
        )
    elif len(missing) < len(failures):  # missing values' lines carry their own remedy
        lines.append(IF_RIGHT)
    return "\n".join(lines)


def _scalar_rows(failures: list[Comparison]) -> list[str]:
    """The table of the failed values without a detail (numbers) in step order (see
    :func:`by_step`), and a line per NaN against NaN among them."""
    rows = by_step(c for c in failures if c.verdict == Verdict.FAIL and not c.detail)
    if not rows:
        return []
    cells = [("metric", "step", "expected", "actual", "abs diff", "rel diff", "beyond", "allowed")]
    for c in rows:
        cells.append(
            (
                c.name,
                where(c).removeprefix("step "),
                number(c.expected),
                number(c.actual),
                number(c.abs_diff, 2),
                number(c.rel_diff, 2),
                beyond(c),
                allowed(c),
            )
        )
    lines = table(cells)
    for c in rows:
        if is_nan(c.expected) and is_nan(c.actual):
            lines.append(
                f"{c.kind} {c.name!r} ({where(c)}): recorded NaN, "
                f"got NaN (equal_nan is off): {ALLOW_NAN}"
            )
    return lines


def _detailed_failures(failures: list[Comparison]) -> list[str]:
    """The failed values with a detail (tensors, mismatch bounds, trends) in step order (see
    :func:`by_step`); the bounds of one batch share their location lines, given once after
    them."""
    lines, located = [], []
    for c in by_step(failures):
        if c.verdict == Verdict.FAIL and c.kind == BOUND_KIND:
            first, *rest = c.detail.splitlines()
            lines.append(first)
            located += [d for d in rest if d not in located]
        elif c.verdict == Verdict.FAIL and c.kind in (
            *SERIES_KINDS,
            *BITWISE_KINDS,
            *PRECISION_KINDS,
        ):
            lines += c.detail.splitlines()
        elif c.verdict == Verdict.FAIL and c.detail and c.tolerance is None and c.kind == "tensor":
            lines.append(f"{c.kind} {c.name!r} ({where(c)}): {c.detail}")  # nothing compared
        elif c.verdict == Verdict.FAIL and c.detail:
            lines.append(f"{c.kind} {c.name!r} ({where(c)}), allowed {allowed(c)}:")
            lines += ["    " + d for d in c.detail.splitlines()]
    return lines + located


def _mismatch_notes(outcome: Outcome, notes: Sequence[str]) -> list[str]:
    """What was not compared on purpose, the environment the replay ran under, ``notes``."""
    lines = []
    ignored: dict[str, set[str]] = {}
    for c in outcome.comparisons:
        if c.verdict == Verdict.IGNORED:
            ignored.setdefault(c.tolerance_source, set()).add(c.name)
    if ignored:
        parts = [f"{', '.join(sorted(names))} ({why})" for why, names in ignored.items()]
        lines.append(f"not compared (excluded on purpose): {'; '.join(parts)}")
    if outcome.environment_changes:
        lines.append(
            "note: replayed under another environment than recorded: "
            + "; ".join(outcome.environment_changes)
        )
    fallback = lane_note(outcome.lane)
    lines += [f"note: {note}" for note in [*([fallback] if fallback else []), *notes]]
    return lines + [f"note: {note}" for note in cancelled_notes(outcome.comparisons)]


# The rounding level of float32 terms of order 1 (8 ulps): a metric whose recorded magnitude
# never rises above it holds no value of its own, only the rounding of terms that cancel.
ROUNDING_LEVEL = 1e-6


def cancelled_notes(comparisons: Iterable[Comparison]) -> list[str]:
    """A note per failed metric measured against a recorded magnitude at rounding level."""
    names = {
        c.name: c.scale
        for c in comparisons
        if c.verdict == Verdict.FAIL
        and c.kind == "metric"
        and c.tolerance is not None
        and c.tolerance.scale == "recorded"
        and c.scale is not None
        and c.scale <= ROUNDING_LEVEL
        and not is_nan(c.expected)  # a NaN has no magnitude: its scale says nothing
    }
    return [
        f"{name} is at most {number(scale, 3)} over every recorded step: the rounding level of "
        "float32 terms of order 1, not a value of its own; if it cancels to zero by "
        "construction (a mean of centred advantages), compare it on the scale of its terms: "
        f"golden_tolerances = {name}:atol=1e-6 (or {name}:scale=1.0)"
        for name, scale in names.items()
    ]


def uncalibrated_lane_note(lane: str, base: str, test: str) -> str:
    """Why a test may fail in a lane where it passes in the base lane: calibrated tolerances
    are per lane, and only the base lane has them; the command that calibrates this one."""
    name = test.rpartition("::")[2].partition("[")[0]
    return (
        f"lane {lane!r} has no calibrated tolerances ({TOLERANCES}) while the base lane "
        f"{base!r} has: calibrate this lane on its hardware: `pytest --golden-calibrate N "
        f'--golden-lane {lane} -k "{name}"` (calibrated tolerances are per lane; until then '
        "this lane compares under the uncalibrated ones)"
    )


def uncalibrated_variant_note(test: str, filename: str, tests: Sequence[str]) -> str:
    """Why a variant's failure may be its own trajectory rather than a defect: no calibration
    ran it, so the lane across variants in ``filename`` was measured without it."""
    return (
        f"{test} was not among the tests calibrated in {filename} ({', '.join(sorted(tests))}): "
        "the spread across variants was measured without it, and a variant calibration never "
        "ran can stray further (in bf16 each variant's trajectory drifts its own way). If it "
        "computes the same math, calibrate it with the others: "
        "`pytest --golden-calibrate N` over every variant, this one included."
    )


def stand_in_note(
    step: int,
    recorded: Mapping[str, int],
    this_run: Mapping[str, int],
    requested: Callable[[str], bool],
) -> str:
    """Why the recorded values of ``step`` may differ: rollouts of other steps stood in for
    its own when they were recorded (``recorded``: ``{rollout name: step}``), and what this
    run used instead (``this_run``: its own stand-ins; ``requested(name)``: it asked for
    the rollout of ``step`` itself)."""
    parts = []
    for name, substitute in recorded.items():
        part = (
            f"rollout {name!r} step {substitute} standing in for step {step} "
            "(missing_step='repeat')"
        )
        if this_run.get(name) == substitute:
            part += ", as in this run"
        elif name in this_run:
            part += f"; this run used step {this_run[name]}'s rollout {name!r}"
        elif requested(name):
            part += f"; this run used step {step}'s own rollout {name!r}"
        parts.append(part)
    return f"step {step}: its recorded values were computed with " + "; and ".join(parts)


def recorded_lines(
    files: Mapping[str, Any], fresh: bool, old: Mapping[str, Any], comparisons: list[Comparison]
) -> list[str]:
    """One line per recorded rollout/tensor name and for metrics: what was written, by step."""
    written: dict[str, set[int]] = {}
    for filename, info in files.items():
        if info.get("kind") in ("rollout", "tensors") and (fresh or filename not in old):
            written.setdefault(f"{info['kind']} {info['name']!r}", set()).add(info["step"])
    new = [c for c in comparisons if c.verdict in _CHANGED and c.kind == "metric"]
    if new:
        written[plural(len({c.name for c in new}), "metric")] = {c.step for c in new}
    return [f"{what}: {steps(s)}" for what, s in written.items()]


def kept_lines(kept: Mapping[str, Iterable[int]]) -> list[str]:
    """``--update-golden``: one line per rollout name whose recorded steps were kept."""
    return [
        f"rollout {name!r}: kept {steps(s)} "
        "(recorded inputs replayed; --golden-regenerate re-runs generate)"
        for name, s in kept.items()
    ]


def not_compared(outcomes: Iterable[Outcome]) -> list[str]:
    """The metrics and tensors tests did not compare, their steps and who said so: one line
    per set of exclusions, naming every test that had it (variants share theirs)."""
    by_items: dict[str, list[str]] = {}
    for outcome in outcomes:
        excluded: dict[tuple[str, str], set[int]] = {}
        for c in outcome.comparisons:
            if c.verdict == Verdict.IGNORED:
                excluded.setdefault((c.name, c.tolerance_source), set()).add(c.step)
        if excluded:
            grouped: dict[tuple[str, str], list[str]] = {}
            for (name, source), s in excluded.items():
                grouped.setdefault((steps(s), source), []).append(name)
            items = [f"{', '.join(names)} ({at}; {why})" for (at, why), names in grouped.items()]
            by_items.setdefault(", ".join(items), []).append(outcome.test)
    # calibration runs a test several times under one id: name it once
    return [f"{', '.join(dict.fromkeys(tests))}: {items}" for items, tests in by_items.items()]


def lane_not_held(directory: Path, lane: str, held: Sequence[str]) -> str:
    """``rollout-golden show --lane`` or ``diff GOLDEN@LANE`` of a lane the golden lacks."""
    holds = f"lane{'s' if len(held) > 1 else ''} {', '.join(held)}" if held else "no named lane"
    return f"golden {directory} has no lane {lane!r}; it holds {holds}"
