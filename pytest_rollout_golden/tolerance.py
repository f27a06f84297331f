"""Per-metric tolerances: where they come from, and the one resolver that picks them.

:class:`Stack` holds every source of tolerances of one test, and :meth:`Stack.resolver`
is the one place that puts them in order (top wins)::

    golden.check(tolerances=)                     call
    @pytest.mark.golden(ignore=, tolerances=)     marker
    --golden-ignore, --golden-tolerance           cli
    calibrated variant lane (tolerances.json)     calibrated_layout   } variants
    variant lane (same_math(), parallel.variants) layout              } only
    calibrated (tolerances.json)                  calibrated
    ini golden_ignore, golden_tolerances          ini
    ini golden_metric_profile                     profile
    built-in RL defaults (families.py)            (always)
    the training-value default                    (always)

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

Resolving is pure; :class:`ToleranceUsage` notes which entries named a checked metric
(the "unused tolerance" warnings).
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Iterable, Mapping, Sequence
from typing import Any


@dataclasses.dataclass(frozen=True)
class Stack:
    """The tolerance layers of one test by role; :meth:`resolver` stacks them in order."""

    call: Layer | None = None
    marker: Sequence[Layer] = ()
    calibrated_layout: Layer | None = None
    layout: Layer | None = None
    calibrated: Layer | None = None
    cli: Sequence[Layer] = ()
    ini: Sequence[Layer] = ()
    profile: Sequence[Layer] = ()
    across_variants: Layer | None = None
    variant: bool = False
    exact: bool = False

    def resolver(self) -> Resolver:
        """The resolver of these layers, in the order of the module docstring."""
        layers = [
            self.call,
            *self.marker,
            self.across_variants if self.variant else None,
            *self.cli,
            self.calibrated_layout,
            self.layout,
            self.calibrated,
            *self.ini,
            *self.profile,
            *builtin_layers(),
        ]
        return Resolver([layer for layer in layers if layer is not None], exact=self.exact)

    def replace(self, **parts: Any) -> Stack:
        """A copy with some parts replaced (``calibrated=``, ``call=``, ``exact=``...)."""
        return dataclasses.replace(self, **parts)


_FIELDS = ("rtol", "atol", "equal_nan", "scale")  # what layers combine; exact, ignore stand alone
RECORDED = "recorded"  # scale: the magnitude of the recorded values


@dataclasses.dataclass(frozen=True, init=False)
class Tolerance:
    """``|actual - expected| <= atol + rtol * max(|expected|, scale)``, element-wise.

    ``scale`` is the magnitude ``rtol`` is measured against where ``|expected|`` is
    smaller (the size of the terms of a cancelling mean): a number, or ``"recorded"``
    for the largest magnitude of the recorded values (a metric's over its recorded steps,
    a tensor's over its compared elements). Without it ``rtol`` is relative to each value.

    NaN against a finite value always fails; NaN against NaN passes only with
    ``equal_nan``. ``exact`` demands bit equality and ignores the rest.
    ``ignore`` excludes the value from comparison on purpose ("not compared").

    A field left out (``None``) reads as 0 (``False``) here, but in a layer of a
    :class:`Stack` it is taken from the next layer down; :attr:`given` lists the fields
    that were named. Equality compares values only.
    """

    rtol: float = 0.0
    atol: float = 0.0
    equal_nan: bool = False
    exact: bool = False
    ignore: bool = False
    scale: float | str = 0.0

    def __init__(
        self,
        rtol: float | None = None,
        atol: float | None = None,
        equal_nan: bool | None = None,
        exact: bool = False,
        ignore: bool = False,
        scale: float | str | None = None,
    ) -> None:
        named = {"rtol": rtol, "atol": atol, "equal_nan": equal_nan, "scale": scale}
        for field, value in (("rtol", rtol), ("atol", atol), ("scale", scale)):
            if field == "scale" and value == RECORDED:
                continue
            if value is not None and (
                not isinstance(value, (int, float)) or isinstance(value, bool) or not value >= 0
            ):
                extra = ' or "recorded"' if field == "scale" else ""
                raise ValueError(f"tolerance {field} must be a number >= 0{extra}, got {value!r}")
        object.__setattr__(self, "rtol", 0.0 if rtol is None else rtol)
        object.__setattr__(self, "atol", 0.0 if atol is None else atol)
        object.__setattr__(self, "equal_nan", bool(equal_nan))
        object.__setattr__(self, "exact", exact)
        object.__setattr__(self, "ignore", ignore)
        object.__setattr__(self, "scale", 0.0 if scale is None else scale)
        given = _FIELDS if exact or ignore else [f for f, v in named.items() if v is not None]
        object.__setattr__(self, "_given", frozenset(given))

    @property
    def given(self) -> frozenset[str]:
        """Which of rtol, atol, equal_nan were named (all of them for ``exact``, ``ignore``)."""
        return self._given  # type: ignore[attr-defined]

    def describe(self) -> str:
        if self.ignore:
            return "not compared"
        if self.exact:
            return "bit-exact"
        nan = ", equal_nan" if self.equal_nan else ""
        scale = f", scale={self._scale_text()}" if self.scale else ""
        return f"rtol={self.rtol:.3g}, atol={self.atol:.3g}{scale}{nan}"

    def _scale_text(self) -> str:
        return self.scale if isinstance(self.scale, str) else f"{self.scale:.3g}"

    @classmethod
    def coerce(cls, value: Tolerance | Mapping[str, Any], *, what: str = "tolerance") -> Tolerance:
        """A Tolerance from itself or a dict such as ``{"rtol": 1e-5, "atol": 1e-7}``."""
        if isinstance(value, Tolerance):
            return value
        if isinstance(value, Mapping):
            unknown = set(value) - {f.name for f in dataclasses.fields(cls)}
            if unknown:
                raise ValueError(
                    f"{what}: unknown field(s) {sorted(unknown)}; "
                    "use rtol, atol, scale, equal_nan, exact, ignore"
                )
            return cls(**value)
        raise TypeError(f"{what}: expected a Tolerance or a dict, got {type(value).__name__}")


EXACT = Tolerance(exact=True)
IGNORE = Tolerance(ignore=True)

# torch.testing.assert_close defaults (rtol, atol) by dtype; integers and bool are exact.
# torch has none for float8: those rows are this project's own, one step of the mantissa.
DTYPE_DEFAULTS: dict[str, Tolerance] = {
    "float16": Tolerance(rtol=1e-3, atol=1e-5),
    "bfloat16": Tolerance(rtol=1.6e-2, atol=1e-5),
    "float32": Tolerance(rtol=1.3e-6, atol=1e-5),
    "float64": Tolerance(rtol=1e-7, atol=1e-7),
    "complex64": Tolerance(rtol=1.3e-6, atol=1e-5),
    "complex128": Tolerance(rtol=1e-7, atol=1e-7),
    "float8_e4m3fn": Tolerance(rtol=1.25e-1, atol=1e-5),
    "float8_e5m2": Tolerance(rtol=2.5e-1, atol=1e-5),
}
_EXACT_VALUES = Tolerance(rtol=0.0, atol=0.0)


def dtype_default(dtypes: Iterable[str]) -> tuple[Tolerance, str]:
    """The loosest torch.testing default among ``dtypes`` (``float64`` for Python floats)."""
    best, label = _EXACT_VALUES, "exact for integers"
    for name in dtypes:
        tol = DTYPE_DEFAULTS.get(name)
        if tol is not None and (tol.rtol, tol.atol) > (best.rtol, best.atol):
            owner = "built-in default" if name.startswith("float8") else "torch.testing default"
            best, label = tol, f"{owner} for {name}"
    return best, label


def fallback(dtypes: Iterable[str]) -> tuple[Tolerance, str]:
    """The tolerance of a value no layer names: exact for integers; for floats the
    training-value default (families.TRAINING), whatever type carries the value, or
    torch.testing's default of a 16- or 8-bit float where that is looser."""
    from .families import TRAINING

    default, label = dtype_default(dtypes)
    if default == _EXACT_VALUES:
        return default, label
    if default.rtol > TRAINING.rtol:
        return Tolerance(rtol=default.rtol, atol=default.atol, scale=RECORDED), label
    return TRAINING, "built-in default for training values"


def parse_spec(text: str) -> tuple[str, Tolerance]:
    """Parse ``"grad_norm:rtol=3e-2,atol=1e-4"`` (also ``equal_nan=true``, ``exact=true``).

    ``"pg_clipfrac:ignore"`` excludes the metric from comparison; ``scale=recorded`` or
    ``scale=1.0`` sets the magnitude ``rtol`` is measured against.
    """
    name, sep, body = text.strip().rpartition(":")
    if sep and name.strip() and body.strip().lower() == "ignore":
        return name.strip(), IGNORE
    if not sep or not name.strip() or not body.strip():
        raise ValueError(
            f"bad tolerance {text!r}: expected METRIC:rtol=R,atol=A "
            "(e.g. grad_norm:rtol=3e-2,atol=1e-4)"
        )
    fields: dict[str, Any] = {}
    for part in body.split(","):
        key, eq, value = (s.strip() for s in part.partition("="))
        if not eq:
            raise ValueError(f"bad tolerance {text!r}: {part!r} is not KEY=VALUE")
        if key in ("rtol", "atol"):
            try:
                fields[key] = float(value)
            except ValueError:
                raise ValueError(f"bad tolerance {text!r}: {key} must be a number") from None
        elif key == "scale":
            try:
                fields[key] = RECORDED if value.lower() == RECORDED else float(value)
            except ValueError:
                raise ValueError(
                    f"bad tolerance {text!r}: scale must be a number or 'recorded'"
                ) from None
        elif key in ("equal_nan", "exact", "ignore"):
            if value.lower() not in ("true", "false", "1", "0"):
                raise ValueError(f"bad tolerance {text!r}: {key} must be true or false")
            fields[key] = value.lower() in ("true", "1")
        else:
            raise ValueError(
                f"bad tolerance {text!r}: unknown key {key!r} "
                "(rtol, atol, scale, equal_nan, exact, ignore)"
            )
    try:
        return name.strip(), Tolerance(**fields)
    except ValueError as exc:
        raise ValueError(f"bad tolerance {text!r}: {exc}") from None


class Layer:
    """One source of tolerances: a name (shown in messages) and its entries by metric name.

    A layer of ``defaults`` excludes a name only where no higher layer names it.
    """

    def __init__(
        self,
        source: str,
        entries: Mapping[str, Tolerance | Mapping[str, Any]],
        *,
        defaults: bool = False,
    ):
        self.source = source
        self.defaults = defaults
        self.entries = {k: Tolerance.coerce(v, what=f"{source} {k!r}") for k, v in entries.items()}
        self._globs = [k for k in self.entries if any(c in k for c in "*?[")]

    def key(self, name: str) -> str | None:
        """The entry ``name`` matches, if any: exact, then glob, then last path component."""
        if name in self.entries:
            return name
        glob = next((g for g in self._globs if fnmatch.fnmatchcase(name, g)), None)
        if glob is not None:
            return glob
        base = name.rsplit("/", 1)[-1]
        return base if base != name and base in self.entries else None

    def match(self, name: str) -> Tolerance | None:
        key = self.key(name)
        return None if key is None else self.entries[key]


def level(
    source: str,
    tolerances: Iterable[str] | Mapping[str, Any] | None,
    ignore_source: str,
    ignored: str | Iterable[str] | None,
) -> tuple[Layer, Layer]:
    """One level of a :class:`Stack` from what a user wrote: the names it excludes from
    comparison (``ignored``, shown as ``ignore_source``), then its tolerances (``source``:
    ``METRIC:rtol=R,atol=A`` specs, or a mapping of name -> tolerance).

    Raises ValueError naming the source on a bad spec or name, and on a name that is both
    excluded and given a tolerance at this level.
    """
    if tolerances is None or isinstance(tolerances, Mapping):
        try:
            layer = Layer(source, tolerances or {})
        except TypeError as exc:
            raise ValueError(str(exc)) from None
    else:
        entries = {}
        for spec in tolerances:
            if not isinstance(spec, str):
                raise ValueError(
                    f"{source}: takes METRIC:rtol=R,atol=A strings, got {spec!r}; "
                    'or a mapping such as {"pg_loss": {"rtol": 1e-3}}'
                )
            try:
                name, tol = parse_spec(spec)
            except ValueError as exc:
                raise ValueError(f"{source}: {exc}") from None
            entries[name] = tol
        layer = Layer(source, entries)
    names = [ignored] if isinstance(ignored, str) else list(ignored or ())
    for name in names:
        if not isinstance(name, str) or not name:
            raise ValueError(f"{ignore_source}: takes metric or tensor names, got {name!r}")
        if not layer.entries.get(name, IGNORE).ignore:
            raise ValueError(
                f"{name!r} has a tolerance in {source} and is ignored by {ignore_source}; "
                "choose one"
            )
    return Layer(ignore_source, dict.fromkeys(names, IGNORE)), layer


class Resolver:
    """Picks the tolerance of a metric from layers (first given first), then dtype defaults.

    Built by :meth:`Stack.resolver`, which decides the order. Pure: see
    :class:`ToleranceUsage` for noting which entries were used.
    """

    def __init__(self, layers: Iterable[Layer], *, exact: bool = False):
        self.layers = [layer for layer in layers if layer.entries]
        self.exact = exact

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
    for field in _FIELDS:
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
