"""Mode policy: what each mode may do with a golden, as one pure decision table.

No I/O and no torch: :class:`ModePolicy` answers questions such as "may this run
record?", "what does a metric missing from the golden mean?" or "what happens to a
rollout step never recorded?" for :class:`~.golden.Golden`, which then acts on the
answer. The table, by mode (``UPDATE`` is ``--update-golden``, ``STRICT`` is
``--golden-strict``, CI or a replay-only golden):

=============================  ==============  ================  ==================
situation                      AUTO            UPDATE            STRICT
=============================  ==============  ================  ==================
golden exists                  replay          re-record         replay
damaged file or manifest       error           re-record it      error
value not in the golden        new, recorded   new, recorded     missing (fails)
recorded value compared        pass/fail       updated           pass/fail
recorded value not checked     missing         dropped           missing
recorded rollout               replayed        kept (or          replayed
                                               regenerated)
rollout step never recorded    missing-step    missing-step      missing-step
                               policy          policy            policy, never
                                                                 recorded
=============================  ==============  ================  ==================

A replay-only golden (:class:`ReplayOnly`, a layout variant) is always ``STRICT``
and a missing golden fails. Under ``UPDATE``, a shared golden that another test
already re-recorded this session is replayed instead (:meth:`ModePolicy.opened`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ..results import Mode, Status, Verdict

# The missing-step policies: what a rollout step never recorded means (ModePolicy.of)
RECORD, ERROR, REPEAT, GENERATE = "record", "error", "repeat", "generate"
MISSING_STEP_POLICIES = (RECORD, ERROR, REPEAT, GENERATE)


def check_policy(value: Any, source: str) -> str:
    """``value`` if it names a missing-step policy, else ValueError naming ``source``."""
    if value not in MISSING_STEP_POLICIES:
        raise ValueError(
            f"{source}: missing-step policy must be one of {', '.join(MISSING_STEP_POLICIES)}, "
            f"got {value!r}"
        )
    return value


# What to do with a rollout the golden lists (ModePolicy.recorded_rollout)
REPLAY, KEEP, REGENERATE = "replay", "keep", "regenerate"
# What to do with a rollout step never recorded (ModePolicy.missing_rollout_step), besides
# the missing-step policies RECORD, REPEAT, GENERATE and ERROR below
REFUSE = "refuse"  # recording is off: a missing golden entry, the usual remedy
# (ERROR: the missing-step policy forbids it, although recording is on)


@dataclass(frozen=True)
class ReplayOnly:
    """This golden is recorded by another test (``recorder``); this one only replays it.

    Such a golden never records, whatever the mode: a missing golden, step or metric fails
    with ``remedy`` (how to record it) instead of the usual ``--update-golden`` advice.
    """

    recorder: str
    remedy: str


@dataclass(frozen=True)
class ModePolicy:
    """The decisions of one golden's mode; immutable, a changed decision is a new policy.

    ``regenerate``: under ``UPDATE``, re-run ``generate`` for recorded rollouts instead of
    keeping them. ``missing_step``: the policy for a rollout step never recorded
    (:data:`MISSING_STEP_POLICIES`; ``None``: ``record``, ``error`` in ``STRICT``).
    ``only_failing``: under ``UPDATE``, a value within tolerance passes, and the golden is
    re-recorded only if one is beyond (``--update-golden-failing``).
    """

    mode: Mode = Mode.AUTO
    replay_only: bool = False
    regenerate: bool = False
    missing_step: str | None = None
    only_failing: bool = False

    @classmethod
    def of(
        cls,
        mode: Mode,
        *,
        replay_only: bool = False,
        regenerate: bool = False,
        missing_step: str | None = None,
        missing_step_source: str = "missing_step=",
        only_failing: bool = False,
    ) -> ModePolicy:
        """The policy of a golden; a replay-only golden never records (``STRICT``)."""
        if missing_step is not None:
            check_policy(missing_step, missing_step_source)
        mode = Mode.STRICT if replay_only else mode
        return cls(mode, replay_only, regenerate, missing_step, only_failing)

    def opened(self, *, exists: bool, updated_this_session: bool) -> ModePolicy:
        """The policy once the golden is open.

        Under ``UPDATE``, a golden another test re-recorded this session (one golden shared
        by several tests, or by xdist workers) is replayed as in ``AUTO``: the first test
        re-records it, the others check against that recording.
        """
        if exists and self.mode is Mode.UPDATE and updated_this_session:
            return dataclasses.replace(self, mode=Mode.AUTO)
        return self

    # ------------------------------------------------------------------ recording

    @property
    def records(self) -> bool:
        """Whether this run may write a value that the golden does not hold."""
        return self.mode is not Mode.STRICT

    @property
    def rerecords(self) -> bool:
        """Whether this run rewrites values the golden holds (``--update-golden``)."""
        return self.mode is Mode.UPDATE

    def replays(self, exists: bool) -> bool:
        """Whether recorded values are the reference this run is compared against."""
        return exists and self.mode is not Mode.UPDATE

    def fresh(self, exists: bool) -> bool:
        """Whether a commit writes a whole new recording (a new environment fingerprint,
        every file listed as recorded) rather than adding to the existing one."""
        return not exists or self.mode is Mode.UPDATE

    @property
    def replaces_damaged(self) -> bool:
        """Whether an unreadable golden file is re-recorded instead of raising.

        Every error about a damaged golden names ``--update-golden`` as the remedy,
        so an update must not need the old values: it only loses their diff.
        """
        return self.mode is Mode.UPDATE

    def refuses_missing_golden(self, exists: bool) -> bool:
        """Whether a golden that does not exist is an error at once (replay-only goldens)."""
        return self.replay_only and not exists

    def warns_nan(self, recorded: bool) -> bool:
        """Whether a NaN value is about to be written (``recorded``: the golden holds it)."""
        return self.records and (self.rerecords or not recorded)

    def keeps_file(self, *, used: bool, calibrated: bool) -> bool:
        """Whether a file of the old version that this run did not rewrite is kept on commit.

        An update keeps only what the test used, plus calibrated tolerances (they describe
        the setup's noise, not the values); other modes keep everything.
        """
        return not self.rerecords or used or calibrated

    def needs_write(
        self, *, staged: bool, checked_metrics: bool, new_values: bool, beyond: bool = True
    ) -> bool:
        """Whether finishing commits a new version of the golden (``beyond``: a value was
        beyond tolerance, which ``only_failing`` re-records on)."""
        if self.rerecords and self.only_failing and not (beyond or new_values):
            return False
        if staged:
            return True
        if self.rerecords:
            return checked_metrics
        return new_values

    def status(self, *, exists: bool, wrote: bool, touched: bool) -> Status | None:
        """The golden's status after a test that passed (``None``: never touched)."""
        if wrote:
            return Status.UPDATED if self.rerecords and exists else Status.RECORDED
        return Status.REPLAYED if touched else None

    # ------------------------------------------------------------------ verdicts

    def verdict(self, *, ok: bool | None, ignore: bool) -> Verdict:
        """The verdict on a value the golden holds, compared: ``ok`` within tolerance."""
        if ignore:
            return Verdict.IGNORED
        if self.rerecords and not (self.only_failing and ok):
            return Verdict.UPDATED
        return Verdict.PASS if ok else Verdict.FAIL

    @property
    def unrecorded(self) -> Verdict:
        """The verdict on a value the golden does not hold: recorded, or missing."""
        return Verdict.NEW if self.records else Verdict.MISSING

    @property
    def reports_unchecked(self) -> bool:
        """Whether a recorded value this run did not check is missing (else it is dropped)."""
        return not self.rerecords

    # ------------------------------------------------------------------ rollouts

    def recorded_rollout(self) -> str:
        """A rollout the golden holds: ``REPLAY``, ``KEEP`` (update, input kept) or
        ``REGENERATE`` (update with ``regenerate``)."""
        if not self.rerecords:
            return REPLAY
        return REGENERATE if self.regenerate else KEEP

    def missing_rollout_step(self, *, steps_recorded: bool) -> str:
        """A rollout step never recorded: ``RECORD``, ``REPEAT`` or ``GENERATE`` (the
        missing-step policies), ``ERROR`` (the policy forbids it) or ``REFUSE`` (recording
        is off). ``steps_recorded``: other steps of this rollout were recorded."""
        policy = self.missing_step or (RECORD if self.records else ERROR)
        if not self.records and policy == RECORD:
            policy = ERROR  # strict mode never records
        if not steps_recorded or (self.rerecords and policy == ERROR):
            # nothing to stand in for it; --update-golden is the remedy of error
            return RECORD if self.records else REFUSE
        if policy == ERROR:
            return ERROR if self.records else REFUSE
        return policy


__all__ = [
    "ERROR",
    "GENERATE",
    "KEEP",
    "MISSING_STEP_POLICIES",
    "RECORD",
    "REFUSE",
    "REGENERATE",
    "REPEAT",
    "REPLAY",
    "ModePolicy",
    "ReplayOnly",
    "check_policy",
]
