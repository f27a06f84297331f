"""The session's settings from flags, ini values and the environment, checked before any test.

Works without pytest: a value this package cannot use raises :class:`OptionError`,
whose message names the flag or ini option and the fix; the plugin turns it into
pytest's usage error.
"""

from __future__ import annotations

import importlib.util
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..golden.modes import MISSING_STEP_POLICIES
from ..results import Mode
from ..tolerance.families import precision_layer, profile_layers
from ..tolerance.spec import ignore_and_tolerance_layers as layers
from ..tolerance.stack import Stack

if TYPE_CHECKING:
    from ..golden.lanes import LaneSetting


class OptionError(ValueError):
    """A flag, ini value or marker option that cannot be used; the message names the fix."""


def truthy_env(name: str) -> bool:
    """Whether environment variable ``name`` is set to something other than 0/false/no/off."""
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no", "off")


def session_mode(*, update: bool, strict: bool, calibrate: int | None, ci: bool) -> Mode:
    """The mode of a session: ``--update-golden`` re-records; ``--golden-strict``, CI or
    ``--golden-calibrate`` never record; else goldens are recorded where missing.

    ``update`` includes ``--golden-regenerate``; ``calibrate`` is the number of runs asked
    for (``None``: not calibrating).
    """
    if update and strict:
        raise OptionError(
            "--update-golden and --golden-strict exclude each other "
            "(--golden-regenerate implies --update-golden)"
        )
    if calibrate is not None and calibrate < 2:
        raise OptionError("--golden-calibrate N needs N >= 2 runs to measure a spread")
    if calibrate and update:
        raise OptionError(
            "--golden-calibrate measures the noise around existing goldens; "
            "record them first, without --update-golden"
        )
    if update:
        return Mode.UPDATE
    if strict or ci or calibrate:
        return Mode.STRICT
    return Mode.AUTO


PYTEST_FLAGS = ("--golden-tolerance", "--golden-ignore")


def session_tolerances(
    flag_tolerances: Any,
    flag_ignore: Any,
    ini_tolerances: Any,
    ini_ignore: Any,
    profile: str = "",
    precision: str = "",
    *,
    flags: tuple[str, str] = PYTEST_FLAGS,
) -> Stack:
    """The session's tolerance layers: ``--golden-tolerance``/``--golden-ignore`` (named
    ``flags``: ``rollout-golden diff`` has its own) over ini ``golden_tolerances``/
    ``golden_ignore`` over ``golden_precision`` over the ``golden_metric_profile``
    (ValueError naming the source on a bad entry or an unknown profile or precision).
    pytest and the CLI's verbs both parse their session's layers here; each golden's stack
    is built over them by :func:`..tolerance.build.build`."""
    cli = layers(flags[0], flag_tolerances, flags[1], flag_ignore)
    ini = layers("ini golden_tolerances", ini_tolerances, "ini golden_ignore", ini_ignore)
    profiled, across_variants = profile_layers(profile) if profile.strip() else ((), None)
    declared = precision_layer(precision, "ini golden_precision") if precision.strip() else None
    return Stack(
        cli=cli,
        ini=ini,
        precision=declared,
        profile=profiled,
        across_variants=across_variants,
    )


def lane_setting(
    flag: str | None, ini: str, fallback: str, fallback_tolerances: Any, environ: Any
) -> LaneSetting:
    """The session's lane (:mod:`..golden.lanes`): ``--golden-lane``, else the environment's
    ``ROLLOUT_GOLDEN_LANE``, else ini ``golden_lane``; ``auto`` stays as it is until a golden
    needs it (:func:`~.lanes.resolve_auto`: deciding imports torch). OptionError on a bad
    name."""
    from ..golden.lanes import AUTO, LaneSetting, lane_problem, resolve_setting

    try:
        name, source = resolve_setting(flag, ini.strip(), environ)
    except ValueError as exc:
        raise OptionError(str(exc)) from None
    fallback = fallback.strip()
    if (fallback and lane_problem(fallback) is not None) or fallback == AUTO:
        raise OptionError(f"ini golden_lane_fallback: {lane_problem(fallback) or 'not auto'}")
    source_of = "ini golden_lane_fallback_tolerances"
    try:
        tolerances = layers(source_of, fallback_tolerances, "", None)[1]
    except ValueError as exc:
        raise OptionError(str(exc)) from None
    if name is None and (fallback or tolerances.entries):
        raise OptionError(
            "ini golden_lane_fallback and golden_lane_fallback_tolerances apply to lanes: "
            "set golden_lane (or --golden-lane, ROLLOUT_GOLDEN_LANE), e.g. golden_lane = auto"
        )
    return LaneSetting(name, source, fallback or None, tolerances if tolerances.entries else None)


def parse_seed(value: Any, source: str, *, text: bool = True) -> int:
    """``value`` as a seed of random, numpy and torch (an int in [0, 2**32)), else OptionError.

    ``text``: whether a string holding an integer is accepted (an ini value is text; a
    marker's ``seed=`` must be an int).
    """
    try:
        refused = (bool, float) if text else (bool, float, str, bytes)
        seed = None if isinstance(value, refused) else int(value)
    except (TypeError, ValueError):
        seed = None
    if seed is None or not 0 <= seed < 2**32:
        raise OptionError(f"{source} must be an integer in [0, 2**32), got {value!r}")
    return seed


def missing_step_policy(
    marker: Any, flag: str | None, ini: str, *, where: str
) -> tuple[str | None, str]:
    """``(policy, where it was set)`` for a rollout step never recorded: the marker's
    ``missing_step=``, else ``--golden-missing-step``, else ini ``golden_missing_step``.

    ``where`` (the test id) prefixes the error for a policy that does not exist.
    """
    policy, source = marker, "marker missing_step="
    if policy is None and flag:
        policy, source = flag, "--golden-missing-step="
    if policy is None and ini:
        policy, source = ini.strip(), "ini golden_missing_step="
    if policy is not None and policy not in MISSING_STEP_POLICIES:
        raise OptionError(
            f"{where}: {source} must be one of {', '.join(MISSING_STEP_POLICIES)}, got {policy!r}"
        )
    return policy, source


def golden_root(rootdir: Path, value: str) -> Path:
    """The golden root; refused where pruning could reach files that are not goldens."""
    if not str(value).strip():
        raise OptionError(
            "golden_dir is empty: goldens need a directory of their own, e.g. golden_dir = golden"
        )
    root = rootdir / value
    real, real_rootdir = Path(os.path.realpath(root)), Path(os.path.realpath(rootdir))
    if real == real_rootdir or real in real_rootdir.parents:
        raise OptionError(
            f"golden_dir {value!r} is the project directory or contains it; goldens need a "
            "directory of their own (e.g. golden_dir = golden), so that --golden-prune can "
            "never reach other files"
        )
    return root


def report_path(value: str | None) -> Path | None:
    """``--golden-report PATH``, checked before any test runs."""
    if not value:
        return None
    path = Path(value)
    if path.is_dir():
        raise OptionError(f"--golden-report {value}: is a directory; name a file")
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise OptionError(f"--golden-report {value}: {parent} is not a directory")
    writable = os.access(path, os.W_OK) if path.exists() else os.access(parent, os.W_OK | os.X_OK)
    if not writable:
        raise OptionError(f"--golden-report {value}: not writable")
    return path


def plot_dir(value: str | None) -> Path | None:
    """``--golden-plot DIR``; refused at once when matplotlib is not installed."""
    if not value:
        return None
    if importlib.util.find_spec("matplotlib") is None:
        from ..report.plot import MISSING_MATPLOTLIB

        raise OptionError(f"--golden-plot: {MISSING_MATPLOTLIB}")
    return Path(value)


def sensitivity_floor(flag: str | None, ini: str) -> tuple[float | None, str]:
    """``(floor, where it was set)`` of ``--golden-sensitivity-require``, else ini
    ``golden_sensitivity_require`` (``None``: no floor); OptionError unless a number in
    (0, 10], the widest relative change the sensitivity probes (:data:`.sensitivity.HIGH`)."""
    value, source = (flag, "--golden-sensitivity-require") if flag else (ini.strip(), "")
    if not value:
        return None, ""
    source = source or "ini golden_sensitivity_require"
    try:
        floor = float(value)
    except ValueError:
        floor = math.nan
    if not 0 < floor <= 10:
        raise OptionError(
            f"{source} must be a relative change in (0, 10], e.g. 1e-3, got {value!r}"
        )
    return floor, source


_UNITS = {"": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}


def history_limits(max_runs: str, max_bytes: str) -> tuple[int, int]:
    """ini ``golden_history_max_runs`` and ``golden_history_max_bytes`` (a count of bytes,
    or with KiB, MiB or GiB), each >= 0; OptionError naming the option otherwise."""
    try:
        runs = int(str(max_runs).strip())
    except ValueError:
        runs = -1
    if runs < 0:
        raise OptionError(f"ini golden_history_max_runs must be an integer >= 0, got {max_runs!r}")
    text = str(max_bytes).strip()
    unit = next((u for u in ("KiB", "MiB", "GiB") if text.endswith(u)), "")
    try:
        size = int(float(text.removesuffix(unit).strip()) * _UNITS[unit]) if text else -1
    except ValueError:
        size = -1
    if size < 0:
        raise OptionError(
            "ini golden_history_max_bytes must be a size >= 0 such as 50MiB or 1000000, "
            f"got {max_bytes!r}"
        )
    return runs, size
