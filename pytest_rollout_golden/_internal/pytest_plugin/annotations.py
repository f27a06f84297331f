"""GitHub Actions annotations for failed goldens (``::error file=...``), pointing at the
test's line in the checkout.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..golden.messages import allowed, beyond, by_step
from ..results import Comparison, Outcome, Status, Verdict
from ..wording import number, steps, where

ANNOTATION_TITLE = "golden mismatch"


def github_command(command: str, message: str, **properties: Any) -> str:
    """A GitHub Actions workflow command (``::error file=F,line=N::message``), escaped as the
    runner reads one: ``%``, CR and LF in the message, ``:`` and ``,`` too in properties."""
    props = ",".join(f"{k}={_escape(str(v), in_property=True)}" for k, v in properties.items())
    return f"::{command} {props}::{_escape(message)}"


def _escape(text: str, *, in_property: bool = False) -> str:
    text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    return text.replace(":", "%3A").replace(",", "%2C") if in_property else text


def github_annotations(
    outcomes: Iterable[Outcome],
    locations: Mapping[str, tuple[str, int]],
    rootdir: Path,
    workspace: str | None,
) -> list[str]:
    """An error annotation per failed value of each failed golden (metric, tensor, bound,
    trend: at its first step beyond, with the others), on its test's line (``locations``:
    test id -> pytest's file relative to ``rootdir`` and 0-based line), the file named
    relative to the checkout (``workspace``, ``GITHUB_WORKSPACE``) where it lies in it."""
    lines = []
    for o in outcomes:
        if o.status is not Status.FAILED:
            continue
        failed: dict[tuple[str, str], list[Comparison]] = {}
        for c in by_step(o.comparisons):
            if c.verdict in (Verdict.FAIL, Verdict.MISSING):
                failed.setdefault((c.kind, c.name), []).append(c)
        place = {}
        if o.test in locations:
            path, line = locations[o.test]
            place = {"file": _checkout_path(rootdir / path, workspace) or path, "line": line + 1}
        for found in failed.values():
            message = f"{o.test}: {_annotated(found)}"
            lines.append(github_command("error", message, **place, title=ANNOTATION_TITLE))
    return lines


def _annotated(found: list[Comparison]) -> str:
    """One failed value in an annotation: its first step beyond tolerance, then where else."""
    c = found[0]
    if c.verdict == Verdict.FAIL and c.kind == "metric":
        text = (
            f"{c.name} {where(c)}: expected {number(c.expected)}, actual {number(c.actual)}, "
            f"{beyond(c)} beyond tolerance, allowed {allowed(c)}"
        )
    else:
        text = f"{c.kind} {c.name} {where(c)}: {(c.detail or c.verdict.value).splitlines()[0]}"
    more = {f.step for f in found}
    return text + (f"; beyond at {steps(more)}" if len(more) > 1 else "")


def _checkout_path(path: Path, workspace: str | None) -> str | None:
    """``path`` relative to the checkout ``workspace``, in ``/`` form; ``None`` outside it."""
    if not workspace:
        return None
    try:
        return path.resolve().relative_to(Path(workspace).resolve()).as_posix()
    except ValueError:
        return None
