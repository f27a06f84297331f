"""What one call of ``golden.check()`` or ``check_tensors()`` adds: checked arguments and
one :class:`~.results.Comparison` per value.

Pure functions over a recorded value, this run's value, the tolerance resolver and the
mode policy; :class:`~.golden.Golden` keeps the bookkeeping of a test (what was checked,
what is staged) and acts on what these return.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...errors import GoldenNaNWarning, UnsupportedValueError
from ..results import Comparison, Verdict, json_number
from ..tolerance.compare import compare_named, dtype_name, finite_magnitude
from ..tolerance.envelope import TREND_MARGIN, Bias, Envelope
from ..tolerance.mismatch_bounds import Bound
from ..tolerance.spec import Tolerance
from ..tolerance.stack import Resolver, ToleranceUsage
from ..tolerance.trends import TrendCheck
from ..user_warnings import warn_user
from . import metric_codec
from .messages import (
    BIAS_KIND,
    DROPPED,
    TREND_KIND,
    bias_beyond,
    difference_detail,
    optimizer_entry_extra,
    trend_beyond,
    typo_hint,
)
from .modes import ModePolicy

# ---------------------------------------------------------------------- arguments


def step_key(step: int) -> str:
    """``step`` as the key of the golden's metric steps; ValueError unless an int >= 0."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be an int >= 0, got {step!r}")
    return str(step)


def require_generator(generate: Any, name: str) -> None:
    if not callable(generate):
        raise TypeError(
            f"golden.rollout() needs the function that generates rollout {name!r}, got a "
            f"{type(generate).__name__}; pass the generator itself, e.g. "
            "`golden.rollout(lambda: engine.generate(prompts))`: replay never calls it"
        )


def require_metrics(metrics: Any) -> None:
    """TypeError unless ``golden.check()`` was given a mapping of metric name -> value."""
    if not isinstance(metrics, Mapping):
        raise TypeError(
            f"golden.check() needs a mapping of metric name -> value, got "
            f'{type(metrics).__name__}; write `golden.check({{"pg_loss": loss}}, step=step)`'
        )


def encode_metric(name: Any, value: Any, step: int, seen: Mapping[str, Any]) -> Any:
    """The metric node of ``value`` (see :func:`.metric_codec.encode`); ``seen``: the names
    this test already checked at ``step``, which may not be checked again."""
    where = f"metric {name!r} at step {step}"
    if not isinstance(name, str):
        raise UnsupportedValueError(f"{where}: a metric name must be a str")
    if name in seen:
        raise ValueError(f"{where} was already checked in this test")
    return metric_codec.encode(value, where=where)


def tensor_masks(name: str, tensors: Any, mask: Any) -> dict[str, Any]:
    """The masks of ``check_tensors(name, tensors, mask=)`` per tensor (see :func:`as_mask`;
    none without ``mask``); TypeError unless ``tensors`` is a non-empty mapping."""
    if not isinstance(tensors, Mapping) or not tensors:
        raise TypeError(f"check_tensors({name!r}) needs a non-empty mapping of name -> tensor")
    return {} if mask is None else as_mask(name, mask, tensors)


def as_mask(name: str, mask: Any, tensors: Mapping[str, Any]) -> dict[str, Any]:
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


def mask_counts(masks: Mapping[str, Any], tensors: Mapping[str, Any]) -> dict[str, list[int]]:
    """Per tensor of ``tensors`` a mask of ``masks`` (:func:`as_mask`) applies to:
    ``[positions it selects, positions]``, what a golden records of the mask (``diff``
    reads it); tensors of another shape than the mask fits are left out."""
    import torch

    out = {}
    for name, mask in masks.items():
        shape = tuple(getattr(tensors.get(name), "shape", ()))
        try:
            selected = torch.broadcast_to(mask, shape)
        except RuntimeError:
            continue
        out[name] = [int(selected.count_nonzero()), selected.numel()]
    return out


def require_first_call(
    name: str, called: bool, *, step: int, rank: int | None, micro: int | None
) -> None:
    """ValueError if ``check_tensors(name)`` was ``called`` at this place already."""
    if called:
        raise ValueError(
            f"check_tensors({name!r}) at step {step}, rank {rank}, micro {micro} was already "
            "called in this test"
        )


# ---------------------------------------------------------------------- comparison records


@dataclass(frozen=True)
class Checker:
    """The result of checking one value, under one tolerance resolver and mode policy.

    Each check notes in ``usage`` which tolerance entries named the value; a value the
    golden does not hold (``old`` is ``None``) is new or missing (:func:`unrecorded`,
    with ``never_recorded``).
    """

    resolver: Resolver
    policy: ModePolicy
    usage: ToleranceUsage
    never_recorded: Callable[[], str]
    magnitude: Callable[[str], float | None] = lambda name: None  # see recorded_magnitude

    def metric(self, name: str, step: int, old: Any, node: Any) -> Comparison:
        """Metric node ``node`` at ``step`` against the recorded node ``old``."""
        self.usage.note(self.resolver, name)
        if old is None:
            actual = metric_codec.scalar(node)
            return unrecorded(name, self.policy, self.never_recorded, step=step, actual=actual)
        return metric_comparison(
            name, step, old, node, self.resolver, self.policy, magnitude=self.magnitude(name)
        )

    def tensor(
        self,
        label: str,
        old: Any,
        value: Any,
        *,
        mask: Any,
        step: int,
        rank: int | None,
        micro: int | None,
    ) -> Comparison:
        """Tensor ``label`` (``name/tensor``) against the recorded tensor ``old``."""
        self.usage.note(self.resolver, label)
        where = {"step": step, "rank": rank, "micro": micro}
        if old is None:
            return unrecorded(label, self.policy, self.never_recorded, kind="tensor", **where)
        return tensor_comparison(label, old, value, self.resolver, self.policy, mask=mask, **where)


def recorded_magnitude(steps: Mapping[str, Mapping[str, Any]], name: str) -> float | None:
    """The largest finite magnitude metric ``name`` has over the recorded ``steps``
    (``{step: {name: node}}``): what ``scale="recorded"`` stands for. ``None`` if never
    recorded."""
    nodes = [names[name] for names in steps.values() if name in names]
    if not nodes:
        return None
    out = 0.0
    for node in nodes:
        if isinstance(node, dict):
            out = max(out, finite_magnitude(metric_codec.decode(node, where=f"metric {name!r}")))
        else:
            value = abs(float(metric_codec.scalar(node)))
            out = max(out, value if math.isfinite(value) else 0.0)
    return out


def metric_comparison(
    name: str,
    step: int,
    old: Any,
    node: Any,
    resolver: Resolver,
    policy: ModePolicy,
    *,
    magnitude: float | None = None,
) -> Comparison:
    """The comparison of a recorded metric node with this run's; ``magnitude``: the
    metric's largest recorded magnitude over all steps (else this step's)."""
    where = f"metric {name!r} at step {step}"
    expected, actual = (metric_codec.decode(n, where=where) for n in (old, node))
    diff, tol, source = compare_named(
        name, expected, actual, resolver, check_dtype=False, magnitude=magnitude
    )
    return Comparison(
        name,
        step,
        policy.verdict(ok=diff.ok, ignore=tol.ignore),
        expected=metric_codec.scalar(old) if expected.dim() == 0 else summary(expected),
        actual=metric_codec.scalar(node) if actual.dim() == 0 else summary(actual),
        abs_diff=diff.abs_diff,
        rel_diff=diff.rel_diff,
        tolerance=tol,
        tolerance_source=source,
        detail=difference_detail(diff) if diff.ok is False else "",
        excess=diff.excess if diff.compared else None,
        scale=diff.scale if tol.scale and diff.compared else None,
    )


def tensor_comparison(
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
        expected=summary(old),
        actual=summary(value),
        abs_diff=diff.abs_diff,
        rel_diff=diff.rel_diff,
        tolerance=tol,
        tolerance_source=source,
        detail=difference_detail(diff),
        excess=diff.excess if diff.compared else None,
        scale=diff.scale if tol.scale and diff.compared else None,
    )


def dropped_tensors(
    name: str,
    dropped: Iterable[str],
    *,
    step: int,
    rank: int | None,
    micro: int | None,
    detail: str = f"recorded but not passed to check_tensors in this run; {DROPPED}",
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
            detail=detail,
        )
        for tensor_name in sorted(dropped)
    ]


def extra_optimizer_entry(
    label: str, recorded: Iterable[str], *, step: int, rank: int | None, micro: int | None
) -> Comparison:
    """The failure of optimizer state entry ``label`` (``optimizer/<parameter>/<entry>``)
    that the recorded state does not hold; ``recorded``: the recorded tensors' names
    (``<parameter>/<entry>``)."""
    parameter = label.split("/", 1)[1].rsplit("/", 1)[0]
    entries = [t.rsplit("/", 1)[1] for t in recorded if t.rsplit("/", 1)[0] == parameter]
    return Comparison(
        label,
        step,
        Verdict.FAIL,
        kind="tensor",
        rank=rank,
        micro=micro,
        detail=optimizer_entry_extra(entries),
    )


def unchecked_metrics(
    recorded: Mapping[str, Mapping[str, Any]],
    checked: Mapping[str, Mapping[str, Any]],
    results: Iterable[Comparison],
    is_ignored: Callable[[str], bool],
) -> list[Comparison]:
    """A missing comparison per recorded metric this run did not check (or ignore):
    ``checked`` by step, or given an ignored verdict among ``results``."""
    ignored = {(str(c.step), c.name) for c in results if c.verdict == Verdict.IGNORED}
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


def unchecked_tensors(
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


def unrecorded(
    name: str, policy: ModePolicy, never_recorded: Callable[[], str], *, step: int, **fields: Any
) -> Comparison:
    """A value the golden does not hold: new (recorded when the test ends), or missing
    (``never_recorded()`` says what the golden holds instead, and the remedy)."""
    verdict = policy.unrecorded
    detail = never_recorded() if verdict == Verdict.MISSING else ""
    return Comparison(name, step, verdict, detail=detail, **fields)


def not_compared(names: Iterable[str], step: int, *, kind: str, why: str) -> list[Comparison]:
    """Checks at a step whose rollout was generated and not recorded (``why``): nothing
    to compare."""
    return [
        Comparison(name, step, Verdict.IGNORED, kind=kind, tolerance_source=why) for name in names
    ]


def trend_comparison(check: TrendCheck, envelope: Envelope | None = None) -> Comparison:
    """The verdict on one bound over a metric's series (:mod:`.trends`), at its last step:
    passed or failed, or not compared where the bound is off or the statistic undefined.
    Replaying against an ``envelope``, a bound the calibration runs of correct code come near
    is raised to a margin over theirs (:meth:`.Envelope.raised_trend_bound`; they drift from the
    recorded rollouts as a defect would), the source saying so."""
    name, bound = f"{check.metric} {check.statistic}", check.bound
    step = check.steps[-1] if check.steps else 0
    trend, recorded = check.trend, check.recorded
    if trend is None:
        why = f"{bound.source}: bound switched off"
        return Comparison(
            f"{name}<=inf", step, Verdict.IGNORED, kind=TREND_KIND, tolerance_source=why
        )
    if trend.value is None:
        return Comparison(name, step, Verdict.IGNORED, kind=TREND_KIND, tolerance_source=trend.why)
    if envelope is not None:
        bound = _raised(check, envelope)
    passed = bound.holds(trend.value)
    text = trend_beyond(check.metric, trend, bound.value, bound.source, recorded)
    return Comparison(
        name,
        step,
        Verdict.PASS if passed else Verdict.FAIL,
        kind=TREND_KIND,
        expected=None if recorded is None else recorded.value,
        actual=trend.value,
        tolerance_source=bound.source,
        detail="" if passed else text,
        excess=_excess(trend.value, bound.value),
        bound=bound.value,
    )


def _raised(check: TrendCheck, envelope: Envelope) -> Bound:
    """``check``'s bound as replay against ``envelope`` holds it: raised over what the
    calibration runs reached where they come near it, the source saying so."""
    bound = check.bound
    raised = envelope.raised_trend_bound(check.metric, check.statistic, bound.value)
    if raised is None:
        return bound
    reached = envelope.reached(check.metric, check.statistic)
    why = (
        f"{bound.source}; raised from {bound.value:g} to {raised:g} on replay: "
        f"{TREND_MARGIN:g} x the {check.statistic} correct code's calibration runs reach "
        f"against the recorded rollouts ({reached:.3g}, {envelope.source})"
    )
    return dataclasses.replace(bound, value=raised, source=why)


def bias_comparison(bias: Bias, steps: Sequence[int], source: str) -> Comparison:
    """The verdict on one metric's mean deviation over a replay's ``steps`` (:mod:`.envelope`),
    at its last step."""
    text = "" if bias.holds else bias_beyond(bias.name, bias.mean, steps, bias.bound, source)
    return Comparison(
        f"{bias.name} bias",
        steps[-1] if steps else 0,
        Verdict.PASS if bias.holds else Verdict.FAIL,
        kind=BIAS_KIND,
        expected=0.0,
        actual=bias.mean,
        tolerance_source=source,
        detail=text,
        excess=_excess(abs(bias.mean), bias.bound),
        bound=bias.bound,
    )


def _excess(value: float, bound: float) -> float | None:
    """How many times its bound a statistic is (NaN: inf); none for a bound <= 0."""
    if math.isnan(value):
        return math.inf
    return value / bound if bound > 0 else None


# ---------------------------------------------------------------------- what a check writes


def staged_tensors(
    recorded: Mapping[str, Any],
    tensors: Mapping[str, Any],
    results: Iterable[Comparison],
    policy: ModePolicy,
) -> dict[str, Any] | None:
    """The tensors file a ``check_tensors`` call stages, or ``None`` when the golden's stays.

    A new file is written when the policy re-records or a tensor is new; it holds the
    recorded value of each tensor the golden has (unless re-recording), else this run's.
    """
    if not policy.rerecords and not any(c.verdict == Verdict.NEW for c in results):
        return None
    return {
        t: recorded[t] if t in recorded and not policy.rerecords else value
        for t, value in tensors.items()
    }


def looser(tol: Tolerance, than: Tolerance) -> bool:
    """Whether ``tol`` allows a difference somewhere that ``than`` does not."""
    if than.ignore or tol.exact:
        return False
    if tol.ignore or than.exact:
        return True
    return tol.rtol > than.rtol or tol.atol > than.atol or _wider_scale(tol.scale, than.scale)


def _wider_scale(scale: float | str, than: float | str) -> bool:
    """A scale where ``than`` has none, or a larger number (``"recorded"`` and a number do
    not compare)."""
    if not scale:
        return False
    if not than:
        return True
    return not isinstance(scale, str) and not isinstance(than, str) and scale > than


def warn_nan(test_id: str, name: str, step: int, node: Any) -> None:
    """Warn when recording a metric that is or holds NaN (replay would fail on it)."""
    value = metric_codec.scalar(node)
    if value is None:
        from .metric_codec import decode

        has_nan = bool(decode(node, where=name).isnan().any())
    else:
        has_nan = isinstance(value, float) and math.isnan(value)
    if has_nan:
        warn_user(
            GoldenNaNWarning(
                f"{test_id}: metric {name!r} at step {step} is NaN and is recorded as NaN; "
                "replay fails on NaN unless its tolerance sets equal_nan (e.g. "
                f"`tolerances={{{name!r}: {{'equal_nan': True}}}}`): fix the NaN, or allow it"
            )
        )


def summary(value: Any) -> dict[str, Any]:
    """A tensor's shape and dtype for reports; a 0-d tensor's value too (a step count)."""
    out = {"shape": list(getattr(value, "shape", ())), "dtype": dtype_name(value)}
    if not out["shape"] and hasattr(value, "item"):
        out["value"] = json_number(value.item())
    return out


def to_device(batch: Any, device: Any) -> Any:
    """``batch`` with its tensors on ``device``: containers rebuilt, anything with a ``to``
    method (a tensor, TensorDict, DataProto) moved by it, other values as they are."""
    if isinstance(batch, Mapping):
        moved = {k: to_device(v, device) for k, v in batch.items()}
        return type(batch)(moved) if isinstance(batch, dict) else moved
    if isinstance(batch, (list, tuple)) and not hasattr(batch, "_fields"):
        return type(batch)(to_device(v, device) for v in batch)
    move = getattr(batch, "to", None)
    return move(device) if callable(move) else batch


# Fields the trainer computes from the engine's output; recorded in a rollout, they are
# replayed, so the code that computes them is never tested.
DERIVED_FIELDS = ("advantages", "returns", "kl", "kl_penalty", "token_level_rewards")


def derived_fields(batch: Any) -> list[str]:
    """The top-level fields of a rollout batch named like :data:`DERIVED_FIELDS`: a dict's
    keys, a TensorDict's, a DataProto-like batch's ``batch`` and ``non_tensor_batch``."""
    names: list[str] = []
    for part in (batch, getattr(batch, "batch", None), getattr(batch, "non_tensor_batch", None)):
        keys = getattr(part, "keys", None)
        if callable(keys) and not isinstance(part, type):
            names += [k for k in keys() if isinstance(k, str)]
    return sorted({n for n in names if n.lower() in DERIVED_FIELDS})
