"""The arguments several verbs share: tolerance options and the stack they build over the
project's ini, and the options of a run of the tests at other commits."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .._internal.commits.goldens import GoldenSource, source_of
from .._internal.commits.runs import RunSpec, in_tree, locate
from .._internal.pytest_plugin.options import session_tolerances
from .._internal.pytest_plugin.projectini import find_config, linelist as lines
from .._internal.tolerance.stack import Stack
from ..errors import GoldenError

_FLAGS = ("--tolerance", "--ignore")


def tolerances(args: argparse.Namespace, paths: Sequence[Path]) -> tuple[Stack, str]:
    """The stack pytest resolves (``session_tolerances``, one builder for both), with
    --tolerance/--ignore in place of pytest's flags, over the ini values of the project
    holding ``paths`` (or ``--config``): ``golden_tolerances``, ``golden_ignore``,
    ``golden_precision``, ``golden_metric_profile``; and that file (``""``: none).
    ValueError for a bad --tolerance/--ignore (usage), GoldenError naming the file for a bad
    ini value."""
    config, options = project_ini(args, paths)
    ini = (
        ini_value(options, "golden_tolerances", linelist=True),
        ini_value(options, "golden_ignore", linelist=True),
        ini_value(options, "golden_metric_profile"),
        ini_value(options, "golden_precision"),
    )
    session_tolerances(args.tolerance, args.ignore, [], [], flags=_FLAGS)  # ValueError: usage
    try:
        stack = session_tolerances(args.tolerance, args.ignore, *ini, flags=_FLAGS)
    except ValueError as exc:  # the command line's own layers are valid: the ini's mistake
        raise GoldenError(f"{config}: {exc}") from None
    return stack.replace(exact=args.exact), config


def project_ini(args: argparse.Namespace, paths: Sequence[Path]) -> tuple[str, Mapping[str, Any]]:
    """``(the pytest configuration file, its options)`` of the project holding ``paths``, or
    ``--config``; ``("", {})`` with ``--no-config`` or none found."""
    if args.no_config:
        return "", {}
    path, options = find_config([args.config] if args.config else [p for p in paths if p])
    if args.config and path is None:
        raise GoldenError(f"{args.config}: not a pytest configuration file")
    return ("", {}) if path is None else (str(path), options)


def ini_value(options: Mapping[str, Any], name: str, *, linelist: bool = False) -> Any:
    """Ini option ``name`` as pytest's ``config.getini`` gives it: a list of lines
    (``linelist``), else a string (``""`` when absent)."""
    return lines(options.get(name)) if linelist else str(options.get(name) or "")


def tolerance_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of a verb that diffs goldens: tolerances, ``--json``, the ini to read."""
    parser.add_argument("--tolerance", action="append", default=[], metavar="M:rtol=R,atol=A")
    parser.add_argument(
        "--ignore", action="append", default=[], metavar="NAME", help="do not compare (glob)"
    )
    parser.add_argument("--exact", action="store_true", help="demand bit equality")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument(
        "--config",
        type=Path,
        help="pytest configuration file to read golden_tolerances, golden_ignore, "
        "golden_precision and golden_metric_profile from",
    )
    parser.add_argument(
        "--no-config", action="store_true", help="ignore the project's pytest configuration"
    )


def commit_run_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of a verb that runs the tests at other commits (``-- PYTEST_ARGS`` after
    them: :func:`split_pytest_args`)."""
    parser.add_argument(
        "--goldens",
        metavar="SOURCE",
        help="where the recorded inputs come from: an existing folder, else a git ref (its "
        "committed golden folder)",
    )
    parser.add_argument(
        "--golden-root",
        type=Path,
        default=Path("golden"),
        metavar="DIR",
        help="the project's golden folder (default: golden, under the current directory)",
    )
    parser.add_argument("--jobs", type=int, default=1, metavar="N", help="commits run at once")
    parser.add_argument("--timeout", type=float, metavar="S", help="seconds per pytest run")
    parser.add_argument(
        "--pythonpath",
        action="append",
        default=[],
        metavar="DIR",
        help="one more import folder (relative: in the checkout), after the checkout's top "
        "and its src/",
    )


def split_pytest_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """``compare`` / ``bisect``: what follows the first ``--`` goes to pytest."""
    if argv[:1] in (["compare"], ["bisect"]) and "--" in argv:
        cut = argv.index("--")
        return argv[:cut], argv[cut + 1 :]
    return argv, []


def run_spec(args: argparse.Namespace, *, goldens_at: str | None) -> RunSpec:
    """The run at each commit, from the options: the tests (run in the current folder's place
    in each checkout) and their goldens: ``--goldens``, else the golden root as committed at
    ``goldens_at``, else as it is on disk."""
    repo, cwd_rel, golden_rel = locate(Path.cwd(), args.golden_root)
    if args.goldens is not None:
        source = source_of(args.goldens, repo, golden_rel)
    elif goldens_at is None:
        source = GoldenSource.directory(repo / golden_rel)
    else:
        source = GoldenSource.committed(repo, goldens_at, golden_rel)
    return RunSpec(
        repo,
        cwd_rel,
        golden_rel,
        source,
        pytest_args=in_tree(repo, cwd_rel, tuple(args.pytest_args)),
        any_failure=getattr(args, "any_failure", False),
        timeout=args.timeout,
        pythonpath=tuple(args.pythonpath),
    )
