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

import math
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from . import inputs, store
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
from .location import METRICS, TOLERANCES, rollout_filename, tensors_filename
from .presentation import (
    DROPPED,
    display,
    kept_lines,
    mismatch_message,
    recorded_lines,
    step_ranges,
    typo_hint,
)
from .results import Comparison, Mode, Outcome, Status, Verdict
from .tolerance import Layer, Resolver, Stack, Tolerance, ToleranceUsage

_RECORD = object()  # sentinel: generate and record the rollout, as without a policy
_DAMAGED = object()  # sentinel: the recorded rollout is unreadable; regenerate it


class UpdateRegistry(Protocol):
    """Which golden directories this session has re-recorded already (shared keys, xdist)."""

    def contains(self, directory: Path) -> bool: ...

    def add(self, directory: Path) -> None: ...


@dataclass(frozen=True)
class ReplayOnly:
    """This golden is recorded by another test (``recorder``); this one only replays it.

    Such a golden never records, whatever the mode: a missing golden, step or metric fails
    with ``remedy`` (how to record it) instead of the usual ``--update-golden`` advice.
    """

    recorder: str
    remedy: str


def _step_key(step: int) -> str:
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be an int >= 0, got {step!r}")
    return str(step)


class Golden:
    """Record/replay/compare for one golden directory."""

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
        never recorded (:data:`~.inputs.MISSING_STEP_POLICIES`; default ``record``,
        ``error`` in strict mode). ``tolerances``: the test's tolerance layers (built-in
        defaults only if ``None``); ``usage`` notes which entries named a checked value."""
        self.directory = Path(directory)
        self.mode = Mode.STRICT if replay_only is not None else mode
        self._replay_only = replay_only
        self._remedy = REMEDY_UPDATE if replay_only is None else replay_only.remedy
        self.test_id = test_id or str(directory)
        self._stack = tolerances or Stack()
        self._resolver = self._stack.resolver()
        self._usage = usage or ToleranceUsage()
        self._rebuild = rebuild
        self._registry = registry
        self._outcome = Outcome(self.test_id, str(self.directory))
        self._lock: Any = None
        self._manifest: dict[str, Any] | None = None
        self._old_metrics: dict[str, dict[str, Any]] | None = None
        self._opened = False
        self._tx: store.Transaction | None = None
        self._metrics: dict[str, dict[str, Any]] = {}  # this run's metrics, by step
        self._tensor_files: dict[str, dict[str, Any]] = {}  # this run's tensor files -> info
        self._touched: set[str] = set()  # golden files this run used
        self._requested: set[tuple[str, str]] = set()  # (rollout name, step) asked for
        self._finished = False
        self._drop_tolerances = False
        self._regenerate = regenerate
        self._missing_step = missing_step
        if missing_step is not None:
            inputs.check_policy(missing_step, missing_step_source)
        self._missing_step_source = missing_step_source
        self._kept: dict[str, set[int]] = {}  # rollout name -> steps kept under --update-golden
        self._damaged: set[str] = set()  # rollout files regenerated because unreadable
        self._inputs_not_recorded: dict[str, str] = {}  # step -> why its metrics are not compared

    # ------------------------------------------------------------------ opening

    def _open(self) -> None:
        if self._opened:
            return
        self._lock = store.locked(self.directory)
        self._lock.__enter__()
        self._opened = True
        store.recover(self.directory)
        try:
            self._manifest = store.read_manifest(self.directory)
        except GoldenFormatError:
            if self.mode is not Mode.UPDATE:
                raise
            self._manifest = None  # --update-golden is the remedy: re-record it from scratch
        if self._manifest is None and self._replay_only is not None:
            only = self._replay_only
            raise GoldenMissingError(
                f"{self.test_id} only replays the golden of {only.recorder}, but "
                f"{display(self.directory)} does not exist; {only.remedy}."
            )
        updated = self._registry is not None and self._registry.contains(self.directory)
        if self._manifest is not None and self.mode is Mode.UPDATE and updated:
            self.mode = Mode.AUTO  # a shared golden another test re-recorded this session
        calibrated, lane = self.calibrated_layers()
        self._stack = self._stack.replace(calibrated=calibrated, calibrated_layout=lane)
        if self._manifest is not None and self.mode is not Mode.UPDATE:
            from .determinism import fingerprint, fingerprint_changes

            changes = fingerprint_changes(self._manifest.get("fingerprint"), fingerprint())
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
        document = self._load_for_update(TOLERANCES, info, None)
        if document is None:  # damaged, and --update-golden is the remedy: drop it
            self._drop_tolerances = True
            return None, None
        from .calibrate import calibrated_layers

        try:
            return calibrated_layers(
                document, self.directory / TOLERANCES, layout_variant=self._replay_only is not None
            )
        except GoldenFormatError:
            if self.mode is not Mode.UPDATE:
                raise
            self._drop_tolerances = True
            return None, None

    @property
    def _replaying(self) -> bool:
        return self._manifest is not None and self.mode is not Mode.UPDATE

    def _old_files(self) -> dict[str, Any]:
        return self._manifest["files"] if self._manifest is not None else {}

    def _transaction(self) -> store.Transaction:
        if self._tx is None:
            self._tx = store.Transaction(self.directory)
        return self._tx

    def _recorded_metrics(self) -> dict[str, dict[str, Any]]:
        if self._old_metrics is None:
            info = self._old_files().get(METRICS)
            self._old_metrics = {}
            if info is not None:
                data = self._load_for_update(METRICS, info, {"steps": {}})
                problem = metric_codec.document_problem(data)
                if problem is not None and self.mode is not Mode.UPDATE:
                    raise store.format_error(self.directory / METRICS, problem)
                self._old_metrics = data["steps"] if problem is None else {}
        return self._old_metrics

    def _load(self, filename: str, info: Mapping[str, Any]) -> Any:
        path, digest = self.directory / filename, info["digest"]
        try:
            if filename.endswith(".json"):
                return store.read_json(path, expect_digest=digest)
            return store.load_batch(path, rebuild=self._rebuild, expect_digest=digest)
        except FileNotFoundError:
            raise GoldenFormatError(
                f"{path}: listed in manifest.json but missing; restore it from version control "
                f"or {REMEDY_UPDATE}."
            ) from None

    def _load_for_update(self, filename: str, info: Mapping[str, Any], damaged: Any) -> Any:
        """:meth:`_load`, except that ``--update-golden`` replaces an unreadable file.

        Every error about a damaged golden names ``--update-golden`` as the remedy,
        so an update must not need the old values: it only loses their diff.
        """
        try:
            return self._load(filename, info)
        except GoldenFormatError:
            if self.mode is not Mode.UPDATE:
                raise
            return damaged

    def _never_recorded(self, step_key: str) -> str:
        steps = sorted(int(k) for k in self._recorded_metrics()) if self._manifest else []
        if self._manifest is None:
            where = "no golden exists yet"
        elif step_key not in self._recorded_metrics():
            where = f"step {step_key} was never recorded (recorded steps: {steps})"
        else:
            where = f"never recorded at step {step_key}"
        return f"{where}; {self._remedy}"

    def _tensor_never_recorded(self, name: str, step: int, old_info: Any) -> str:
        if old_info is not None:
            return f"never recorded in this file; {self._remedy}"
        steps = sorted(
            {
                i["step"]
                for i in self._old_files().values()
                if i.get("kind") == "tensors" and i.get("name") == name
            }
        )
        listing = f"recorded steps: {steps}" if steps else f"no {name!r} tensors were recorded"
        return f"step {step} was never recorded ({listing}); {self._remedy}"

    def _missing(
        self, what: str, step: int, recorded: Iterable[int], why: str = ""
    ) -> GoldenMissingError:
        steps = sorted(set(recorded))
        listing = f"recorded steps: {steps}" if steps else "nothing of it was recorded"
        why = why or "Recording is off (--golden-strict or CI)"
        if self._replay_only is not None:
            why = f"This test only replays the golden of {self._replay_only.recorder}"
        return GoldenMissingError(
            f"{what} at step {step} is not in the golden {display(self.directory)} ({listing}). "
            f"{why}; {self._remedy}."
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
        filename = rollout_filename(name, int(key))
        if (name, key) in self._requested:  # not _touched: a stand-in step touches another file
            raise ValueError(
                f"golden.rollout(name={name!r}, step={step}) was already called in this test: "
                "in a loop, pass the loop's step (`golden.rollout(generate, step=step)`), or give "
                "each batch of one step its own `name=`"
            )
        self._requested.add((name, key))
        self._touched.add(filename)
        if self._tx is not None and filename in self._tx.files:
            return store.load_batch(self._tx.staging / filename, rebuild=self._rebuild)
        info = self._old_files().get(filename)
        if info is not None and self._replaying:
            return self._load(filename, info)
        if info is not None and self.mode is Mode.UPDATE and not self._regenerate:
            kept = self._keep_rollout(filename, info, name, int(key))
            if kept is not _DAMAGED:
                return kept
        if info is None:
            stand_in = self._missing_rollout_step(generate, name, int(key))
            if stand_in is not _RECORD:
                return stand_in
        if self.mode is Mode.STRICT:
            recorded = [
                i["step"]
                for i in self._old_files().values()
                if i.get("kind") == "rollout" and i.get("name") == name
            ]
            raise self._missing(f"rollout {name!r}", step, recorded)
        batch = inputs.generate_forked(generate)
        tx = self._transaction()
        tx.write_batch(filename, batch, kind="rollout", name=name, step=step)
        if info is not None and info.get("kind") == "rollout":
            self._note_regenerated(filename, name, int(key))
        # What replay will return, not the object generate() built (requires_grad, views, ...)
        return store.load_batch(tx.staging / filename, rebuild=self._rebuild)

    # ------------------------------------------------------------------ rollouts as inputs

    def _recorded_rollout_steps(self, name: str) -> list[int]:
        return sorted(
            i["step"]
            for i in self._old_files().values()
            if i.get("kind") == "rollout" and i.get("name") == name
        )

    def _keep_rollout(self, filename: str, info: Mapping[str, Any], name: str, step: int) -> Any:
        """``--update-golden``: replay the recorded rollout (the test's input) and keep its file."""
        try:
            batch = self._load(filename, info)
        except GoldenFormatError as exc:
            first = str(exc).splitlines()[0]
            self._outcome.rollouts.append(
                f"rollout {name!r} step {step}: recorded file damaged ({first}); regenerated"
            )
            self._damaged.add(filename)
            return _DAMAGED
        self._kept.setdefault(name, set()).add(step)
        return batch

    def _note_regenerated(self, filename: str, name: str, step: int) -> None:
        if filename in self._damaged:
            return  # already said, and there is nothing to diff against
        assert self._tx is not None
        changes = inputs.batch_changes(self.directory / filename, self._tx.staging / filename)
        self._outcome.rollouts.append(f"rollout {name!r} step {step}: regenerated, {changes}")

    def _missing_rollout_step(self, generate: Callable[[], Any], name: str, step: int) -> Any:
        """A rollout step never recorded: the policy decides (``_RECORD``: record it as before)."""
        recorded = self._recorded_rollout_steps(name)
        policy = self._missing_step or (inputs.ERROR if self.mode is Mode.STRICT else inputs.RECORD)
        if self.mode is Mode.STRICT and policy == inputs.RECORD:
            policy = inputs.ERROR  # strict mode never records
        if not recorded or (self.mode is Mode.UPDATE and policy == inputs.ERROR):
            return _RECORD  # nothing to stand in for it; --update-golden is the remedy of error
        if policy == inputs.ERROR and self.mode is not Mode.STRICT:
            raise self._missing(
                f"rollout {name!r}",
                step,
                recorded,
                why=f"A step beyond the recording is an error here ({self._missing_step_source}"
                f"{policy!r}; 'repeat' or 'generate' would replay past it)",
            )
        if policy == inputs.REPEAT:
            substitute = inputs.substitute_step(recorded, step)
            assert substitute is not None
            sub_file = rollout_filename(name, substitute)
            self._touched.add(sub_file)
            self._outcome.rollouts.append(
                f"rollout {name!r} step {step}: step {substitute} stood in for it "
                f"(missing_step='repeat'; recorded steps {step_ranges(recorded)})"
            )
            return self._load(sub_file, self._old_files()[sub_file])
        if policy == inputs.GENERATE:
            self._outcome.rollouts.append(
                f"rollout {name!r} step {step}: generated, not recorded "
                "(missing_step='generate'); its metrics and tensors are not compared"
            )
            self._inputs_not_recorded[str(step)] = "missing_step='generate': rollout not recorded"
            return inputs.generate_forked(generate)
        return _RECORD  # record; strict mode with error raises in rollout()

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
        if key in self._inputs_not_recorded:
            return self._not_compared(list(metrics), step, kind="metric")
        resolver, layer = self._resolver, None
        if tolerances:
            layer = Layer("golden.check(tolerances=)", tolerances)
            resolver = self._stack.replace(call=layer).resolver()
        seen = self._metrics.setdefault(key, {})
        recorded = self._recorded_metrics().get(key, {}) if self._manifest is not None else {}
        results = []
        for name, value in metrics.items():
            where = f"metric {name!r} at step {step}"
            if not isinstance(name, str):
                raise UnsupportedValueError(f"{where}: a metric name must be a str")
            if name in seen:
                raise ValueError(f"{where} was already checked in this test")
            node = metric_codec.encode(value, where=where)
            seen[name] = node
            if self.mode is not Mode.STRICT and (self.mode is Mode.UPDATE or name not in recorded):
                _warn_nan(self.test_id, name, step, node)
            self._usage.note(resolver, name)
            old = recorded.get(name)
            if old is None:
                if self.mode is Mode.STRICT:
                    results.append(
                        Comparison(
                            name,
                            step,
                            Verdict.MISSING,
                            actual=metric_codec.scalar(node),
                            detail=self._never_recorded(key),
                        )
                    )
                else:
                    results.append(
                        Comparison(name, step, Verdict.NEW, actual=metric_codec.scalar(node))
                    )
                continue
            results.append(self._compare_metric(name, step, old, node, resolver))
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
        if key in self._inputs_not_recorded:
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
        old = {}
        if old_info is not None and (self._replaying or self.mode is Mode.UPDATE):
            old = self._load_for_update(filename, old_info, {})
        merged: dict[str, Any] = {}
        results = []
        for tensor_name, value in tensors.items():
            label = f"{name}/{tensor_name}"
            self._usage.note(self._resolver, label)
            if tensor_name not in old:
                verdict = Verdict.MISSING if self.mode is Mode.STRICT else Verdict.NEW
                detail = (
                    self._tensor_never_recorded(name, step, old_info)
                    if verdict == Verdict.MISSING
                    else ""
                )
                results.append(
                    Comparison(
                        label, step, verdict, kind="tensor", rank=rank, micro=micro, detail=detail
                    )
                )
                merged[tensor_name] = value
                continue
            diff, tol, source = compare_named(
                label,
                old[tensor_name],
                value,
                self._resolver,
                check_dtype=True,
                mask=masks.get(tensor_name),
            )
            verdict = _verdict(self.mode, diff.ok, tol)
            results.append(
                Comparison(
                    label,
                    step,
                    verdict,
                    kind="tensor",
                    rank=rank,
                    micro=micro,
                    expected=_summary(old[tensor_name]),
                    actual=_summary(value),
                    abs_diff=diff.abs_diff,
                    rel_diff=diff.rel_diff,
                    tolerance=tol,
                    tolerance_source=source,
                    detail=diff.detail,
                )
            )
            merged[tensor_name] = value if self.mode is Mode.UPDATE else old[tensor_name]
        for tensor_name in old.keys() - tensors.keys():
            if self.mode is not Mode.UPDATE:
                results.append(
                    Comparison(
                        f"{name}/{tensor_name}",
                        step,
                        Verdict.MISSING,
                        kind="tensor",
                        rank=rank,
                        micro=micro,
                        detail=f"recorded but not passed to check_tensors in this run; {DROPPED}",
                    )
                )
        if self.mode is Mode.UPDATE or any(c.verdict == Verdict.NEW for c in results):
            self._transaction().write_batch(filename, merged, **info)
        self._outcome.comparisons.extend(results)
        return results

    def _not_compared(self, names: list[str], step: int, *, kind: str) -> list[Comparison]:
        """Checks at a step whose rollout was generated and not recorded: nothing to compare."""
        why = self._inputs_not_recorded[str(step)]
        results = [
            Comparison(name, step, Verdict.IGNORED, kind=kind, tolerance_source=why)
            for name in names
        ]
        self._outcome.comparisons.extend(results)
        return results

    # ------------------------------------------------------------------ comparing

    def _compare_metric(
        self, name: str, step: int, old: Any, node: Any, resolver: Resolver
    ) -> Comparison:
        where = f"metric {name!r} at step {step}"
        expected, actual = (metric_codec.decode(n, where=where) for n in (old, node))
        diff, tol, source = compare_named(name, expected, actual, resolver, check_dtype=False)
        verdict = _verdict(self.mode, diff.ok, tol)
        return Comparison(
            name,
            step,
            verdict,
            expected=metric_codec.scalar(old) if expected.dim() == 0 else _summary(expected),
            actual=metric_codec.scalar(node) if actual.dim() == 0 else _summary(actual),
            abs_diff=diff.abs_diff,
            rel_diff=diff.rel_diff,
            tolerance=tol,
            tolerance_source=source,
            detail=diff.detail if diff.ok is False else "",
        )

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
            self._outcome.rollouts[:0] = kept_lines(self._kept)
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
            if self._needs_write():
                self._commit()
                self._outcome.status = (
                    Status.UPDATED
                    if self.mode is Mode.UPDATE and (self._manifest is not None)
                    else Status.RECORDED
                )
            elif self._outcome.comparisons or self._touched:
                self._outcome.status = Status.REPLAYED
            return self._outcome
        finally:
            self._release()

    def _needs_write(self) -> bool:
        if self._tx is not None:
            return True
        if self.mode is Mode.UPDATE:
            return bool(self._metrics)
        return any(c.verdict == Verdict.NEW for c in self._outcome.comparisons)

    def _unchecked(self) -> list[Comparison]:
        seen = {(step, name) for step, names in self._metrics.items() for name in names}
        seen |= {
            (str(c.step), c.name) for c in self._outcome.comparisons if c.verdict == Verdict.IGNORED
        }
        out = []
        for step, names in self._recorded_metrics().items():
            unrecorded = [n for n in self._metrics.get(step, {}) if n not in names]
            for name in names:
                if (step, name) not in seen and not self._ignored(name):
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
        for filename, info in self._old_files().items():
            if (
                info.get("kind") == "tensors"
                and filename not in self._touched
                and not self._ignored(info["name"])
            ):
                out.append(
                    Comparison(
                        info["name"],
                        info["step"],
                        Verdict.MISSING,
                        kind="tensor",
                        rank=info.get("rank"),
                        micro=info.get("micro"),
                        detail=f"recorded but check_tensors was not called; {DROPPED}",
                    )
                )
        return out

    def _commit(self) -> None:
        from .determinism import fingerprint

        tx = self._transaction()
        steps: dict[str, dict[str, Any]] = {}
        if self.mode is not Mode.UPDATE:
            for step, names in self._recorded_metrics().items():
                steps[step] = dict(names)
        for step, names in self._metrics.items():
            target = steps.setdefault(step, {})
            for name, node in names.items():
                if self.mode is Mode.UPDATE or name not in target:
                    target[name] = node
        for filename, info in self._old_files().items():
            if filename in tx.files or filename == METRICS:
                continue
            if filename == TOLERANCES and self._drop_tolerances:
                continue
            kept_on_update = filename in self._touched or (
                filename == TOLERANCES and not self._drop_tolerances
            )
            if self.mode is Mode.UPDATE and not kept_on_update:
                continue  # calibrated tolerances describe the setup's noise: kept on update
            tx.keep(filename, info)
        if steps:
            ordered = {k: steps[k] for k in sorted(steps, key=int)}
            tx.write_json(METRICS, {"steps": ordered}, kind="metrics")
        new_env = self.mode is Mode.UPDATE or self._manifest is None
        env = fingerprint() if new_env else self._manifest.get("fingerprint")
        tx.commit({"test": self.test_id, "fingerprint": env})
        self._tx = None
        if self.mode is Mode.UPDATE and self._registry is not None:
            self._registry.add(self.directory)
        self._outcome.recorded = recorded_lines(
            tx.files,
            self._manifest is None or self.mode is Mode.UPDATE,
            self._old_files(),
            self._outcome.comparisons,
        )

    def _discard(self) -> None:
        if self._tx is not None:
            self._outcome.discarded = bool(self._tx.files) or self._outcome.discarded
            self._tx.abort()
            self._tx = None
        if any(c.verdict == Verdict.NEW for c in self._outcome.comparisons):
            self._outcome.discarded = True

    def _release(self) -> None:
        if self._tx is not None:
            self._tx.abort()
            self._tx = None
        if self._lock is not None:
            self._lock.__exit__(None, None, None)
            self._lock = None

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


def _verdict(mode: Mode, ok: bool, tol: Tolerance) -> Verdict:
    if tol.ignore:
        return Verdict.IGNORED
    return Verdict.UPDATED if mode is Mode.UPDATE else (Verdict.PASS if ok else Verdict.FAIL)


def _summary(value: Any) -> dict[str, Any]:
    return {"shape": list(getattr(value, "shape", ())), "dtype": dtype_name(value)}


__all__ = [
    "Golden",
    "GoldenError",
    "ReplayOnly",
]
