"""The precision manifest of ``golden.check_precision``: recorded as ``precision-<name>.json``
and compared parameter by parameter on replay; its audits (substring matches, sensitive layers
quantized, sides that must agree) hold in every mode, recorded or not.

=====================  ==========================================================
what                   verdict
=====================  ==========================================================
an audit finds         fail, one line per problem (kind ``precision audit``)
recorded, same         pass
recorded, changed      fail, naming each parameter, both sides then and now and
                       the rules that decided them (kind ``precision manifest``)
not recorded           new (recorded when the test ends), or missing in strict mode
``--update-golden``    updated
=====================  ==========================================================
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ...store.location import precision_filename
from ..results import Comparison, Verdict
from .messages import PRECISION_KINDS

MANIFEST_KIND, AUDIT_KIND = PRECISION_KINDS
PREFIX = "precision/"


@dataclass(frozen=True)
class Lane:
    """What the lane needs of an opened golden: its values' files, the files this run used
    (shared, it adds the manifest's), the mode policy and the remedy its messages name."""

    files: Any
    touched: set[str]
    policy: Any
    remedy: str


def comparisons(
    name: str,
    trainer: Any,
    engine: Any,
    *,
    rules: Any,
    declared: Sequence[str],
    same: bool,
    golden: Lane,
) -> list[Comparison]:
    """The audits' and the manifest's verdicts for one call of ``check_precision`` on the
    opened golden ``golden``, staging the manifest where it records."""
    from ...quant import manifest

    if isinstance(declared, str):
        raise TypeError(f"check_precision(declared=) takes a list of patterns, got {declared!r}")
    filename = precision_filename(name)
    if filename in golden.touched:
        raise ValueError(f"check_precision(name={name!r}) was already called in this test")
    golden.touched.add(filename)
    found = manifest.build(trainer, engine, rules=rules, declared=declared, same=same)
    label = PREFIX + name
    out = [
        Comparison(label, 0, Verdict.FAIL, kind=AUDIT_KIND, detail=f"{label}: {problem}")
        for problem in found.problems
    ]
    return [*out, _manifest(golden, label, filename, found)]


def _manifest(golden: Lane, label: str, filename: str, found: Any) -> Comparison:
    """The manifest against the recorded one: pass, fail (what changed), new or updated."""
    from ...quant.manifest import changes

    files, policy = golden.files, golden.policy
    count = f"{len(found.layers)} parameters"
    recorded = files.recorded.get(filename)
    if recorded is not None and not policy.rerecords:
        moved = changes(files.load(filename), found)
        if not moved:
            return Comparison(label, 0, Verdict.PASS, kind=MANIFEST_KIND, detail=count)
        lines = [f"{label}: {len(moved)} of {count} changed precision since recorded:"]
        lines += ["    " + line for line in moved]
        return Comparison(label, 0, Verdict.FAIL, kind=MANIFEST_KIND, detail="\n".join(lines))
    verdict = Verdict.UPDATED if policy.rerecords else policy.unrecorded
    if verdict == Verdict.MISSING:
        detail = f"{label}: the golden holds no precision manifest {filename}; {golden.remedy}"
        return Comparison(label, 0, verdict, kind=MANIFEST_KIND, detail=detail)
    files.stage_json(filename, found.to_json(), kind="precision", name=label)
    if verdict == Verdict.UPDATED and recorded is not None:
        moved = changes(files.load(filename, damaged={}), found)
        count = f"{len(moved)} of {count} changed precision" if moved else f"unchanged ({count})"
    return Comparison(label, 0, verdict, kind=MANIFEST_KIND, detail=count)


def unchecked(recorded: dict[str, Any], touched: set[str]) -> list[Comparison]:
    """A missing comparison per recorded precision manifest this run did not check."""
    return [
        Comparison(
            info["name"],
            0,
            Verdict.MISSING,
            kind=MANIFEST_KIND,
            detail="recorded but check_precision was not called; call it, or drop the "
            "manifest with `pytest --update-golden`",
        )
        for filename, info in recorded.items()
        if info.get("kind") == "precision" and filename not in touched
    ]
