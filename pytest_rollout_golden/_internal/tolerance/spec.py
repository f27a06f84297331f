"""What one tolerance is and how a user writes it: :class:`Tolerance`, the spec grammar,
torch.testing's defaults by dtype, and :class:`Layer`, one source of tolerances by metric
name. The order in which layers resolve is :mod:`.stack`'s."""

from __future__ import annotations

import copy
import dataclasses
import fnmatch
from collections.abc import Collection, Iterable, Mapping
from typing import Any

FIELDS = ("rtol", "atol", "equal_nan", "scale")  # what layers combine; exact, ignore stand alone
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
        given = FIELDS if exact or ignore else [f for f, v in named.items() if v is not None]
        object.__setattr__(self, "_given", frozenset(given))

    @property
    def given(self) -> frozenset[str]:
        """Which of rtol, atol, equal_nan were named (all of them for ``exact``, ``ignore``)."""
        return self._given  # type: ignore[attr-defined]

    def allowance(self, expected: float, magnitude: float | None = None) -> float:
        """The largest ``|actual - expected|`` this tolerance allows one number
        (``magnitude``: what ``scale="recorded"`` stands for)."""
        scale = (magnitude or 0.0) if self.scale == RECORDED else float(self.scale or 0.0)
        return self.atol + self.rtol * max(abs(expected), scale)

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
EXACT_VALUES = Tolerance(rtol=0.0, atol=0.0)


def dtype_default(dtypes: Iterable[str]) -> tuple[Tolerance, str]:
    """The loosest torch.testing default among ``dtypes`` (``float64`` for Python floats)."""
    best, label = EXACT_VALUES, "exact for integers"
    for name in dtypes:
        tol = DTYPE_DEFAULTS.get(name)
        if tol is not None and (tol.rtol, tol.atol) > (best.rtol, best.atol):
            owner = "built-in default" if name.startswith("float8") else "torch.testing default"
            best, label = tol, f"{owner} for {name}"
    return best, label


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


def is_glob(key: str) -> bool:
    """Whether an entry's name is a glob pattern (``actor/*``)."""
    return any(c in key for c in "*?[")


def entry_key(
    name: str, entries: Collection[str], globs: Iterable[str] | None = None
) -> str | None:
    """The entry of ``entries`` that metric ``name`` matches, if any: exact, then a glob
    pattern (``globs``: those of ``entries``, if known), then its last path component
    (``pg_loss`` matches ``actor/pg_loss``)."""
    if name in entries:
        return name
    patterns = (k for k in entries if is_glob(k)) if globs is None else globs
    glob = next((g for g in patterns if fnmatch.fnmatchcase(name, g)), None)
    if glob is not None:
        return glob
    base = name.rsplit("/", 1)[-1]
    return base if base != name and base in entries else None


def named_file(source: str, filename: str, name: str) -> str:
    """Tolerance ``source``, naming its file ``filename`` as ``name`` (``(tolerances.json)``
    becomes ``(@lanes/<lane>/tolerances.json)``)."""
    return source.replace(f"({filename}", f"({name}")


class Layer:
    """One source of tolerances: a name (shown in messages) and its entries by metric name.

    A layer of ``defaults`` excludes a name only where no higher layer names it; a layer of
    ``exact_names`` matches a metric by its whole name only (no glob, no last component).
    """

    def __init__(
        self,
        source: str,
        entries: Mapping[str, Tolerance | Mapping[str, Any]],
        *,
        defaults: bool = False,
        exact_names: bool = False,
    ):
        self.source = source
        self.defaults = defaults
        self.exact_names = exact_names
        self.entries = {k: Tolerance.coerce(v, what=f"{source} {k!r}") for k, v in entries.items()}
        self._globs = [k for k in self.entries if is_glob(k)]
        self._without: frozenset[str] = frozenset()

    def excluding(self, names: Iterable[str]) -> Layer:
        """This layer, silent for the metrics ``names`` (another layer decides them)."""
        out = copy.copy(self)
        out._without = self._without | frozenset(names)
        return out

    def read_from(self, filename: str, name: str) -> Layer:
        """This layer, its source naming the file it was read from as ``name`` (a lane's own
        ``@lanes/<lane>/tolerances.json``) where it says ``filename``."""
        out = copy.copy(self)
        out.source = named_file(self.source, filename, name)
        return out

    def key(self, name: str) -> str | None:
        """The entry ``name`` matches, if any (see :func:`entry_key`); a layer of
        ``exact_names`` only by the whole name."""
        if name in self._without:
            return None
        if self.exact_names:
            return name if name in self.entries else None
        return entry_key(name, self.entries, self._globs)

    def match(self, name: str) -> Tolerance | None:
        key = self.key(name)
        return None if key is None else self.entries[key]


def ignore_and_tolerance_layers(
    source: str,
    tolerances: Iterable[str] | Mapping[str, Any] | None,
    ignore_source: str,
    ignored: str | Iterable[str] | None,
) -> tuple[Layer, Layer]:
    """The two layers one source of a :class:`.stack.Stack` makes of what a user wrote: the
    names it excludes from comparison (``ignored``, shown as ``ignore_source``), then its
    tolerances (``source``: ``METRIC:rtol=R,atol=A`` specs, or a mapping of name ->
    tolerance).

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
