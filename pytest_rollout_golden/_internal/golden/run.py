"""A golden's run: compare each check against the opened golden, stage what it records, and
when the test ends commit it, or discard it and return every failure (:class:`GoldenRun`).

:class:`~.golden.Golden` opens the golden and takes the user's calls; its run works over
what the opening decided (:class:`OpenedGolden`).
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

from ...errors import GoldenError, GoldenMismatch, GoldenToleranceWarning
from ...store.location import (
    ENVELOPE,
    METRICS,
    TOLERANCES,
    in_golden,
    rollout_filename,
    tensors_filename,
)
from ..results import Comparison, Outcome, Verdict
from ..tolerance.build import GoldenStack
from ..tolerance.envelope import Envelope
from ..tolerance.spec import Layer, Tolerance
from ..tolerance.stack import ToleranceUsage
from ..tolerance.trends import TrendBounds, TrendCheck, evaluate
from ..user_warnings import warn_user
from . import checks, metric_codec, precision_lane
from .golden_files import GoldenFiles, merge_metrics
from .inputs import RolloutInputs, stand_in_marks
from .lanes import input_digests
from .long_runs import bias_checks, long_run_facts
from .messages import (
    OPTIMIZER_ENTRY_ABSENT,
    derived_fields_note,
    never_recorded_metric,
    never_recorded_tensors,
    recorded_lines,
    unused_tolerance,
)
from .modes import ModePolicy, ReplayOnly
from .refresh import PROVENANCE, Refresh, changed_values, placeholder_problem
from .sensitivity import TensorProbe

_WRITTEN = (Verdict.NEW, Verdict.UPDATED)  # the verdicts of values a commit writes


class UpdateRegistry(Protocol):
    """Which golden directories this session has re-recorded already (shared keys, xdist)."""

    def contains(self, directory: Path) -> bool: ...

    def add(self, directory: Path) -> None: ...


@dataclasses.dataclass(frozen=True)
class OpenedGolden:
    """What opening a golden decided, and the session's ties, that its run works under."""

    test_id: str
    directory: Path  # the golden's, which holds its inputs
    policy: ModePolicy
    inputs: GoldenFiles
    files: GoldenFiles  # the values compared: the inputs', or a lane's in @lanes/<lane>/
    lane: str | None  # the lane compared; None: lanes off
    envelope: Envelope | None  # a long run's per-step bands
    tolerances: GoldenStack
    trends: TrendBounds
    certify: bool  # the float64 oracle
    replay_only: ReplayOnly | None
    remedy: str  # what a message says to do about a missing or drifted value
    usage: ToleranceUsage
    registry: UpdateRegistry | None
    refresh: Refresh | None


class GoldenRun:
    """Compare, stage and commit for one opened golden (:class:`OpenedGolden`).

    Each check adds its comparisons to the Golden's :class:`~.results.Outcome`;
    :meth:`finish` adds what the run as a whole decides, then commits or discards.
    """

    def __init__(
        self,
        golden: OpenedGolden,
        *,
        outcome: Outcome,
        rollouts: RolloutInputs,
        metrics: dict[str, dict[str, Any]],
        touched: set[str],
        probes: dict[str, dict[int, Any]] | None,
    ):
        """The Golden's records, which the run adds to: ``outcome``, ``rollouts``,
        ``metrics`` (this run's, by step), ``touched`` (the golden files this run used),
        ``probes`` (``--golden-sensitivity``: per tensor, its first and last step's value,
        mask and tolerance; ``None``: not kept)."""
        self._golden = golden
        self._policy, self._files, self._inputs = golden.policy, golden.files, golden.inputs
        self._outcome, self._rollouts = outcome, rollouts
        self._metrics, self._touched, self._tensor_probes = metrics, touched, probes
        self._magnitudes: dict[str, float | None] = {}
        self._uncalibrated: dict[tuple[str, str], Tolerance] = {}  # see _without_files
        self._derived_noted: set[str] = set()  # rollout names checked for derived fields

    @property
    def _replaying(self) -> bool:
        return self._policy.replays(self._files.exists)

    # ------------------------------------------------------------------ checks

    def check_metrics(
        self,
        metrics: Mapping[str, Any],
        *,
        step: int,
        tolerances: Mapping[str, Tolerance | Mapping[str, Any]] | None,
    ) -> list[Comparison]:
        """Record or compare ``metrics`` at ``step`` (:meth:`.Golden.check`)."""
        key = str(step)
        if key in self._rollouts.not_recorded:
            return self._not_compared(list(metrics), step, kind="metric")
        stack = self._golden.tolerances
        resolver, layer = stack.at(step), None
        if tolerances:
            layer = Layer("golden.check(tolerances=)", tolerances)
            resolver = stack.resolver().above(layer)
        seen = self._metrics.setdefault(key, {})
        never_recorded = functools.partial(self._never_recorded, key)
        recorded = self._files.metrics().get(key, {})
        checker = checks.Checker(
            resolver, self._policy, self._golden.usage, never_recorded, magnitude=self.magnitude
        )
        results = []
        for name, value in metrics.items():
            seen[name] = node = checks.encode_metric(name, value, step, seen)
            if self._policy.warns_nan(recorded=name in recorded):
                checks.warn_nan(self._golden.test_id, name, step, node)
            results.append(checker.metric(name, step, recorded.get(name), node))
        if layer is not None:
            self._warn_unused(layer, always=True)
        self._note_loosened(results)
        self._outcome.comparisons.extend(results)
        return results

    def check_tensor_file(
        self,
        name: str,
        tensors: Mapping[str, Any],
        masks: Mapping[str, Any],
        *,
        step: int,
        rank: int | None,
        micro: int | None,
        whole_state: bool = False,
    ) -> list[Comparison]:
        """Compare or stage one tensors file (``check_tensors``, ``check_optimizer``).

        ``whole_state``: the recorded file is the complete set (an optimizer's state), so
        a tensor it lacks fails instead of being recorded beside the others, and one it
        holds that this run lacks is missing, with the optimizer's wording.
        """
        if str(step) in self._rollouts.not_recorded:
            return self._not_compared([f"{name}/{t}" for t in tensors], step, kind="tensor")
        filename = tensors_filename(name, step, rank, micro)
        checks.require_first_call(
            name, filename in self._touched, step=step, rank=rank, micro=micro
        )
        self._touched.add(filename)
        old_info = self._files.recorded.get(filename)
        old = {} if old_info is None else self._files.load(filename, damaged={})
        where = {"step": step, "rank": rank, "micro": micro}
        never_recorded = functools.partial(self._tensor_never_recorded, name, step, old_info)
        checker = checks.Checker(
            self._golden.tolerances.resolver(), self._policy, self._golden.usage, never_recorded
        )
        closed = whole_state and old_info is not None and not self._policy.rerecords
        results = []
        for tensor_name, value in tensors.items():
            recorded, selected = old.get(tensor_name), masks.get(tensor_name)
            label = f"{name}/{tensor_name}"
            if closed and recorded is None:
                results.append(checks.extra_optimizer_entry(label, old, **where))
                continue
            results.append(checker.tensor(label, recorded, value, mask=selected, **where))
        if self._policy.reports_unchecked:
            absent = {"detail": OPTIMIZER_ENTRY_ABSENT} if whole_state else {}
            results += checks.dropped_tensors(name, old.keys() - tensors.keys(), **where, **absent)
        staged = checks.staged_tensors(old, tensors, results, self._policy)
        if staged is not None:
            counts = checks.mask_counts(masks, staged)
            masked = {"masked": counts} if counts else {}
            self._files.stage_batch(filename, staged, kind="tensors", name=name, **masked, **where)
        self._note_loosened(results)
        self._outcome.comparisons.extend(results)
        self._keep_probes(old, tensors, masks, results, where)
        return results

    def _never_recorded(self, step_key: str) -> str:
        recorded = self._files.metrics() if self._files.exists else None
        return never_recorded_metric(step_key, recorded, self._golden.remedy)

    def _tensor_never_recorded(self, name: str, step: int, old_info: Any) -> str:
        steps = None if old_info is not None else self._files.steps("tensors", name)
        return never_recorded_tensors(name, step, steps, self._golden.remedy)

    def _keep_probes(
        self,
        recorded: Mapping[str, Any],
        tensors: Mapping[str, Any],
        masks: Mapping[str, Any],
        results: list[Comparison],
        where: Mapping[str, Any],
    ) -> None:
        """Under ``--golden-sensitivity``: keep, per tensor, its recorded value (this run's
        where it records), mask and tolerance at its first and last step so far."""
        if self._tensor_probes is None:
            return
        rank, micro, step = where["rank"], where["micro"], where["step"]
        suffix = "".join(
            f" {k} {v}" for k, v in (("rank", rank), ("micro", micro)) if v is not None
        )
        for c in results:
            tensor_name = c.name.partition("/")[2]
            if c.kind != "tensor" or tensor_name not in tensors:
                continue
            value = recorded.get(tensor_name, tensors[tensor_name])
            tol, source = c.tolerance, c.tolerance_source
            if tol is None:  # new: the tolerance its replay will resolve
                tol, source = self._golden.tolerances.resolver().resolve(
                    c.name, (checks.dtype_name(value),) * 2
                )
            kept = self._tensor_probes.setdefault(c.name + suffix, {})
            kept[step] = TensorProbe(value, masks.get(tensor_name), tol, source)
            for middle in sorted(kept)[1:-1]:
                del kept[middle]

    def note_derived(self, name: str, step: int, batch: Any) -> None:
        """Note, once per rollout name, a recorded batch holding fields the trainer derives."""
        if name in self._derived_noted or not self._inputs.staged(rollout_filename(name, step)):
            return
        self._derived_noted.add(name)
        fields = checks.derived_fields(batch)
        if fields:
            self._outcome.rollouts.append(derived_fields_note(name, fields))

    def _note_loosened(self, results: list[Comparison]) -> None:
        """Note each tolerance from the golden's calibrated files looser than without them."""
        for c in results:
            if c.tolerance is None or not _calibrated_file(c.tolerance_source):
                continue
            dtype = c.expected.get("dtype", "float64") if isinstance(c.expected, dict) else ""
            without = self._without_files(c.name, dtype or "float64")
            if not checks.looser(c.tolerance, without):
                continue
            file = ENVELOPE if ENVELOPE in c.tolerance_source else TOLERANCES
            where = in_golden(self._files.directory, file)  # a lane's: its own file
            noted = self._outcome.loosened.setdefault(
                c.name,
                {"tolerance": c.tolerance.describe(), "without": without.describe(), "file": where},
            )
            if file == ENVELOPE:  # a band's width changes with the step: its widest, and where
                noted["file"] = where
                noted["steps"] = [*noted.get("steps", []), c.step]
                if c.tolerance.atol >= noted.get("atol", 0.0):
                    noted.update(tolerance=c.tolerance.describe(), atol=c.tolerance.atol)

    def _note_raised(self, trends: list[TrendCheck], found: list[Comparison]) -> None:
        """Note each trend bound the envelope raised on replay (passed or failed)."""
        for check, c in zip(trends, found, strict=True):
            if c.bound is not None and c.bound != check.bound.value:
                self._outcome.loosened[c.name] = {
                    "tolerance": f"<= {c.bound:g}",
                    "without": f"<= {check.bound.value:g}",
                    "file": in_golden(self._files.directory, ENVELOPE),
                }

    def _without_files(self, name: str, dtype: str) -> Tolerance:
        """Value ``name``'s tolerance without the files calibration wrote into the golden
        (the same at every step: the bands and the calibrated layers all go; cached)."""
        if (name, dtype) not in self._uncalibrated:
            found = self._golden.tolerances.uncalibrated().resolve(name, (dtype,))[0]
            self._uncalibrated[name, dtype] = found
        return self._uncalibrated[name, dtype]

    def magnitude(self, name: str) -> float | None:
        """Metric ``name``'s largest recorded magnitude over every step (cached)."""
        if name not in self._magnitudes:
            self._magnitudes[name] = checks.recorded_magnitude(self._files.metrics(), name)
        return self._magnitudes[name]

    def _not_compared(self, names: list[str], step: int, *, kind: str) -> list[Comparison]:
        why = self._rollouts.not_recorded[str(step)]
        results = checks.not_compared(names, step, kind=kind, why=why)
        self._outcome.comparisons.extend(results)
        return results

    def _ignored(self, name: str) -> bool:
        resolver = self._golden.tolerances.resolver()
        self._golden.usage.note(resolver, name)
        return resolver.resolve(name)[0].ignore

    def _warn_unused(
        self, layer: Layer, at: tuple[str, int] | None = None, *, always: bool = False
    ) -> None:
        """Warn about ``layer``'s unmatched entries, at the caller of check() or at ``at``.

        ``always``: the layer's metrics were all seen (check(tolerances=)), so it may warn
        on a recording run too.
        """
        if not self._replaying and not always:  # nothing was compared, so nothing could match
            return
        for name in self._golden.usage.unused(layer):
            text = unused_tolerance(self._golden.test_id, layer.source, name)
            warning = GoldenToleranceWarning(text)
            if at is None:
                warn_user(warning)
            else:
                warnings.warn_explicit(warning, GoldenToleranceWarning, at[0], at[1])

    # ------------------------------------------------------------------ finishing

    def finish(
        self, *, error: bool, tolerance_layers: Iterable[Layer], warn_at: tuple[str, int] | None
    ) -> list[Comparison]:
        """Add what the run as a whole decides and commit (:meth:`.Golden.finish`); the
        failures, if anything drifted, with nothing written. With ``error`` (the test itself
        raised) nothing is written and none are returned."""
        outcome = self._outcome
        outcome.rollouts[:0] = self._rollouts.kept_notes()
        if error:
            if self._replaying:
                outcome.unreached = self._unreached()
            self._discard()
            return []
        if self._replaying:
            outcome.comparisons.extend(self._unchecked())
        outcome.comparisons.extend(self._series_checks())
        if self._replaying and not self._golden.certify:
            outcome.long_run = long_run_facts(
                outcome.comparisons,
                self._files,
                self._golden.envelope,
                self._golden.test_id,
                variant=self._golden.replay_only is not None,
            )
        for layer in tolerance_layers:
            self._warn_unused(layer, warn_at)
        failures = [c for c in outcome.comparisons if c.failed]
        if failures:
            outcome.fail()
            self._discard()
            return failures
        beyond = [c for c in outcome.comparisons if c.verdict == Verdict.UPDATED]
        if beyond and self._policy.only_failing:
            self._refuse_placeholders(beyond)
        wrote = self._policy.needs_write(
            staged=self._files.staging,
            checked_metrics=bool(self._metrics),
            new_values=any(c.verdict == Verdict.NEW for c in outcome.comparisons),
            beyond=bool(beyond),
        )
        if wrote:
            self._commit()
        touched = bool(outcome.comparisons or self._touched)
        status = self._policy.status(exists=self._files.exists, wrote=wrote, touched=touched)
        if status is not None:
            outcome.status = status
        return []

    def _refuse_placeholders(self, beyond: list[Comparison]) -> None:
        """``--update-golden-failing``: raise GoldenMismatch, writing nothing, where the new
        values of a metric beyond tolerance look like a placeholder (:mod:`.refresh`)."""
        refresh = self._golden.refresh
        if refresh is None or refresh.allow_placeholder:
            return
        names = sorted({c.name for c in beyond if c.kind == "metric"})
        found = [(n, why) for n in names if (why := placeholder_problem(self._metrics, n))]
        if not found:
            return
        self._outcome.fail()
        self._discard()
        where = self._files.directory / METRICS
        lines = [f"{where}: not re-recorded, the old golden is kept: new values that look "
                 "like placeholders"]  # fmt: skip
        lines += [f"  metric {name!r}: {why}" for name, why in found]
        lines.append("If these are the real values, run again with --golden-allow-placeholder.")
        raise GoldenMismatch("\n".join(lines))

    def _series_checks(self) -> list[Comparison]:
        """The bounds over this run's series of each metric (:mod:`.trends`), recording or
        replaying; replaying, each names the recorded golden's own statistic, and each band
        of the envelope holds the run's mean deviation from the golden to its bias bound
        (:func:`.envelope.biases`) unless a tolerance above the envelope decides."""
        recorded = metric_codec.numbers(self._files.metrics()) if self._replaying else None
        run = metric_codec.numbers(self._metrics)
        trends = evaluate(run, self._golden.trends, recorded)
        envelope = self._golden.envelope
        if recorded is None or envelope is None:
            return [checks.trend_comparison(c) for c in trends]
        found = [checks.trend_comparison(c, envelope) for c in trends]
        self._note_raised(trends, found)
        return found + bias_checks(envelope, recorded, run, self._outcome.comparisons)

    def _unchecked(self) -> list[Comparison]:
        """A missing comparison per recorded value this run did not check."""
        recorded, results = self._files.metrics(), self._outcome.comparisons
        metrics = checks.unchecked_metrics(recorded, self._metrics, results, self._ignored)
        tensors = checks.unchecked_tensors(self._files.recorded, self._touched, self._ignored)
        return metrics + tensors + precision_lane.unchecked(self._files.recorded, self._touched)

    def _unreached(self) -> list[dict[str, Any]]:
        """The recorded values a test that raised never checked, ``{"metric", "step"}`` each,
        in step order: what its run says nothing about; none where the golden's values cannot
        be read (the test's own error says why)."""
        try:
            missing = sorted(self._unchecked(), key=lambda c: (c.step, c.name))
        except GoldenError:
            return []
        return [{"metric": c.name, "step": c.step} for c in missing]

    def _commit(self) -> None:
        policy = self._policy
        fresh = policy.fresh(self._files.exists)
        steps = merge_metrics(self._files.metrics(), self._metrics, replace=policy.rerecords)

        def keep(filename: str) -> bool:
            used, calibrated = filename in self._touched, filename in (TOLERANCES, ENVELOPE)
            return policy.keeps_file(used=used, calibrated=calibrated)

        written = {str(c.step) for c in self._outcome.comparisons if c.verdict in _WRITTEN}
        stand_ins = stand_in_marks(
            self._files.stand_ins,
            self._rollouts.stood_in,
            written,
            replace=policy.rerecords,
        )
        manifest = self._files.new_manifest(self._golden.test_id, fresh=fresh, stand_ins=stand_ins)
        manifest.update(self._lane_fields(fresh))
        if policy.rerecords and self._golden.refresh is not None and self._files.exists:
            manifest.update(self._provenance(manifest.get("lane")))
        files = self._files.commit(manifest, metrics=steps, keep=keep)
        if policy.rerecords and self._golden.registry is not None:
            self._golden.registry.add(self._golden.directory)
        self._outcome.recorded = recorded_lines(
            files, fresh, self._files.recorded, self._outcome.comparisons
        )

    def _provenance(self, lane: str | None) -> dict[str, Any]:
        """The manifest's ``provenance`` of a re-recording: new where a value changed; else
        the old one, if any, so that re-recording the same values rewrites the same bytes."""
        refresh = self._golden.refresh
        assert refresh is not None
        comparisons = self._outcome.comparisons
        if changed_values(comparisons):
            return {PROVENANCE: refresh.provenance(comparisons, lane)}
        old = (self._files.manifest or {}).get(PROVENANCE)
        return {} if old is None else {PROVENANCE: old}

    def _lane_fields(self, fresh: bool) -> dict[str, Any]:
        """The lane fields of the manifest a commit writes: a lane's name, and for a lane
        apart from the inputs the digests of the inputs its values were computed on."""
        recorded = (self._files.manifest or {}).get("lane")
        lane = self._golden.lane
        lane = lane if lane is not None and (fresh or recorded is None) else recorded
        fields: dict[str, Any] = {} if lane is None else {"lane": lane}
        if self._files is not self._inputs:
            fields["inputs"] = input_digests(self._inputs.recorded)
        return fields

    def _discard(self) -> None:
        """Drop what this run staged; the outcome says whether new values were lost."""
        staged = self._files.abort()
        if staged or any(c.verdict == Verdict.NEW for c in self._outcome.comparisons):
            self._outcome.discarded = True


def _calibrated_file(source: str) -> bool:
    """Whether a tolerance source is a file calibration wrote into the golden."""
    return TOLERANCES in source or ENVELOPE in source


__all__ = ["GoldenRun", "OpenedGolden", "UpdateRegistry"]
