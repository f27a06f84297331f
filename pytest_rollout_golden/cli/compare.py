"""``rollout-golden compare``: the tests at git refs A and B on the same goldens, B's values
diffed against A's; with ``--python-a``/``--python-b``, the triage of two environments."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .._internal.commits.compare_commits import compare
from .._internal.commits.text import compare_lines, triage_lines
from .._internal.commits.triage import triage
from .._internal.tolerance.stack import Stack
from ..errors import GoldenError
from .arguments import commit_run_arguments, run_spec, tolerance_arguments


def add_parser(sub: Any) -> None:
    """``rollout-golden compare``'s arguments."""
    p_compare = sub.add_parser(
        "compare",
        help="run the selected tests at git refs A and B on the same goldens; diff the values",
        usage="rollout-golden compare A B [options] -- [PYTEST_ARGS ...]",
        description="Run the tests after -- at git refs A and B, each in a temporary checkout "
        "with --update-golden on its own copy of the same goldens, and diff B's values against "
        "A's per golden, step and metric. The checkout you run it in is never written.",
    )
    p_compare.add_argument("a", metavar="A", help="git ref: branch, tag, commit hash, HEAD~3")
    p_compare.add_argument("b", metavar="B", help="git ref")
    for side in "ab":
        p_compare.add_argument(
            f"--python-{side}",
            metavar="PYTHON",
            help=f"the interpreter (a virtual environment's python) {side.upper()} runs in; "
            "either one: replay both sides on the goldens committed at A and print which tests "
            "pass in A and fail in B (default: the python running this command)",
        )
    commit_run_arguments(p_compare)
    tolerance_arguments(p_compare)


def compare_commits(args: argparse.Namespace, tolerances: Stack) -> int:
    """Run the tests at refs A and B on the same goldens; print the diff (0 same, 1 differs)."""
    if args.python_a is not None or args.python_b is not None:
        return triage_environments(args)
    spec = run_spec(args, goldens_at=None)
    result = compare(spec, args.a, args.b, tolerances, jobs=args.jobs)
    if args.json:
        print(json.dumps(result.to_json(), indent=2, allow_nan=False))
    else:
        print("\n".join(compare_lines(result)))
    return 1 if result.differs else 0


# compare's options that only its diff reads (option: attribute)
_DIFF_ONLY = {
    "--tolerance": "tolerance",
    "--ignore": "ignore",
    "--exact": "exact",
    "--config": "config",
    "--no-config": "no_config",
}


def triage_environments(args: argparse.Namespace) -> int:
    """``compare --python-a/--python-b``: replay both sides on the goldens committed at A and
    print which tests pass in A and fail in B (1: some do, 0: none)."""
    given = [o for o, v in _DIFF_ONLY.items() if getattr(args, v)]
    if given:  # ignored silently, a --tolerance would seem to loosen the gate
        raise GoldenError(
            f"{', '.join(given)}: options of the diff of re-recorded values; with --python-a "
            "or --python-b each side replays judged by the project's own tolerances. Leave "
            "them out, or give pytest options after -- (e.g. -- -o golden_tolerances=...)"
        )
    python = (args.python_a or sys.executable, args.python_b or sys.executable)
    spec = run_spec(args, goldens_at=args.a)
    result = triage(spec, args.a, args.b, python, jobs=args.jobs)
    if args.json:
        print(json.dumps(result.to_json(), indent=2, allow_nan=False))
    else:
        print("\n".join(triage_lines(result)))
    return 1 if result.regressed else 0
