"""The golden of one test: record what is missing, replay what is recorded, compare.

:class:`Golden` opens the golden (its files, lane, tolerances and mode) and takes the
user's calls; its :class:`~.run.GoldenRun` compares, stages and commits. It works without
pytest::

    with Golden(Path("golden/my_case"), mode=Mode.AUTO) as golden:
        batch = golden.rollout(generate, step=0)
        golden.check({"pg_loss": loss}, step=0)

Comparisons are collected while the test runs; :meth:`Golden.finish` commits
new recordings as one transaction (:class:`~.store.Transaction`) and raises
:class:`~.errors.GoldenMismatch` listing every mismatch at once.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ...errors import REMEDY_UPDATE, GoldenError, GoldenMismatch, GoldenMissingError
from ...store.location import TOLERANCES, tensors_filename
from ..results import Comparison, Mode, Outcome, Verdict
from ..tolerance.build import Declared, GoldenStack, Recorded, build
from ..tolerance.calibration import tensor_distances
from ..tolerance.envelope import Envelope
from ..tolerance.mismatch_bounds import CALL_SOURCE, DEFAULT_BOUNDS, PREFIX, Bound, layer, resolve
from ..tolerance.spec import Layer, Tolerance
from ..tolerance.stack import ToleranceUsage
from ..tolerance.trends import TrendBounds, call_trends
from ..wording import nothing_selected
from . import (
    bitwise_lane,
    checks,
    keyed,
    metric_codec,
    precision as precision_names,
    precision_lane,
)
from .determinism import fingerprint, fingerprint_changes
from .golden_files import GoldenFiles, merge_metrics
from .inputs import RolloutInputs
from .lane_opening import lane_refusal, open_lane
from .lanes import LaneChoice, LaneSetting
from .messages import (
    BOUND_KIND,
    input_outside_base_lane,
    mismatch_bound_exceeded,
    mismatch_message,
    missing_input,
    missing_recording,
    not_same_math,
    oracle_without_inputs,
    stand_in_note,
    uncalibrated_lane_note,
    uncalibrated_variant_note,
)
from .modes import ModePolicy, ReplayOnly
from .optimizer import flat, optimizer_state
from .refresh import Refresh
from .run import GoldenRun, OpenedGolden, UpdateRegistry
from .scores import per_sample as scores_of
from .sensitivity import bound_gates, golden_gates, tensor_gate

OPTIMIZER = "optimizer"  # the tensors name of check_optimizer: optimizer/<parameter>/<entry>


def user_facing(method: Callable[..., Any]) -> Callable[..., Any]:
    """A method users call: a golden error it raises shows the user's frames, not this
    package's (pytest hides the frame of ``__tracebackhide__``)."""

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True
        try:
            return method(*args, **kwargs)
        except GoldenError as exc:
            raise exc.with_traceback(None) from exc.__cause__

    return wrapper


@dataclasses.dataclass(frozen=True)
class SessionLinks:
    """How the pytest plugin ties a :class:`Golden` into its session: the session's
    tolerance usage tracker, its record of goldens updated so far, the reference a layout
    variant replays (``None``: this test records its own golden), and where the
    missing-step policy was set (for messages), and what a session that re-records says of
    itself (:mod:`.refresh`)."""

    usage: ToleranceUsage | None = None
    registry: UpdateRegistry | None = None
    replay_only: ReplayOnly | None = None
    missing_step_source: str = "missing_step="
    keep_probes: bool = False  # keep each tensor's first and last step (--golden-sensitivity)
    refresh: Refresh | None = None


def _mode_policy(
    mode: Mode, links: SessionLinks, *, regenerate: bool, missing_step: str | None
) -> ModePolicy:
    """The mode policy of a golden before it is opened (:meth:`.ModePolicy.of`)."""
    return ModePolicy.of(
        mode,
        replay_only=links.replay_only is not None,
        regenerate=regenerate,
        missing_step=missing_step,
        missing_step_source=links.missing_step_source,
        only_failing=links.refresh is not None and links.refresh.only_failing,
    )


def _declared_tolerances(
    tolerances: Mapping[str, Tolerance | Mapping[str, Any]] | Declared | None, *, certify: bool
) -> Declared:
    """What a golden's test declares: ``Golden(tolerances=)`` as its marker's layer; the
    float64 oracle's bound while certifying."""
    if tolerances is not None and not isinstance(tolerances, Declared):
        tolerances = Declared(marker=[Layer("Golden(tolerances=)", tolerances)])
    declared = tolerances or Declared()
    return dataclasses.replace(declared, certify=True) if certify else declared


class Golden:
    """Record/replay/compare for one golden directory: opens it and takes the user's calls.

    What the mode allows is decided by :attr:`policy` (:mod:`.modes`); the files are read
    and written through :class:`~.golden_files.GoldenFiles`; once opened, the golden's run
    (:class:`~.run.GoldenRun`) compares, stages and commits, and what each check adds (its
    comparison records, what it stages) is built by :mod:`.checks`.
    """

    def __init__(
        self,
        directory: Path,
        *,
        mode: Mode = Mode.AUTO,
        tolerances: Mapping[str, Tolerance | Mapping[str, Any]] | Declared | None = None,
        test_id: str = "",
        rebuild: Callable[..., Any] | None = None,
        regenerate: bool = False,
        missing_step: str | None = None,
        mismatch_bounds: Mapping[str, Bound] | None = None,
        trends: Mapping[str, str | Sequence[str]] | TrendBounds | None = None,
        session: SessionLinks | None = None,
        lane: LaneSetting | None = None,
        precision: str = "float32",
        certify: bool = False,
    ):
        """``tolerances``: per-metric tolerances (name or glob -> :class:`Tolerance` or
        dict) above the built-in defaults, or what a test declares (:class:`.build.Declared`,
        the pytest plugin's). ``test_id``: the name recorded in the manifest.
        ``rebuild``: the factory of DataProto-like batches on replay. ``regenerate``: under
        ``--update-golden``, call ``generate`` again instead of keeping the recorded
        rollouts. ``missing_step``: the policy for a rollout step never recorded
        (:data:`~.modes.MISSING_STEP_POLICIES`; default ``record``, ``error`` in strict
        mode). ``mismatch_bounds``: the bounds :meth:`check_mismatch` enforces (default:
        the published ones, :data:`~.mismatch_bounds.DEFAULT_BOUNDS`). ``trends``: bounds
        on how metrics evolve over the run, checked when it finishes, ``{metric: "growth<=2"
        or a list of specs}`` (statistics ``growth``, ``slope``; ``inf`` switches one off)
        over the defaults (:mod:`.trends`). ``session``: how
        the pytest plugin ties this golden into its session; scripts leave it out.
        ``lane``: the lane whose values this run compares and records (:mod:`.lanes`;
        default: lanes off, the values beside the inputs). ``precision``: the precision
        the test trains in (``float32``, ``bf16``), which :attr:`precision`, :attr:`dtype`
        and :meth:`autocast` pass on to it. ``certify``: run as the float64 oracle
        (:mod:`.precision`): the values are the golden's lane ``float64-oracle``, compared
        at the float64 bound; ``lane`` and ``precision`` are then ignored."""
        links = session or SessionLinks()
        usage, registry, replay_only = links.usage, links.registry, links.replay_only
        self._declared = _declared_tolerances(tolerances, certify=certify)
        self.directory = Path(directory)
        self.policy = _mode_policy(mode, links, regenerate=regenerate, missing_step=missing_step)
        self._refresh = links.refresh
        self._replay_only = replay_only
        self._remedy = REMEDY_UPDATE if replay_only is None else replay_only.remedy
        self.test_id = test_id or str(directory)
        self._certify = certify
        self._precision = (
            precision_names.ORACLE if certify else precision_names.canonical(precision)
        )
        if certify:
            lane = LaneSetting(precision_names.ORACLE_LANE, "--golden-certify")
        self._built: GoldenStack | None = None  # built once, when the golden is opened
        self._usage = usage or ToleranceUsage()
        self._registry = registry
        self._inputs = GoldenFiles(self.directory, rebuild=rebuild)
        self._files = self._inputs  # the values: another lane's directory once opened
        self._lane = lane or LaneSetting()
        self._choice = LaneChoice(self._lane)  # the lane compared, once opened
        self._rebuild = rebuild
        self._outcome = Outcome(self.test_id, str(self.directory))
        self._opened = False
        self._metrics: dict[str, dict[str, Any]] = {}  # this run's metrics, by step
        self._touched: set[str] = set()  # golden files this run used
        self._envelope: Envelope | None = None  # a long run's per-step bands, once opened
        self._finished = False
        self._bounds_held: dict[str, Bound] = {}  # mismatch metric -> its bound, last in force
        # --golden-sensitivity: per tensor, its first and last step's value, mask and tolerance
        self._tensor_probes: dict[str, dict[int, Any]] | None = {} if links.keep_probes else None
        self._mismatch_bounds = dict(DEFAULT_BOUNDS if mismatch_bounds is None else mismatch_bounds)
        self._trends = trends if isinstance(trends, TrendBounds) else call_trends(trends)
        self._rollouts = RolloutInputs(
            self._inputs,
            notes=self._outcome.rollouts,
            touched=self._touched,
            missing=self._missing,
            missing_step_source=links.missing_step_source,
        )

    @property
    def mode(self) -> Mode:
        """The mode this golden runs in, as :attr:`policy` decided it once opened."""
        return self.policy.mode

    # ------------------------------------------------------------------ precision

    @property
    def precision(self) -> str:
        """The precision this run trains in: ``float64`` while certifying (the oracle),
        else the declared one (ini ``golden_precision``, marker ``precision=``; default
        ``float32``)."""
        return self._precision

    @property
    def certifying(self) -> bool:
        """Whether this run is the float64 oracle (``--golden-certify``)."""
        return self._certify

    @property
    def dtype(self) -> Any:
        """The torch dtype of the model's weights and floating inputs this run: float64
        while certifying, else float32 (bf16 training computes under :meth:`autocast`)."""
        return precision_names.weight_dtype(self._precision)

    @property
    def compute_dtype(self) -> Any:
        """The torch dtype this run computes in: float64, float32 or bfloat16."""
        return precision_names.compute_dtype(self._precision)

    def autocast(self, device_type: str = "cpu") -> Any:
        """A context for the training step: ``torch.autocast`` to bf16 when the declared
        precision is ``bf16``, else autocast off (the oracle is never lowered by an outer
        autocast)."""
        return precision_names.autocast(self._precision, device_type)

    # ------------------------------------------------------------------ opening

    def _open(self) -> None:
        if self._opened:
            return
        try:
            self._inputs.open(damaged_is_missing=self.policy.replaces_damaged)
        finally:
            self._opened = self._inputs.is_open
        if self.policy.refuses_missing_golden(self._inputs.exists):
            only = self._replay_only
            assert only is not None
            text = missing_recording(self.test_id, only.recorder, self.directory, only.remedy)
            raise GoldenMissingError(text)
        if self._certify and not self._inputs.exists:
            raise GoldenMissingError(oracle_without_inputs(self.test_id, self.directory))
        self._open_lane()
        updated = self._registry is not None and self._registry.contains(self._files.directory)
        self.policy = self.policy.opened(exists=self._files.exists, updated_this_session=updated)
        self._files.replaces_damaged = self.policy.replaces_damaged

        only = self._replay_only is not None
        calibrated: tuple[Layer | None, Layer | None] = (None, None)
        if not self._certify:  # the oracle's bound replaces what calibration measured
            calibrated = self._files.calibrated_layers(layout_variant=only)
            self._envelope = self._files.envelope(layout_variant=only)
        recorder = self._files.recorded_by
        if self._replaying and not only and recorder not in (None, self.test_id):
            self._outcome.recorded_by = recorder  # a key=/shared= golden of another test
        if self._replaying:
            recorded = self._files.manifest.get("fingerprint")  # type: ignore[union-attr]
            self._outcome.environment_changes = fingerprint_changes(recorded, fingerprint())
        self._built = build(
            self._declared,
            Recorded(
                *calibrated,
                envelope=self._envelope,
                environment_changed=bool(self._outcome.environment_changes),
                fallback=self._choice.role == "fallback",
                fallback_tolerances=self._choice.tolerances,
            ),
        )

    def _open_lane(self) -> None:
        """Make :attr:`_files` the values of the lane :func:`.lanes.choose` chooses
        (:func:`.lane_opening.open_lane`). A refusal raises with the values it refuses as
        :attr:`_files`."""
        exists = self._inputs.exists
        choice, self._files = open_lane(
            self.directory, self._inputs, self._lane, self.policy, rebuild=self._rebuild
        )
        self._choice = choice
        if choice.lane is not None:
            self._outcome.lane = {"name": choice.lane, "source": choice.setting.source}
            if exists and choice.refusal != "regenerate":
                self._outcome.lane["base"] = choice.base
        if choice.refusal is not None:
            where = self._files.directory
            raise lane_refusal(choice, self.directory, where, self.test_id, self._remedy)
        if choice.role == "fallback":
            self._outcome.lane["fallback"] = choice.values

    @property
    def _replaying(self) -> bool:
        return self.policy.replays(self._files.exists)

    def _missing(
        self, what: str, step: int, recorded: Iterable[int], why: str = ""
    ) -> GoldenMissingError:
        recorder = None if self._replay_only is None else self._replay_only.recorder
        return GoldenMissingError(
            missing_input(what, step, recorded, self.directory, self._remedy, why, recorder)
        )

    # ------------------------------------------------------------------ public API

    @user_facing
    def rollout(
        self,
        generate: Callable[[], Any],
        *,
        step: int = 0,
        name: str = "rollout",
        device: Any = None,
    ) -> Any:
        """Rollout batch ``name`` at ``step``: replayed if recorded, else generated and recorded.

        Replay never calls ``generate``; it returns the same structure, dtypes,
        shapes and bit-identical values that were recorded, and so does the recording
        run (the batch as decoded from the file written). ``generate`` runs on a
        random stream of its own (seeded from the session's seed, ``name`` and ``step``;
        the outer streams are restored afterwards). Under ``--update-golden`` a recorded
        rollout is kept
        unless ``regenerate``; a step never recorded follows the missing-step policy.

        A batch is read onto the CPU, where it was recorded or not; ``device`` (``"cuda"``,
        a ``torch.device``) puts its tensors there: every tensor of a dict, list or tuple,
        or the batch's own ``.to(device)`` (a tensor, TensorDict, DataProto).
        """
        checks.require_generator(generate, name)
        key = checks.step_key(step)
        self._open()
        batch = self._rollouts.get(self.policy, generate, name, int(key))
        if self._inputs is not self._files and self._inputs.staging:
            self._inputs.abort()
            raise GoldenMissingError(
                input_outside_base_lane(name, step, self.directory, self._choice.lane)
            )
        self._run.note_derived(name, step, batch)
        if self._certify:
            batch = precision_names.as_float64(batch)
        return batch if device is None else checks.to_device(batch, device)

    @user_facing
    def rollout_samples(
        self,
        generate: Callable[[], Iterable[Any]],
        *,
        key: Callable[[Any], Any],
        step: int = 0,
        name: str = "rollout",
        order: str = "key",
        device: Any = None,
    ) -> list[Any]:
        """The samples of rollout ``name`` at ``step``, whatever order they completed in.

        ``generate()`` returns or yields the samples as the engine finished them (an
        asynchronous engine, an agent loop); ``key(sample)`` says what identifies one: a
        str, an int or a tuple of them (prompt uid, sample index, turn, policy version).
        Recording and replay return the samples sorted by key, so the training step sees
        the same batch whatever order the engine finished in; ``order="recorded"`` returns
        the completion order of the recording. A sample is any value ``rollout`` stores
        (messages, tool calls, token ids, per-turn loss masks), returned bit for bit.
        Otherwise as :meth:`rollout`.
        """
        keyed.check_order(order)
        checks.require_generator(generate, name)
        where = f"rollout {name!r} at step {step}"
        stored = self.rollout(
            lambda: keyed.collect(generate(), key, where), step=step, name=name, device=device
        )
        try:
            return keyed.ordered(stored, order, where, keyed.REMEDY)
        except ValueError as exc:
            raise GoldenError(str(exc)) from None

    @user_facing
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
        checks.require_metrics(metrics)
        checks.step_key(step)
        self._open()
        return self._run.check_metrics(metrics, step=step, tolerances=tolerances)

    @user_facing
    def check_scores(
        self,
        scores: Any,
        *,
        step: int = 0,
        ids: Sequence[Any] | None = None,
        name: str = "reward",
        tolerances: Mapping[str, Tolerance | Mapping[str, Any]] | None = None,
    ) -> list[Comparison]:
        """Record or compare the scores a reward model or verifier gave this step's samples.

        ``scores``: one per sample (a 1-D tensor, array or list); ``ids``: what names each
        sample (default its index). Each score is the metric ``<name>/<id>``, so a failure
        names the samples whose score moved, and a tolerance or a same-math variant (scoring
        in other batch sizes: ``same_math([16, 4, 1])``) applies to all of them. Otherwise as
        :meth:`check`.
        """
        try:
            metrics = scores_of(scores, ids, name)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"{exc} (name={name!r}, step={step})") from None
        return self.check(metrics, step=step, tolerances=tolerances)

    @user_facing
    def check_mismatch(
        self,
        log_probs: Any,
        rollout_log_probs: Any,
        response_mask: Any,
        *,
        step: int = 0,
        bounds: Mapping[str, float] | None = None,
    ) -> list[Comparison]:
        """Gate the train–inference mismatch of one batch: record or compare its metrics
        (:func:`.mismatch.metrics`, as ``mismatch/<name>``) like :meth:`check`, and hold
        each to its absolute bound (``metric <= bound``), recording or not.

        ``log_probs``: the trainer's log probs of the sampled tokens ``[B, T]``;
        ``rollout_log_probs``: the engine's; ``response_mask``: the valid tokens (bool,
        int or float; a mask that selects no token fails, as every metric would read 0).
        ``bounds`` (``{metric: value}``, ``inf`` switches one off, listed as not compared)
        come before the marker's, the command line's, the ini's and the defaults. A metric
        beyond its bound fails the test when it ends, naming the bound, its source and the
        worst sequences and tokens.
        """
        # imported on use: both import torch, which loading the plugin must not
        from ... import mismatch
        from ...reference.masking import as_bool_mask

        if bounds is not None and not isinstance(bounds, Mapping):
            raise TypeError(f"check_mismatch(bounds=) takes {{metric: bound}}, got {bounds!r}")
        in_force = resolve(layer(bounds, CALL_SOURCE), base=self._mismatch_bounds)
        self._bounds_held.update({PREFIX + name: bound for name, bound in in_force.items()})
        values = mismatch.metrics(log_probs, rollout_log_probs, response_mask)
        if not bool(as_bool_mask(response_mask.detach()).any()):  # every metric reads 0
            self._open()
            text = nothing_selected(response_mask.numel(), "check_mismatch out")
            failed = Comparison(
                PREFIX + "response_mask", step, Verdict.FAIL, kind="mask", detail=text
            )
            self._outcome.comparisons.append(failed)
            return [failed]
        results = self.check({PREFIX + name: v for name, v in values.items()}, step=step)
        added = [
            Comparison(
                f"{PREFIX}{name}<=inf",
                step,
                Verdict.IGNORED,
                kind=BOUND_KIND,
                tolerance_source=f"{bound.source}: bound switched off",
            )
            for name, bound in in_force.items()
            if bound.off
        ]
        beyond = {name: b for name, b in in_force.items() if not b.holds(values[name])}
        if beyond:
            where = mismatch.locate(log_probs, rollout_log_probs, response_mask)
            added += [
                self._beyond(PREFIX + n, values[n], b, step, where) for n, b in beyond.items()
            ]
        self._outcome.comparisons.extend(added)
        return results + added

    @user_facing
    def check_bitwise(
        self,
        log_probs: Any,
        rollout_log_probs: Any,
        response_mask: Any = None,
        *,
        step: int = 0,
        control: Any = None,
        locate: Callable[[], Any] | None = None,
        name: str = "log_probs",
    ) -> list[Comparison]:
        """Require the trainer's ``log_probs`` to equal the engine's ``rollout_log_probs``
        bit for bit where ``response_mask`` selects (``[B, T]`` sampled tokens, or ``[B, T,
        K]`` top-k / full-vocabulary log probs under a ``[B, T]`` mask), recording or not.

        ``control``: the must-fail control, the trainer's log probs computed with the
        property off (batch invariance off, another batch size), or a callable returning
        them; it must differ from the engine's somewhere, or the test fails as
        inconclusive. Without one the pass is listed as uncontrolled. ``locate``: a
        callable returning :func:`~pytest_rollout_golden.bitwise.first_divergence`'s
        answer, called only when the lane fails. ``name`` tells several lanes of one step
        apart (``bitwise/<name>``). See :mod:`.bitwise_lane` for the verdicts.
        """
        checks.step_key(step)
        self._open()
        if self._certify:
            found = [bitwise_lane.oracle_skipped(name, step)]
        else:
            found = bitwise_lane.comparisons(
                name, log_probs, rollout_log_probs, response_mask, step=step,
                control=control, locate=locate,
            )  # fmt: skip
        self._outcome.comparisons.extend(found)
        return found

    @user_facing
    def check_precision(
        self,
        trainer: Any,
        engine: Any = None,
        *,
        rules: Any = None,
        declared: Sequence[str] = (),
        same: bool = False,
        name: str = "precision",
    ) -> list[Comparison]:
        """Record or compare the precision manifest of ``trainer`` and ``engine``: per
        parameter, the dtype and quantization scheme each side uses and the rule that chose
        it (:func:`~pytest_rollout_golden.quant.manifest.build`; each side a module, a state
        dict, or the :class:`~pytest_rollout_golden.quant.manifest.Rules` of its quantization
        config; ``rules=`` declares the engine's). A parameter whose precision changes on
        either side fails naming it, both sides and the rules. Whatever the golden says,
        patterns that matched by substring what a whole-name match would not, sensitive
        layers (routers, norms, embeddings, the output head) quantized without ``declared``
        naming them, and (``same=True``) sides that disagree fail. ``name`` tells several
        manifests of one test apart (file ``precision-<name>.json``)."""
        self._open()
        lane = precision_lane.Lane(self._files, self._touched, self.policy, self._remedy)
        found = precision_lane.comparisons(
            name, trainer, engine, rules=rules, declared=declared, same=same, golden=lane
        )
        self._outcome.comparisons.extend(found)
        return found

    @staticmethod
    def _beyond(name: str, value: float, bound: Bound, step: int, where: Any) -> Comparison:
        """The failure of mismatch metric ``name`` beyond ``bound`` (``where``: the worst
        sequences and tokens of the batch, :func:`.mismatch.locate`)."""
        finite = value == value and abs(value) != float("inf")
        text = mismatch_bound_exceeded(
            name, value, bound.value, bound.source, step, where.sequences, where.tokens
        )
        return Comparison(
            name,
            step,
            Verdict.FAIL,
            kind=BOUND_KIND,
            actual=value,
            detail=text,
            tolerance_source=bound.source,
            excess=value / bound.value if finite and bound.value > 0 else float("inf"),
        )

    @user_facing
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
        The mask itself is not stored: this run's mask decides. A recording notes, per
        tensor, how many positions its mask selected (``masked`` in the file's manifest
        entry), so that ``rollout-golden diff`` can say it compares padding too.
        """
        checks.step_key(step)
        self._open()
        masks = checks.tensor_masks(name, tensors, mask)
        return self._run.check_tensor_file(name, tensors, masks, step=step, rank=rank, micro=micro)

    @user_facing
    def check_accumulation(self, step: Callable[..., Any], batch: Any, **settings: Any) -> None:
        """Require ``step`` to learn the same whatever its micro-batching and gradient
        accumulation, in float64 on ``batch`` (a recorded rollout, rows = samples):
        :func:`~pytest_rollout_golden.invariants.check_accumulation_invariance`, whose
        keyword arguments ``settings`` are (``micro_batch_sizes``, ``accumulation_steps``,
        ``settings``, ``data=st.data()`` to draw them with hypothesis, ``rtol``, ``atol``).
        Raises AssertionError naming the setting pair and the value that differs."""
        # imported on use: the invariants import torch, which loading the plugin must not
        from ...invariants.accumulation import check_accumulation_invariance

        check_accumulation_invariance(step, batch, **settings)

    @user_facing
    def check_optimizer(
        self,
        optimizer: Any,
        *,
        step: int = 0,
        model: Any = None,
        master_weights: Mapping[str, Any] | None = None,
    ) -> list[Comparison]:
        """Record or compare the optimizer's state at ``step`` by parameter name, as tensors
        ``optimizer/<parameter>/<entry>`` (Adam's ``exp_avg``, ``exp_avg_sq``, ``step``;
        SGD's ``momentum_buffer``; whatever else the state holds).

        ``optimizer``, ``model`` and ``master_weights`` are those of
        :func:`~pytest_rollout_golden.optimizer_state` (a ``torch.optim`` optimizer, its
        ``state_dict()`` or an already named state; FSDP2's DTensor state is gathered, so
        every rank calls this). The recorded state is the whole state: an entry it holds
        and this run lacks is missing, an entry this run adds fails (neither is recorded
        except under ``--update-golden``). Moments are compared against their largest
        recorded element (the built-in ``optimizer/*`` tolerances); the step count exactly.
        """
        checks.step_key(step)
        tensors = flat(optimizer_state(optimizer, model, master_weights=master_weights))
        self._open()
        if (
            not tensors
            and tensors_filename(OPTIMIZER, step, None, None) not in self._files.recorded
        ):
            raise ValueError(
                f"check_optimizer at step {step}: the optimizer holds no state to record; "
                "call it after optimizer.step()"
            )
        return self._run.check_tensor_file(
            OPTIMIZER, tensors, {}, step=step, rank=None, micro=None, whole_state=True
        )

    @functools.cached_property
    def _run(self) -> GoldenRun:
        """The run that compares, stages and commits, over what opening decided (built on
        first use, once the golden is opened, whose decisions are final then)."""
        assert self._opened, "a golden's run starts once the golden is opened"
        opened = OpenedGolden(
            test_id=self.test_id,
            directory=self.directory,
            policy=self.policy,
            inputs=self._inputs,
            files=self._files,
            lane=self._choice.lane,
            envelope=self._envelope,
            tolerances=self._tolerances,
            trends=self._trends,
            certify=self._certify,
            replay_only=self._replay_only,
            remedy=self._remedy,
            usage=self._usage,
            registry=self._registry,
            refresh=self._refresh,
        )
        return GoldenRun(
            opened,
            outcome=self._outcome,
            rollouts=self._rollouts,
            metrics=self._metrics,
            touched=self._touched,
            probes=self._tensor_probes,
        )

    @property
    def _tolerances(self) -> GoldenStack:
        """This golden's tolerance stack (:func:`.build.build`), built when it is opened; a
        golden never opened holds nothing but what its test declared."""
        if self._built is None:
            self._built = build(self._declared)
        return self._built

    # ------------------------------------------------------------------ finishing

    @user_facing
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
            failures = self._run.finish(
                error=error, tolerance_layers=tolerance_layers, warn_at=warn_at
            )
            if failures:
                raise GoldenMismatch(self.failure_message(failures))
            return self._outcome
        finally:
            self._files.close()
            self._inputs.close()

    def failure_message(self, failures: list[Comparison]) -> str:
        """The text of a GoldenMismatch (see :func:`.messages.mismatch_message`); a
        variant failing the float64 oracle is headed "not the same math" (see
        :func:`.messages.not_same_math`)."""
        only = self._replay_only
        notes = self._stand_in_notes(failures) + self._uncalibrated_notes()
        if self._certify:
            notes += self._lower_precision_notes()
        else:
            notes += self._uncalibrated_lane_notes()
        if only is None:
            return mismatch_message(self._outcome, failures, notes=notes)
        text = mismatch_message(
            self._outcome, failures, recorder=only.recorder, remedy=only.remedy, notes=notes
        )
        return not_same_math(failures, text) if self._certify else text

    def _lower_precision_notes(self) -> list[str]:
        """While certifying: a note naming the values checked below float64."""
        return precision_names.lower_precision_note(self.checked_dtypes())

    def checked_dtypes(self) -> dict[str, str]:
        """The dtype of each metric this run checked (its last step's)."""
        return {
            name: dtype
            for values in self.checked_metrics().values()
            for name, (_, dtype) in values.items()
        }

    def _stand_in_notes(self, failures: list[Comparison]) -> list[str]:
        """A note per failed step whose recorded values were computed on a stand-in rollout."""
        marks = self._files.stand_ins if self._replaying else {}
        steps = sorted({c.step for c in failures if str(c.step) in marks})
        return [
            stand_in_note(
                step,
                marks[str(step)],
                self._rollouts.stood_in.get(str(step), {}),
                functools.partial(self._rollouts.requested, step=step),
            )
            for step in steps
        ]

    def _uncalibrated_lane_notes(self) -> list[str]:
        """This run's lane lacks the calibrated tolerances its base lane has: a note."""
        lane = self._outcome.lane
        if self._files is self._inputs or lane.get("fallback") or not lane.get("base"):
            return []
        if TOLERANCES in self._files.recorded or TOLERANCES not in self._inputs.recorded:
            return []
        return [uncalibrated_lane_note(lane["name"], lane["base"], self._outcome.test)]

    def _uncalibrated_notes(self) -> list[str]:
        """A variant that none of the calibrations across variants of this golden ran: a
        note, so that its failure reads as what it may be."""
        if self._replay_only is None:
            return []
        test = self._outcome.test
        missed = {f: t for f, t in self._files.calibrated_tests().items() if test not in t}
        if not missed:
            return []
        tests = sorted({t for found in missed.values() for t in found})
        return [uncalibrated_variant_note(test, " and ".join(missed), tests)]

    # ------------------------------------------------------------------ context manager

    def __enter__(self) -> Golden:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.finish(error=exc_type is not None)

    @property
    def outcome(self) -> Outcome:
        return self._outcome

    @property
    def values_directory(self) -> Path:
        """Where this run's lane keeps its values: the golden's directory, or its
        ``@lanes/<lane>/`` (:mod:`.lanes`); calibration writes its tolerances there."""
        return self._files.directory

    def checked_metrics(self) -> dict[str, dict[str, tuple[Any, str]]]:
        """This run's scalar metrics: ``{step: {name: (value, dtype)}}`` (for calibration)."""
        return metric_codec.numbers(self._metrics)

    def sensitivity(self) -> list[Any]:
        """What each gate of this golden can detect (:mod:`.sensitivity`): its
        metrics as recorded (this run's where it recorded them) under the tolerance replay
        applied at each step (this run's comparisons', else the step's resolver), and its
        trend bounds."""
        steps = merge_metrics(self._files.metrics(), self._metrics, replace=self.policy.rerecords)
        applied = {
            (c.name, c.step): (c.tolerance, c.tolerance_source)
            for c in self._outcome.comparisons
            if c.kind == "metric" and c.tolerance is not None
        }

        def tolerance_at(name: str, step: int, dtypes: tuple[str, str]) -> tuple[Tolerance, str]:
            found = applied.get((name, step))
            return found if found is not None else self._tolerances.at(step).resolve(name, dtypes)

        gates = golden_gates(steps, tolerance_at, trends=self._trends, envelope=self._envelope)
        gates += bound_gates(steps, self._bounds_held)
        kept = self._tensor_probes or {}
        return gates + [tensor_gate(name, kept[name]) for name in sorted(kept)]

    def calibration_sample(self) -> dict[str, Any]:
        """What ``--golden-calibrate`` keeps of this run: its scalar metrics, the golden's
        (replaying; what an envelope is centred on), their largest recorded magnitudes, per
        tensor its greatest distance to the golden (:func:`.calibration.tensor_distances`),
        and the names its tolerances (the marker's
        included) do not compare."""
        comparisons = self._outcome.comparisons
        metrics = self.checked_metrics()
        names = {name for values in metrics.values() for name in values}
        magnitudes = {name: self._run.magnitude(name) for name in sorted(names)}
        return {
            "metrics": metrics,
            "recorded": metric_codec.numbers(self._files.metrics()) if self._replaying else {},
            "magnitudes": {k: v for k, v in magnitudes.items() if v is not None},
            "tensors": tensor_distances(comparisons),
            "ignored": sorted({c.name for c in comparisons if c.verdict == Verdict.IGNORED}),
        }


__all__ = ["Golden", "SessionLinks", "UpdateRegistry", "user_facing"]
