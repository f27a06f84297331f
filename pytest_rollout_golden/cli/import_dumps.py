"""``rollout-golden import``: a folder of verl/ROLL/NexRL/AReaL/NeMo-RL/slime dumps
converted into a golden directory."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .._internal.wording import plural
from ..dumps import LAYOUTS, PATTERNS, convert


def add_parser(sub: Any) -> None:
    """``rollout-golden import``'s arguments, and the files each layout reads as its epilog."""
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


def import_dumps(args: argparse.Namespace) -> int:
    """Convert a folder of framework dumps into a golden directory."""
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


def _import_epilog() -> str:
    """The files each layout reads, for ``rollout-golden import -h``."""
    lines = ["files each --layout reads (under the dump folder, at any depth):"]
    for layout, patterns in PATTERNS.items():
        lines.append(f"  {layout}:")
        lines += [f"    {pattern}" for pattern in patterns]
    lines.append("every other file is listed as skipped, with the reason")
    return "\n".join(lines)
