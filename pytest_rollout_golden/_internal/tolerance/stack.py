"""Per-metric tolerances: where they come from, and the one resolver that picks them.

:class:`Stack` holds every source of tolerances of one test, and :meth:`Stack.resolver`
is the one place that puts them in order, :data:`ORDER` (top wins), under one
``golden.check(tolerances=)`` (:meth:`Resolver.above`) and over the training-value default
(:func:`fallback`). docs/guide/tolerances.md prints that order from :data:`ORDER`.

Tolerances given explicitly (in the call, the marker, on the command line) come before
those read from files, so a committed ``tolerances.json`` can be overridden for a run.
A variant replaying another's golden (``same_math()``, ``parallel.variants()``) also
resolves ``across_variants`` just under the marker: the metrics its profile averages per
micro-batch, not comparable across variants.

Within a layer a metric name matches an exact entry first, then a glob pattern
(``rollout_corr/*``), then its last path component (``pg_loss`` matches
``actor/pg_loss``); a layer answers with that one entry.

How the fields of matching entries combine:

- An entry may say "not compared" (``ignore=True``, :data:`IGNORE`) instead of giving
  a tolerance; such an exclusion, from any layer, wins over everything.
  A layer of defaults (the built-in one, a profile, a variant's not-comparable names)
  excludes only as the highest matching layer: a tolerance given above it wins.
- Otherwise ``rtol``, ``atol``, ``scale`` and ``equal_nan`` are each taken from the
  highest matching entry that names them, going down until ``rtol`` and ``atol`` are
  both known: an entry naming only ``rtol`` takes ``atol`` from the next layer down (as
  torch.testing refuses a lone ``rtol`` or ``atol``), one naming only ``equal_nan``
  takes both numbers from below. Below the last layer, the training-value default fills
  in (:func:`fallback`); ``equal_nan`` and ``scale`` named nowhere on the way are off.
- ``exact=True`` names every field (``rtol=atol=0``, no NaN equality): as the highest
  match it means bit equality; below an entry that named some fields it only fills
  the others with 0.
- The exact lane (``Stack.exact``) replaces every tolerance by bit equality.
- Certification (``Stack.certify``, ``--golden-certify``) replaces every tolerance of a
  floating value by the float64 oracle bound (:data:`.families.CERTIFY`); integers and
  bools stay exact, exclusions still win.

Resolving is pure; :class:`ToleranceUsage` notes which entries named a checked metric
(the "unused tolerance" warnings).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .spec import EXACT, EXACT_VALUES, FIELDS, IGNORE, RECORDED, Layer, Tolerance, dtype_default

# The layers of a Stack, top wins: (its field, or "builtin"; where its tolerances come from).
# Stack.resolver stacks them in this order; the docs print it from here.
ORDER: tuple[tuple[str, str], ...] = (
    ("marker", "`@pytest.mark.golden(ignore=, tolerances=)`"),
    (
        "across_variants",
        "a variant only (`same_math()`, `parallel.variants()`): the metrics its metric profile "
        "averages per micro-batch, not comparable across variants",
    ),
    (
        "drifting",
        "a variant only: the values the calibrated variants drift away from by more than the "
        "value itself (`envelope.json`), not comparable across variants",
    ),
    ("cli", "`--golden-ignore`, `--golden-tolerance NAME:rtol=...` (repeatable)"),
    (
        "lane_fallback",
        "ini `golden_lane_fallback_tolerances`, where the run's lane was never recorded and "
        "it compares against the `golden_lane_fallback` lane",
    ),
    (
        "envelope",
        "this step's band in the `envelope.json` of the lane compared against (a long run's)",
    ),
    (
        "calibrated_layout",
        "a variant only: the calibrated variant lane in the `tolerances.json` of that lane",
    ),
    (
        "layout",
        "a variant only: the variant lane it was declared with (`same_math(tolerances=)`, the "
        "shipped layout lane of `parallel.variants()`)",
    ),
    (
        "calibrated",
        "the `tolerances.json` of the lane compared against (the base lane's beside the inputs, "
        "another lane's in `@lanes/<lane>/`), written by `--golden-calibrate N`",
    ),
    ("ini", "ini `golden_ignore`, `golden_tolerances`"),
    ("precision", "marker `precision=`, ini `golden_precision` (`bf16`)"),
    ("profile", "ini `golden_metric_profile` (`verl`, `openrlhf`, `trl`, `slime`, `megatron`)"),
    ("builtin", "the built-in RL defaults (families of known names; timing never compared)"),
)
VARIANT_ONLY = ("across_variants", "drifting")  # layers a test that is no variant leaves out


@dataclasses.dataclass(frozen=True)
class Stack:
    """The tolerance layers of one test by role; :meth:`resolver` stacks them in order."""

    marker: Sequence[Layer] = ()
    calibrated_layout: Layer | None = None
    layout: Layer | None = None
    lane_fallback: Layer | None = None
    envelope: Layer | None = None
    calibrated: Layer | None = None
    cli: Sequence[Layer] = ()
    ini: Sequence[Layer] = ()
    precision: Layer | None = None
    profile: Sequence[Layer] = ()
    across_variants: Layer | None = None
    drifting: Layer | None = None  # across variants: values the variants drift away from
    variant: bool = False
    exact: bool = False
    certify: bool = False

    def layers(self) -> list[tuple[str, Layer]]:
        """``(role, layer)`` of every layer given, in :data:`ORDER` (top first); each
        layer's :attr:`~.spec.Layer.source` says where its tolerances come from."""
        layers: list[tuple[str, Layer]] = []
        for name, _ in ORDER:
            if name in VARIANT_ONLY and not self.variant:
                continue
            part = builtin_layers() if name == "builtin" else getattr(self, name)
            parts = part if isinstance(part, (list, tuple)) else [part]
            layers.extend((name, layer) for layer in parts if layer is not None)
        return layers

    def resolver(self) -> Resolver:
        """The resolver of these layers, in :data:`ORDER`."""
        layers = [layer for _, layer in self.layers()]
        return Resolver(layers, exact=self.exact, certify=self.certify)

    def replace(self, **parts: Any) -> Stack:
        """A copy with some parts replaced (``calibrated=``, ``exact=``...)."""
        return dataclasses.replace(self, **parts)


def fallback(dtypes: Iterable[str]) -> tuple[Tolerance, str]:
    """The tolerance of a value no layer names: exact for integers; for floats the
    training-value default (families.TRAINING), whatever type carries the value, or
    torch.testing's default of a 16- or 8-bit float where that is looser."""
    from .families import TRAINING

    default, label = dtype_default(dtypes)
    if default == EXACT_VALUES:
        return default, label
    if default.rtol > TRAINING.rtol:
        return Tolerance(rtol=default.rtol, atol=default.atol, scale=RECORDED), label
    return TRAINING, "built-in default for training values"


class Resolver:
    """Picks the tolerance of a metric from layers (first given first), then dtype defaults.

    Built by :meth:`Stack.resolver`, which decides the order. Pure: see
    :class:`ToleranceUsage` for noting which entries were used.
    """

    def __init__(self, layers: Iterable[Layer], *, exact: bool = False, certify: bool = False):
        self.layers = [layer for layer in layers if layer.entries]
        self.exact = exact
        self.certify = certify

    def above(self, layer: Layer) -> Resolver:
        """This resolver with ``layer`` over every other (one ``golden.check(tolerances=)``)."""
        return Resolver([layer, *self.layers], exact=self.exact, certify=self.certify)

    def without(self, *layers: Layer | None) -> Resolver:
        """This resolver without ``layers`` (what applies where they are missing)."""
        kept = [layer for layer in self.layers if layer not in layers]
        return Resolver(kept, exact=self.exact, certify=self.certify)

    def resolve(self, name: str, dtypes: Iterable[str] = ("float64",)) -> tuple[Tolerance, str]:
        """``(tolerance, where it came from)`` for metric ``name`` of the given dtypes.

        When the fields came from different layers, the source names each:
        ``"rtol from @pytest.mark.golden(tolerances=); atol from built-in default"``.
        """
        matches = [(layer.match(name), layer) for layer in self.layers]
        matches = [(tol, layer) for tol, layer in matches if tol is not None]
        found = [(tol, layer.source) for tol, layer in matches]
        # a user's exclusion, wherever it is given, beats every tolerance; one of defaults
        # only where it is the highest match
        ignored = next(
            (
                (tol, layer.source)
                for i, (tol, layer) in enumerate(matches)
                if tol.ignore and (not layer.defaults or i == 0)
            ),
            None,
        )
        if ignored is not None:
            return ignored
        found = [(tol, source) for tol, source in found if not tol.ignore]
        if self.exact:
            return EXACT, "exact lane"
        if self.certify:
            from .families import CERTIFY, CERTIFY_SOURCE

            default, label = dtype_default(dtypes)
            return (default, label) if default == EXACT_VALUES else (CERTIFY, CERTIFY_SOURCE)
        taken: dict[str, tuple[Any, str]] = {}
        for tol, source in found:
            if tol.exact and not taken:
                return tol, source
            for field in tol.given:
                taken.setdefault(field, (getattr(tol, field), source))
            if "rtol" in taken and "atol" in taken:
                break
        else:
            default, label = fallback(dtypes)
            if not taken:
                return default, label
            for field in ("rtol", "atol", "scale"):
                taken.setdefault(field, (getattr(default, field), label))
        values = {field: value for field, (value, _) in taken.items()}
        return Tolerance(**values), _source(taken)


def _source(taken: Mapping[str, tuple[Any, str]]) -> str:
    """One layer's name, or which field came from which layer when they differ."""
    fields: dict[str, list[str]] = {}
    for field in FIELDS:
        value, source = taken.get(field, (False, ""))
        if field in ("rtol", "atol") or value:  # a field off is not shown, so not attributed
            fields.setdefault(source, []).append(field)
    if len(fields) == 1:
        return next(iter(fields))
    return "; ".join(f"{_and(names)} from {source}" for source, names in fields.items())


def _and(names: Sequence[str]) -> str:
    """``"rtol"``, ``"rtol and atol"``, ``"rtol, atol and scale"``."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


class ToleranceUsage:
    """Which entries of which layers named a metric or tensor that was checked.

    Resolving is pure: code that checks a name notes it here, with every layer entry
    it matches (an entry shadowed by a higher layer or by the exact lane still counts).
    Entries are kept per layer object, and by label (``"--golden-tolerance 'kl'"``),
    the form in which pytest-xdist workers hand them to the controller.
    """

    def __init__(self) -> None:
        self._keys: dict[Layer, set[str]] = {}
        self._labels: set[str] = set()
        self._names: set[str] = set()

    def note(self, resolver: Resolver, name: str) -> None:
        self._names.add(name)
        for layer in resolver.layers:
            key = layer.key(name)
            if key is not None:
                self._keys.setdefault(layer, set()).add(key)
                self._labels.add(_label(layer, key))

    def unused(self, layer: Layer) -> list[str]:
        """Entries of this layer object that named nothing checked."""
        used = self._keys.get(layer, set())
        return [k for k in layer.entries if k not in used]

    def unused_entries(self, layers: Iterable[Layer]) -> list[tuple[str, str]]:
        """``(label, entry)`` of the entries of ``layers`` that no process noted
        (session-wide layers)."""
        return [
            (_label(layer, k), k)
            for layer in layers
            for k in layer.entries
            if _label(layer, k) not in self._labels
        ]

    def labels(self) -> list[str]:
        return sorted(self._labels)

    def names(self) -> list[str]:
        """Every metric and tensor name checked (what an unmatched entry may have meant)."""
        return sorted(self._names)

    def merge(self, labels: Iterable[str], names: Iterable[str] = ()) -> None:
        """Add the labels and names another process noted (:meth:`labels`, :meth:`names`)."""
        self._labels.update(labels)
        self._names.update(names)


def _label(layer: Layer, key: str) -> str:
    return f"{layer.source} {key!r}"


_BUILTIN: list[Layer] = []


def builtin_layers() -> list[Layer]:
    """The built-in RL defaults: the families of known names (:mod:`.families`), then the
    timing, throughput and memory metrics, never compared unless a layer above names them."""
    if not _BUILTIN:
        from . import families

        _BUILTIN.append(
            Layer("built-in default", families.entries(families.BUILTIN_NAMES), defaults=True)
        )
        machine = dict.fromkeys(families.MACHINE, IGNORE)
        _BUILTIN.append(Layer(families.MACHINE_REASON, machine, defaults=True))
    return list(_BUILTIN)


def builtin_layer() -> Layer:
    """The families of the names the built-in defaults know."""
    return builtin_layers()[0]
