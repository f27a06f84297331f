"""The plugin's command-line flags and ini values, declared as a table.

``pytest --help`` lists them in this order under the ``rollout-golden`` group.
:func:`add_options` registers them; the values are checked by :mod:`.options`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ...store.location import ENVELOPE, TOLERANCES
from ..golden.modes import MISSING_STEP_POLICIES
from ..tolerance.calibration import PERTURBATIONS
from ..tolerance.envelope import MIN_STEPS

if TYPE_CHECKING:
    import pytest

GROUP = "rollout-golden"
GROUP_DESCRIPTION = "golden rollout regression tests"

# How a flag takes its value, as argparse actions.
_ACTIONS = {"switch": "store_true", "off": "store_false", "repeat": "append"}


@dataclass(frozen=True)
class Flag:
    """One command-line flag.

    ``kind``: ``switch`` (on when given), ``off`` (False when given, else None: the ini
    decides), ``value`` (one string), ``int``, ``repeat`` (a list, one entry per use).
    ``default``: for ``repeat``, the entries of a run without the flag (None: None).
    """

    name: str
    kind: Literal["switch", "off", "value", "int", "repeat"]
    help: str
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    dest: str | None = None
    default: tuple[str, ...] | None = None

    def arguments(self) -> dict[str, Any]:
        """The keyword arguments of ``addoption``."""
        kwargs: dict[str, Any] = {}
        if self.kind in _ACTIONS:
            kwargs["action"] = _ACTIONS[self.kind]
        if self.kind == "int":
            kwargs["type"] = int
        if self.kind == "off":
            kwargs["default"] = None
        elif self.default is not None:
            kwargs["default"] = list(self.default)  # a list of its own for each parser
        for name in ("metavar", "choices", "dest"):
            if getattr(self, name) is not None:
                kwargs[name] = getattr(self, name)
        return {**kwargs, "help": self.help}


@dataclass(frozen=True)
class Ini:
    """One ini option; ``type`` as ``parser.addini`` takes it (None: a string)."""

    name: str
    help: str
    default: str | bool | tuple[str, ...]
    type: Literal["linelist", "bool"] | None = None

    def arguments(self) -> dict[str, Any]:
        """The keyword arguments of ``addini``, after its name and help."""
        default = list(self.default) if isinstance(self.default, tuple) else self.default
        if self.type is None:
            return {"default": default}
        return {"type": self.type, "default": default}


FLAGS = (
    Flag(
        "--update-golden",
        "switch",
        "re-record every golden the selected tests touch (they pass)",
    ),
    Flag(
        "--update-golden-failing",
        "switch",
        "re-record only the goldens with a value beyond tolerance (the others replay), "
        "refusing new values that look like placeholders (all zeros, NaN, constant)",
    ),
    Flag(
        "--golden-reason",
        "value",
        "with --update-golden: why, recorded in each re-recorded golden's provenance "
        "(default: the commit checked out)",
        metavar="TEXT",
    ),
    Flag(
        "--golden-allow-placeholder",
        "switch",
        "with --update-golden-failing: re-record values that look like placeholders",
    ),
    Flag(
        "--golden-regenerate",
        "switch",
        "with --update-golden (implied): also re-run generate() for recorded rollouts "
        "instead of keeping them",
    ),
    Flag(
        "--golden-missing-step",
        "value",
        "a rollout step never recorded: record (the default; error in strict mode), "
        "error, repeat (nearest recorded step stands in), generate (not recorded)",
        choices=MISSING_STEP_POLICIES,
    ),
    Flag(
        "--golden-strict",
        "switch",
        "never record; a missing golden, step or metric fails "
        "(on by default when the CI environment variable is truthy)",
    ),
    Flag(
        "--golden-dir",
        "value",
        "root directory of goldens, relative to rootdir (ini golden_dir)",
        metavar="DIR",
    ),
    Flag(
        "--golden-report",
        "value",
        "write every comparison and its verdict to a JSON file",
        metavar="PATH",
    ),
    Flag(
        "--golden-tolerance",
        "repeat",
        "per-metric tolerance, e.g. grad_norm:rtol=3e-2,atol=1e-4 (repeatable)",
        metavar="SPEC",
        default=(),
    ),
    Flag(
        "--golden-ignore",
        "repeat",
        "do not compare this metric or tensor (glob; repeatable); listed as 'not compared'",
        metavar="NAME",
        default=(),
    ),
    Flag(
        "--golden-mismatch-bound",
        "repeat",
        "bound of golden.check_mismatch, e.g. gen_kl_error<=0.001 (inf: none; repeatable)",
        metavar="METRIC<=VALUE",
        default=(),
    ),
    Flag(
        "--golden-trend",
        "repeat",
        "bound on how a metric evolves over a run, e.g. kl:growth<=3 or kl:slope<=1e-3 "
        "(inf: none; repeatable)",
        metavar="METRIC:STAT<=VALUE",
        default=(),
    ),
    Flag(
        "--golden-exact",
        "switch",
        "demand bit equality for every metric and tensor",
    ),
    Flag(
        "--golden-lane",
        "value",
        "the lane whose values this run compares and records (one golden, values per "
        "platform): a name such as cpu or cuda-sm90, or auto for this machine's "
        "(ini golden_lane, environment ROLLOUT_GOLDEN_LANE)",
        metavar="NAME",
    ),
    Flag(
        "--golden-plot",
        "value",
        "write a PNG of metric curves (recorded vs this run) per failed golden to DIR "
        "(needs matplotlib: pip install 'pytest-rollout-golden[plot]')",
        metavar="DIR",
    ),
    Flag(
        "--golden-history",
        "value",
        "append this session's compared values and distances to the run history in DIR, "
        "relative to rootdir (ini golden_history; docs/guide/history.md)",
        metavar="DIR",
    ),
    Flag(
        "--golden-calibrate",
        "int",
        "run each selected golden test N times under perturbed reduction orders and write "
        f"calibrated tolerances (spread x margin) into {TOLERANCES} of its golden, and for a "
        f"test of {MIN_STEPS}+ steps per-step bands into {ENVELOPE}",
        metavar="N",
    ),
    Flag(
        "--golden-certify",
        "switch",
        "run every golden test as the float64 oracle (golden.precision is float64): the "
        "reference records its float64 values in the golden's lane float64-oracle, each "
        "same_math() variant must match them at rtol 1e-6 (docs/guide/certify.md)",
    ),
    Flag(
        "--golden-calibrate-perturb",
        "repeat",
        "what --golden-calibrate varies between runs: threads (default), "
        "nondeterministic, tf32 (GPU; repeatable)",
        metavar="KIND",
        choices=PERTURBATIONS,
    ),
    Flag(
        "--golden-prune",
        "switch",
        "delete goldens whose test file is gone (whole runs only; docs/guide/pruning.md)",
    ),
    Flag(
        "--golden-prune-tests",
        "switch",
        "--golden-prune, and also delete unused goldens of test files that still exist "
        "(a removed test, or a case collected only on other machines, e.g. cuda)",
    ),
    Flag(
        "--no-golden-deterministic",
        "off",
        "do not apply deterministic settings around golden tests",
        dest="golden_deterministic",
    ),
)

INI = (
    Ini("golden_dir", "root directory of goldens, relative to rootdir", "golden"),
    Ini(
        "golden_tolerances",
        "per-metric tolerances, one METRIC:rtol=R,atol=A per line",
        (),
        "linelist",
    ),
    Ini("golden_ignore", "metrics or tensors (globs) not compared, one per line", (), "linelist"),
    Ini(
        "golden_metric_profile",
        "how a framework names its metrics: verl, openrlhf, trl, slime or megatron",
        "",
    ),
    Ini(
        "golden_precision",
        "the precision the training computes in: float32 (default) or bf16 (looser grad_norm)",
        "",
    ),
    Ini(
        "golden_mismatch_bounds",
        "bounds of golden.check_mismatch, one METRIC<=VALUE per line",
        (),
        "linelist",
    ),
    Ini(
        "golden_trends",
        "bounds on how metrics evolve over a run, one METRIC:STAT<=VALUE per line "
        "(STAT: growth or slope)",
        (),
        "linelist",
    ),
    Ini("golden_lane", "the lane of this project's runs: a name, or auto (see --golden-lane)", ""),
    Ini(
        "golden_lane_fallback",
        "in strict mode, the lane a golden is compared against where the run's lane was "
        "never recorded",
        "",
    ),
    Ini(
        "golden_lane_fallback_tolerances",
        "tolerances of a comparison against the fallback lane, one METRIC:rtol=R,atol=A per line",
        (),
        "linelist",
    ),
    Ini("golden_history", "folder of the run history, relative to rootdir (off when empty)", ""),
    Ini(
        "golden_history_max_runs",
        "runs the history keeps; older ones are dropped (0: no bound)",
        "1000",
    ),
    Ini(
        "golden_history_max_bytes",
        "bytes the history keeps, e.g. 50MiB; older runs are dropped (0: no bound)",
        "100MiB",
    ),
    Ini("golden_seed", "seed of the deterministic settings", "0"),
    Ini(
        "golden_missing_step",
        "policy for a rollout step never recorded: record, error, repeat or generate",
        "",
    ),
    Ini("golden_deterministic", "apply deterministic settings around golden tests", True, "bool"),
)


def add_options(parser: pytest.Parser) -> None:
    """Register :data:`FLAGS` in the ``rollout-golden`` group, and :data:`INI`."""
    group = parser.getgroup(GROUP, GROUP_DESCRIPTION)
    for flag in FLAGS:
        group.addoption(flag.name, **flag.arguments())
    for ini in INI:
        parser.addini(ini.name, ini.help, **ini.arguments())
