"""``rollout-golden show``: a golden (structure, lanes, steps x metrics, per-tensor
statistics, what each gate can detect) or one batch file, as tables or JSON.

numpy is imported where a non-tensor array's dtype is named, so that the command line
starts without it.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .. import store
from .._internal.golden import keyed, metric_codec
from .._internal.golden.files import load_golden
from .._internal.golden.lanes import golden_lanes, input_digests, lane_values
from .._internal.golden.results import json_number
from .._internal.report.presentation import (
    lane_inputs_changed,
    location,
    metric_cell,
    number,
    plural,
    table,
)
from .._internal.report.sensitivity import SHOW_HEADER, directory_gates, gate_lines
from .._internal.report.stats import tensor_stats
from .._internal.tolerance import calibration, envelope
from .._internal.tolerance.spec import Tolerance
from .._internal.tolerance.trends import session_trends
from ..errors import GoldenError
from ..store import codec
from ..store.location import ENVELOPE, LANES, MANIFEST, METRICS, TOLERANCES
from .arguments import ini_value, project_ini, tolerances


def add_parser(sub: Any) -> None:
    """``rollout-golden show``'s arguments."""
    p_show = sub.add_parser("show", help="print a golden directory or a .safetensors batch")
    p_show.add_argument("path", type=Path)
    p_show.add_argument("--json", action="store_true", help="machine-readable output")
    p_show.add_argument(
        "--lane", metavar="NAME", help="that lane's values (metrics, tensors) with the inputs"
    )


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
    (:mod:`~pytest_rollout_golden._internal.report.sensitivity`), under the tolerances and
    trend bounds of the project's ini, as ``pytest --golden-sensitivity`` probes them."""
    found = argparse.Namespace(tolerance=[], ignore=[], config=None, no_config=False, exact=False)
    stack, _ = tolerances(found, [path])
    _, options = project_ini(found, [path])
    trends = session_trends(None, [], ini_value(options, "golden_trends", linelist=True))
    gates = directory_gates(path, load_golden(path)[1], stack, trends)
    return [SHOW_HEADER, *gate_lines(gates)]


def _tolerance_lines(content: Mapping[str, Any] | None) -> list[str]:
    """``show``'s lines of a golden's ``tolerances.json``: each lane's entries (``same
    layout``: the runs of the tests that record the golden; ``across variants``: the variant
    lane), a lane the file lacks left out, one that kept every default said so."""
    if not content:
        return []
    lines = [f"calibrated tolerances ({TOLERANCES}):"]
    for lane, (section, *_) in calibration.LANES.items():
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
    if not isinstance(content, dict):
        return None
    how = content.get("how", {})
    lanes = {
        lane: {name: _band_summary(band) for name, band in sorted(content[section].items())}
        for lane, section in envelope.LANES.items()
        if section in content
    }
    drifting = {
        name: {"widest": entry.get("widest")}
        for name, entry in sorted(content.get(envelope.DRIFTING, {}).items())
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
    steps = band["steps"]
    counts = [c for c in band.get("distinct") or () if c]
    return {
        "distinct": min(counts, default=None),
        "margin": envelope.margin(min(counts)) if counts else None,
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

    return json_number(value) if value is not None else node
