"""``rollout-golden show``: a golden (structure, lanes, steps x metrics, per-tensor
statistics, what each gate can detect) or one batch file, as tables or JSON.

numpy is imported where a non-tensor array's dtype is named, so that the command line
starts without it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from .._internal.golden.golden_files import load_golden
from .._internal.golden.sensitivity import gate_lines
from .._internal.report.diff_text import lane_inputs_changed
from .._internal.report.show_document import (
    SHOW_HEADER,
    batch_file_document,
    directory_gates,
    envelope_lines,
    golden_document,
    tolerance_lines,
)
from .._internal.tolerance.trends import session_trends
from .._internal.wording import location, number, plural, table
from ..errors import GoldenError
from ..store.location import LANES
from .arguments import ini_value, project_ini, tolerances
from .tables import metric_cell


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
        document, files = batch_file_document(path)
    else:
        manifest, steps, document, files = golden_document(path, lane)
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
        *tolerance_lines(document.get("tolerances")),
        *envelope_lines(document.get("envelope")),
    ]:
        print(line)
    if steps and lane is None:
        for line in _sensitivity_lines(path):
            print(line)
    return 0


def _sensitivity_lines(path: Path) -> list[str]:
    """``show``'s section of what each gate of the golden in ``path`` can detect
    (:mod:`~pytest_rollout_golden._internal.golden.sensitivity`), under the tolerances and
    trend bounds of the project's ini, as ``pytest --golden-sensitivity`` probes them."""
    found = argparse.Namespace(tolerance=[], ignore=[], config=None, no_config=False, exact=False)
    stack, _ = tolerances(found, [path])
    _, options = project_ini(found, [path])
    trends = session_trends(None, [], ini_value(options, "golden_trends", linelist=True))
    gates = directory_gates(path, load_golden(path)[1], stack, trends)
    return [SHOW_HEADER, *gate_lines(gates)]


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
