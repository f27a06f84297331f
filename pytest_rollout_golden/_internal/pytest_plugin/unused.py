"""What a session left unused: the goldens no test used, and the tolerance entries that named
nothing checked.

The controller judges the unused goldens once, at session end (pruning them first when the
prune plugin is on); the judgement is kept in the config's stash under :data:`UNUSED` for the
JSON report and the summary.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ..wording import close_match, display
from .golden_plugin import GoldenPlugin
from .prune import Unused, partial_project, unused_and_pruned

UNUSED = pytest.StashKey[Unused]()


def judged(core: GoldenPlugin, session: pytest.Session) -> Unused:
    """The session's unused goldens, judged on first call (the prune plugin's, if on)."""
    stash = core.config.stash
    if UNUSED not in stash:
        stash[UNUSED] = find_unused(core, session)
    return stash[UNUSED]


def find_unused(
    core: GoldenPlugin,
    session: pytest.Session,
    *,
    prune_gone: bool = False,
    prune_tests: bool = False,
) -> Unused:
    """The goldens no test of this session used; pruned as ``prune_*`` ask
    (:func:`.prune.unused_and_pruned`)."""
    return unused_and_pruned(
        core.state,
        core.root,
        core.rootdir,
        prune_gone=prune_gone,
        prune_tests=prune_tests,
        stopped=bool(session.shouldstop or session.shouldfail),
        failed=bool(session.testsfailed),
        partial=left_out(core),
    )


def left_out(core: GoldenPlugin) -> str:
    """Why this run may have left out test files of the project (``""``: it did not)."""
    config, opt = core.config, core.config.option
    invoked = Path(config.invocation_params.dir)
    testpaths = ""
    if config.args_source == pytest.Config.ArgsSource.TESTPATHS:
        ini = f" ({display(config.inipath, core.rootdir)})" if config.inipath else ""
        testpaths = f"testpaths = {' '.join(config.getini('testpaths'))}{ini}"
    return partial_project(
        [invoked / str(arg).split("::")[0] for arg in config.args],
        core.rootdir,
        testpaths=testpaths,
        ignored=[*(opt.ignore or ()), *(opt.ignore_glob or ())],
        skipped=sorted(core.state.skipped_files),
        collect_ignored=sorted(core.state.collect_ignored),
    )


def unused_tolerances(core: GoldenPlugin) -> list[str]:
    """``--golden-tolerance``/ini entries that named nothing checked in any process."""
    stack, used = core.session_tolerances, core.state.tolerance_usage
    return [
        label + close_match(key, used.names())
        for label, key in used.unused_entries([*stack.cli, *stack.ini])
    ]
