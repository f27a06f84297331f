"""What a golden run decides, as data: modes, verdicts, comparisons and outcomes.

Torch-free, so the plugin and the CLI can hold results without importing the
replay machinery. Texts built from these live in :mod:`.golden.messages`
and :mod:`.pytest_plugin.summary`.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from typing import Any

from .tolerance.spec import Tolerance


class Mode(enum.Enum):
    """AUTO records what is missing; UPDATE re-records; STRICT never records."""

    AUTO = "auto"
    UPDATE = "update"
    STRICT = "strict"


class Verdict(str, enum.Enum):
    """The verdict on one metric or tensor at one step; its value is what reports print."""

    PASS = "pass"
    FAIL = "fail"
    MISSING = "missing"
    NEW = "new"
    UPDATED = "updated"
    IGNORED = "not compared"  # excluded on purpose by a tolerance entry (Tolerance.ignore)

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


class Status(str, enum.Enum):
    """What happened to one golden during one test."""

    REPLAYED = "replayed"
    RECORDED = "recorded"
    UPDATED = "updated"
    FAILED = "failed"
    XFAILED = "xfailed"  # failed inside an expected failure

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


STATUSES = (Status.REPLAYED, Status.RECORDED, Status.UPDATED, Status.FAILED)


def json_number(value: Any) -> Any:
    """Strict-JSON form of a float: non-finite values become "nan", "inf", "-inf"."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    return value


def from_json_number(value: Any) -> Any:
    """Inverse of :func:`json_number`; a string other than "nan", "inf", "-inf" is a ValueError."""
    if isinstance(value, str):
        if value not in ("nan", "inf", "-inf"):
            raise ValueError(f"{value[:40]!r} is not a number, 'nan', 'inf' or '-inf'")
        return float(value)
    return value


@dataclasses.dataclass
class Comparison:
    """The verdict on one metric or tensor at one step, with everything a report needs."""

    name: str
    step: int
    verdict: Verdict
    kind: str = "metric"
    rank: int | None = None
    micro: int | None = None
    expected: Any = None
    actual: Any = None
    abs_diff: float | None = None
    rel_diff: float | None = None
    tolerance: Tolerance | None = None
    tolerance_source: str = ""
    detail: str = ""
    excess: float | None = None  # greatest difference / difference allowed (>1: beyond)
    scale: float | None = None  # the magnitude rtol was measured against, where not |expected|
    bound: float | None = None  # a gate's ceiling (a trend's), where no tolerance applies

    @property
    def failed(self) -> bool:
        return self.verdict in (Verdict.FAIL, Verdict.MISSING)

    def to_json(self) -> dict[str, Any]:
        out = {"metric" if k == "name" else k: v for k, v in dataclasses.asdict(self).items()}
        out["verdict"] = str(self.verdict)
        out["tolerance"] = dataclasses.asdict(self.tolerance) if self.tolerance else None
        for key in ("expected", "actual", "abs_diff", "rel_diff", "excess", "bound"):
            out[key] = json_number(out[key])
        if self.bound is None:
            del out["bound"]
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Comparison:
        fields = {"name" if k == "metric" else k: v for k, v in data.items()}
        fields["verdict"] = Verdict(fields["verdict"])
        if fields.get("tolerance") is not None:
            fields["tolerance"] = Tolerance(**fields["tolerance"])
        for key in ("expected", "actual", "abs_diff", "rel_diff", "excess", "bound"):
            fields[key] = from_json_number(fields.get(key))
        return cls(**fields)


@dataclasses.dataclass
class Outcome:
    """What happened to one golden during one test; the session summary is built from these."""

    test: str
    directory: str
    status: Status | None = None  # None: the golden was never touched
    comparisons: list[Comparison] = dataclasses.field(default_factory=list)
    recorded: list[str] = dataclasses.field(default_factory=list)
    environment_changes: list[str] = dataclasses.field(default_factory=list)
    discarded: bool = False
    rollouts: list[str] = dataclasses.field(default_factory=list)  # kept / regenerated inputs
    # tolerances from the golden's tolerances.json looser than without it, by value name:
    # {"tolerance": ..., "without": ...} as described
    loosened: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)
    # the test that recorded the golden this test replayed, where another (key=, shared=)
    recorded_by: str = ""
    # the lane this run used (lanes.py): name, source, the golden's base lane, and the
    # fallback lane compared against where this one was never recorded; {} with lanes off
    lane: dict[str, Any] = dataclasses.field(default_factory=dict)
    # replaying, the recorded values a test that raised never reached: {"metric", "step"}
    unreached: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    # replaying, what decides a long run's gates (:mod:`..report.gates`): the envelope lane
    # ("source", "bands") or why none ("none"), and this test's float64 "certificate"
    long_run: dict[str, Any] = dataclasses.field(default_factory=dict)

    def fail(self) -> None:
        """The golden failed: a mismatch, or it was missing or unreadable."""
        self.status = Status.FAILED

    def expected_failure(self) -> None:
        """The test is marked xfail: a failed golden counts as expected, not as a failure."""
        if self.status is Status.FAILED:
            self.status = Status.XFAILED

    def to_json(self) -> dict[str, Any]:
        return {
            "test": self.test,
            "directory": self.directory,
            "status": None if self.status is None else self.status.value,
            "comparisons": [c.to_json() for c in self.comparisons],
            "recorded": self.recorded,
            "environment_changes": self.environment_changes,
            "discarded": self.discarded,
            "rollouts": self.rollouts,
            "loosened": self.loosened,
            **({"recorded_by": self.recorded_by} if self.recorded_by else {}),
            **({"lane": self.lane} if self.lane else {}),
            **({"unreached": self.unreached} if self.unreached else {}),
            **({"long_run": self.long_run} if self.long_run else {}),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Outcome:
        status = data.get("status")
        return cls(
            test=data["test"],
            directory=data["directory"],
            status=None if status is None else Status(status),
            comparisons=[Comparison.from_json(c) for c in data.get("comparisons", [])],
            recorded=list(data.get("recorded", [])),
            environment_changes=list(data.get("environment_changes", [])),
            discarded=bool(data.get("discarded", False)),
            rollouts=list(data.get("rollouts", [])),
            loosened=dict(data.get("loosened", {})),
            recorded_by=str(data.get("recorded_by", "")),
            lane=dict(data.get("lane", {})),
            unreached=list(data.get("unreached", [])),
            long_run=dict(data.get("long_run", {})),
        )


# ------------------------------------------------------------- rollout-golden diff


@dataclasses.dataclass
class Row:
    """One metric or tensor at one step (rank, micro-batch) of one golden."""

    kind: str  # "metric" | "tensor"
    name: str
    step: int | None
    ok: bool
    rank: int | None = None
    micro: int | None = None
    compared: bool = True
    expected: Any = None  # a scalar metric's values; tensors: None
    actual: Any = None
    shape: tuple[list[int] | None, list[int] | None] = (None, None)
    dtype: tuple[str | None, str | None] = (None, None)
    numel: int = 0
    mismatched: int = 0
    abs_max: float = 0.0
    abs_mean: float = 0.0
    rel_max: float = 0.0
    rel_mean: float = 0.0
    allowed: str = ""
    source: str = ""
    detail: str = ""
    mask_selected: int | None = None  # positions the recording's mask selected (of numel)
    allowance: float | None = None  # a scalar metric's: the difference allowed at its step
    note: str = ""  # what the numbers do not say (a mask diff does not apply)

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        for key in ("expected", "actual", "abs_max", "abs_mean", "rel_max", "rel_mean"):
            out[key] = json_number(out[key])
        if self.allowance is not None:
            out["allowance"] = json_number(self.allowance)
        out["shape"], out["dtype"] = list(self.shape), list(self.dtype)
        return out


@dataclasses.dataclass
class GoldenDiff:
    """The comparison of one golden (or batch file) of side A with its counterpart in B."""

    label: str
    a: str | None
    b: str | None
    rows: list[Row] = dataclasses.field(default_factory=list)
    problems: list[str] = dataclasses.field(default_factory=list)  # structure, one-sided files

    @property
    def one_sided(self) -> bool:
        return self.a is None or self.b is None

    @property
    def differences(self) -> int:
        return (
            len(self.problems)
            + sum(not r.ok for r in self.rows)
            + (1 if self.one_sided and not self.problems else 0)
        )

    def first_divergence(self) -> dict[str, int | None]:
        """Per metric or tensor name: the first step beyond tolerance (``None``: none)."""
        first: dict[str, int | None] = {}
        for row in self.rows:
            first.setdefault(row.name, None)
            if not row.ok and row.step is not None:
                step = first[row.name]
                first[row.name] = row.step if step is None else min(step, row.step)
        return first

    def to_json(self) -> dict[str, Any]:
        return {
            "golden": self.label,
            "a": self.a,
            "b": self.b,
            "differences": self.differences,
            "first_divergence": self.first_divergence(),
            "problems": self.problems,
            "metrics": [r.to_json() for r in self.rows if r.kind == "metric"],
            "tensors": [r.to_json() for r in self.rows if r.kind == "tensor"],
        }
