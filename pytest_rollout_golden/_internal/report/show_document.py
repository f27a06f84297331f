"""What ``rollout-golden show`` says of a golden or a batch file, as a JSON document and as
lines: its metrics, tensor statistics, non-tensor values, lanes, calibrated tolerances, envelope
and what each gate can detect (:func:`directory_gates`). The CLI prints them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ... import store
from ...errors import GoldenError
from ...store import codec
from ...store.location import ENVELOPE, MANIFEST, METRICS, TOLERANCES
from ..golden import keyed, metric_codec
from ..golden.golden_files import load_golden, read_envelope
from ..golden.lanes import golden_lanes, input_digests, lane_values
from ..golden.sensitivity import Gate, golden_gates
from ..results import json_number
from ..tolerance import calibration, envelope
from ..tolerance.build import Declared, Recorded, build
from ..tolerance.spec import Tolerance
from ..tolerance.trends import TrendBounds
from ..wording import plural
from .diff import calibrated_layer
from .stats import tensor_stats


def directory_gates(
    directory: Any, content: Mapping[str, Any], stack: Any, trends: TrendBounds
) -> list[Gate]:
    """The gates of the golden in ``directory`` (``content``: its files, as loaded) under
    ``stack`` (a :class:`..tolerance.stack.Stack` of the project's session-wide layers), with
    its calibrated ``tolerances.json`` and its envelope's band at each step, as replay
    resolves them (what ``rollout-golden show`` prints)."""
    steps = (content.get(METRICS) or {}).get("steps", {})
    calibrated = calibrated_layer(content.get(TOLERANCES), Path(directory) / TOLERANCES,
                             content.get(METRICS))  # fmt: skip
    built = build(Declared(stack), Recorded(calibrated, envelope=read_envelope(Path(directory))))

    def tolerance_at(name: str, step: int, dtypes: tuple[str, str]) -> tuple[Tolerance, str]:
        return built.at(step).resolve(name, dtypes)

    return golden_gates(steps, tolerance_at, trends=trends, envelope=built.envelope)


SHOW_HEADER = (
    "sensitivity (the project's ini tolerances and the golden's calibrated files; a test's "
    "marker and check(tolerances=) apply under pytest --golden-sensitivity):"
)


def tolerance_lines(content: Mapping[str, Any] | None) -> list[str]:
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


def envelope_summary(content: Any) -> dict[str, Any] | None:
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
    """One metric's entry of :func:`envelope_summary`: with the fewest distinct runs at a
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


def envelope_lines(summary: Mapping[str, Any] | None) -> list[str]:
    """``show``'s lines of a golden's envelope (:func:`envelope_summary`)."""
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


def batch_file_document(path: Path) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
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


def golden_document(
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
        "envelope": envelope_summary(content.get(ENVELOPE)),
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
