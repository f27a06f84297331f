"""``rollout-golden bisect``: the first commit between ``--good`` and ``--bad`` whose replay
of the selected tests fails."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

# Called through its module: tests/project/doc_figures.py records what is drawn there.
from .._internal.commits import timeline
from .._internal.commits.bisect import BisectOptions, bisect
from .._internal.commits.cache import Cache
from .._internal.commits.text import bisect_lines, bisect_plan, bisect_progress
from .._internal.report.plot import figure_classes
from ..errors import GoldenError
from .arguments import commit_run_arguments, run_spec


def bisect_command(args: argparse.Namespace) -> int:
    """Search the commits between ``--good`` and ``--bad`` for the first one whose replay of
    the selected tests fails; 0 found, 1 ambiguous (skipped commits border it)."""
    if args.jobs < 1:
        raise GoldenError(f"--jobs {args.jobs}: give at least 1")
    if args.plot is not None:
        figure_classes()  # without matplotlib: say so before replaying any commit
    spec = run_spec(args, goldens_at=args.good)

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    options = BisectOptions(
        good=args.good,
        bad=args.bad,
        jobs=args.jobs,
        cache=_commit_cache(args),
        check_ends=args.check_ends,
        on_plan=lambda good, bad, count: progress(
            bisect_plan(good, bad, count, spec.goldens.describe())
        ),
        on_run=lambda tried, run: progress(bisect_progress(tried, run)),
    )
    result = bisect(spec, options)
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        print("\n".join(bisect_lines(result)))
    if args.plot is not None:
        progress(f"bisect: wrote {timeline.plot_bisect(result, args.plot)}")
    return 0 if result.first_bad is not None else 1


def _commit_cache(args: argparse.Namespace) -> Cache | None:
    """The cache of results of commits tried (``None`` with ``--no-cache``)."""
    return None if args.no_cache else Cache(args.cache_dir)


def add_parser(sub: Any) -> None:
    """``rollout-golden bisect``'s options."""
    p_bisect = sub.add_parser(
        "bisect",
        help="find the first commit between --good and --bad whose replay fails",
        usage="rollout-golden bisect --good REF --bad REF [options] [-- PYTEST_ARGS ...]",
        description="Replay the selected tests (PYTEST_ARGS after --) at the commits between "
        "--good and --bad, each in a temporary checkout on the goldens committed at --good, "
        "and print the first bad commit, its first divergence and the commits tried. The "
        "checkout you run it in is only read.",
    )
    p_bisect.add_argument("--good", required=True, metavar="REF", help="a commit that passes")
    p_bisect.add_argument("--bad", required=True, metavar="REF", help="a commit that fails")
    p_bisect.add_argument(
        "--any-failure",
        action="store_true",
        help="a commit is bad when any test fails, not only on the plugin's verdict",
    )
    p_bisect.add_argument(
        "--check-ends",
        action="store_true",
        help="replay --good and --bad too, and stop unless they replay good and bad",
    )
    commit_run_arguments(p_bisect)
    p_bisect.add_argument("--json", action="store_true", help="machine-readable output")
    p_bisect.add_argument(
        "--plot",
        type=Path,
        metavar="PNG",
        help="also draw the commits tried, in order, at their place in the history",
    )
    p_bisect.add_argument(
        "--no-cache", action="store_true", help="run every commit, store no result"
    )
    p_bisect.add_argument(
        "--cache-dir",
        type=Path,
        metavar="DIR",
        help="where results of commits are kept "
        "(default: $XDG_CACHE_HOME/pytest-rollout-golden/commits)",
    )
