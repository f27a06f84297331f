"""``rollout-golden``: verify, show, diff, plot and import goldens outside pytest; compare commits.

    rollout-golden verify [PATH ...]          check every checksum of every golden and lane
    rollout-golden show PATH [--json]         lanes, steps x metrics, per-tensor statistics
    rollout-golden show GOLDEN --lane NAME    that lane's values, with the golden's inputs
    rollout-golden diff A B [--json] [...]    two goldens, golden roots or batch files
    rollout-golden diff G@cpu G@cuda-sm90     two lanes of a golden (or of every golden of a root)
    rollout-golden plot A [B] -o out.png      metric curves, first divergence marked
    rollout-golden plot ROOT_A [ROOT_B] -o DIR  one PNG per golden (pair), DIR/REL.png
    rollout-golden import DUMPS -o GOLDEN     verl/ROLL/NexRL/AReaL/NeMo-RL/slime dumps -> golden
    rollout-golden compare A B -- ARGS        the tests at git refs A and B on the same goldens
    rollout-golden bisect --good A --bad B -- PYTEST_ARGS   the first commit whose replay fails
    rollout-golden history DIR list | show TEST | compare RUN RUN   the --golden-history runs
    rollout-golden history DIR changes        change points across runs, the commits to bisect

``diff`` uses the same comparison and tolerance rules as the plugin, so it is
the gate for dumps two runs wrote with :func:`~pytest_rollout_golden.save_batch`; it
compares on the CPU, whatever device each side was recorded on.
Exit status: 0 fine, 1 a difference (or failed check), 2 unusable input.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from . import store
from ._internal.report.presentation import (
    diff_summary,
    golden_diff_lines,
    lane_inputs_changed,
    lane_linked,
    location,
    manifestless,
    metric_cell,
    not_a_lane,
    number,
    plural,
    table,
    verify_row,
    verify_totals,
)
from ._internal.tolerance.stack import Stack
from .errors import GoldenError
from .store.location import (
    ENVELOPE,
    LANE_NAME,
    LANES,
    MANIFEST,
    METRICS,
    TOLERANCES,
    files_without_manifest,
    find_goldens,
    find_manifestless,
)


def _load_dir(directory: Path) -> dict[str, Any]:
    """Every file of a golden, verified: ``{filename: loaded content}``."""
    from ._internal.golden.files import load_golden

    return load_golden(directory)[1]


def verify(paths: Sequence[Path]) -> int:
    """Check every golden under ``paths``, and every lane of each; 0 all intact, 1 a problem
    found, 2 could not check.

    Every golden and lane is reported, whatever the others hold. A golden whose update was
    interrupted past its commit point (a staged ``.NAME.new-PID`` with its manifest left
    beside it) is a problem, as is a lane computed on other inputs than its golden holds and
    an entry of ``@lanes/`` that is no lane (reported, never deleted); symlinked goldens are
    followed, as replay does, but a linked lane (or a link in one) is a problem.
    """
    missing = [p for p in paths if not p.exists()]
    for path in missing:
        print(f"error: {path}: no such file or directory", file=sys.stderr)
    if missing:
        return 2
    problems = unchecked = checked = lanes = 0
    for path in paths:
        directories = find_goldens(path, follow_symlinks=True)
        unlisted = find_manifestless(path)
        if not directories and not unlisted:
            print(
                f"error: {path}: no golden (no {MANIFEST}) at or below it; "
                "give the golden root (ini golden_dir, default golden/) or a golden directory",
                file=sys.stderr,
            )
            unchecked += 1
        for directory in unlisted:
            problems += 1
            problem = manifestless(directory, files_without_manifest(directory))
            print(verify_row("FAIL", directory, f": {problem}"))
        for directory in directories:
            checked += 1
            rows = [(*_verify_one(directory), directory, False), *_verify_lanes(directory)]
            for status, message, where, lane in rows:
                lanes += lane
                problems += status == "FAIL"
                unchecked += status == "ERROR"
                print(verify_row(status, where, message))
    print(verify_totals(checked, lanes, problems, unchecked))
    return 2 if unchecked else 1 if problems else 0


def _verify_one(directory: Path, what: str = "") -> tuple[str, str]:
    """``(status, what follows the directory in the report)`` of one golden or lane
    (``what``: how its row names it, before the count of its files)."""
    interrupted = [p.name for p in store.interrupted_commits(directory)]
    if interrupted:  # its files may be half moved in: say why before any checksum does
        return "FAIL", (
            f": half-committed, an interrupted update left {', '.join(interrupted)} beside "
            "it; any pytest run of its test finishes the update; commit that"
        )
    try:
        files = _load_dir(directory)
    except (GoldenError, OSError) as exc:
        return "FAIL", f": {exc}"
    except Exception as exc:  # a file this version cannot read: say so, check the rest
        return "ERROR", f": could not be checked ({type(exc).__name__}: {exc})"
    return "ok", f" ({what}{plural(len(files), 'file')}{_not_compared(files.get(ENVELOPE))})"


def _not_compared(envelope: Any) -> str:
    """What ``verify`` says of the metrics a checked ``envelope.json`` takes out of every
    variant's comparison (``layout_drifting``): a gate calibration may open is named where
    the golden is checked, never silently."""
    from ._internal.tolerance.envelope import DRIFTING

    drifting = envelope.get(DRIFTING) if isinstance(envelope, dict) else None
    if not drifting:
        return ""
    names = ", ".join(f"{n} ({e['widest']:g}x)" for n, e in sorted(drifting.items()))
    return f"; not comparable across variants ({ENVELOPE}): {names}"


def _verify_lanes(directory: Path) -> list[tuple[str, str, Path, bool]]:
    """``verify``'s rows of the entries of a golden's ``@lanes/``: ``(status, message,
    path, whether it is a lane)``. Hidden entries (a lane's lock, its staged update) are the
    lane's, checked with it."""
    from ._internal.golden.lanes import input_digests, lane_link, stale_inputs

    folder = directory / LANES
    if not folder.is_dir():
        return [("FAIL", f": {not_a_lane(folder)}", folder, False)] if folder.exists() else []
    try:
        inputs = input_digests((store.read_manifest(directory) or {}).get("files", {}))
    except GoldenError:
        inputs = {}  # the golden's own row says why; each lane is still checked
    rows = []
    for entry in sorted(e for e in folder.iterdir() if not e.name.startswith(".")):
        link = lane_link(directory, entry.name) if LANE_NAME.fullmatch(entry.name) else None
        if link is not None:
            rows.append(("FAIL", f": {lane_linked(link, entry.name)}", entry, False))
            continue
        orphans = files_without_manifest(entry) if LANE_NAME.fullmatch(entry.name) else []
        if orphans:
            lane = f" (a lane: with `--golden-lane {entry.name}` on its hardware)"
            rows.append(("FAIL", f": {manifestless(entry, orphans)}{lane}", entry, False))
            continue
        if not (LANE_NAME.fullmatch(entry.name) and (entry / MANIFEST).is_file()):
            rows.append(("FAIL", f": {not_a_lane(entry)}", entry, False))
            continue
        status, message = _verify_one(entry, f"lane {entry.name}, ")
        stale = stale_inputs(store.read_manifest(entry) or {}, inputs) if status == "ok" else []
        if stale:
            status, message = "FAIL", f": {lane_inputs_changed(entry.name, stale)}"
        rows.append((status, message, entry, True))
    return rows


def show(path: Path, *, as_json: bool = False, lane: str | None = None) -> int:
    """Print a golden (structure, lanes, steps × metrics, per-tensor statistics) or one batch
    file; ``lane``: the values of that lane of the golden, with the golden's inputs."""
    if path.is_file():
        if lane is not None:
            raise GoldenError(f"{path}: a batch file has no lanes; --lane takes a golden")
        manifest, steps = None, {}
        document, files = _batch_file_document(path)
    else:
        manifest, steps, document, files = _golden_document(path, lane)
    if as_json:
        print(json.dumps(document, indent=2, allow_nan=False, default=str))
        return 0
    if manifest is not None:
        print(_golden_line(path, manifest))
        for line in _lane_lines(path, document, shown=lane):
            print(line)
        if document.get("fingerprint") is not None:
            print("fingerprint:", json.dumps(document.get("fingerprint")))
        _print_lanes(document["lanes"])
    if steps:
        names = sorted({n for m in steps.values() for n in m})
        rows = [("step", *names)]
        for step in sorted(steps, key=int):
            rows.append((step, *(metric_cell(steps[step].get(n)) for n in names)))
        print(f"metrics ({plural(len(steps), 'step')} × {plural(len(names), 'metric')}):")
        print("\n".join(table(rows)))
    for filename, entry in files.items():
        _print_file(filename, entry)
    if manifest is None and files[path.name].get("layout"):
        print("layout:", files[path.name]["layout"][:2000])
    for line in [
        *_tolerance_lines(document.get("tolerances")),
        *_envelope_lines(document.get("envelope")),
    ]:
        print(line)
    if steps and lane is None:
        for line in _sensitivity_lines(path):
            print(line)
    return 0


def _sensitivity_lines(path: Path) -> list[str]:
    """``show``'s section of what each gate of the golden in ``path`` can detect
    (:mod:`._internal.report.sensitivity`), under the tolerances and trend bounds of the
    project's ini, as ``pytest --golden-sensitivity`` probes them."""
    from ._internal.golden.files import load_golden
    from ._internal.report.sensitivity import SHOW_HEADER, directory_gates, gate_lines
    from ._internal.tolerance.trends import session_trends

    found = argparse.Namespace(tolerance=[], ignore=[], config=None, no_config=False, exact=False)
    stack, _ = _tolerances(found, [path])
    _, options = _project_ini(found, [path])
    trends = session_trends(None, [], _ini_value(options, "golden_trends", linelist=True))
    gates = directory_gates(path, load_golden(path)[1], stack, trends)
    return [SHOW_HEADER, *gate_lines(gates)]


def _tolerance_lines(content: Mapping[str, Any] | None) -> list[str]:
    """``show``'s lines of a golden's ``tolerances.json``: each lane's entries (``same
    layout``: the runs of the tests that record the golden; ``across variants``: the variant
    lane), a lane the file lacks left out, one that kept every default said so."""
    from ._internal.tolerance.calibration import LANES
    from ._internal.tolerance.spec import Tolerance

    if not content:
        return []
    lines = [f"calibrated tolerances ({TOLERANCES}):"]
    for lane, (section, *_) in LANES.items():
        if section not in content:
            continue
        entries = content[section]
        lines.append(f"  {lane}:" if entries else f"  {lane}: every value keeps its default")
        lines += [
            f"    {name}: {Tolerance.coerce(tol).describe()}" for name, tol in entries.items()
        ]
    return lines


def _envelope_summary(content: Any) -> dict[str, Any] | None:
    """What ``show`` says of a golden's ``envelope.json`` (``None``: it has none): the margin,
    smooth and runs; per lane, per metric its steps, runs, widest half-width and bias bound;
    and the values not comparable across variants."""
    from ._internal.tolerance.envelope import DRIFTING, LANES

    if not isinstance(content, dict):
        return None
    how = content.get("how", {})
    lanes = {
        lane: {name: _band_summary(band) for name, band in sorted(content[section].items())}
        for lane, section in LANES.items()
        if section in content
    }
    drifting = {
        name: {"widest": entry.get("widest")}
        for name, entry in sorted(content.get(DRIFTING, {}).items())
    }
    return {
        "margin": how.get("margin"),
        "smooth": how.get("smooth"),
        "runs": how.get("runs"),
        "lanes": lanes,
        "drifting": drifting,
    }


def _band_summary(band: Mapping[str, Any]) -> dict[str, Any]:
    """One metric's entry of :func:`_envelope_summary`: with the fewest distinct runs at a
    step, the largest margin the band applies (``None`` in a file that predates the count)."""
    from ._internal.tolerance.envelope import margin

    steps = band["steps"]
    counts = [c for c in band.get("distinct") or () if c]
    return {
        "distinct": min(counts, default=None),
        "margin": margin(min(counts)) if counts else None,
        "steps": len(steps),
        "first": steps[0] if steps else None,
        "last": steps[-1] if steps else None,
        "runs": band.get("runs"),
        "widest": max([*band["below"], *band["above"]], default=0.0),
        "bias_bound": (band.get("bias") or {}).get("bound"),
    }


def _envelope_lines(summary: Mapping[str, Any] | None) -> list[str]:
    """``show``'s lines of a golden's envelope (:func:`_envelope_summary`)."""
    if summary is None:
        return []
    lines = [
        f"per-step envelope ({ENVELOPE}): from {summary['runs']} runs, "
        f"margin x{summary['margin']:g} (more from fewer than 8 distinct runs), "
        f"smooth {summary['smooth']} steps each side"
    ]
    for lane, metrics in summary["lanes"].items():
        lines.append(f"  {lane}:")
        for name, m in metrics.items():
            bias = "none" if m["bias_bound"] is None else f"{m['bias_bound']:g}"
            fewest = (
                ""
                if m["margin"] is None
                else (f" ({m['distinct']} distinct at the fewest, margin x{m['margin']:g})")
            )
            width = f"half-width up to {m['widest']:g}"
            if not m["widest"]:
                width = "half-width 0 (the runs repeated the golden bit for bit: rounding level)"
            lines.append(
                f"    {name}: {plural(m['steps'], 'step')} ({m['first']}-{m['last']}), "
                f"{m['runs']} runs{fewest}, {width}, bias bound {bias}"
            )
    if summary["drifting"]:
        widest = ", ".join(f"{n} ({d['widest']:g}x)" for n, d in summary["drifting"].items())
        lines.append(f"  not comparable across variants: {widest}")
    return lines


def _lane_lines(path: Path, document: dict[str, Any], *, shown: str | None) -> list[str]:
    """What ``show --lane`` says of the lane it shows (nothing without ``--lane``)."""
    if shown is None:
        return []
    lane = next(x for x in document["lanes"] if x["lane"] == shown)
    if lane["base"]:
        return [f"lane {shown}: the base lane, its values beside the inputs"]
    lines = [f"lane {shown}: values from {lane['directory']}, inputs from {path}"]
    if lane["stale"]:
        lines.append(f"lane {shown}: {lane_inputs_changed(shown, lane['stale'])}")
    return lines


def _print_lanes(lanes: list[dict[str, Any]]) -> None:
    """``show``'s table of a golden's lanes: where each keeps its values, what recorded them."""
    if not lanes:
        return
    rows = [("lane", "values", "recorded on")]
    for lane in lanes:
        where = "beside the inputs (base lane)" if lane["base"] else f"{LANES}/{lane['lane']}"
        if lane["stale"]:
            where += " (computed on other inputs: re-record it)"
        device = lane["device"] or "-"
        if lane["problem"]:
            device = "unreadable (rollout-golden verify says why)"
        rows.append((lane["lane"], where, device))
    print(f"lanes ({len(lanes)}):")
    print("\n".join(table(rows)))


def _batch_file_document(path: Path) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """What ``show`` says of one batch file: its JSON document, and its one file entry."""
    from ._internal.golden import keyed
    from ._internal.report.stats import tensor_stats
    from .store import codec

    arrays, metadata = store.read_safetensors(path)
    layout = metadata.get("prg.layout")
    values: dict[str, dict[str, str]] = {}
    if layout is not None:
        tree = json.loads(layout)
        batch = codec.unflatten(arrays, tree, on_cpu=True)
        shown = keyed.by_key(batch, completion=True)
        if shown is not batch:  # keyed samples: by key
            arrays, tree = codec.flatten(shown)
            layout = json.dumps(tree)
        values = _values(tree)
    document: dict[str, Any] = {"file": str(path), "tensors": tensor_stats(arrays)}
    document["values"] = values
    entry = {"info": {}, "tensors": document["tensors"], "values": values, "layout": layout}
    return document, {path.name: entry}


def _golden_document(
    path: Path, lane: str | None = None
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, dict[str, Any]]]:
    """What ``show`` says of a golden (of its lane ``lane``: that lane's values, the golden's
    inputs): its manifest, its metrics by step, its JSON document, and an entry per batch file
    (manifest info, tensor statistics, non-tensor values)."""
    from ._internal.golden import keyed, metric_codec
    from ._internal.golden.files import load_golden
    from ._internal.golden.lanes import golden_lanes
    from ._internal.report.stats import tensor_stats
    from .store import codec

    if not (path / MANIFEST).is_file():
        raise GoldenError(f"{path}: no {MANIFEST}; not a golden directory")
    manifest, content = load_golden(path)
    lanes = golden_lanes(path, manifest)
    info, values = manifest["files"], manifest
    if lane is not None:
        info, content, values = _lane_content(path, manifest, content, lane)
    steps = content.get(METRICS, {}).get("steps", {})
    files = {}
    for filename, value in content.items():
        if filename.endswith(".json"):
            continue
        arrays, layout = codec.flatten(keyed.by_key(value, completion=True))
        files[filename] = {
            "info": info[filename],
            "tensors": tensor_stats(arrays),
            "values": _values(layout),
        }
    document = {
        "golden": str(path),
        "test": manifest.get("test"),
        "lane": values.get("lane") if lane is None else lane,
        "fingerprint": values.get("fingerprint"),
        "imported": manifest.get("imported"),
        "lanes": [_lane_json(x) for x in lanes],
        "metrics": {
            step: {
                name: _json_scalar(metric_codec.scalar(node), node) for name, node in names.items()
            }
            for step, names in steps.items()
        },
        "files": {
            k: {"info": v["info"], "tensors": v["tensors"], "values": v["values"]}
            for k, v in files.items()
        },
        "tolerances": content.get(TOLERANCES),
        "envelope": _envelope_summary(content.get(ENVELOPE)),
    }
    return manifest, steps, document, files


def _lane_content(
    path: Path, manifest: dict[str, Any], content: dict[str, Any], lane: str
) -> tuple[dict[str, Any], dict[str, Any], Mapping[str, Any]]:
    """``(file table, {filename: content}, manifest of the values)`` of lane ``lane`` of the
    golden in ``path``: the golden's inputs with that lane's values, every checksum verified."""
    from ._internal.golden.files import load_golden
    from ._internal.golden.lanes import input_digests, lane_values

    chosen = lane_values(path, lane)
    if chosen.base:
        return manifest["files"], content, manifest
    recorded, values = load_golden(chosen.directory)
    inputs = input_digests(manifest["files"])
    info = {name: manifest["files"][name] for name in inputs} | recorded["files"]
    return info, {name: content[name] for name in inputs} | values, recorded


def _lane_json(lane: Any) -> dict[str, Any]:
    """One lane in ``show --json``'s ``lanes``."""
    fingerprint = (lane.manifest or {}).get("fingerprint")
    return {
        "lane": lane.lane,
        "base": lane.base,
        "directory": str(lane.directory),
        "device": lane.device,
        "fingerprint": fingerprint,
        "stale": lane.stale,
        "problem": lane.problem,
    }


def _print_file(filename: str, entry: dict[str, Any]) -> None:
    """``show``'s section of one batch file: its tensors' statistics, its other values."""
    info = entry["info"]
    where = location(info.get("step"), info.get("rank"), info.get("micro"))
    what = f" ({info.get('kind')} {info.get('name')!r}, {where})" if info else ""
    print(f"{filename}{what}")
    rows = [("tensor", "dtype[shape]", "min", "max", "mean", "std", "nan", "inf", "padding")]
    for key, st in entry["tensors"].items():
        padding = "-" if st["padding"] is None else f"{st['padding']:.1%}"
        rows.append(
            (
                key,
                f"{st['dtype']}{st['shape']}",
                number(st["min"], 6),
                number(st["max"], 6),
                number(st["mean"], 6),
                number(st["std"], 6),
                st["nan"],
                st["inf"],
                padding,
            )
        )
    if entry["tensors"]:  # a batch of plain values only has no tensor table
        print("\n".join(table(rows)))
    if entry["values"]:
        rows = [("value", "type", "content")]
        rows += [(key, v["type"], v["value"]) for key, v in entry["values"].items()]
        print("\n".join(table(rows)))


def _golden_line(path: Path, manifest: dict[str, Any]) -> str:
    """The first line of ``show``: the golden, its test, where an imported one came from."""
    test = manifest.get("test")
    imported = manifest.get("imported")
    if not isinstance(imported, dict):
        return f"golden {path} (test {test})"
    origin = f"imported from {imported.get('source')} ({imported.get('layout')} layout)"
    return f"golden {path} ({origin}{f', test {test}' if test else ''})"


_PREVIEW = 100  # characters of a non-tensor value that show prints


def _values(layout: Any) -> dict[str, dict[str, str]]:
    """The non-tensor values of a batch layout (non_tensor_batch, meta_info, ...) by path.

    Each is ``{"type": ..., "value": <repr, at most _PREVIEW characters>}``; a list
    of JSON scalars is one value, tensors are left to the tensor table.
    """
    from .store import codec

    out: dict[str, dict[str, str]] = {}

    def shown(kind: str, node: Any) -> dict[str, str]:
        try:
            value = codec.unflatten({}, node)
            value = value.tolist() if hasattr(value, "tolist") else value
            text = repr(value)
        except Exception:  # a node naming a tensor (an object array of tensors): say so
            text = "(holds tensors)"
        if len(text) > _PREVIEW:
            text = text[: _PREVIEW - 3] + "..."
        return {"type": kind, "value": text}

    def walk(node: Any, path: list[str]) -> None:
        key = "/".join(path) or "value"
        if isinstance(node, list):
            if all(not isinstance(x, (list, dict)) for x in node):
                out[key] = shown(f"list[{len(node)}]", node)
            else:
                for i, x in enumerate(node):
                    walk(x, [*path, str(i)])
            return
        if not isinstance(node, dict):
            out[key] = shown(type(node).__name__, node)
            return
        tag = node.get("t")
        if tag in ("dict", "tensordict"):
            for k, v in node["items"]:
                walk(v, [*path, str(k)])
        elif tag == "dataproto":
            for part in ("batch", "non_tensor_batch", "meta_info"):
                if node.get(part) is not None:
                    walk(node[part], [*path, part])
        elif tag == "batchproxy":
            walk(node["v"], path)
        elif tag == "ndarray":
            import numpy as np

            kind = f"{np.dtype(node['dtype']).name}[{', '.join(map(str, node['shape']))}]"
            out[key] = shown(kind, node)
        elif tag == "tuple":
            out[key] = shown(f"tuple[{len(node['v'])}]", node)
        elif tag in ("float", "npscalar", "bytes", "nontensordata", "nontensorstack"):
            out[key] = shown(tag, node)

    walk(layout, [])
    return out


def _json_scalar(value: Any, node: Any) -> Any:
    from ._internal.golden.results import json_number

    return json_number(value) if value is not None else node


def diff(a: Path, b: Path, tolerances: Stack, *, as_json: bool = False, config: str = "") -> int:
    """Compare B against A; print a table (or JSON); exit status 0 same, 1 differs."""
    from ._internal.report.diff import diff_paths

    return print_diffs(diff_paths(a, b, tolerances), str(a), str(b), as_json=as_json, config=config)


def print_diffs(
    diffs: Sequence[Any], a: str, b: str, *, as_json: bool = False, config: str = ""
) -> int:
    """Print ``diff``'s report of ``diffs`` (B against A) as tables or JSON; 0 same, 1 differs."""
    from ._internal.report.diff import summary

    counts = summary(diffs)
    differs = counts["differ"] + counts["one_sided"]
    if as_json:
        document = {
            "format": "pytest-rollout-golden-diff",
            "version": 1,
            "a": a,
            "b": b,
            "tolerance_config": config or None,
            "ok": not differs,
            "summary": counts,
            "goldens": [d.to_json() for d in diffs],
        }
        print(json.dumps(document, indent=2, allow_nan=False))
        return 1 if differs else 0
    print(f"A: {a}\nB: {b}")
    if config:
        print(f"tolerances also from {config}")
    for d in diffs:
        print()
        print("\n".join(golden_diff_lines(d)))
    print()
    print(diff_summary(counts))
    return 1 if differs else 0


def plot(a: Path, b: Path | None, out: Path, tolerances: Stack) -> int:
    """Draw the metric curves of golden ``a`` (against ``b``) into the PNG ``out``.

    Paths resolve as for ``diff`` (:func:`~.diff.pair_paths`), ``GOLDEN@LANE`` included. Given
    golden roots, ``out`` is a directory: one PNG per golden (pair), at the golden's path
    relative to its root (``OUT/REL.png``); a golden on one side only, or without the lane
    asked for, is named, not drawn.
    """
    from ._internal.golden.lanes import split_lane
    from ._internal.report.diff import pair_paths

    a, lane_a = split_lane(a)
    b, lane_b = split_lane(b) if b is not None else (None, None)
    lanes = (lane_a, lane_b)
    pairs = pair_paths(a, b)
    if a.is_file():
        raise GoldenError(f"{a}: a batch file holds no metric curves; plot takes goldens or roots")
    if (a / MANIFEST).is_file():
        return _plot_pair(_plot_sides(pairs[0].a or a, pairs[0].b, lanes), out, tolerances)
    if out.suffix.lower() == ".png":
        raise GoldenError(
            f"{out}: given golden roots, -o names a directory (one PNG per golden in it)"
        )
    for pair in pairs:
        if pair.a is None or (b is not None and pair.b is None):
            side, path = ("A", pair.a) if pair.a is not None else ("B", pair.b)
            print(f"not drawn: {pair.label}: golden only in {side} ({path})")
            continue
        try:
            sides = _plot_sides(pair.a, pair.b, lanes)
        except GoldenError as exc:
            if lanes == (None, None):
                raise
            print(f"not drawn: {pair.label}: {exc}")
            continue
        _plot_pair(sides, out / f"{pair.label}.png", tolerances)
    return 0


class _Sides(NamedTuple):
    """What one picture of ``plot`` draws: the directories of the values, its title, the
    legend's names, and whether only values are compared (lanes: the inputs are shared)."""

    a: Path
    b: Path | None
    title: str
    labels: tuple[str, str]
    values_only: bool


def _plot_sides(a: Path, b: Path | None, lanes: tuple[str | None, str | None]) -> _Sides:
    """Where the values of golden ``a`` (and ``b``) are, in lanes ``lanes`` if any. Raises
    :class:`GoldenError` for a lane a golden lacks, or one computed on other inputs."""
    from ._internal.golden.lanes import lane_values

    if lanes == (None, None):
        title = f"{a}" if b is None else f"{a} vs {b}"
        labels = (a.name, b.name) if b is not None and a.name != b.name else ("A", "B")
        return _Sides(a, b, title, labels, False)
    sides = [lane_values(a, lanes[0]), *([] if b is None else [lane_values(b, lanes[1])])]
    for side in sides:
        if side.stale:
            changed = lane_inputs_changed(str(side.lane), side.stale)
            raise GoldenError(f"{side.directory}: {changed}")
    named = [f"{golden}@{side.lane}" for golden, side in zip((a, b), sides, strict=False)]
    names = [str(side.lane) for side in sides]
    labels = (names[0], names[1]) if len(set(names)) == 2 else ("A", "B")
    b_values = sides[1].directory if b is not None else None
    return _Sides(sides[0].directory, b_values, " vs ".join(named), labels, True)


def _plot_pair(sides: _Sides, out: Path, tolerances: Stack) -> int:
    """One picture: golden ``a``'s curves (and its envelope), against ``b``'s when given."""
    from ._internal.golden.files import load_golden, read_envelope
    from ._internal.report.diff import diff_goldens
    from ._internal.report.plot import plot_metrics, series
    from ._internal.tolerance.envelope import band_source

    a, b = sides.a, sides.b
    curves = [
        series(load_golden(path)[1].get(METRICS, {}).get("steps", {}))
        for path in (a, b)
        if path is not None
    ]
    envelope = read_envelope(a)
    bands = dict(envelope.bands) if envelope is not None else {}
    first, allowed = None, None
    if b is not None:
        result = diff_goldens(a, b, tolerances, label=a.name, values_only=sides.values_only)
        first = {n: s for n, s in result.first_divergence().items()}
        allowed: dict[str, dict[int, float]] = {}
        for row in result.rows:
            if row.kind == "metric" and row.compared and row.allowance is not None:
                allowed.setdefault(row.name, {})[row.step] = row.allowance  # type: ignore[index]
            if row.kind == "metric" and not band_source(row.source):  # a tolerance above the band
                bands.pop(row.name, None)
        ignored = {r.name for r in result.rows if r.kind == "metric" and not r.compared}
    else:
        resolver = tolerances.resolver()
        ignored = {n for n in curves[0] if resolver.resolve(n)[0].ignore}
    picture = plot_metrics(
        curves[0],
        out,
        b=curves[1] if b is not None else None,
        labels=sides.labels,
        title=sides.title,
        first_divergence=first,
        allowed=allowed,
        ignored=ignored,
        bands={n: band for n, band in bands.items() if n not in ignored},
    )
    print(f"wrote {out}")
    if picture.not_drawn_note:
        print(picture.not_drawn_note)
    return 0


def import_dumps(args: argparse.Namespace) -> int:
    """Convert a folder of framework dumps into a golden directory."""
    from .dumps import convert

    imported = convert(
        args.source,
        args.output,
        layout=args.layout,
        name=args.name,
        trust_pickle=args.trust_pickle,
        test_id=args.test or "",
    )
    for entry, filename in imported.done:
        for source in entry.sources:
            print(f"{source} -> {filename}")
    for skipped in imported.skipped:
        print(f"skipped {skipped.path}: {skipped.why}")
    print(
        f"wrote golden {args.output} ({plural(len(imported.done), 'file')}, "
        f"{plural(len(imported.skipped), 'dump file')} skipped); check it with: "
        "rollout-golden verify"
    )
    return 0


def bisect_command(args: argparse.Namespace) -> int:
    """Search the commits between ``--good`` and ``--bad`` for the first one whose replay of
    the selected tests fails; 0 found, 1 ambiguous (skipped commits border it)."""
    from ._internal.commits.bisect import BisectOptions, bisect
    from ._internal.report.commits import bisect_lines, bisect_plan, bisect_progress

    if args.jobs < 1:
        raise GoldenError(f"--jobs {args.jobs}: give at least 1")
    if args.plot is not None:
        from ._internal.report.plot import figure_classes

        figure_classes()  # without matplotlib: say so before replaying any commit
    spec = _run_spec(args, goldens_at=args.good)

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    options = BisectOptions(
        good=args.good,
        bad=args.bad,
        jobs=args.jobs,
        cache=_commit_cache(args),
        check_ends=args.check_ends,
        on_plan=lambda good, bad, count: progress(
            bisect_plan(good, bad, count, spec.goldens.describe())
        ),
        on_run=lambda tried, run: progress(bisect_progress(tried, run)),
    )
    result = bisect(spec, options)
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        print("\n".join(bisect_lines(result)))
    if args.plot is not None:
        from ._internal.report.timeline import plot_bisect

        progress(f"bisect: wrote {plot_bisect(result, args.plot)}")
    return 0 if result.first_bad is not None else 1


def _run_spec(args: argparse.Namespace, *, goldens_at: str | None) -> Any:
    """The run at each commit, from the options: the tests (run in the current folder's place
    in each checkout) and their goldens: ``--goldens``, else the golden root as committed at
    ``goldens_at``, else as it is on disk."""
    from ._internal.commits.goldens import GoldenSource, source_of
    from ._internal.commits.runs import RunSpec, in_tree, locate

    repo, cwd_rel, golden_rel = locate(Path.cwd(), args.golden_root)
    if args.goldens is not None:
        source = source_of(args.goldens, repo, golden_rel)
    elif goldens_at is None:
        source = GoldenSource.directory(repo / golden_rel)
    else:
        source = GoldenSource.committed(repo, goldens_at, golden_rel)
    return RunSpec(
        repo,
        cwd_rel,
        golden_rel,
        source,
        pytest_args=in_tree(repo, cwd_rel, tuple(args.pytest_args)),
        any_failure=getattr(args, "any_failure", False),
        timeout=args.timeout,
        pythonpath=tuple(args.pythonpath),
    )


def _commit_cache(args: argparse.Namespace) -> Any:
    """The cache of results of commits tried (``None`` with ``--no-cache``)."""
    from ._internal.commits.cache import Cache

    return None if args.no_cache else Cache(args.cache_dir)


def _import_epilog() -> str:
    """The files each layout reads, for ``rollout-golden import -h``."""
    from .dumps import PATTERNS

    lines = ["files each --layout reads (under the dump folder, at any depth):"]
    for layout, patterns in PATTERNS.items():
        lines.append(f"  {layout}:")
        lines += [f"    {pattern}" for pattern in patterns]
    lines.append("every other file is listed as skipped, with the reason")
    return "\n".join(lines)


_FLAGS = ("--tolerance", "--ignore")


def _tolerances(args: argparse.Namespace, paths: Sequence[Path]) -> tuple[Stack, str]:
    """The stack pytest resolves (``session_tolerances``, one builder for both), with
    --tolerance/--ignore in place of pytest's flags, over the ini values of the project
    holding ``paths`` (or ``--config``): ``golden_tolerances``, ``golden_ignore``,
    ``golden_precision``, ``golden_metric_profile``; and that file (``""``: none).
    ValueError for a bad --tolerance/--ignore (usage), GoldenError naming the file for a bad
    ini value."""
    from ._internal.pytest_plugin.options import session_tolerances

    config, options = _project_ini(args, paths)
    ini = (
        _ini_value(options, "golden_tolerances", linelist=True),
        _ini_value(options, "golden_ignore", linelist=True),
        _ini_value(options, "golden_metric_profile"),
        _ini_value(options, "golden_precision"),
    )
    session_tolerances(args.tolerance, args.ignore, [], [], flags=_FLAGS)  # ValueError: usage
    try:
        stack = session_tolerances(args.tolerance, args.ignore, *ini, flags=_FLAGS)
    except ValueError as exc:  # the command line's own layers are valid: the ini's mistake
        raise GoldenError(f"{config}: {exc}") from None
    return stack.replace(exact=args.exact), config


def _project_ini(args: argparse.Namespace, paths: Sequence[Path]) -> tuple[str, Mapping[str, Any]]:
    """``(the pytest configuration file, its options)`` of the project holding ``paths``, or
    ``--config``; ``("", {})`` with ``--no-config`` or none found."""
    if args.no_config:
        return "", {}
    from ._internal.pytest_plugin.projectini import find_config

    path, options = find_config([args.config] if args.config else [p for p in paths if p])
    if args.config and path is None:
        raise GoldenError(f"{args.config}: not a pytest configuration file")
    return ("", {}) if path is None else (str(path), options)


def _ini_value(options: Mapping[str, Any], name: str, *, linelist: bool = False) -> Any:
    """Ini option ``name`` as pytest's ``config.getini`` gives it: a list of lines
    (``linelist``), else a string (``""`` when absent)."""
    from ._internal.pytest_plugin.projectini import linelist as lines

    return lines(options.get(name)) if linelist else str(options.get(name) or "")


def _parser() -> argparse.ArgumentParser:
    """The command line: one subcommand per verb, each option with its help."""
    parser = argparse.ArgumentParser(prog="rollout-golden", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_verify = sub.add_parser("verify", help="check every checksum of every golden under PATHs")
    p_verify.add_argument("paths", nargs="*", type=Path, default=[Path("golden")])
    p_show = sub.add_parser("show", help="print a golden directory or a .safetensors batch")
    p_show.add_argument("path", type=Path)
    p_show.add_argument("--json", action="store_true", help="machine-readable output")
    p_show.add_argument(
        "--lane", metavar="NAME", help="that lane's values (metrics, tensors) with the inputs"
    )
    p_plot = sub.add_parser(
        "plot", help="draw metric curves of golden A (against B) to a PNG (goldens or roots)"
    )
    p_plot.add_argument("a", type=Path)
    p_plot.add_argument("b", type=Path, nargs="?")
    p_plot.add_argument(
        "-o",
        "--output",
        type=Path,
        required=True,
        help="PNG file to write; given golden roots, the directory to write one PNG per golden",
    )
    from .dumps import LAYOUTS

    p_import = sub.add_parser(
        "import",
        help="convert verl/ROLL/NexRL/AReaL/NeMo-RL/slime dumps into a golden directory",
        description="Convert a folder of framework dumps into a golden directory. JSON-lines "
        "logs are read with json only. Pickles and torch.save files are loaded with "
        "torch.load(weights_only=True) when that suffices; anything else needs --trust-pickle, "
        "because unpickling runs code named in the file.",
        epilog=_import_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p_import.add_argument("source", type=Path, help="the dump folder")
    p_import.add_argument("-o", "--output", type=Path, required=True, help="golden to write")
    p_import.add_argument("--layout", choices=tuple(LAYOUTS))
    p_import.add_argument("--name", default="rollout", help="rollout name (golden.rollout(name=))")
    p_import.add_argument("--test", help="test id recorded in the manifest")
    p_import.add_argument(
        "--trust-pickle",
        action="store_true",
        help="allow full unpickling of dumps that need it (runs code from the files)",
    )
    p_diff = sub.add_parser(
        "diff",
        help="compare B against A (goldens, golden roots or batch files; GOLDEN@LANE: a lane)",
    )
    p_diff.add_argument("a", type=Path, help="golden, root or batch file; GOLDEN@LANE: a lane")
    p_diff.add_argument("b", type=Path, help="the same kind of path as A")
    tolerance_arguments(p_diff)
    _compare_parser(sub)
    _bisect_parser(sub)
    _history_parser(sub)
    return parser


def tolerance_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of a verb that diffs goldens: tolerances, ``--json``, the ini to read."""
    parser.add_argument("--tolerance", action="append", default=[], metavar="M:rtol=R,atol=A")
    parser.add_argument(
        "--ignore", action="append", default=[], metavar="NAME", help="do not compare (glob)"
    )
    parser.add_argument("--exact", action="store_true", help="demand bit equality")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument(
        "--config",
        type=Path,
        help="pytest configuration file to read golden_tolerances, golden_ignore, "
        "golden_precision and golden_metric_profile from",
    )
    parser.add_argument(
        "--no-config", action="store_true", help="ignore the project's pytest configuration"
    )


def _commit_run_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of a verb that runs the tests at other commits (``-- PYTEST_ARGS`` after
    them: :func:`_split_pytest_args`)."""
    parser.add_argument(
        "--goldens",
        metavar="SOURCE",
        help="where the recorded inputs come from: an existing folder, else a git ref (its "
        "committed golden folder)",
    )
    parser.add_argument(
        "--golden-root",
        type=Path,
        default=Path("golden"),
        metavar="DIR",
        help="the project's golden folder (default: golden, under the current directory)",
    )
    parser.add_argument("--jobs", type=int, default=1, metavar="N", help="commits run at once")
    parser.add_argument("--timeout", type=float, metavar="S", help="seconds per pytest run")
    parser.add_argument(
        "--pythonpath",
        action="append",
        default=[],
        metavar="DIR",
        help="one more import folder (relative: in the checkout), after the checkout's top "
        "and its src/",
    )


def _compare_parser(sub: Any) -> None:
    p_compare = sub.add_parser(
        "compare",
        help="run the selected tests at git refs A and B on the same goldens; diff the values",
        usage="rollout-golden compare A B [options] -- [PYTEST_ARGS ...]",
        description="Run the tests after -- at git refs A and B, each in a temporary checkout "
        "with --update-golden on its own copy of the same goldens, and diff B's values against "
        "A's per golden, step and metric. The checkout you run it in is never written.",
    )
    p_compare.add_argument("a", metavar="A", help="git ref: branch, tag, commit hash, HEAD~3")
    p_compare.add_argument("b", metavar="B", help="git ref")
    for side in "ab":
        p_compare.add_argument(
            f"--python-{side}",
            metavar="PYTHON",
            help=f"the interpreter (a virtual environment's python) {side.upper()} runs in; "
            "either one: replay both sides on the goldens committed at A and print which tests "
            "pass in A and fail in B (default: the python running this command)",
        )
    _commit_run_arguments(p_compare)
    tolerance_arguments(p_compare)


def _split_pytest_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """``compare`` / ``bisect``: what follows the first ``--`` goes to pytest."""
    if argv[:1] in (["compare"], ["bisect"]) and "--" in argv:
        cut = argv.index("--")
        return argv[:cut], argv[cut + 1 :]
    return argv, []


def compare_commits(args: argparse.Namespace, tolerances: Stack) -> int:
    """Run the tests at refs A and B on the same goldens; print the diff (0 same, 1 differs)."""
    from ._internal.commits.compare import compare
    from ._internal.report.commits import compare_lines

    if args.python_a is not None or args.python_b is not None:
        return triage_environments(args)
    spec = _run_spec(args, goldens_at=None)
    result = compare(spec, args.a, args.b, tolerances, jobs=args.jobs)
    if args.json:
        print(json.dumps(result.to_json(), indent=2, allow_nan=False))
    else:
        print("\n".join(compare_lines(result)))
    return 1 if result.differs else 0


def history_command(args: argparse.Namespace, tolerances: Stack | None, config: str) -> int:
    """``rollout-golden history DIR list | show | compare | changes`` (:mod:`.history`)."""
    from ._internal.history import commands

    if args.history_command == "list":
        return commands.list_runs(args.folder)
    if args.history_command == "show":
        return commands.show_test(args.folder, args.test, metric=args.metric, plot=args.plot)
    if args.history_command == "changes":
        from ._internal.history.changes import changes_command

        return changes_command(args.folder, test=args.test, metric=args.metric,
                               false_alarm_rate=args.false_alarm_rate, plot=args.plot)  # fmt: skip
    diffs, sides = commands.compare_runs(args.folder, args.a, args.b, tolerances)
    return print_diffs(diffs, *sides, as_json=args.json, config=config)


def _history_parser(sub: Any) -> None:
    """``rollout-golden history``'s verbs and options."""
    from ._internal.history.changes import add_parser as add_changes_parser

    p_history = sub.add_parser(
        "history",
        help="the run history of --golden-history DIR: list runs, show a test, compare two runs",
        description="Read the run history pytest --golden-history DIR appends to.",
    )
    p_history.add_argument("folder", type=Path, metavar="DIR", help="the history folder")
    verbs = p_history.add_subparsers(dest="history_command", required=True)
    verbs.add_parser("list", help="one line per run: time, commit, lane, goldens passed, failed")
    p_show = verbs.add_parser("show", help="one test's distances across runs")
    p_show.add_argument("test", help="its test id, or a part naming one test")
    p_show.add_argument("--metric", metavar="M", help="only this metric")
    p_show.add_argument("--plot", type=Path, metavar="PNG", help="also draw the series to a PNG")
    p_compare = verbs.add_parser(
        "compare", help="diff's table of run B's values against run A's (-1: the newest)"
    )
    p_compare.add_argument("a", metavar="RUN")
    p_compare.add_argument("b", metavar="RUN")
    tolerance_arguments(p_compare)
    add_changes_parser(verbs)


# compare's options that only its diff reads (option: attribute)
_DIFF_ONLY = {
    "--tolerance": "tolerance",
    "--ignore": "ignore",
    "--exact": "exact",
    "--config": "config",
    "--no-config": "no_config",
}


def triage_environments(args: argparse.Namespace) -> int:
    """``compare --python-a/--python-b``: replay both sides on the goldens committed at A and
    print which tests pass in A and fail in B (1: some do, 0: none)."""
    from ._internal.commits.triage import triage
    from ._internal.report.commits import triage_lines

    given = [o for o, v in _DIFF_ONLY.items() if getattr(args, v)]
    if given:  # ignored silently, a --tolerance would seem to loosen the gate
        raise GoldenError(
            f"{', '.join(given)}: options of the diff of re-recorded values; with --python-a "
            "or --python-b each side replays judged by the project's own tolerances. Leave "
            "them out, or give pytest options after -- (e.g. -- -o golden_tolerances=...)"
        )
    python = (args.python_a or sys.executable, args.python_b or sys.executable)
    spec = _run_spec(args, goldens_at=args.a)
    result = triage(spec, args.a, args.b, python, jobs=args.jobs)
    if args.json:
        print(json.dumps(result.to_json(), indent=2, allow_nan=False))
    else:
        print("\n".join(triage_lines(result)))
    return 1 if result.regressed else 0


def _bisect_parser(sub: Any) -> None:
    """``rollout-golden bisect``'s options."""
    p_bisect = sub.add_parser(
        "bisect",
        help="find the first commit between --good and --bad whose replay fails",
        usage="rollout-golden bisect --good REF --bad REF [options] [-- PYTEST_ARGS ...]",
        description="Replay the selected tests (PYTEST_ARGS after --) at the commits between "
        "--good and --bad, each in a temporary checkout on the goldens committed at --good, "
        "and print the first bad commit, its first divergence and the commits tried. The "
        "checkout you run it in is only read.",
    )
    p_bisect.add_argument("--good", required=True, metavar="REF", help="a commit that passes")
    p_bisect.add_argument("--bad", required=True, metavar="REF", help="a commit that fails")
    p_bisect.add_argument(
        "--any-failure",
        action="store_true",
        help="a commit is bad when any test fails, not only on the plugin's verdict",
    )
    p_bisect.add_argument(
        "--check-ends",
        action="store_true",
        help="replay --good and --bad too, and stop unless they replay good and bad",
    )
    _commit_run_arguments(p_bisect)
    p_bisect.add_argument("--json", action="store_true", help="machine-readable output")
    p_bisect.add_argument(
        "--plot",
        type=Path,
        metavar="PNG",
        help="also draw the commits tried, in order, at their place in the history",
    )
    p_bisect.add_argument(
        "--no-cache", action="store_true", help="run every commit, store no result"
    )
    p_bisect.add_argument(
        "--cache-dir",
        type=Path,
        metavar="DIR",
        help="where results of commits are kept "
        "(default: $XDG_CACHE_HOME/pytest-rollout-golden/commits)",
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    argv, pytest_args = _split_pytest_args(list(sys.argv[1:] if argv is None else argv))
    args = parser.parse_args(argv)
    args.pytest_args = pytest_args
    try:
        if args.command == "bisect":
            return bisect_command(args)
        if args.command == "verify":
            return verify(args.paths)
        if args.command == "show":
            return show(args.path, as_json=args.json, lane=args.lane)
        if args.command == "import":
            return import_dumps(args)
        if args.command == "plot":
            args.tolerance, args.ignore, args.exact, args.config = [], [], False, None
            args.no_config = False
            tolerances, _ = _tolerances(args, [args.a, args.b])
            return plot(args.a, args.b, args.output, tolerances)
        if args.command == "history" and args.history_command != "compare":
            return history_command(args, None, "")
        if args.command in ("compare", "history"):
            paths = [Path.cwd() if args.command == "compare" else args.folder]
        else:
            paths = [args.a, args.b]
        try:
            tolerances, config = _tolerances(args, paths)
        except ValueError as exc:
            parser.error(str(exc))
        if args.command == "compare":
            return compare_commits(args, tolerances)
        if args.command == "history":
            return history_command(args, tolerances, config)
        return diff(args.a, args.b, tolerances, as_json=args.json, config=config)
    except (GoldenError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # the temporary checkouts and their runs are gone already
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
