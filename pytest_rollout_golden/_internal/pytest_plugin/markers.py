"""The options of ``@pytest.mark.golden``: which exist, how several markers combine, and
what a layout variant's ``variant=``/``reference=`` mean.

Works on plain keyword dictionaries, without pytest; a mistake raises
:class:`~.options.OptionError` naming the test and the fix.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ...errors import update_command
from ...store.location import golden_dir, shared_golden_dir
from ..golden.modes import ReplayOnly
from ..tolerance import mismatch_bounds, trends
from ..tolerance.build import Declared
from ..tolerance.families import precision_layer
from ..tolerance.spec import Layer, ignore_and_tolerance_layers
from ..tolerance.stack import Stack
from ..wording import close_match
from .options import OptionError, missing_step_policy, parse_seed

MARKER_DOC = (
    "golden(key=None, shared=None, tolerances=None, ignore=(), exact=False, deterministic=True, "
    "seed=None, rebuild=None, regenerate=False, missing_step=None, variant=None, reference=None, "
    "layout_tolerances=None, mismatch_bounds=None, trends=None): configure "
    "the golden of this test; key= shares it within a file, shared= across files; ignore= names "
    "metrics/tensors not compared; regenerate= re-runs generate under --update-golden; "
    "missing_step= record|error|repeat|generate for a rollout step never recorded; "
    "variant/reference: a layout variant that replays the "
    "reference's golden (see parallel.variants()); mismatch_bounds={metric: bound} for "
    "golden.check_mismatch; trends={metric: 'growth<=2' or a list of specs} bound how metrics "
    "evolve over the run"
)
_OPTIONS = {
    "key", "tolerances", "ignore", "exact", "deterministic", "seed", "rebuild", "precision",
}  # fmt: skip
_MISMATCH_OPTIONS = {"mismatch_bounds"}  # golden.check_mismatch (mismatch_bounds.py)
_SERIES_OPTIONS = {"trends"}  # bounds over a run's series (trends.py)
_INPUT_OPTIONS = {"regenerate", "missing_step"}  # recorded rollouts as inputs (inputs.py)
_LAYOUT_OPTIONS = {"shared", "variant", "reference", "layout_tolerances"}
MARKER_OPTIONS = frozenset(
    _OPTIONS | _INPUT_OPTIONS | _LAYOUT_OPTIONS | _MISMATCH_OPTIONS | _SERIES_OPTIONS
)
"""Every keyword ``@pytest.mark.golden`` accepts."""
_FLAGS = ("exact", "deterministic", "regenerate")  # True or False, nothing that merely converts
_TOLERANCE_FIELDS = ("rtol", "atol", "equal_nan", "scale")  # belong in tolerances={metric: ...}


def marker_options(
    markers: Iterable[tuple[Sequence[Any], Mapping[str, Any]]], test_id: str
) -> dict[str, Any]:
    """The options of a test's ``golden`` markers, ``(args, kwargs)`` closest first: the
    closest marker (the function's own) wins over its class's and module's.

    Every mistake of the markers is reported at once, in one :class:`OptionError`.
    """
    options: dict[str, Any] = {}
    mistakes = []
    for args, kwargs in reversed(list(markers)):
        mistakes += [_positional(arg) for arg in args]
        options.update(kwargs)
    mistakes += _unknown_options(options)
    mistakes += [m.removeprefix(f"{test_id}: ") for m in _value_mistakes(options, test_id)]
    if not mistakes:
        return options
    if len(mistakes) == 1:
        raise OptionError(f"{test_id}: @pytest.mark.golden: {mistakes[0]}")
    listed = "".join(f"\n  - {m}" for m in mistakes)
    raise OptionError(f"{test_id}: {len(mistakes)} mistakes in @pytest.mark.golden:{listed}")


def _positional(arg: Any) -> str:
    """The mistake of a positional marker argument, and the keyword it was probably meant as."""
    keyword = f"key={arg!r}" if isinstance(arg, str) else "its keyword (key=, tolerances=, ...)"
    return (
        f"{arg!r} is given positionally, but the marker takes keywords only: pass it as {keyword}"
    )


def _unknown_options(options: Mapping[str, Any]) -> list[str]:
    """The keywords that are no marker option: the fields of one tolerance (``rtol=``...)
    point to ``tolerances=``, the others to the option they look like."""
    unknown = [name for name in options if name not in MARKER_OPTIONS]
    fields = {name: options[name] for name in unknown if name in _TOLERANCE_FIELDS}
    others = [name for name in unknown if name not in fields]
    mistakes = []
    if fields:
        given = ", ".join(f"{name}=" for name in fields)
        mistakes.append(
            f"{given} {'belongs' if len(fields) == 1 else 'belong'} to a metric's tolerance, "
            f"not to the marker: tolerances={{'pg_loss': {fields!r}}} (a metric name, or a glob "
            "like 'actor/*')"
        )
    if others:
        named = ", ".join(f"{name}={close_match(name, MARKER_OPTIONS)}" for name in others)
        mistakes.append(
            f"unknown option{'s' if len(others) > 1 else ''} {named}; "
            f"the options are {', '.join(sorted(MARKER_OPTIONS))}"
        )
    return mistakes


def _value_mistakes(options: Mapping[str, Any], test_id: str) -> list[str]:
    """What is wrong with the values of known options."""
    mistakes = [
        f"{name}= must be True or False, got {options[name]!r}"
        for name in _FLAGS
        if name in options and not isinstance(options[name], bool)
    ]
    for name in ("key", "shared"):
        value = options.get(name)
        if value is not None and (not isinstance(value, str) or not value):
            mistakes.append(f"{name}= must be a non-empty string, got {value!r}")
    if options.get("key") is not None and options.get("shared") is not None:
        mistakes.append("key= and shared= exclude each other")
    checks = {
        "seed": lambda v: parse_seed(v, "seed=", text=False),
        "precision": lambda v: precision_layer(str(v), "precision="),
        "missing_step": lambda v: missing_step_policy(v, None, "", where=test_id),
        "mismatch_bounds": lambda v: mismatch_bounds.session_bounds(v, (), ()),
        "trends": lambda v: trends.session_trends(v, (), ()),
    }
    for name, check in checks.items():
        if name in options:
            try:
                check(options[name])
            except (OptionError, ValueError) as exc:
                mistakes.append(str(exc))
    try:
        marker_level(options)
    except ValueError as exc:
        mistakes.append(str(exc))
    return mistakes


def replays_reference(options: Mapping[str, Any]) -> bool:
    """A layout variant other than its reference: it replays the reference's golden."""
    variant, reference = options.get("variant"), options.get("reference")
    return variant is not None and reference is not None and variant != reference


def reference_name(test_id: str, name: str, options: Mapping[str, Any]) -> str:
    """The test name of the reference param (``test_x[tp2-...]`` -> ``test_x[tp1-...]``)."""
    base, bracket, params = name.partition("[")
    variant, reference = str(options["variant"]), str(options["reference"])
    if variant not in params:
        raise OptionError(
            f"{test_id}: the id of layout variant {variant!r} is not in the test id; "
            "keep the ids variants() gives"
        )
    return base + bracket + params.replace(variant, reference, 1)


def reference_recipe(options: Mapping[str, Any], *, certify: bool = False) -> ReplayOnly:
    """How a layout variant's golden is recorded: by running its reference layout
    (``certify``: its float64 oracle, by the reference under ``--golden-certify``)."""
    reference = str(options["reference"])
    where = f"shared golden {options['shared']!r}" if options.get("shared") is not None else ""
    selection = f'-k "{reference}"'
    command = (
        f"`pytest --golden-certify {selection}` (without CI=true), then commit the golden/ "
        "directory"
        if certify
        else update_command(selection)
    )
    return ReplayOnly(
        recorder=f"the reference [{reference}]" + (f" ({where})" if where else ""),
        remedy=f"record it by running the reference: {command}",
    )


def golden_directory(
    root: Path, rootdir: Path, test_file: Path, test_id: str, name: str, options: Mapping[str, Any]
) -> Path:
    """The golden directory of test ``name`` (its id without the file part): ``shared=``
    names one across files, ``key=`` one within a file; a layout variant without ``key=``
    uses its reference's; else the test's own."""
    if options.get("shared") is not None:
        return shared_golden_dir(root, str(options["shared"]))
    key = options.get("key")
    if key is None and replays_reference(options):
        name = reference_name(test_id, name, options)
    return golden_dir(root, rootdir, test_file, name, key=None if key is None else str(key))


def marker_level(options: Mapping[str, Any]) -> tuple[Layer, Layer]:
    """The marker's level of a tolerance stack: its ``ignore=``, then its ``tolerances=``
    (see :func:`.spec.ignore_and_tolerance_layers`; ValueError on a bad entry)."""
    return ignore_and_tolerance_layers(
        "@pytest.mark.golden(tolerances=)",
        options.get("tolerances"),
        "@pytest.mark.golden(ignore=)",
        options.get("ignore"),
    )


def declared_tolerances(
    session: Stack, marker: tuple[Layer, Layer], options: Mapping[str, Any], *, exact: bool
) -> Declared:
    """What a test declares of its tolerances (:func:`..tolerance.build.build` stacks it):
    ``session``'s layers (``--golden-tolerance``, ini) under the ``marker`` level and the
    marker's ``precision=`` and ``exact=``; ``exact``: ``--golden-exact``. A layout variant
    declares its variant lane (``layout_tolerances=``): another layout recorded its values."""
    precision = options.get("precision")
    layout = (options.get("layout_tolerances") or {}) if replays_reference(options) else None
    return Declared(
        session=session,
        marker=marker,
        precision=None if precision is None else str(precision),
        layout=layout,
        exact=bool(options.get("exact")),
        exact_run=exact,
    )
