"""Golden lanes: one set of recorded values per platform over one set of inputs.

A golden directory holds its rollout inputs once, with the values of the lane that recorded
them: the *base lane*, named in its manifest (a golden recorded before lanes existed: the lane
of the environment its fingerprint describes). Every other lane keeps its values
(``metrics.json``, ``check_tensors`` files, ``tolerances.json``) in ``@lanes/<lane>/``, a
directory with a manifest, a lock and commits of its own, so recording one lane never changes
another lane's files or the inputs. A lane's manifest lists the digests of the inputs its
values were computed on, so values recorded on other inputs are refused, not compared.

A lane is named by the user (``--golden-lane``, ini ``golden_lane``, environment
``ROLLOUT_GOLDEN_LANE``) or derived from the environment with ``auto``: ``cpu``,
``cuda-sm90`` (compute capability 9.0), ``rocm-gfx942``, ``mps``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from ...errors import GoldenError
from ...store.location import LANE_NAME as _NAME, LANES, MANIFEST

AUTO = "auto"
ENVIRONMENT_VARIABLE = "ROLLOUT_GOLDEN_LANE"

# Goldens recorded before the fingerprint held a compute capability name only their device;
# these are the data-centre and workstation GPUs whose capability the name tells.
_CAPABILITY_BY_NAME = (
    (("B200", "GB200", "B100"), "100"),
    (("H100", "H200", "H800", "H20", "GH200"), "90"),
    (("A100", "A800", "A30"), "80"),  # before "A10", which "A100" contains
    (("L4", "L40", "RTX 40", "RTX 6000 Ada"), "89"),
    (("A10", "A40", "RTX 30", "A6000"), "86"),
    (("T4", "RTX 20"), "75"),
    (("V100",), "70"),
)


def lane_problem(name: str) -> str | None:
    """Why ``name`` cannot name a lane (``None``: it can)."""
    from .precision import ORACLE_LANE

    if name == ORACLE_LANE:
        return f"{name!r} is the float64 oracle's lane: it is chosen by --golden-certify"
    if name == AUTO or _NAME.fullmatch(name):
        return None
    return (
        f"{name!r} is not a lane name: use lower-case letters, digits, '.', '_' and '-' "
        f"(at most 64, starting with a letter or digit), or {AUTO!r} for this machine's lane"
    )


def environment_lane(fingerprint: Mapping[str, Any] | None) -> str | None:
    """The lane an environment fingerprint (:func:`.determinism.fingerprint`) belongs to:
    ``cpu``, ``cuda-sm<major><minor>``, ``rocm-<arch>``, ``mps``; ``None`` for no fingerprint."""
    if not fingerprint:
        return None
    device = str(fingerprint.get("device") or "")
    if not fingerprint.get("cuda") and not fingerprint.get("hip"):
        return "mps" if device == "mps" else "cpu"
    if fingerprint.get("hip"):
        arch = str(fingerprint.get("gpu_arch") or "").split(":")[0].lower()
        return f"rocm-{arch}" if _NAME.fullmatch(arch or "-") else "rocm"
    capability = fingerprint.get("capability")
    if isinstance(capability, str) and re.fullmatch(r"[0-9]+\.[0-9]+", capability):
        return "cuda-sm" + capability.replace(".", "")
    for names, sm in _CAPABILITY_BY_NAME:
        if any(name in device for name in names):
            return f"cuda-sm{sm}"
    return "cuda"


def base_lane(manifest: Mapping[str, Any]) -> str | None:
    """The lane whose values sit beside the inputs: the manifest's ``lane``, else the lane
    of the environment that recorded it."""
    lane = manifest.get("lane")
    if isinstance(lane, str) and _NAME.fullmatch(lane):
        return lane
    fingerprint = manifest.get("fingerprint")
    return environment_lane(fingerprint if isinstance(fingerprint, Mapping) else None)


def lane_dir(directory: Path, lane: str) -> Path:
    """Where a lane other than the base lane keeps its values."""
    return directory / LANES / lane


def lane_link(directory: Path, lane: str) -> Path | None:
    """The first symbolic link on the way to lane ``lane``'s values or among them (``@lanes``,
    ``@lanes/<lane>``, an entry of that folder); ``None``: none. A lane is written and read
    only in its own folder, as a golden only inside its golden root."""
    folder = lane_dir(directory, lane)
    for path in (folder.parent, folder):
        if path.is_symlink():
            return path
    if not folder.is_dir():
        return None
    return next((entry for entry in sorted(folder.iterdir()) if entry.is_symlink()), None)


def refuse_lane_link(directory: Path, lane: str) -> None:
    """GoldenError naming the link if lane ``lane`` of ``directory`` is reached through one
    or holds one (:func:`lane_link`)."""
    from .messages import lane_linked

    link = lane_link(directory, lane)
    if link is not None:
        raise GoldenError(lane_linked(link, lane))


def other_lanes(directory: Path) -> list[str]:
    """The lanes recorded under ``@lanes/`` (each a directory with a manifest), sorted."""
    folder = directory / LANES
    if not folder.is_dir():
        return []
    return sorted(
        entry.name
        for entry in folder.iterdir()
        if _NAME.fullmatch(entry.name) and (entry / MANIFEST).is_file()
    )


def input_digests(recorded: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """``{rollout file: digest}`` of a manifest's file table: the inputs a lane was computed on."""
    return {
        name: str(info["digest"])
        for name, info in sorted(recorded.items())
        if info.get("kind") == "rollout"
    }


def stale_inputs(lane_manifest: Mapping[str, Any], inputs: Mapping[str, str]) -> list[str]:
    """The input files whose digest differs from the one a lane recorded (its values were
    computed on other inputs), sorted; a file the lane never saw is not stale."""
    seen = lane_manifest.get("inputs")
    if not isinstance(seen, Mapping):
        return []
    return sorted(name for name, digest in seen.items() if inputs.get(name, digest) != digest)


@dataclasses.dataclass(frozen=True)
class LaneSetting:
    """The lane a session runs in and its declared fallback.

    ``name``: the lane (``None``: lanes are off and a golden's values are the ones beside its
    inputs). ``source``: where it was set, for messages. ``fallback``: the lane a golden is
    compared against where this lane was never recorded and the run cannot record it (CI),
    under the tolerances of ``fallback_tolerances`` (a layer, or ``None``: the usual ones).
    """

    name: str | None = None
    source: str = ""
    fallback: str | None = None
    fallback_tolerances: Any = None

    @property
    def on(self) -> bool:
        return self.name is not None


def resolve_auto(
    setting: LaneSetting, fingerprint: Callable[[], Mapping[str, Any] | None] | None = None
) -> LaneSetting:
    """``setting`` with ``auto`` replaced by the lane of this environment (``fingerprint``:
    what describes it, default :func:`.determinism.fingerprint`, which imports torch)."""
    if setting.name != AUTO:
        return setting
    if fingerprint is None:
        from .determinism import fingerprint as describe
    else:
        describe = fingerprint
    return dataclasses.replace(setting, name=environment_lane(describe()) or "cpu")


Role = Literal["base", "own", "fallback"]
Refusal = Literal["regenerate", "missing", "stale", "oracle-missing", "oracle-stale"]


@dataclasses.dataclass(frozen=True)
class LaneChoice:
    """The lane whose values a golden is compared against (:func:`choose`).

    ``setting``: the run's lane (``auto`` decided; its ``name`` ``None``: lanes off), where it
    was set and its fallback. ``base``: the golden's base lane (``None``: no inputs yet, or a
    golden without one). ``role``: whose values are compared and recorded: ``"base"`` (the
    ones beside the inputs: lanes off, no golden yet, the run's lane is the base lane, or a
    refused lane never recorded), ``"own"`` (the run's lane in ``@lanes/``, recorded or to be
    recorded), ``"fallback"`` (the declared fallback, where the run's lane was never recorded
    and this run does not record). ``values``: the lane named by ``role``. ``tolerances``:
    the layer a fallback is compared under (``None``: the usual ones). ``refusal``: why the
    golden cannot be compared (``None``: it can), with ``held`` (the lanes recorded, for
    ``missing`` and ``regenerate``) and ``stale`` (the inputs changed since ``values`` were
    computed, for ``stale`` and ``oracle-stale``).
    """

    setting: LaneSetting
    base: str | None = None
    role: Role = "base"
    values: str | None = None
    tolerances: Any = None
    refusal: Refusal | None = None
    held: tuple[str | None, ...] = ()
    stale: tuple[str, ...] = ()

    @property
    def lane(self) -> str | None:
        """The run's lane (``None``: lanes off)."""
        return self.setting.name

    @property
    def in_base(self) -> bool:
        """Whether the run's lane is the golden's base lane (or lanes are off)."""
        return self.lane is None or self.lane == self.base


def choose(
    setting: LaneSetting,
    manifest: Mapping[str, Any] | None,
    others: Sequence[str],
    *,
    recorded: Callable[[str], bool],
    stale: Callable[[str], Sequence[str]],
    records: bool = False,
    rerecords: bool = False,
    regenerate: bool = False,
    fingerprint: Callable[[], Mapping[str, Any] | None] | None = None,
) -> LaneChoice:
    """The lane a golden's values are compared against, or why they cannot be.

    ``setting``: the run's lane (``auto`` decided here, :func:`resolve_auto`); ``manifest``:
    the golden's own (``None``: no inputs recorded yet); ``others``: the lanes under
    ``@lanes/`` (:func:`other_lanes`). ``recorded(lane)``: whether the run's lane holds values
    (asked once, before anything else is read of it); ``stale(lane)``: the inputs changed
    since that lane's values were computed (:func:`stale_inputs`). ``records``: this run
    records a lane it lacks; ``rerecords``, ``regenerate``: it re-records (new inputs), and
    stale values are then not refused.

    Refused: ``--golden-regenerate`` from another lane than the base lane, or while other
    lanes exist (new inputs would orphan their values); values computed on other inputs; a
    lane never recorded in a run that does not record, without a recorded fallback. The
    float64 oracle's lane is refused as ``oracle-missing``/``oracle-stale`` and never falls
    back."""
    from .precision import ORACLE_LANE

    setting = resolve_auto(setting, fingerprint)
    chosen = LaneChoice(setting)
    if manifest is None:
        return chosen
    base = base_lane(manifest)
    chosen = dataclasses.replace(chosen, base=base, values=base)
    kept = tuple(name for name in others if name not in (base, ORACLE_LANE))
    if regenerate and rerecords and (not chosen.in_base or kept):
        return dataclasses.replace(chosen, refusal="regenerate", held=kept)
    lane = setting.name
    if lane is None or chosen.in_base:
        return chosen
    oracle = lane == ORACLE_LANE
    if recorded(lane) or records:
        return _unless_stale(chosen, "own", lane, stale, rerecords, oracle)
    if oracle:
        return dataclasses.replace(chosen, refusal="oracle-missing")
    held = (base, *others)
    if setting.fallback is None or setting.fallback not in held:
        return dataclasses.replace(chosen, refusal="missing", held=held)
    chosen = dataclasses.replace(chosen, tolerances=setting.fallback_tolerances)
    return _unless_stale(chosen, "fallback", setting.fallback, stale, rerecords, oracle)


def _unless_stale(
    chosen: LaneChoice,
    role: Role,
    values: str,
    stale: Callable[[str], Sequence[str]],
    rerecords: bool,
    oracle: bool,
) -> LaneChoice:
    """``chosen`` comparing lane ``values`` as ``role``, refused if they are stale."""
    chosen = dataclasses.replace(chosen, role=role, values=values)
    changed = () if rerecords else tuple(stale(values))
    if not changed:
        return chosen
    return dataclasses.replace(chosen, refusal="oracle-stale" if oracle else "stale", stale=changed)


def resolve_setting(
    option: str | None, ini: str | None, environ: Mapping[str, str]
) -> tuple[str | None, str]:
    """``(lane, source)`` from the option, the environment and the ini value, first set
    first (``auto`` as it is: deciding it needs torch). Raises ValueError naming a bad
    value's source."""
    for value, source in (
        (option, "--golden-lane"),
        (environ.get(ENVIRONMENT_VARIABLE), ENVIRONMENT_VARIABLE),
        (ini, "ini golden_lane"),
    ):
        if not value:
            continue
        problem = lane_problem(value)
        if problem is not None:
            raise ValueError(f"{source}: {problem}")
        return value, (f"{source} = {AUTO}" if value == AUTO else source)
    return None, ""


def split_lane(path: Path) -> tuple[Path, str | None]:
    """``GOLDEN@LANE`` (as ``rollout-golden diff`` and ``plot`` take it) as ``(GOLDEN, LANE)``
    where ``GOLDEN`` exists; any other path (one that exists, or whose name ends in no
    ``@<lane name>``) as ``(path, None)``.

    A golden's own name never holds ``@`` (:func:`~.location.safe_name`), so the split is
    unambiguous for every golden the plugin writes."""
    stem, at, lane = path.name.rpartition("@")
    if path.exists() or not (at and stem and _NAME.fullmatch(lane)):
        return path, None
    golden = path.with_name(stem)
    return (golden, lane) if golden.exists() else (path, None)


@dataclasses.dataclass(frozen=True)
class LaneValues:
    """One lane of a golden as the command line reads it.

    ``directory``: where its values are (the golden itself for its base lane); ``manifest``:
    the manifest there (``None`` where it could not be read, see ``problem``); ``stale``: the
    input files changed since its values were computed (:func:`stale_inputs`).
    """

    lane: str | None
    directory: Path
    base: bool
    manifest: Mapping[str, Any] | None
    stale: list[str] = dataclasses.field(default_factory=list)
    problem: str | None = None

    @property
    def device(self) -> str | None:
        """The device line of the fingerprint of the run that recorded these values."""
        fingerprint = (self.manifest or {}).get("fingerprint")
        return str(fingerprint.get("device")) if isinstance(fingerprint, Mapping) else None


def golden_lanes(directory: Path, manifest: Mapping[str, Any]) -> list[LaneValues]:
    """Every lane of the golden in ``directory`` (``manifest``: its own, read): its base lane
    (where it has one: a golden imported without a fingerprint has none), then the others by
    name. A lane whose manifest is unreadable is listed with the reason as its ``problem``."""
    from ... import store

    base = base_lane(manifest)
    found = [] if base is None else [LaneValues(base, directory, True, manifest)]
    inputs = input_digests(manifest.get("files", {}))
    for name in other_lanes(directory):
        folder = lane_dir(directory, name)
        try:
            recorded = store.read_manifest(folder)
        except GoldenError as exc:
            found.append(LaneValues(name, folder, False, None, problem=str(exc)))
            continue
        stale = stale_inputs(recorded or {}, inputs)
        found.append(LaneValues(name, folder, False, recorded, stale))
    return found


def lane_values(directory: Path, lane: str | None) -> LaneValues:
    """Lane ``lane`` of the golden in ``directory`` (``None``: its base lane, the values
    beside its inputs). Raises :class:`~.errors.GoldenError` naming the lanes it holds if it
    has no such lane, or naming the file if it is not a golden or its manifest is damaged."""
    from ... import store
    from .messages import lane_not_held

    manifest = store.read_manifest(directory)
    if manifest is None:
        raise GoldenError(f"{directory}: no {MANIFEST}; not a golden directory")
    held = golden_lanes(directory, manifest)
    if lane is None:
        return LaneValues(base_lane(manifest), directory, True, manifest)
    for values in held:
        if values.lane == lane:
            if values.problem is not None:
                raise GoldenError(values.problem)
            return values
    raise GoldenError(lane_not_held(directory, lane, [v.lane for v in held if v.lane]))


__all__ = [
    "AUTO",
    "ENVIRONMENT_VARIABLE",
    "LaneChoice",
    "LaneSetting",
    "LaneValues",
    "base_lane",
    "choose",
    "environment_lane",
    "golden_lanes",
    "input_digests",
    "lane_dir",
    "lane_problem",
    "lane_values",
    "other_lanes",
    "resolve_auto",
    "resolve_setting",
    "split_lane",
    "stale_inputs",
]
