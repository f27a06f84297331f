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

One module per verb (its ``add_parser`` and what it runs); :mod:`.arguments` holds the
options and the tolerance loading several verbs share. This module assembles the parser and
dispatches.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from ..errors import GoldenError
from . import bisect, compare, diff, history, import_dumps, plot, show, verify
from .arguments import split_pytest_args, tolerances

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    """The command line: one subcommand per verb, each option with its help."""
    parser = argparse.ArgumentParser(prog="rollout-golden", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for verb in (verify, show, plot, import_dumps, diff, compare, bisect, history):
        verb.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``rollout-golden`` with ``argv`` (default: the process's); the exit status."""
    parser = _parser()
    argv, pytest_args = split_pytest_args(list(sys.argv[1:] if argv is None else argv))
    args = parser.parse_args(argv)
    args.pytest_args = pytest_args
    try:
        if args.command == "bisect":
            return bisect.bisect_command(args)
        if args.command == "verify":
            return verify.verify(args.paths)
        if args.command == "show":
            return show.show(args.path, as_json=args.json, lane=args.lane)
        if args.command == "import":
            return import_dumps.import_dumps(args)
        if args.command == "plot":
            args.tolerance, args.ignore, args.exact, args.config = [], [], False, None
            args.no_config = False
            stack, _ = tolerances(args, [args.a, args.b])
            return plot.plot(args.a, args.b, args.output, stack)
        if args.command == "history" and args.history_command != "compare":
            return history.history_command(args, None, "")
        if args.command in ("compare", "history"):
            paths = [Path.cwd() if args.command == "compare" else args.folder]
        else:
            paths = [args.a, args.b]
        try:
            stack, config = tolerances(args, paths)
        except ValueError as exc:
            parser.error(str(exc))
        if args.command == "compare":
            return compare.compare_commits(args, stack)
        if args.command == "history":
            return history.history_command(args, stack, config)
        return diff.diff(args.a, args.b, stack, as_json=args.json, config=config)
    except (GoldenError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # the temporary checkouts and their runs are gone already
        print("interrupted", file=sys.stderr)
        return 130
