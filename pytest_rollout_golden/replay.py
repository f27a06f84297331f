"""The golden of one test: record what is missing, replay what is recorded, compare.

:class:`Golden` works without pytest::

    with Golden(Path("golden/my_case"), mode=Mode.AUTO) as golden:
        batch = golden.rollout(generate, step=0)
        golden.check({"pg_loss": loss}, step=0)

Comparisons are collected while the test runs; :meth:`Golden.finish` commits
new recordings as one atomic swap of the directory and raises
:class:`~.errors.GoldenMismatch` listing every mismatch at once.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

from . import metrics as metric_codec
from .compare import compare_named, dtype_name
from .errors import (
    REMEDY_UPDATE,
    GoldenError,
    GoldenFormatError,
    GoldenMismatch,
    GoldenMissingError,
    GoldenNaNWarning,
    GoldenToleranceWarning,
    UnsupportedValueError,
)
from .golden_files import GoldenFiles, merge_metrics
from .inputs import RolloutInputs
from .location import TOLERANCES, tensors_filename
from .modes import ModePolicy, ReplayOnly
from .presentation import (
    DROPPED,
    display,
    mismatch_message,
    missing_input,
    never_recorded_metric,
    never_recorded_tensors,
    recorded_lines,
    typo_hint,
)
from .results import Comparison, Mode, Outcome, Verdict
from .tolerance import Layer, Resolver, Stack, Tolerance, ToleranceUsage


class UpdateRegistry(Protocol):
    """Which golden directories this session has re-recorded already (shared keys, xdist)."""

    def contains(self, directory: Path) -> bool: ...

    def add(self, directory: Path) -> None: ...


def _step_key(step: int) -> str:
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be an int >= 0, got {step!r}")
    return str(step)


class Golden:
    """Record/replay/compare for one golden directory.

    What the mode allows is decided by :attr:`policy` (:mod:`.modes`); the files are read
    and written through :class:`~.golden_files.GoldenFiles`.
    """

    def __init__(
        self,
        directory: Path,
        *,
        mode: Mode = Mode.AUTO,
        tolerances: Stack | None = None,
        usage: ToleranceUsage | None = None,
        test_id: str = "",
        rebuild: Callable[..., Any] | None = None,
        registry: UpdateRegistry | None = None,
        replay_only: ReplayOnly | None = None,
        regenerate: bool = False,
        missing_step: str | None = None,
        missing_step_source: str = "missing_step=",
    ):
        """``regenerate``: under ``--update-golden``, call ``generate`` again instead of
        keeping the recorded rollouts. ``missing_step``: the policy for a rollout step
        never recorded (:data:`~.modes.MISSING_STEP_POLICIES`; default ``record``,
        ``error`` in strict mode). ``tolerances``: the test's tolerance layers (built-in
        defaults only if ``None``); ``usage`` notes which entries named a checked value."""
        self.directory = Path(directory)
        self.policy = ModePolicy.of(
            mode,
            replay_only=replay_only is not None,
            regenerate=regenerate,
            missing_step=missing_step,
            missing_step_source=missing_step_source,
        )
        self._replay_only = replay_only
        self._remedy = REMEDY_UPDATE if replay_only is None else replay_only.remedy
        self.test_id = test_id or str(directory)
        self._stack = tolerances or Stack()
        self._resolver = self._stack.resolver()
        self._usage = usage or ToleranceUsage()
        self._registry = registry
        self._files = GoldenFiles(self.directory, rebuild=rebuild)
        self._outcome = Outcome(self.test_id, str(self.directory))
        self._old_metrics: dict[str, dict[str, Any]] | None = None
        self._opened = False
        self._metrics: dict[str, dict[str, Any]] = {}  # this run's metrics, by step
        self._tensor_files: dict[str, dict[str, Any]] = {}  # this run's tensor files -> info
        self._touched: set[str] = set()  # golden files this run used
        self._finished = False
        self._drop_tolerances = False
        self._rollouts = RolloutInputs(
            self._files,
            notes=self._outcome.rollouts,
            touched=self._touched,
            missing=self._missing,
            missing_step_source=missing_step_source,
        )

    @property
    def mode(self) -> Mode:
        """The mode this golden runs in, as :attr:`policy` decided it once opened."""
        return self.policy.mode

    # ------------------------------------------------------------------ opening

    def _open(self) -> None:
        if self._opened:
            return
        try:
            self._files.open(damaged_is_missing=self.policy.replaces_damaged)
        finally:
            self._opened = self._files.is_open
        if self.policy.refuses_missing_golden(self._files.exists):
            only = self._replay_only
            assert only is not None
            raise GoldenMissingError(
                f"{self.test_id} only replays the golden of {only.recorder}, but "
                f"{display(self.directory)} does not exist; {only.remedy}."
            )
        updated = self._registry is not None and self._registry.contains(self.directory)
        self.policy = self.policy.opened(exists=self._files.exists, updated_this_session=updated)
        calibrated, lane = self.calibrated_layers()
        self._stack = self._stack.replace(calibrated=calibrated, calibrated_layout=lane)
        if self._replaying:
            from .determinism import fingerprint, fingerprint_changes

            recorded = self._files.manifest.get("fingerprint")  # type: ignore[union-attr]
            changes = fingerprint_changes(recorded, fingerprint())
            self._outcome.environment_changes = changes
            if changes and self._stack.exact:
                self._stack = self._stack.replace(exact=False)
        self._resolver = self._stack.resolver()

    def calibrated_layers(self) -> tuple[Layer | None, Layer | None]:
        """The tolerances ``--golden-calibrate`` wrote into this golden, if any.

        A replay-only golden (a layout variant) also takes the lane calibrated across layouts.
        """
        info = self._old_files().get(TOLERANCES)
        if info is None:
            return None, None
        document = self._load_for_update(TOLERANCES, None)
        if document is None:  # damaged, and --update-golden is the remedy: drop it
            self._drop_tolerances = True
            return None, None
        from .calibrate import calibrated_layers

        try:
            return calibrated_layers(
                document, self.directory / TOLERANCES, layout_variant=self._replay_only is not None
            )
        except GoldenFormatError:
            if not self.policy.replaces_damaged:
                raise
            self._drop_tolerances = True
            return None, None

    @property
    def _replaying(self) -> bool:
        return self.policy.replays(self._files.exists)

    def _old_files(self) -> dict[str, Any]:
        return self._files.recorded

    def _recorded_metrics(self) -> dict[str, dict[str, Any]]:
        if self._old_metrics is None:
            self._old_metrics = self._unless_damaged(self._files.metrics, {})
        return self._old_metrics

    def _load_for_update(self, filename: str, damaged: Any) -> Any:
        """A recorded file, or ``damaged`` for an unreadable one that is being re-recorded."""
        return self._unless_damaged(lambda: self._files.load(filename), damaged)

    def _unless_damaged(self, read: Callable[[], Any], damaged: Any) -> Any:
        """``read()``, except that ``--update-golden`` replaces an unreadable file.

        Every error about a damaged golden names ``--update-golden`` as the remedy,
        so an update must not need the old values: it only loses their diff.
        """
        try:
            return read()
        except GoldenFormatError:
            if not self.policy.replaces_damaged:
                raise
            return damaged

    def _never_recorded(self, step_key: str) -> str:
        recorded = self._recorded_metrics() if self._files.exists else None
        return never_recorded_metric(step_key, recorded, self._remedy)

    def _tensor_never_recorded(self, name: str, step: int, old_info: Any) -> str:
        steps = None if old_info is not None else self._files.steps("tensors", name)
        return never_recorded_tensors(name, step, steps, self._remedy)

    def _missing(
        self, what: str, step: int, recorded: Iterable[int], why: str = ""
    ) -> GoldenMissingError:
        recorder = None if self._replay_only is None else self._replay_only.recorder
        return GoldenMissingError(
            missing_input(what, step, recorded, self.directory, self._remedy, why, recorder)
        )

    # ------------------------------------------------------------------ public API

    def rollout(self, generate: Callable[[], Any], *, step: int = 0, name: str = "rollout") -> Any:
        """Rollout batch ``name`` at ``step``: replayed if recorded, else generated and recorded.

        Replay never calls ``generate``; it returns the same structure, dtypes,
        shapes and bit-identical values that were recorded, and so does the recording
        run (the batch as decoded from the file written). ``generate`` runs under a
        forked random state. Under ``--update-golden`` a recorded rollout is kept
        unless ``regenerate``; a step never recorded follows the missing-step policy.
        """
        _require_generator(generate, name)
        key = _step_key(step)
        self._open()
        return self._rollouts.get(self.policy, generate, name, int(key))

    def check(
        self,
        metrics: Mapping[str, Any],
        *,
        step: int = 0,
        tolerances: Mapping[str, Tolerance | Mapping[str, Any]] | None = None,
    ) -> list[Comparison]:
        """Record or compare ``metrics`` (name -> number, numpy value or tensor) at ``step``.

        Mismatches do not raise here: every one of them is reported together
        when the test ends.
        """
        if not isinstance(metrics, Mapping):
            raise TypeError(
                f"golden.check() needs a mapping of metric name -> value, got "
                f'{type(metrics).__name__}; write `golden.check({{"pg_loss": loss}}, step=step)`'
            )
        key = _step_key(step)
        self._open()
        if key in self._rollouts.not_recorded:
            return self._not_compared(list(metrics), step, kind="metric")
        resolver, layer = self._resolver, None
        if tolerances:
            layer = Layer("golden.check(tolerances=)", tolerances)
            resolver = self._stack.replace(call=layer).resolver()
        seen = self._metrics.setdefault(key, {})
        never_recorded = functools.partial(self._never_recorded, key)
        recorded = self._recorded_metrics().get(key, {})
        results = []
        for name, value in metrics.items():
            where = f"metric {name!r} at step {step}"
            if not isinstance(name, str):
                raise UnsupportedValueError(f"{where}: a metric name must be a str")
            if name in seen:
                raise ValueError(f"{where} was already checked in this test")
            node = metric_codec.encode(value, where=where)
            seen[name] = node
            if self.policy.warns_nan(recorded=name in recorded):
                _warn_nan(self.test_id, name, step, node)
            self._usage.note(resolver, name)
            old = recorded.get(name)
            if old is None:
                actual = metric_codec.scalar(node)
                results.append(self._unrecorded(name, never_recorded, step=step, actual=actual))
                continue
            results.append(_metric_comparison(name, step, old, node, resolver, self.policy))
        if layer is not None:
            self._warn_unused(layer, always=True)
        self._outcome.comparisons.extend(results)
        return results

    def check_tensors(
        self,
        name: str,
        tensors: Mapping[str, Any],
        *,
        step: int = 0,
        rank: int | None = None,
        micro: int | None = None,
        mask: Any = None,
    ) -> list[Comparison]:
        """Record or compare forward data (log_probs, entropy, ...) of one rank and micro-batch.

        ``mask`` (e.g. ``response_mask``; bool or 0/1) limits the comparison to the positions
        it selects; its dimensions line up with each tensor's leading ones (``[batch, tokens]``
        covers ``[batch, tokens, vocab]``). Values on padding are stored but never compared.
        The mask itself is not stored: this run's mask decides.
        """
        key = _step_key(step)
        self._open()
        if not isinstance(tensors, Mapping) or not tensors:
            raise TypeError(f"check_tensors({name!r}) needs a non-empty mapping of name -> tensor")
        masks = {} if mask is None else _as_mask(name, mask, tensors)
        if key in self._rollouts.not_recorded:
            return self._not_compared([f"{name}/{t}" for t in tensors], step, kind="tensor")
        filename = tensors_filename(name, int(key), rank, micro)
        if filename in self._tensor_files:
            raise ValueError(
                f"check_tensors({name!r}) at step {step}, rank {rank}, micro {micro} was already "
                "called in this test"
            )
        info = {"kind": "tensors", "name": name, "step": step, "rank": rank, "micro": micro}
        self._tensor_files[filename] = info
        self._touched.add(filename)
        old_info = self._old_files().get(filename)
        old = {} if old_info is None else self._load_for_update(filename, {})
        where = {"step": step, "rank": rank, "micro": micro}
        never_recorded = functools.partial(self._tensor_never_recorded, name, step, old_info)
        results = []
        for tensor_name, value in tensors.items():
            label = f"{name}/{tensor_name}"
            self._usage.note(self._resolver, label)
            if tensor_name in old:
                results.append(
                    _tensor_comparison(
                        label,
                        old[tensor_name],
                        value,
                        self._resolver,
                        self.policy,
                        mask=masks.get(tensor_name),
                        **where,
                    )
                )
            else:
                results.append(self._unrecorded(label, never_recorded, kind="tensor", **where))
        if self.policy.reports_unchecked:
            results += _dropped_tensors(name, old.keys() - tensors.keys(), **where)
        merged = {
            t: old[t] if t in old and not self.policy.rerecords else value
            for t, value in tensors.items()
        }
        if self.policy.rerecords or any(c.verdict == Verdict.NEW for c in results):
            self._files.stage_batch(filename, merged, **info)
        self._outcome.comparisons.extend(results)
        return results

    def _unrecorded(
        self, name: str, never_recorded: Callable[[], str], *, step: int, **fields: Any
    ) -> Comparison:
        """A value the golden does not hold: new (recorded when the test ends), or missing
        (``never_recorded()`` says what the golden holds instead, and the remedy)."""
        verdict = self.policy.unrecorded
        detail = never_recorded() if verdict == Verdict.MISSING else ""
        return Comparison(name, step, verdict, detail=detail, **fields)

    def _not_compared(self, names: list[str], step: int, *, kind: str) -> list[Comparison]:
        """Checks at a step whose rollout was generated and not recorded: nothing to compare."""
        why = self._rollouts.not_recorded[str(step)]
        results = [
            Comparison(name, step, Verdict.IGNORED, kind=kind, tolerance_source=why)
            for name in names
        ]
        self._outcome.comparisons.extend(results)
        return results

    def _ignored(self, name: str) -> bool:
        self._usage.note(self._resolver, name)
        return self._resolver.resolve(name)[0].ignore

    def _warn_unused(
        self, layer: Layer, at: tuple[str, int] | None = None, *, always: bool = False
    ) -> None:
        """Warn about ``layer``'s unmatched entries, at the caller of check() or at ``at``.

        ``always``: the layer's metrics were all seen (check(tolerances=)), so it may warn
        on a recording run too.
        """
        if not self._replaying and not always:  # nothing was compared, so nothing could match
            return
        for name in self._usage.unused(layer):
            warning = GoldenToleranceWarning(
                f"{self.test_id}: {layer.source} gives a tolerance for {name!r}, "
                "but no metric or tensor of that name was checked"
            )
            if at is None:
                warnings.warn(warning, stacklevel=3)
            else:
                warnings.warn_explicit(warning, GoldenToleranceWarning, at[0], at[1])

    # ------------------------------------------------------------------ finishing

    def finish(
        self,
        *,
        error: bool = False,
        tolerance_layers: Iterable[Layer] = (),
        warn_at: tuple[str, int] | None = None,
    ) -> Outcome:
        """Commit new recordings and report; raise GoldenMismatch if anything drifted.

        With ``error`` (the test itself raised) nothing is written and nothing is raised.
        """
        if self._finished:
            return self._outcome
        self._finished = True
        try:
            if not self._opened:
                return self._outcome
            self._outcome.rollouts[:0] = self._rollouts.kept_notes()
            if error:
                self._discard()
                return self._outcome
            if self._replaying:
                self._outcome.comparisons.extend(self._unchecked())
            for layer in tolerance_layers:
                self._warn_unused(layer, warn_at)
            failures = [c for c in self._outcome.comparisons if c.failed]
            if failures:
                self._outcome.fail()
                self._discard()
                raise GoldenMismatch(self.failure_message(failures))
            wrote = self.policy.needs_write(
                staged=self._files.staging,
                checked_metrics=bool(self._metrics),
                new_values=any(c.verdict == Verdict.NEW for c in self._outcome.comparisons),
            )
            if wrote:
                self._commit()
            touched = bool(self._outcome.comparisons or self._touched)
            status = self.policy.status(exists=self._files.exists, wrote=wrote, touched=touched)
            if status is not None:
                self._outcome.status = status
            return self._outcome
        finally:
            self._files.close()

    def _unchecked(self) -> list[Comparison]:
        ignored = {
            (str(c.step), c.name) for c in self._outcome.comparisons if c.verdict == Verdict.IGNORED
        }
        return _unchecked_metrics(
            self._recorded_metrics(), self._metrics, ignored, self._ignored
        ) + _unchecked_tensors(self._old_files(), self._touched, self._ignored)

    def _commit(self) -> None:
        from .determinism import fingerprint

        fresh = self.policy.fresh(self._files.exists)
        steps = merge_metrics(
            self._recorded_metrics(), self._metrics, replace=self.policy.rerecords
        )

        def keep(filename: str) -> bool:
            calibrated = filename == TOLERANCES
            if calibrated and self._drop_tolerances:
                return False
            return self.policy.keeps_file(used=filename in self._touched, calibrated=calibrated)

        env = fingerprint() if fresh else self._files.manifest.get("fingerprint")  # type: ignore[union-attr]
        files = self._files.commit(
            {"test": self.test_id, "fingerprint": env}, metrics=steps, keep=keep
        )
        if self.policy.rerecords and self._registry is not None:
            self._registry.add(self.directory)
        self._outcome.recorded = recorded_lines(
            files, fresh, self._old_files(), self._outcome.comparisons
        )

    def _discard(self) -> None:
        if self._files.abort():
            self._outcome.discarded = True
        if any(c.verdict == Verdict.NEW for c in self._outcome.comparisons):
            self._outcome.discarded = True

    def failure_message(self, failures: list[Comparison]) -> str:
        """The text of a GoldenMismatch (see :func:`.presentation.mismatch_message`)."""
        only = self._replay_only
        if only is None:
            return mismatch_message(self._outcome, failures)
        return mismatch_message(self._outcome, failures, recorder=only.recorder, remedy=only.remedy)

    # ------------------------------------------------------------------ context manager

    def __enter__(self) -> Golden:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.finish(error=exc_type is not None)

    @property
    def outcome(self) -> Outcome:
        return self._outcome

    def checked_metrics(self) -> dict[str, dict[str, tuple[Any, str]]]:
        """This run's scalar metrics: ``{step: {name: (value, dtype)}}`` (for calibration)."""
        out: dict[str, dict[str, tuple[Any, str]]] = {}
        for step, names in self._metrics.items():
            for name, node in names.items():
                value = metric_codec.scalar(node)
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    dtype = node["dtype"] if isinstance(node, dict) else "float64"
                    out.setdefault(step, {})[name] = (value, dtype)
        return out


# ---------------------------------------------------------------------- comparison records


def _metric_comparison(
    name: str, step: int, old: Any, node: Any, resolver: Resolver, policy: ModePolicy
) -> Comparison:
    """The comparison of a recorded metric node with this run's."""
    where = f"metric {name!r} at step {step}"
    expected, actual = (metric_codec.decode(n, where=where) for n in (old, node))
    diff, tol, source = compare_named(name, expected, actual, resolver, check_dtype=False)
    return Comparison(
        name,
        step,
        policy.verdict(ok=diff.ok, ignore=tol.ignore),
        expected=metric_codec.scalar(old) if expected.dim() == 0 else _summary(expected),
        actual=metric_codec.scalar(node) if actual.dim() == 0 else _summary(actual),
        abs_diff=diff.abs_diff,
        rel_diff=diff.rel_diff,
        tolerance=tol,
        tolerance_source=source,
        detail=diff.detail if diff.ok is False else "",
    )


def _tensor_comparison(
    label: str,
    old: Any,
    value: Any,
    resolver: Resolver,
    policy: ModePolicy,
    *,
    mask: Any,
    step: int,
    rank: int | None,
    micro: int | None,
) -> Comparison:
    """The comparison of a recorded tensor with this run's (``mask``: positions compared)."""
    diff, tol, source = compare_named(label, old, value, resolver, check_dtype=True, mask=mask)
    return Comparison(
        label,
        step,
        policy.verdict(ok=diff.ok, ignore=tol.ignore),
        kind="tensor",
        rank=rank,
        micro=micro,
        expected=_summary(old),
        actual=_summary(value),
        abs_diff=diff.abs_diff,
        rel_diff=diff.rel_diff,
        tolerance=tol,
        tolerance_source=source,
        detail=diff.detail,
    )


def _dropped_tensors(
    name: str, dropped: Iterable[str], *, step: int, rank: int | None, micro: int | None
) -> list[Comparison]:
    """A missing comparison per recorded tensor not passed to ``check_tensors(name)``."""
    return [
        Comparison(
            f"{name}/{tensor_name}",
            step,
            Verdict.MISSING,
            kind="tensor",
            rank=rank,
            micro=micro,
            detail=f"recorded but not passed to check_tensors in this run; {DROPPED}",
        )
        for tensor_name in dropped
    ]


def _unchecked_metrics(
    recorded: Mapping[str, Mapping[str, Any]],
    checked: Mapping[str, Mapping[str, Any]],
    ignored: set[tuple[str, str]],
    is_ignored: Callable[[str], bool],
) -> list[Comparison]:
    """A missing comparison per recorded metric this run did not check (or ignore)."""
    seen = {(step, name) for step, names in checked.items() for name in names} | ignored
    out = []
    for step, names in recorded.items():
        unrecorded = [n for n in checked.get(step, {}) if n not in names]
        for name in names:
            if (step, name) not in seen and not is_ignored(name):
                out.append(
                    Comparison(
                        name,
                        int(step),
                        Verdict.MISSING,
                        expected=metric_codec.scalar(names[name]),
                        detail=f"recorded but not checked in this run; "
                        f"{typo_hint(name, unrecorded)}{DROPPED}",
                    )
                )
    return out


def _unchecked_tensors(
    recorded: Mapping[str, Mapping[str, Any]], touched: set[str], is_ignored: Callable[[str], bool]
) -> list[Comparison]:
    """A missing comparison per recorded tensors file this run did not check."""
    return [
        Comparison(
            info["name"],
            info["step"],
            Verdict.MISSING,
            kind="tensor",
            rank=info.get("rank"),
            micro=info.get("micro"),
            detail=f"recorded but check_tensors was not called; {DROPPED}",
        )
        for filename, info in recorded.items()
        if info.get("kind") == "tensors"
        and filename not in touched
        and not is_ignored(info["name"])
    ]


def _as_mask(name: str, mask: Any, tensors: Mapping[str, Any]) -> dict[str, Any]:
    """``mask`` as a bool tensor per tensor name, lined up with each tensor's leading dims."""
    import torch

    where = f"check_tensors({name!r}, mask=)"
    m = torch.as_tensor(mask).detach()
    if m.dtype != torch.bool:
        if m.is_complex() or not bool(((m == 0) | (m == 1)).all()):
            raise ValueError(f"{where}: the mask must be bool or hold only 0 and 1, got {m.dtype}")
        m = m != 0
    masks = {}
    for tensor_name, value in tensors.items():
        shape = tuple(getattr(value, "shape", ()))
        lined_up = m.reshape(*m.shape, *(1,) * (len(shape) - m.dim()))
        try:
            fits = m.dim() <= len(shape) and torch.broadcast_shapes(lined_up.shape, shape) == shape
        except RuntimeError:
            fits = False
        if not fits:
            raise ValueError(
                f"{where}: the mask's shape {tuple(m.shape)} does not fit {tensor_name!r} of "
                f"shape {shape}: its dimensions must match the tensor's leading ones (or be 1), "
                "e.g. a [batch, tokens] response_mask for [batch, tokens, ...] tensors"
            )
        masks[tensor_name] = lined_up
    return masks


def _require_generator(generate: Any, name: str) -> None:
    if not callable(generate):
        raise TypeError(
            f"golden.rollout() needs the function that generates rollout {name!r}, got a "
            f"{type(generate).__name__}; pass the generator itself, e.g. "
            "`golden.rollout(lambda: engine.generate(prompts))`: replay never calls it"
        )


def _warn_nan(test_id: str, name: str, step: int, node: Any) -> None:
    """Warn when recording a metric that is or holds NaN (replay would fail on it)."""
    value = metric_codec.scalar(node)
    if value is None:
        from .metrics import decode

        has_nan = bool(decode(node, where=name).isnan().any())
    else:
        has_nan = isinstance(value, float) and math.isnan(value)
    if has_nan:
        warnings.warn(
            GoldenNaNWarning(
                f"{test_id}: metric {name!r} at step {step} is NaN and is recorded as NaN; "
                "replay fails on NaN unless its tolerance sets equal_nan (e.g. "
                f"`tolerances={{{name!r}: {{'equal_nan': True}}}}`): fix the NaN, or allow it"
            ),
            stacklevel=3,
        )


def _summary(value: Any) -> dict[str, Any]:
    return {"shape": list(getattr(value, "shape", ())), "dtype": dtype_name(value)}


__all__ = [
    "Golden",
    "GoldenError",
    "ReplayOnly",
]
