"""``rollout-golden history DIR``: the runs ``pytest --golden-history DIR`` appended: list
them, show one test's series, compare two runs, find the change points."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .._internal.history import commands
from .._internal.history.changes import add_parser as add_changes_parser, changes_command
from .._internal.tolerance.stack import Stack
from .arguments import tolerance_arguments
from .diff import print_diffs


def history_command(args: argparse.Namespace, tolerances: Stack | None, config: str) -> int:
    """``rollout-golden history DIR list | show | compare | changes``
    (:mod:`~pytest_rollout_golden._internal.history`)."""
    if args.history_command == "list":
        return commands.list_runs(args.folder)
    if args.history_command == "show":
        return commands.show_test(args.folder, args.test, metric=args.metric, plot=args.plot)
    if args.history_command == "changes":
        return changes_command(args.folder, test=args.test, metric=args.metric,
                               false_alarm_rate=args.false_alarm_rate, plot=args.plot)  # fmt: skip
    diffs, sides = commands.compare_runs(args.folder, args.a, args.b, tolerances)
    return print_diffs(diffs, *sides, as_json=args.json, config=config)


def add_parser(sub: Any) -> None:
    """``rollout-golden history``'s verbs and options."""
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
