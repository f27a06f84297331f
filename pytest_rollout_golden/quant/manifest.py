"""The precision manifest: per parameter, the dtype and quantization scheme the trainer and
the rollout engine each use, and the rule (pattern, or tensor evidence) that decided it.

A side is described either by its tensors (a state dict or a module: float8 weights with
``weight_scale_inv`` / ``weight_scale`` companions, packed NVFP4 bytes, bf16...) or by
declared :class:`Rules` (the ``ignored_layers`` / ``modules_to_not_convert`` /
``SKIP_WEIGHT_SUBSTRINGS`` of a quantization config) applied to the trainer's names.

Three audits run on every manifest, recorded or not (:func:`audit`):

* **substring matches**: a pattern matches a name when its dotted components equal a
  contiguous run of the name's components (``mlp.gate`` matches ``model.layers.1.mlp.gate.weight``,
  not ``model.layers.0.mlp.gate_proj.weight``). Rules declared with ``match="substring"`` (how
  verl's and NeMo-RL's filters test ``pattern in name``) are applied as declared, and every
  name they matched that a whole-name match would not is reported (verl#7519: ``mlp.gate``
  kept ``mlp.gate_up_proj`` in bf16 on one side only);
* **sensitive layers**: routers, norms, embeddings and the output head quantized on either
  side fail unless ``declared`` names them (NeMo-RL#3614: a skip list that missed the
  routers' spellings);
* **agreement** (``same=True``): every parameter in the same scheme on both sides.

Torch is never imported here: tensors are read through ``dtype`` and ``shape``.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = [
    "SCHEMES",
    "SENSITIVE",
    "Manifest",
    "Rules",
    "audit",
    "build",
    "changes",
    "detect",
    "substring_only",
    "whole_match",
]

SCHEMES = (
    "fp8-e4m3",  # one float32 scale per tensor
    "fp8-e5m2",
    "fp8-e4m3-block128",  # one float32 scale per 128x128 block (DeepSeek-V3 style)
    "fp8-e4m3-channel",  # one scale per output row
    "mxfp8",  # e4m3 values, one e8m0 (power of two) scale per 32 elements of a row
    "nvfp4",  # e2m1 values packed two per byte, one e4m3 scale per 16, one float32 global
)
"""The quantization schemes :func:`detect` recognises; any other parameter's scheme is its
dtype (``bfloat16``, ``float16``, ``float32``)."""

SENSITIVE: dict[str, tuple[str, ...]] = {
    "router": ("gate", "router", "shared_expert_gate"),
    "norm": ("*norm*", "ln_*", "ln"),
    "embedding": ("embed_tokens", "wte", "wpe", "word_embeddings", "embedding", "embed"),
    "output head": ("lm_head", "output_layer"),
}
"""Module names (one dotted component, glob) of layers that quantization harms most: a
router's top-k is an argmax that quantization error flips; norms, embeddings and the
output head are kept in high precision by every published fp8 recipe."""

_COMPANIONS = ("_scale_inv", "_scale", "_scale_2", "_scale_from_checkpoint", "_global_scale")
_MODULE_COMPANIONS = ("input_scale", "input_global_scale", "k_scale", "v_scale")
_FP8 = {"float8_e4m3fn": "fp8-e4m3", "float8_e4m3fnuz": "fp8-e4m3", "float8_e5m2": "fp8-e5m2"}
_MATCH_MODES = ("whole", "substring", "regex")


@dataclasses.dataclass(frozen=True)
class Rules:
    """A side's declared precision: ``scheme`` for every parameter ``include`` selects (default:
    every weight of two or more dimensions) and ``ignore`` does not, ``default`` for the rest.

    ``match``: how the framework applies the patterns: ``"whole"`` (dotted components,
    ``*`` globs within one component), ``"substring"`` (``pattern in name``, as verl's
    ``should_quantize_param`` and NeMo-RL's ``SKIP_WEIGHT_SUBSTRINGS`` do) or ``"regex"``
    (``re.search``). ``source`` names the config in messages."""

    scheme: str
    ignore: Sequence[str] = ()
    include: Sequence[str] = ()
    default: str = "bfloat16"
    match: str = "whole"
    source: str = "rules"

    def __post_init__(self) -> None:
        if self.match not in _MATCH_MODES:
            raise ValueError(f"Rules(match={self.match!r}): one of {', '.join(_MATCH_MODES)}")
        for field in ("ignore", "include"):
            value = getattr(self, field)
            if isinstance(value, str):
                raise TypeError(f"Rules({field}=) takes a list of patterns, got {value!r}")
            object.__setattr__(self, field, tuple(value))

    def matches(self, pattern: str, name: str) -> bool:
        """Whether the framework's own matching selects ``name`` with ``pattern``."""
        if self.match == "substring":
            return pattern in name
        if self.match == "regex":
            return re.search(pattern, name) is not None
        return whole_match(pattern, name)

    def decide(self, name: str, ndim: int) -> tuple[str, str]:
        """``(scheme, rule)`` of parameter ``name`` with ``ndim`` dimensions."""
        for pattern in self.ignore:
            if self.matches(pattern, name):
                return self.default, f"{self.source}: ignore {pattern!r} ({self.match})"
        if self.include:
            hit = next((p for p in self.include if self.matches(p, name)), None)
            if hit is None:
                return self.default, f"{self.source}: no include pattern"
            return self.scheme, f"{self.source}: include {hit!r} ({self.match})"
        if ndim < 2:
            return self.default, f"{self.source}: not a matrix"
        return self.scheme, f"{self.source}: every matrix weight"


def whole_match(pattern: str, name: str) -> bool:
    """Whether ``pattern``'s dotted components equal a contiguous run of ``name``'s (``*``
    globs within a component; leading and trailing dots ignored)."""
    want = [p for p in pattern.strip(".").split(".") if p]
    have = name.split(".")
    if not want:
        return False
    for start in range(len(have) - len(want) + 1):
        window = have[start : start + len(want)]
        if all(fnmatch.fnmatchcase(h, w) for h, w in zip(window, want, strict=True)):
            return True
    return False


def substring_only(patterns: Iterable[str], names: Iterable[str]) -> dict[str, list[str]]:
    """``{pattern: [names]}``: the names each pattern contains as a substring that a
    whole-name match (:func:`whole_match`) would not select."""
    names = list(names)
    found = {p: [n for n in names if p in n and not whole_match(p, n)] for p in patterns}
    return {p: hits for p, hits in found.items() if hits}


@dataclasses.dataclass(frozen=True)
class Entry:
    """One parameter's precision on one side and what decided it."""

    scheme: str
    rule: str


def _dtype(tensor: Any) -> str:
    return str(tensor.dtype).removeprefix("torch.")


def _scheme(weight: Any, scale: Any) -> str:
    """The scheme of a quantized ``weight`` read from its ``scale`` companion's shape/dtype."""
    dtype, shape = _dtype(weight), tuple(weight.shape)
    scale_dtype, scale_shape = _dtype(scale), tuple(scale.shape)
    if dtype == "uint8" and scale_dtype.startswith("float8"):
        return "nvfp4"
    if dtype not in _FP8:
        return f"{dtype}+scale"
    if scale_dtype in ("float8_e8m0fnu", "uint8"):
        return "mxfp8"
    size = 1
    for n in scale_shape:
        size *= n
    if size == 1:
        return _FP8[dtype]
    rows, cols = shape[-2], shape[-1]
    if scale_shape[-2:] == (-(-rows // 128), -(-cols // 128)):
        return "fp8-e4m3-block128"
    if scale_shape[-1:] == (1,) or scale_shape == shape[:-1]:
        return "fp8-e4m3-channel"
    return f"{_FP8[dtype]}-scale{list(scale_shape)}"


def detect(tensors: Mapping[str, Any], source: str = "tensors") -> dict[str, Entry]:
    """Per parameter of a state dict (or module), its scheme read from the tensors: a weight
    with a ``<name>_scale_inv`` / ``_scale`` companion is quantized (:data:`SCHEMES`); a
    float8 weight without one is tensorwise with its scale elsewhere; others are their dtype.
    Companions (scales, ``input_scale``) are not entries of their own."""
    if hasattr(tensors, "state_dict") and callable(tensors.state_dict):
        tensors = tensors.state_dict()
    names = set(tensors)
    out: dict[str, Entry] = {}
    for name, tensor in tensors.items():
        if _is_companion(name, names):
            continue
        scale = next((tensors[name + s] for s in _COMPANIONS if name + s in names), None)
        if scale is None and name.endswith(".weight"):
            base = name.removesuffix("weight")
            scale = next(
                (tensors[base + s[1:]] for s in _COMPANIONS if base + s[1:] in names), None
            )
        if scale is not None:
            evidence = (
                f"{_dtype(tensor)} {list(tensor.shape)}, scale {_dtype(scale)} {list(scale.shape)}"
            )
            out[name] = Entry(_scheme(tensor, scale), f"{source}: {evidence}")
        elif _dtype(tensor) in _FP8:
            out[name] = Entry(_FP8[_dtype(tensor)], f"{source}: {_dtype(tensor)}, no scale tensor")
        else:
            out[name] = Entry(_dtype(tensor), f"{source}: {_dtype(tensor)}")
    return out


def _is_companion(name: str, names: set[str]) -> bool:
    """Whether ``name`` is a scale tensor of another entry of ``names``."""
    last = name.rpartition(".")[2]
    if last in _MODULE_COMPANIONS:
        return True
    for suffix in _COMPANIONS:
        if name.endswith(suffix):
            owner = name.removesuffix(suffix)
            if owner in names or owner.rpartition(".")[0] + ".weight" in names:
                return True
    return False


def _declared(rules: Rules, shapes: Mapping[str, int]) -> dict[str, Entry]:
    """Per parameter (``{name: ndim}``), the scheme ``rules`` give it."""
    return {name: Entry(*rules.decide(name, ndim)) for name, ndim in shapes.items()}


@dataclasses.dataclass
class Manifest:
    """Both sides' precision per parameter, the rules that decided it, and what the audits
    found (:func:`audit`)."""

    layers: dict[str, dict[str, str]]
    problems: list[str] = dataclasses.field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The golden's JSON document (the audits are not recorded: they run every time)."""
        return {"version": 1, "layers": self.layers}


def _side(value: Any, shapes: Mapping[str, int], label: str) -> dict[str, Entry]:
    if isinstance(value, Rules):
        return _declared(value, shapes)
    if hasattr(value, "state_dict") or isinstance(value, Mapping):
        return detect(value, source=f"{label} tensors")
    raise TypeError(
        f"check_precision: the {label} side is a state dict, a module or a Rules, got "
        f"{type(value).__name__}"
    )


def build(
    trainer: Any,
    engine: Any = None,
    *,
    rules: Rules | None = None,
    declared: Sequence[str] = (),
    same: bool = False,
) -> Manifest:
    """The manifest of ``trainer`` (a module or state dict, or :class:`Rules` applied to the
    engine's names) and ``engine`` (a state dict of what it holds, or :class:`Rules` applied
    to the trainer's names). ``rules``: the engine's quantization config; alone it stands
    for the engine, beside the engine's tensors it is audited and the tensors must hold what
    it declares. ``declared``: patterns of sensitive layers quantized on purpose. ``same``:
    require both sides to agree."""
    if engine is None:
        if rules is None:
            raise TypeError("check_precision: pass the engine's state dict, its rules=, or both")
        engine, rules = rules, None
    if isinstance(trainer, Rules) and isinstance(engine, Rules):
        raise TypeError("check_precision: one side must be tensors (a state dict or a module)")
    anchor = engine if isinstance(trainer, Rules) else trainer
    tensors = anchor.state_dict() if hasattr(anchor, "state_dict") else anchor
    if not isinstance(tensors, Mapping):
        raise TypeError(
            f"check_precision: a side is a state dict, a module or a Rules, got "
            f"{type(tensors).__name__}"
        )
    names = set(tensors)
    shapes = {n: len(t.shape) for n, t in tensors.items() if not _is_companion(n, names)}
    sides = {
        "trainer": _side(trainer, shapes, "trainer"),
        "engine": _side(engine, shapes, "engine"),
    }
    problems = []
    if rules is not None:
        sides["engine"], problems = _with_rules(sides["engine"], rules, shapes)
    layers: dict[str, dict[str, str]] = {}
    for name in sorted(set(sides["trainer"]) | set(sides["engine"])):
        row = {}
        for label, found in sides.items():
            entry = found.get(name)
            row[label] = entry.scheme if entry else "absent"
            row[f"{label}_rule"] = entry.rule if entry else f"{label}: no such parameter"
        layers[name] = row
    pattern_rules = [r for r in (trainer, engine, rules) if isinstance(r, Rules)]
    problems += audit(layers, pattern_rules, declared=declared, same=same)
    return Manifest(layers, problems)


def _with_rules(
    held: dict[str, Entry], rules: Rules, shapes: Mapping[str, int]
) -> tuple[dict[str, Entry], list[str]]:
    """The engine's entries with the rule of its config beside the tensor evidence, and a
    problem per parameter whose tensors hold another scheme than the config declares."""
    out, problems = {}, []
    for name, entry in held.items():
        scheme, rule = rules.decide(name, shapes.get(name, 2))
        out[name] = Entry(entry.scheme, f"{rule}; {entry.rule}")
        if scheme != entry.scheme:
            problems.append(
                f"{name!r}: the engine holds {entry.scheme} ({entry.rule}) but its config "
                f"declares {scheme} ({rule})"
            )
    return out, problems


def sensitive_kind(name: str) -> str | None:
    """The kind of sensitive layer (:data:`SENSITIVE`) parameter ``name`` belongs to, if any:
    its module's own name (the component before the parameter's) decides."""
    module = name.split(".")[-2] if "." in name else name
    for kind, globs in SENSITIVE.items():
        if any(fnmatch.fnmatchcase(module, g) for g in globs):
            return kind
    return None


def _quantized(scheme: str) -> bool:
    return scheme in SCHEMES or "+scale" in scheme or scheme.startswith("fp8")


def audit(
    layers: Mapping[str, Mapping[str, str]],
    rules: Sequence[Rules],
    *,
    declared: Sequence[str] = (),
    same: bool = False,
) -> list[str]:
    """What is wrong with a manifest whatever the golden says, one message each."""
    problems = []
    for r in rules:
        if r.match == "whole":
            continue
        for pattern in [*r.ignore, *r.include]:
            hits = [n for n in layers if r.matches(pattern, n) and not whole_match(pattern, n)]
            if not hits:
                continue
            problems.append(
                f"pattern {pattern!r} ({r.source}, matched by {r.match}) selects "
                f"{len(hits)} parameter(s) that a whole-module-name match would not: "
                f"{_listed(hits)}; they get that side's rule by accident (verl#7519: "
                "'mlp.gate' matched 'mlp.gate_up_proj'); match whole dotted names, or "
                f"anchor the pattern (e.g. {pattern.rstrip('.') + '.weight'!r})"
            )
    for name, row in layers.items():
        kind = sensitive_kind(name)
        quantized = [s for s in ("trainer", "engine") if _quantized(row[s])]
        if kind and quantized and not any(whole_match(p, name) for p in declared):
            side = quantized[0]
            problems.append(
                f"{kind} {name!r} is quantized on the {' and '.join(quantized)} side "
                f"({row[side]}, by {row[side + '_rule']}); {kind}s stay in high precision "
                "unless declared: add its pattern to the ignore list, or pass "
                f"declared=[{name.rpartition('.')[0]!r}] if it is on purpose"
            )
        if same and row["trainer"] != row["engine"]:
            problems.append(
                f"{name!r}: the trainer computes in {row['trainer']} ({row['trainer_rule']}), "
                f"the engine in {row['engine']} ({row['engine_rule']}); same=True requires "
                "one scheme on both sides"
            )
    return problems


def changes(recorded: Mapping[str, Any], now: Manifest) -> list[str]:
    """One message per parameter whose precision on either side differs from ``recorded``
    (a :meth:`Manifest.to_json` document), naming both sides then and now and the rules."""
    before = recorded.get("layers", {})
    out = []
    for name in sorted(set(before) | set(now.layers)):
        old, new = before.get(name), now.layers.get(name)
        if old is None or new is None:
            which = "new in this run" if old is None else "recorded but absent now"
            out.append(f"{name!r}: {which} ({_row(new or old)})")
            continue
        moved = [s for s in ("trainer", "engine") if old.get(s) != new[s]]
        if moved:
            sides = "; ".join(
                f"{s}: recorded {old.get(s)} ({old.get(s + '_rule')}), now {new[s]} "
                f"({new[s + '_rule']})"
                for s in moved
            )
            kept = [s for s in ("trainer", "engine") if s not in moved]
            other = f"; {kept[0]} unchanged: {new[kept[0]]}" if kept else ""
            out.append(f"{name!r} changed precision: {sides}{other}")
    return out


def _row(row: Mapping[str, str]) -> str:
    return f"trainer {row.get('trainer')}, engine {row.get('engine')}"


def _listed(names: Sequence[str], most: int = 4) -> str:
    shown = ", ".join(repr(n) for n in names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")
