"""``rollout-golden diff``: B against A (goldens, golden roots, batch files or lanes) under
the plugin's comparison and tolerance rules, as tables or JSON."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .._internal.report.diff import diff_paths, summary
from .._internal.report.diff_text import diff_summary, golden_diff_lines
from .._internal.tolerance.stack import Stack
from .arguments import tolerance_arguments


def add_parser(sub: Any) -> None:
    """``rollout-golden diff``'s arguments."""
    p_diff = sub.add_parser(
        "diff",
        help="compare B against A (goldens, golden roots or batch files; GOLDEN@LANE: a lane)",
    )
    p_diff.add_argument("a", type=Path, help="golden, root or batch file; GOLDEN@LANE: a lane")
    p_diff.add_argument("b", type=Path, help="the same kind of path as A")
    tolerance_arguments(p_diff)


def diff(a: Path, b: Path, tolerances: Stack, *, as_json: bool = False, config: str = "") -> int:
    """Compare B against A; print a table (or JSON); exit status 0 same, 1 differs."""
    return print_diffs(diff_paths(a, b, tolerances), str(a), str(b), as_json=as_json, config=config)


def print_diffs(
    diffs: Sequence[Any], a: str, b: str, *, as_json: bool = False, config: str = ""
) -> int:
    """Print ``diff``'s report of ``diffs`` (B against A) as tables or JSON; 0 same, 1 differs."""
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
