"""``rollout-golden verify``: every checksum of every golden under the paths, and of each lane."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .. import store
from .._internal.golden.golden_files import load_golden
from .._internal.golden.lanes import input_digests, lane_link, stale_inputs
from .._internal.golden.messages import lane_linked, manifestless
from .._internal.report.diff_text import lane_inputs_changed
from .._internal.tolerance.envelope import DRIFTING
from .._internal.wording import plural
from ..errors import GoldenError
from ..store.location import (
    ENVELOPE,
    LANE_NAME,
    LANES,
    MANIFEST,
    files_without_manifest,
    find_goldens,
    find_manifestless,
)
from .tables import not_a_lane, verify_row, verify_totals


def add_parser(sub: Any) -> None:
    """``rollout-golden verify``'s arguments."""
    p_verify = sub.add_parser("verify", help="check every checksum of every golden under PATHs")
    p_verify.add_argument("paths", nargs="*", type=Path, default=[Path("golden")])


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
        files = load_golden(directory)[1]
    except (GoldenError, OSError) as exc:
        return "FAIL", f": {exc}"
    except Exception as exc:  # a file this version cannot read: say so, check the rest
        return "ERROR", f": could not be checked ({type(exc).__name__}: {exc})"
    return "ok", f" ({what}{plural(len(files), 'file')}{_not_compared(files.get(ENVELOPE))})"


def _not_compared(envelope: Any) -> str:
    """What ``verify`` says of the metrics a checked ``envelope.json`` takes out of every
    variant's comparison (``layout_drifting``): a gate calibration may open is named where
    the golden is checked, never silently."""
    drifting = envelope.get(DRIFTING) if isinstance(envelope, dict) else None
    if not drifting:
        return ""
    names = ", ".join(f"{n} ({e['widest']:g}x)" for n, e in sorted(drifting.items()))
    return f"; not comparable across variants ({ENVELOPE}): {names}"


def _verify_lanes(directory: Path) -> list[tuple[str, str, Path, bool]]:
    """``verify``'s rows of the entries of a golden's ``@lanes/``: ``(status, message,
    path, whether it is a lane)``. Hidden entries (a lane's lock, its staged update) are the
    lane's, checked with it."""
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
