"""Per-metric tolerances and the one resolver that picks them.

Resolution order, first match wins: ``golden.check(tolerances=)`` >
``@pytest.mark.golden(tolerances=)`` > the layout lane (variants of
``parallel.variants()`` replaying their reference: calibrated across layouts if
measured, else the shipped lane) > calibrated (``tolerances.json`` in the golden) >
``--golden-tolerance`` > ini ``golden_tolerances`` > built-in RL defaults >
torch.testing's per-dtype defaults. Within a layer a metric name matches an exact
entry first, then a glob pattern (``rollout_corr/*``), then its last path component
(``pg_loss`` matches ``actor/pg_loss``). An entry may say "not compared"
(:data:`IGNORE`) instead of giving a tolerance; such an exclusion wins over the
tolerances of every layer.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Iterable, Mapping
from typing import Any


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """``|actual - expected| <= atol + rtol * |expected|``, element-wise.

    NaN against a finite value always fails; NaN against NaN passes only with
    ``equal_nan``. ``exact`` demands bit equality and ignores the rest.
    ``ignore`` excludes the value from comparison on purpose ("not compared").
    """

    rtol: float = 0.0
    atol: float = 0.0
    equal_nan: bool = False
    exact: bool = False
    ignore: bool = False

    def __post_init__(self) -> None:
        for field in ("rtol", "atol"):
            value = getattr(self, field)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value >= 0:
                raise ValueError(f"tolerance {field} must be a number >= 0, got {value!r}")

    def describe(self) -> str:
        if self.ignore:
            return "not compared"
        if self.exact:
            return "bit-exact"
        nan = ", equal_nan" if self.equal_nan else ""
        return f"rtol={self.rtol:.3g}, atol={self.atol:.3g}{nan}"

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
                    "use rtol, atol, equal_nan, exact, ignore"
                )
            return cls(**value)
        raise TypeError(f"{what}: expected a Tolerance or a dict, got {type(value).__name__}")


EXACT = Tolerance(exact=True)
IGNORE = Tolerance(ignore=True)

# Where each source of tolerances sits in the resolution order (lower wins).
# LAYOUT is the cross-layout lane of parallel.variants(): a variant replaying the reference
# layout's golden differs by reduction order across ranks, more than same-layout noise.
# CALIBRATED_LAYOUT is that lane measured on the user's own model by --golden-calibrate.
CHECK, MARKER, CALIBRATED_LAYOUT, LAYOUT, CALIBRATED = 0, 10, 12, 15, 20
CLI, INI, BUILTIN_ORDER = 30, 40, 50

# Tight defaults for replay on the same platform under deterministic settings,
# where results are usually bit-identical: rtol 1e-5 leaves ~100 float32 ulps for
# benign differences (another BLAS build, a different thread count) and still
# fails a relative drift of 1e-4. atol only keeps values that should be zero from
# failing on rounding noise. README.md explains each and how to widen them.
_LOSS = Tolerance(rtol=1e-5, atol=1e-8)
_KL = Tolerance(rtol=1e-5, atol=1e-9)
_FRACTION = Tolerance(rtol=0.0, atol=1e-7)
_PER_TOKEN = Tolerance(rtol=1e-5, atol=1e-6)
BUILTIN: dict[str, Tolerance] = {
    **dict.fromkeys(
        [
            "pg_loss",
            "policy_loss",
            "actor_loss",
            "loss",
            "total_loss",
            "value_loss",
            "vf_loss",
            "critic_loss",
            "entropy",
            "entropy_loss",
            "grad_norm",
        ],
        _LOSS,
    ),
    **dict.fromkeys(["kl", "ppo_kl", "kl_loss", "approx_kl", "k3_kl"], _KL),
    **dict.fromkeys(
        ["pg_clipfrac", "pg_clipfrac_lower", "clipfrac", "vf_clipfrac", "clip_ratio"], _FRACTION
    ),
    **dict.fromkeys(
        [
            "log_probs",
            "old_log_probs",
            "ref_log_prob",
            "rollout_log_probs",
            "entropys",
            "advantages",
            "returns",
            "values",
        ],
        _PER_TOKEN,
    ),
    "rollout_is*": _LOSS,
    "rollout_rs*": _FRACTION,
}

# torch.testing.assert_close defaults (rtol, atol) by dtype; integers and bool are exact.
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
_EXACT_VALUES = Tolerance()


def dtype_default(dtypes: Iterable[str]) -> tuple[Tolerance, str]:
    """The loosest torch.testing default among ``dtypes`` (``float64`` for Python floats)."""
    best, label = _EXACT_VALUES, "exact for integers"
    for name in dtypes:
        tol = DTYPE_DEFAULTS.get(name)
        if tol is not None and (tol.rtol, tol.atol) > (best.rtol, best.atol):
            best, label = tol, f"torch.testing default for {name}"
    return best, label


def parse_spec(text: str) -> tuple[str, Tolerance]:
    """Parse ``"grad_norm:rtol=3e-2,atol=1e-4"`` (also ``equal_nan=true``, ``exact=true``).

    ``"pg_clipfrac:ignore"`` excludes the metric from comparison.
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
        elif key in ("equal_nan", "exact", "ignore"):
            if value.lower() not in ("true", "false", "1", "0"):
                raise ValueError(f"bad tolerance {text!r}: {key} must be true or false")
            fields[key] = value.lower() in ("true", "1")
        else:
            raise ValueError(
                f"bad tolerance {text!r}: unknown key {key!r} "
                "(rtol, atol, equal_nan, exact, ignore)"
            )
    try:
        return name.strip(), Tolerance(**fields)
    except ValueError as exc:
        raise ValueError(f"bad tolerance {text!r}: {exc}") from None


class Layer:
    """One source of tolerances; remembers which of its entries matched a metric.

    ``order`` places the layer in the resolution order (:data:`CHECK` ...
    :data:`BUILTIN_ORDER`); layers of equal order keep the order they were given in.
    """

    def __init__(
        self,
        source: str,
        entries: Mapping[str, Tolerance | Mapping[str, Any]],
        *,
        order: int = CHECK,
    ):
        self.source = source
        self.order = order
        self.entries = {k: Tolerance.coerce(v, what=f"{source} {k!r}") for k, v in entries.items()}
        self.used: set[str] = set()
        self._globs = [k for k in self.entries if any(c in k for c in "*?[")]

    def match(self, name: str) -> Tolerance | None:
        key = name if name in self.entries else None
        if key is None:
            key = next((g for g in self._globs if fnmatch.fnmatchcase(name, g)), None)
        if key is None:
            base = name.rsplit("/", 1)[-1]
            key = base if base != name and base in self.entries else None
        if key is None:
            return None
        self.used.add(key)
        return self.entries[key]

    def unused(self) -> list[str]:
        return [k for k in self.entries if k not in self.used]


class Resolver:
    """Picks the tolerance of a metric from ordered layers, then dtype defaults."""

    def __init__(self, layers: Iterable[Layer], *, exact: bool = False):
        kept = [layer for layer in layers if layer.entries]
        self.layers = sorted(kept, key=lambda layer: layer.order)  # stable: ties keep their order
        self.exact = exact

    def with_layer(self, layer: Layer) -> Resolver:
        """A resolver that also consults ``layer``, at its place in the order.

        A layer of the default order (:data:`CHECK`) comes before every other.
        """
        return Resolver([layer, *self.layers], exact=self.exact)

    def resolve(self, name: str, dtypes: Iterable[str] = ("float64",)) -> tuple[Tolerance, str]:
        """``(tolerance, where it came from)`` for metric ``name`` of the given dtypes.

        Every layer is consulted, so that an entry shadowed by a higher layer or by
        the exact lane still counts as matched (it must not be reported as unused).
        A "not compared" entry from any layer wins over every tolerance and over
        the exact lane: it is a decision about the metric, not a width.
        """
        found = ignored = None
        for layer in self.layers:
            tol = layer.match(name)
            if tol is not None and found is None:
                found = tol, layer.source
            if tol is not None and tol.ignore and ignored is None:
                ignored = tol, layer.source
        if ignored is not None:  # an exclusion, wherever it is given, beats every tolerance
            return ignored
        if self.exact:
            return EXACT, "exact lane"
        return found or dtype_default(dtypes)


def builtin_layer() -> Layer:
    return Layer("built-in default", BUILTIN, order=BUILTIN_ORDER)
