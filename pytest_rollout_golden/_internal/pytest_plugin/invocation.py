"""What this session's command line asks, what pytest made of it, and who ran it.

The session's mode from its flags, a path option pytest took for a test path (before this
plugin's options were known), and the record a re-recording session keeps of itself: reason,
user, host, commit.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from ..golden.refresh import Refresh
from ..results import Mode
from .options import session_mode, truthy_env


def mode_of(opt: Any) -> Mode:
    """The session's mode from its flags (and ``CI``); flags that exclude each other refused."""
    if opt.golden_regenerate or opt.update_golden_failing:
        opt.update_golden = True  # regenerating a rollout re-records what depends on it
    mode = session_mode(
        update=opt.update_golden,
        strict=opt.golden_strict,
        calibrate=opt.golden_calibrate,
        ci=truthy_env("CI"),
    )
    if opt.golden_certify and opt.golden_calibrate:
        raise pytest.UsageError(
            "--golden-calibrate certifies the same_math() variants in float64 itself "
            "(one more run per test); leave out --golden-certify"
        )
    return mode


_PATH_OPTIONS = ("--golden-report", "--golden-dir", "--golden-plot")


def check_space_form(config: pytest.Config) -> None:
    """Refuse ``--golden-report PATH`` (a space, no ``=``) when pytest took PATH for a test path.

    pytest picks the rootdir and ini file before plugin options are known, so it reads an
    existing PATH after a plugin option as a test path; no plugin can undo that choice.
    """
    args = [str(a) for a in config.invocation_params.args]
    for i, arg in enumerate(args[:-1]):
        if arg in _PATH_OPTIONS and Path(config.invocation_params.dir, args[i + 1]).exists():
            rootdir, inipath = _intended_setup(config, args)
            if rootdir is not None and (rootdir, inipath) != (config.rootpath, config.inipath):
                raise pytest.UsageError(
                    f"`{arg} {args[i + 1]}`: pytest took {args[i + 1]} for a test path before "
                    f"this plugin could claim it, and chose rootdir {config.rootpath} "
                    f"(ini file {config.inipath}) instead of {rootdir} ({inipath}); "
                    f"write `{arg}={args[i + 1]}`"
                )


def _intended_setup(config: pytest.Config, args: list[str]) -> tuple[Any, Any]:
    """The (rootdir, ini file) pytest would pick knowing this plugin's options."""
    try:
        from _pytest.config.findpaths import determine_setup

        ns = config._parser.parse_known_args(args)
        rootdir, inipath, *_ = determine_setup(
            inifile=config.option.inifilename,
            override_ini=config.option.override_ini,
            args=ns.file_or_dir,
            rootdir_cmd_arg=config.option.rootdir or None,
            invocation_dir=config.invocation_params.dir,
        )
    except Exception:  # pytest's private API changed: no check rather than a wrong one
        return None, None
    return rootdir, inipath


def refresh_of(opt: Any, rootdir: Path) -> Refresh:
    """What a session that re-records goldens records of itself (:mod:`..golden.refresh`)."""
    import getpass
    import socket

    from ..commits.git import head

    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container)
        user = f"uid {os.getuid()}" if hasattr(os, "getuid") else ""
    return Refresh(
        reason=opt.golden_reason or None,
        by=user,
        host=socket.gethostname(),
        commit=head(rootdir),
        only_failing=opt.update_golden_failing,
        allow_placeholder=opt.golden_allow_placeholder,
    )
