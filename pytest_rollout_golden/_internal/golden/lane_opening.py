"""Opening the values of a golden's lane: the lane :func:`.lanes.choose` chooses, opened (and
locked) beside the inputs or in ``@lanes/<lane>/`` (:func:`open_lane`), and the error that
says why it refused one (:func:`lane_refusal`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...errors import GoldenError, GoldenFormatError, GoldenMissingError
from . import lanes
from .golden_files import GoldenFiles
from .lanes import LaneChoice, LaneSetting
from .messages import (
    lane_missing,
    lane_on_other_inputs,
    oracle_missing,
    oracle_on_other_inputs,
    regenerate_in_lane,
)
from .modes import ModePolicy


def open_lane(
    directory: Path,
    inputs: GoldenFiles,
    setting: LaneSetting,
    policy: ModePolicy,
    *,
    rebuild: Callable[..., Any] | None = None,
) -> tuple[LaneChoice, GoldenFiles]:
    """``(the lane chosen, its values)`` for the golden in ``directory`` whose ``inputs`` are
    open: the base lane's values are the inputs' own files; another lane's are opened in
    ``@lanes/<lane>/``; those not chosen are closed again. A refused choice comes back with
    the values it refuses (:func:`lane_refusal` says why)."""
    exists = inputs.exists
    base = lanes.base_lane(inputs.manifest) if exists else None  # type: ignore[arg-type]
    opened: dict[str, GoldenFiles] = {}

    def values(name: str) -> GoldenFiles:
        if name not in opened:
            opened[name] = (
                inputs if name == base else _open_values(directory, name, policy, rebuild)
            )
        return opened[name]

    choice = None
    try:
        choice = lanes.choose(
            setting,
            inputs.manifest if exists else None,
            lanes.other_lanes(directory) if exists else (),
            recorded=lambda name: values(name).exists,
            stale=lambda name: _stale_inputs(inputs, values(name)),
            records=policy.records,
            rerecords=policy.rerecords,
            regenerate=policy.regenerate,
        )
    finally:
        kept = None if choice is None or choice.role == "base" else choice.values
        for name, files in opened.items():
            if files is not inputs and name != kept:
                files.close()
    if choice.role == "base":
        return choice, inputs
    assert choice.values is not None
    return choice, values(choice.values)


def _open_values(
    directory: Path, lane: str, policy: ModePolicy, rebuild: Callable[..., Any] | None
) -> GoldenFiles:
    """The values of ``lane`` in ``@lanes/<lane>/``, opened (a link there is refused)."""
    lanes.refuse_lane_link(directory, lane)
    values = GoldenFiles(lanes.lane_dir(directory, lane), rebuild=rebuild)
    values.open(damaged_is_missing=policy.replaces_damaged)
    return values


def _stale_inputs(inputs: GoldenFiles, values: GoldenFiles) -> list[str]:
    """The input files changed since ``values`` (a lane's) were computed."""
    if not values.exists:
        return []
    digests = lanes.input_digests(inputs.recorded)
    return lanes.stale_inputs(values.manifest, digests)  # type: ignore[arg-type]


def lane_refusal(
    choice: LaneChoice, directory: Path, where: Path, test_id: str, remedy: str
) -> GoldenError:
    """The error that says why :func:`.lanes.choose` refused the lanes of the golden in
    ``directory`` (``where``: the values refused)."""
    if choice.refusal == "regenerate":
        lane = choice.base if choice.in_base else choice.lane
        return GoldenError(regenerate_in_lane(directory, lane, choice.base, choice.held))
    if choice.refusal == "oracle-missing":
        return GoldenMissingError(oracle_missing(test_id, directory, remedy))
    if choice.refusal == "missing":
        return GoldenMissingError(lane_missing(directory, choice.setting, choice.held))
    if choice.refusal == "oracle-stale":
        return GoldenFormatError(oracle_on_other_inputs(where, choice.stale))
    return GoldenFormatError(lane_on_other_inputs(where, str(choice.values), choice.stale))
