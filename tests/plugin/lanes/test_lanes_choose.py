""":func:`~.lanes.choose`, the one place a golden's lane is decided: each branch, table-driven.

``choose`` reads nothing itself: a golden is its manifest, the lanes under ``@lanes/``, which
lanes hold values and which are stale, so every row below states the whole golden it decides.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from pytest_rollout_golden._internal.golden.lanes import (
    LaneChoice,
    LaneSetting,
    base_lane,
    choose,
    resolve_auto,
)
from pytest_rollout_golden._internal.golden.precision import ORACLE_LANE

CPU = {"lane": "cpu", "files": {}}  # a golden recorded on the cpu lane
FALLBACK_LAYER = object()  # stands for golden_lane_fallback_tolerances' layer
GPU = LaneSetting("gpu", "--golden-lane")
GPU_FALLING_BACK = LaneSetting("gpu", "--golden-lane", "cpu", FALLBACK_LAYER)
ORACLE = LaneSetting(ORACLE_LANE, "--golden-certify")


def _choose(
    setting: LaneSetting,
    manifest: Mapping[str, Any] | None = CPU,
    others: Sequence[str] = (),
    *,
    recorded: Sequence[str] = (),
    stale: Mapping[str, Sequence[str]] | None = None,
    **policy: bool,
) -> LaneChoice:
    return choose(
        setting,
        manifest,
        others,
        recorded=lambda lane: lane in recorded,
        stale=lambda lane: (stale or {}).get(lane, []),
        **policy,
    )


RERECORD = {"records": True, "rerecords": True}
REGENERATE = {**RERECORD, "regenerate": True}
STALE = ("r.safetensors",)  # an input re-recorded since a lane's values were computed


@dataclasses.dataclass(frozen=True)
class Case:
    """A golden, a run's lane and policy, and the choice expected: ``role``, ``values``,
    ``refusal``, then ``held``, ``stale`` and ``tolerances`` (default: none)."""

    setting: LaneSetting
    expected: tuple[Any, ...]
    manifest: Mapping[str, Any] | None = dataclasses.field(default_factory=lambda: CPU)
    others: Sequence[str] = ()
    recorded: Sequence[str] = ()
    stale: Mapping[str, Sequence[str]] = dataclasses.field(default_factory=dict)
    policy: Mapping[str, bool] = dataclasses.field(default_factory=dict)


CASES = {
    "lanes off": Case(LaneSetting(), ("base", "cpu", None)),
    "no golden yet": Case(GPU, ("base", None, None), manifest=None),
    "the base lane": Case(LaneSetting("cpu"), ("base", "cpu", None), others=["gpu"]),
    "base lane from the fingerprint": Case(
        LaneSetting("cuda-sm90"),
        ("base", "cuda-sm90", None),
        manifest={"fingerprint": {"cuda": "12.4", "capability": "9.0"}},
    ),
    "own lane recorded": Case(GPU, ("own", "gpu", None), others=["gpu"], recorded=["gpu"]),
    "own lane to record": Case(GPU, ("own", "gpu", None), policy={"records": True}),
    "own lane stale": Case(
        GPU,
        ("own", "gpu", "stale", (), STALE),
        others=["gpu"],
        recorded=["gpu"],
        stale={"gpu": STALE},
    ),
    "own lane stale, re-recorded": Case(
        GPU,
        ("own", "gpu", None),
        others=["gpu"],
        recorded=["gpu"],
        stale={"gpu": STALE},
        policy=RERECORD,
    ),
    "never recorded, no fallback": Case(
        GPU, ("base", "cpu", "missing", ("cpu", "tpu")), others=["tpu"]
    ),
    "never recorded, fallback not recorded": Case(
        LaneSetting("gpu", "", "tpu"), ("base", "cpu", "missing", ("cpu",))
    ),
    "fallback to the base lane": Case(
        GPU_FALLING_BACK, ("fallback", "cpu", None, (), (), FALLBACK_LAYER)
    ),
    "fallback to another lane": Case(
        LaneSetting("gpu", "", "tpu", FALLBACK_LAYER),
        ("fallback", "tpu", None, (), (), FALLBACK_LAYER),
        others=["tpu"],
    ),
    "fallback stale": Case(
        LaneSetting("gpu", "", "tpu"),
        ("fallback", "tpu", "stale", (), STALE),
        others=["tpu"],
        stale={"tpu": STALE},
    ),
    "--golden-regenerate where nothing is re-recorded": Case(
        GPU, ("own", "gpu", None), others=["gpu"], recorded=["gpu"], policy={"regenerate": True}
    ),
    "regenerate from another lane": Case(GPU, ("base", "cpu", "regenerate"), policy=REGENERATE),
    "regenerate while other lanes exist": Case(
        LaneSetting(),
        ("base", "cpu", "regenerate", ("gpu",)),
        others=["cpu", ORACLE_LANE, "gpu"],
        policy=REGENERATE,
    ),
    "regenerate the base lane, the oracle kept": Case(
        LaneSetting("cpu"), ("base", "cpu", None), others=[ORACLE_LANE], policy=REGENERATE
    ),
    "oracle recorded": Case(
        ORACLE, ("own", ORACLE_LANE, None), others=[ORACLE_LANE], recorded=[ORACLE_LANE]
    ),
    "oracle missing, no fallback": Case(ORACLE, ("base", "cpu", "oracle-missing")),
    "oracle stale": Case(
        ORACLE,
        ("own", ORACLE_LANE, "oracle-stale", (), STALE),
        others=[ORACLE_LANE],
        recorded=[ORACLE_LANE],
        stale={ORACLE_LANE: STALE},
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_choose(case: Case) -> None:
    choice = _choose(
        case.setting,
        case.manifest,
        case.others,
        recorded=case.recorded,
        stale=case.stale,
        **case.policy,
    )
    found = (choice.role, choice.values, choice.refusal, choice.held, choice.stale)
    assert (*found, choice.tolerances) == (
        *case.expected,
        *((), (), None)[len(case.expected) - 3 :],
    )
    assert choice.setting == case.setting
    assert choice.base == (None if case.manifest is None else base_lane(case.manifest))


def test_the_own_lane_is_opened_even_where_the_run_records_it() -> None:
    """Opening the run's lane locks it and refuses a link into it, so it is asked first."""
    asked: list[str] = []
    choose(
        GPU,
        CPU,
        [],
        recorded=lambda lane: asked.append(lane) or False,
        stale=lambda _: [],
        records=True,
    )
    assert asked == ["gpu"]


def test_the_base_lane_opens_no_other_lane() -> None:
    def never(lane: str) -> Any:
        raise AssertionError(f"lane {lane!r} read for a run in the base lane")

    assert choose(LaneSetting("cpu"), CPU, ["gpu"], recorded=never, stale=never).role == "base"


def test_re_recorded_values_are_not_read_for_staleness() -> None:
    def never(lane: str) -> Any:
        raise AssertionError(f"staleness of {lane!r} read while re-recording")

    choice = choose(GPU, CPU, ["gpu"], recorded=lambda _: True, stale=never, rerecords=True)
    assert (choice.role, choice.refusal) == ("own", None)


@pytest.mark.parametrize(
    ("fingerprint", "lane"),
    [
        ({"device": "cpu"}, "cpu"),
        ({"cuda": "12.4", "device": "NVIDIA H200", "capability": "9.0"}, "cuda-sm90"),
        (None, "cpu"),  # no fingerprint: the cpu lane
    ],
)
def test_auto_is_decided_from_the_environment(fingerprint, lane) -> None:
    auto = LaneSetting("auto", "ini golden_lane = auto", "cpu")
    assert resolve_auto(auto, lambda: fingerprint) == LaneSetting(lane, auto.source, "cpu")
    choice = choose(auto, None, [], recorded=bool, stale=list, fingerprint=lambda: fingerprint)
    assert choice.lane == lane


def test_a_named_lane_needs_no_fingerprint() -> None:
    def never() -> Any:
        raise AssertionError("the environment described for a named lane")

    assert resolve_auto(GPU, never) is GPU
