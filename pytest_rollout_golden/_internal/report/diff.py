"""Differences between two goldens, two golden roots or two batch files, outside pytest.

Every value goes through the plugin's comparison routine and tolerance resolver,
so a difference reported here is one the plugin would fail on. For each golden
the result lists, per metric and per tensor, every step (and rank and
micro-batch) with its greatest and mean absolute and relative difference, the
count of mismatched elements, shape and dtype problems and entries present on
one side only, plus the first divergent step of each metric and tensor.

NaN against NaN differs here as it fails the plugin, unless the tolerance sets
``equal_nan``: diff is the plugin's gate run outside pytest, so a golden diffed against
itself differs where it holds a NaN; the row says so and names the ``--tolerance`` that
allows it.

A tensor ``check_tensors(mask=)`` compared under a mask is compared here at every
position, padding included: the golden does not store the mask, only how many positions
it selected (``masked`` in the tensors file's manifest entry), and the row notes that
(``mask_selected``, ``note``). The mask is an input of the run that checks, not of the
recording: a replay compares under *its* mask and keeps the recorded tensors as they are,
so a stored mask would describe one past run (the one that last re-recorded the file), and
applying it would let diff pass padding the next run's mask selects. The count costs
nothing and is enough to read the numbers right.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from ... import store
from ...errors import GoldenError
from ...store.location import ENVELOPE, MANIFEST, METRICS, TOLERANCES, find_goldens
from ..golden import keyed
from ..golden.golden_files import load_golden, read_calibrated, read_envelope
from ..golden.lanes import LaneValues, input_digests, lane_values, split_lane
from ..golden.messages import ALLOW_NAN, difference_detail
from ..results import GoldenDiff, Row
from ..tolerance.build import Declared, Recorded, build
from ..tolerance.compare import compare_named, dtype_name
from ..tolerance.spec import Layer, Tolerance
from ..tolerance.stack import Resolver, Stack
from ..wording import listed
from .diff_text import diff_allow_nan, diff_mask_note, lane_inputs_changed


@dataclasses.dataclass(frozen=True)
class Pair:
    """A golden (or batch file) of side A and its counterpart in B (``None``: missing there).

    ``label`` names it: the golden's path relative to its root, or its directory or file name.
    """

    label: str
    a: Path | None
    b: Path | None


def pair_paths(a: Path, b: Path | None) -> list[Pair]:
    """What ``rollout-golden diff A B`` (and ``plot``) compares: two golden directories, two
    golden roots or two batch files, paired; without ``b``, every golden at or under ``a``.

    Roots are paired by the goldens' paths relative to them. Raises :class:`GoldenError` for
    a path that is missing, a golden given with a root, or roots holding no golden.
    """
    paths = (a,) if b is None else (a, b)
    for path in paths:
        if not path.exists():
            raise GoldenError(f"{path}: no such file or directory")
    if b is not None and a.is_file() != b.is_file():
        raise GoldenError(f"{a} and {b}: compare two batch files or two directories, not one each")
    if a.is_file():
        return [Pair(a.name, a, b)]
    a_golden = (a / MANIFEST).is_file()
    b_golden = b is not None and (b / MANIFEST).is_file()
    if b is None and a_golden:
        return [Pair(a.name, a, None)]
    if a_golden and b_golden:
        assert b is not None
        return [Pair(a.name if a.name == b.name else f"{a.name} vs {b.name}", a, b)]
    if b is not None and a_golden != b_golden:
        golden, root = (a, b) if a_golden else (b, a)
        raise GoldenError(
            f"{golden} is a golden directory but {root} is not (it has no {MANIFEST}); "
            "give two golden directories or two golden roots"
        )
    left = {str(d.relative_to(a)): d for d in find_goldens(a)}
    right = {} if b is None else {str(d.relative_to(b)): d for d in find_goldens(b)}
    if not left and not right:
        where = a if b is None else f"{a} or {b}"
        raise GoldenError(f"no golden directory (no {MANIFEST}) under {where}")
    return [Pair(rel, left.get(rel), right.get(rel)) for rel in sorted(left.keys() | right.keys())]


def one_sided(pair: Pair) -> GoldenDiff:
    """A golden found on one side only: a difference."""
    side, path = ("A", pair.a) if pair.a is not None else ("B", pair.b)
    return GoldenDiff(
        pair.label,
        None if pair.a is None else str(pair.a),
        None if pair.b is None else str(pair.b),
        problems=[f"golden only in {side} ({path})"],
    )


def diff_paths(a: Path, b: Path, tolerances: Stack) -> list[GoldenDiff]:
    """Compare B against A: two golden directories, two golden roots or two batch files
    (paired by :func:`pair_paths`); a golden found on one side only is a difference.
    ``GOLDEN@LANE`` (or ``ROOT@LANE``) takes that lane's values (:func:`lane_pair`).
    Raises :class:`GoldenError` for a path that is missing, unreadable or not ours, and for a
    lane that a golden given as such lacks.
    """
    (a, lane_a), (b, lane_b) = split_lane(a), split_lane(b)
    pairs = pair_paths(a, b)
    if a.is_file():
        if lane_a or lane_b:
            raise GoldenError(f"{a} and {b}: batch files have no lanes; GOLDEN@LANE takes goldens")
        return [_diff_batches(a, b, build(Declared(tolerances)).resolver())]
    lanes = (lane_a, lane_b)
    single = (a / MANIFEST).is_file()
    return [diff_pair(p, tolerances, lanes, strict=single) for p in pairs]


def diff_pair(
    pair: Pair, tolerances: Stack, lanes: tuple[str | None, str | None], *, strict: bool = False
) -> GoldenDiff:
    """Compare a pair of goldens, lane ``lanes[1]`` of B against lane ``lanes[0]`` of A
    (both ``None``: the goldens as they are; one ``None``: that golden's base lane).

    A golden without the lane asked for is a difference, or with ``strict`` a
    :class:`GoldenError`; a lane computed on other inputs than its golden holds is a
    difference, not compared."""
    if pair.a is None or pair.b is None:
        return one_sided(pair)
    if lanes == (None, None):
        return diff_goldens(pair.a, pair.b, tolerances, label=pair.label)
    try:
        values = lane_pair(pair.a, pair.b, lanes)
    except GoldenError as exc:
        if strict:
            raise
        label = f"{pair.label} (lane {lanes[0]} vs {lanes[1]})"
        return GoldenDiff(label, str(pair.a), str(pair.b), problems=[str(exc)])
    label = f"{pair.label} (lane {values[0].lane} vs {values[1].lane})"
    stale = [
        f"{side.directory}: {lane_inputs_changed(str(side.lane), side.stale)}"
        for side in values
        if side.stale
    ]
    a, b = values[0].directory, values[1].directory
    if stale:
        return GoldenDiff(label, str(a), str(b), problems=stale)
    return diff_goldens(a, b, tolerances, label=label, values_only=True)


def lane_pair(a: Path, b: Path, lanes: tuple[str | None, str | None]) -> tuple[LaneValues, ...]:
    """Where lane ``lanes[0]`` of golden ``a`` and lane ``lanes[1]`` of ``b`` keep their
    values (``None``: the golden's base lane). Raises :class:`GoldenError` for a lane a
    golden lacks."""
    return lane_values(a, lanes[0]), lane_values(b, lanes[1])


def diff_goldens(
    a: Path, b: Path, tolerances: Stack, *, label: str, values_only: bool = False
) -> GoldenDiff:
    """Compare golden directory ``b`` against ``a`` (A's calibrated tolerances apply, and
    its envelope at each step, as on replay).

    ``values_only``: leave out the inputs (rollout files), which two lanes of a golden share
    and a lane's directory does not hold."""
    manifest_a, left = load_golden(a)
    manifest_b, right = load_golden(b)
    calibrated = calibrated_layer(left.get(TOLERANCES), a / TOLERANCES, left.get(METRICS))
    built = build(Declared(tolerances), Recorded(calibrated, envelope=read_envelope(a)))
    resolver = built.resolver()
    result = GoldenDiff(label, str(a), str(b))
    skipped = {TOLERANCES, ENVELOPE}
    if values_only:
        skipped |= {*input_digests(manifest_a["files"]), *input_digests(manifest_b["files"])}
    for filename in sorted((left.keys() | right.keys()) - skipped):
        if filename not in left or filename not in right:
            result.problems.append(f"{filename} only in {'A' if filename in left else 'B'}")
            continue
        if filename == METRICS:
            result.rows += _metric_rows(left[filename], right[filename], built.at)
            continue
        info = manifest_a["files"][filename]
        result.rows += _tensor_rows(
            left[filename], right[filename], resolver, info, result.problems, filename
        )
    return result


def diff_metric_tables(
    label: str,
    sides: tuple[str, str],
    a: Mapping[str, Any],
    b: Mapping[str, Any],
    tolerances: Stack,
) -> GoldenDiff:
    """Compare metric table ``b`` against ``a`` (``{step: {name: value}}``, as a
    ``metrics.json`` holds them) under ``tolerances``; ``sides`` names where each came from
    (two runs of a history)."""
    resolver = build(Declared(tolerances)).resolver()
    rows = _metric_rows({"steps": a}, {"steps": b}, lambda step: resolver)
    return GoldenDiff(label, sides[0], sides[1], rows=rows)


def calibrated_layer(document: Any, path: Path, metrics: Any) -> Layer | None:
    """The layer of a golden's ``tolerances.json``, bounded by its recorded ``metrics``."""
    if document is None:
        return None
    from ..golden.checks import recorded_magnitude

    steps = metrics["steps"] if metrics else {}
    return read_calibrated(document, path, functools.partial(recorded_magnitude, steps))[0]


def _diff_batches(a: Path, b: Path, resolver: Resolver) -> GoldenDiff:
    result = GoldenDiff(a.name, str(a), str(b))
    left, right = store.load_batch(a, on_cpu=True), store.load_batch(b, on_cpu=True)
    result.rows += _tensor_rows(left, right, resolver, {}, result.problems, a.name)
    return result


def _metric_rows(left: Any, right: Any, resolvers: Callable[[int], Resolver]) -> list[Row]:
    """A row per metric and step; ``resolvers(step)`` gives each step's tolerances."""
    from ..golden import metric_codec
    from ..golden.checks import recorded_magnitude

    steps_a, steps_b = left.get("steps", {}), right.get("steps", {})
    magnitude = functools.partial(recorded_magnitude, steps_a)  # A is the golden
    names = sorted({n for s in (steps_a, steps_b) for names in s.values() for n in names})
    rows = []
    for name in names:
        for step in sorted(steps_a.keys() | steps_b.keys(), key=int):
            ma, mb = steps_a.get(step, {}), steps_b.get(step, {})
            if name not in ma and name not in mb:
                continue
            resolver = resolvers(int(step))
            if name not in ma or name not in mb:
                tol, source = resolver.resolve(name)
                rows.append(
                    Row(
                        "metric",
                        name,
                        int(step),
                        ok=tol.ignore,
                        compared=not tol.ignore,
                        expected=metric_codec.scalar(ma[name]) if name in ma else None,
                        actual=metric_codec.scalar(mb[name]) if name in mb else None,
                        source=source,
                        detail=f"only in {'A' if name in ma else 'B'}",
                    )
                )
                continue
            where = f"metric {name!r} at step {step}"
            ea = metric_codec.decode(ma[name], where=where)
            eb = metric_codec.decode(mb[name], where=where)
            d, tol, source = compare_named(
                name, ea, eb, resolver, check_dtype=False, magnitude=magnitude(name)
            )
            expected = metric_codec.scalar(ma[name])
            row = _row("metric", name, ea, eb, d, tol, source, step=int(step), expected=expected,
                       actual=metric_codec.scalar(mb[name]))  # fmt: skip
            row.allowance = _allowance(tol, expected, magnitude(name))
            rows.append(row)
    return rows


def _allowance(tol: Tolerance, expected: Any, magnitude: float | None) -> float | None:
    """The difference ``tol`` allows a scalar ``expected`` (``None``: exact, ignored, or not
    one finite number)."""
    if tol.exact or tol.ignore or not isinstance(expected, (int, float)):
        return None
    limit = tol.allowance(float(expected), magnitude)
    return limit if math.isfinite(limit) else None


def _tensor_rows(
    left: Any,
    right: Any,
    resolver: Resolver,
    info: Mapping[str, Any],
    problems: list[str],
    filename: str,
) -> list[Row]:
    from ...store import codec

    # loaded onto the CPU, whatever they were on; keyed samples compared by key
    arrays_a, layout_a = codec.flatten(keyed.by_key(left))
    arrays_b, layout_b = codec.flatten(keyed.by_key(right))
    prefix = f"{info['name']}/" if info.get("name") else ""
    where = {"step": info.get("step"), "rank": info.get("rank"), "micro": info.get("micro")}
    changed = codec.value_differences(layout_a, layout_b)
    if changed:
        problems.append(f"{filename}: non-tensor values or structure differ: {listed(changed)}")
    rows = []
    for key in sorted(arrays_a.keys() | arrays_b.keys()):
        label = prefix + key
        if key not in arrays_a or key not in arrays_b:
            tol, source = resolver.resolve(label)
            present = arrays_a.get(key, arrays_b.get(key))
            shape = list(getattr(present, "shape", ()))
            rows.append(
                Row(
                    "tensor",
                    label,
                    ok=tol.ignore,
                    compared=not tol.ignore,
                    shape=(shape, None) if key in arrays_a else (None, shape),
                    dtype=(dtype_name(present), None)
                    if key in arrays_a
                    else (None, dtype_name(present)),
                    source=source,
                    detail=f"only in {'A' if key in arrays_a else 'B'} ({filename})",
                    **where,
                )
            )
            continue
        ea, eb = arrays_a[key], arrays_b[key]
        d, tol, source = compare_named(label, ea, eb, resolver, check_dtype=True)
        row = _row("tensor", label, ea, eb, d, tol, source, **where)
        selected = _mask_selected(info, key, row.numel)
        if selected is not None and row.compared:
            row.mask_selected, row.note = selected, diff_mask_note(selected, row.numel)
        rows.append(row)
    return rows


def _mask_selected(info: Mapping[str, Any], key: str, numel: int) -> int | None:
    """How many of tensor ``key``'s ``numel`` positions the recording's mask selected
    (``None``: recorded without a mask, or the golden does not say)."""
    masked = info.get("masked")
    counts = masked.get(key) if isinstance(masked, dict) else None
    if not isinstance(counts, list) or len(counts) != 2:
        return None
    selected, positions = counts
    if not all(isinstance(c, int) and not isinstance(c, bool) for c in counts):
        return None
    return selected if positions == numel and 0 <= selected <= numel else None


def _row(kind: str, name: str, a: Any, b: Any, d: Any, tol: Any, source: str, **kw: Any) -> Row:
    """A row of two values compared (``kw``: step, rank, micro, expected, actual)."""
    detail = difference_detail(d) if not d.ok else ""
    if not d.ok and not tol.equal_nan and _nan_in_both(a, b):
        hint = diff_allow_nan(name)
        if ALLOW_NAN in detail:  # compare's hint names pytest's option
            detail = detail.replace(ALLOW_NAN, hint)
        else:
            detail = "\n".join(filter(None, [detail, f"NaN in A and B (equal_nan is off): {hint}"]))
    return Row(
        kind,
        name,
        ok=d.ok,
        compared=d.compared,
        shape=(list(getattr(a, "shape", ())), list(getattr(b, "shape", ()))),
        dtype=(dtype_name(a), dtype_name(b)),
        numel=d.numel,
        mismatched=d.mismatched,
        abs_max=d.abs_diff,
        abs_mean=d.abs_mean,
        rel_max=d.rel_diff,
        rel_mean=d.rel_mean,
        allowed=tol.describe(),
        source=source,
        detail=detail,
        **kw,
    )


def _nan_in_both(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` hold a NaN at the same place."""
    import torch

    ta, tb = torch.as_tensor(a), torch.as_tensor(b)
    if ta.shape != tb.shape or not (ta.is_floating_point() and tb.is_floating_point()):
        return False
    return bool((ta.isnan() & tb.isnan()).any())


def summary(diffs: Iterable[GoldenDiff]) -> dict[str, int]:
    """Counts over goldens: compared, differing, within tolerance, on one side only."""
    diffs = list(diffs)
    return {
        "goldens": len(diffs),
        "differ": sum(1 for d in diffs if d.differences and not d.one_sided),
        "within_tolerance": sum(1 for d in diffs if not d.differences),
        "one_sided": sum(1 for d in diffs if d.one_sided),
        "not_compared": sum(1 for d in diffs for r in d.rows if not r.compared),
    }
