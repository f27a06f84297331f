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
from ..report.presentation import close_match
from ..tolerance.spec import Layer, ignore_and_tolerance_layers
from ..tolerance.stack import Stack
from .options import OptionError, with_precision

MARKER_DOC = (
    "golden(key=None, shared=None, tolerances=None, ignore=(), exact=False, deterministic=True, "
    "seed=None, rebuild=None, regenerate=False, missing_step=None, variant=None, reference=None, "
    "layout_tolerances=None, mismatch_bounds=None): configure "
    "the golden of this test; key= shares it within a file, shared= across files; ignore= names "
    "metrics/tensors not compared; regenerate= re-runs generate under --update-golden; "
    "missing_step= record|error|repeat|generate for a rollout step never recorded; "
    "variant/reference: a layout variant that replays the "
    "reference's golden (see parallel.variants()); mismatch_bounds={metric: bound} for "
    "golden.check_mismatch"
)
_OPTIONS = {
    "key", "tolerances", "ignore", "exact", "deterministic", "seed", "rebuild", "precision",
}  # fmt: skip
_MISMATCH_OPTIONS = {"mismatch_bounds"}  # golden.check_mismatch (mismatch_bounds.py)
_INPUT_OPTIONS = {"regenerate", "missing_step"}  # recorded rollouts as inputs (inputs.py)
_LAYOUT_OPTIONS = {"shared", "variant", "reference", "layout_tolerances"}
MARKER_OPTIONS = frozenset(_OPTIONS | _INPUT_OPTIONS | _LAYOUT_OPTIONS | _MISMATCH_OPTIONS)
"""Every keyword ``@pytest.mark.golden`` accepts."""
_FLAGS = ("exact", "deterministic", "regenerate")  # True or False, nothing that merely converts


def marker_options(
    markers: Iterable[tuple[Sequence[Any], Mapping[str, Any]]], test_id: str
) -> dict[str, Any]:
    """The options of a test's ``golden`` markers, ``(args, kwargs)`` closest first: the
    closest marker (the function's own) wins over its class's and module's."""
    options: dict[str, Any] = {}
    for args, kwargs in reversed(list(markers)):
        if args:
            raise OptionError(f"{test_id}: @pytest.mark.golden takes keywords only")
        options.update(kwargs)
    unknown = set(options) - MARKER_OPTIONS
    if unknown:
        raise OptionError(
            f"{test_id}: unknown @pytest.mark.golden option(s) {sorted(unknown)}"
            f"{close_match(sorted(unknown)[0], MARKER_OPTIONS)}; "
            f"the options are {', '.join(sorted(MARKER_OPTIONS))}"
        )
    for name in _FLAGS:
        if name in options and not isinstance(options[name], bool):
            raise OptionError(
                f"{test_id}: @pytest.mark.golden {name}= must be True or False, "
                f"got {options[name]!r}"
            )
    for name in ("key", "shared"):
        value = options.get(name)
        if value is not None and (not isinstance(value, str) or not value):
            raise OptionError(
                f"{test_id}: @pytest.mark.golden {name}= must be a non-empty string, got {value!r}"
            )
    if options.get("key") is not None and options.get("shared") is not None:
        raise OptionError(f"{test_id}: golden key= and shared= exclude each other")
    if "precision" in options:
        from ..tolerance.families import precision_layer

        try:
            precision_layer(str(options["precision"]), "@pytest.mark.golden precision=")
        except ValueError as exc:
            raise OptionError(f"{test_id}: {exc}") from None
    return options


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


def reference_recipe(options: Mapping[str, Any]) -> ReplayOnly:
    """How a layout variant's golden is recorded: by running its reference layout."""
    reference = str(options["reference"])
    where = f"shared golden {options['shared']!r}" if options.get("shared") is not None else ""
    selection = f'-k "{reference}"'
    return ReplayOnly(
        recorder=f"the reference [{reference}]" + (f" ({where})" if where else ""),
        remedy=f"record it by running the reference: {update_command(selection)}",
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


def tolerance_stack(
    session: Stack, marker: tuple[Layer, Layer], options: Mapping[str, Any], *, exact: bool
) -> tuple[Stack, ReplayOnly | None]:
    """A test's tolerance stack: ``session``'s (``--golden-tolerance``, ini) under the
    ``marker`` level; ``exact``: ``--golden-exact``. For a layout variant, also how its
    golden is recorded."""
    stack = session.replace(marker=marker, exact=bool(options.get("exact")) or exact)
    if options.get("precision") is not None:
        stack = with_precision(stack, str(options["precision"]), "marker precision")
    if not replays_reference(options):
        return stack, None
    # Another layout recorded these values: the layout lane replaces the same-layout
    # defaults (the user's own marker tolerances still come first), never bit-exact.
    stack = stack.replace(
        layout=Layer("variant lane", options.get("layout_tolerances") or {}),
        exact=bool(options.get("exact")),
        variant=True,
    )
    return stack, reference_recipe(options)
