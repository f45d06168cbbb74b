"""Why a test runs again: one decision, made here and nowhere else.

A test runs again, and every reason is in `decide`:

- its own failure, error or timeout, under its own `reruns` or `--devpool-reruns`
  (`Why.RERUN`, a new attempt that spends one of the job's reruns of failures);
- a crash, or an infra ending (a machine lost, a worker that died before its test or did
  not collect it), under `--devpool-reruns-infra` (`Why.RERUN_INFRA`, one of its reruns of
  crashes); a crash is the test's own ending, infra is not;
- it ran out of device memory within what it declared, beside other tests (`Why.MEMORY`,
  the record's `memory_retry`): once more, alone on a whole device, spending nothing;
- it never ran: its batch ended before it (a failure or crash ahead of it, a fair-share
  cut), its worker ended before it or was ended for another test's timeout
  (`Why.SENT_BACK`: the same attempt goes back to the queue; sent back too often, it runs
  next in a worker of its own, and sent back from there, its ending is its own: infra).

What happens to the worker is not decided here: a fatal pattern or
`--devpool-fresh-after-failure` retires it, and every new attempt runs in a fresh one
(Job.fresh). Endings (endings.py) carry a decision out; the replay (replay.py) tells
pytest a RERUN or a final ending from it. An attempt's decision is written by `ask` alone.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Literal, Protocol

from devpool.config import Settings
from devpool.outcomes import Outcome
from devpool.plan.jobs import Job

ALONE_AFTER = 3  # an attempt sent back untouched this often runs next in a worker of its own
_NOT_ITS_TEST = (Outcome.CRASHED, Outcome.INFRA)  # endings under --devpool-reruns-infra


class Why(str, enum.Enum):
    """Why a test runs again."""

    RERUN = "rerun"  # its failure, error or timeout; its reruns or --devpool-reruns
    RERUN_INFRA = "rerun-infra"  # a crash or infra ending; --devpool-reruns-infra
    MEMORY = "memory"  # out of memory beside others: alone on a whole device, not counted
    SENT_BACK = "sent-back"  # it never ran: the same attempt goes back to the queue


class Happened(enum.Enum):
    """What the decision is asked about."""

    FAILED_REPORT = "failed report"  # a phase report failed; the attempt runs on
    RAN_OUT_BESIDE = "ran out beside"  # a failed report: out of memory within its declaration
    FINISHED = "finished"  # the worker ran it to its end: its reports decided
    ENDED = "ended"  # an ending devpool saw: timeout, crash, lost, died before, not collected
    SENT_BACK = "sent back"  # it was sent and did not run
    LOST_TRACK = "lost track"  # after the loop, without its one ending: a devpool bug


Spends = Literal["", "failed", "infra"]


@dataclass(frozen=True)
class Decision:
    """Whether the test runs again, why, and how."""

    why: Why | None = None  # None: it does not run again (sent back: it cannot go back)
    spends: Spends = ""  # the job's reruns it spends: of failures, of crashes, none
    own_failure: bool = False  # the test's own ending: a later pass is flaky
    whole_device: bool = False  # alone on a whole device (after running out beside others)
    own_worker: bool = False  # sent back too often: next in a worker of its own
    delay: float = 0.0  # --devpool-reruns-delay: seconds before it is queued again

    @property
    def runs(self) -> bool:
        return self.why is not None

    @property
    def new_attempt(self) -> bool:
        """It runs as a new attempt (a rerun); one sent back keeps its attempt."""
        return self.runs and self.why is not Why.SENT_BACK

    @property
    def movable(self) -> bool:
        """A shared queue may run it in another CI job (never the memory retry: not its doing)."""
        return self.new_attempt and not self.whole_device


NO = Decision()


@dataclass(frozen=True)
class Limits:
    """The run's options on reruns."""

    reruns: int = 0
    reruns_infra: int = 1
    reruns_delay: float = 0.0

    @classmethod
    def of(cls, settings: Settings) -> Limits:
        return cls(settings.reruns, settings.reruns_infra, settings.reruns_delay)


@dataclass(frozen=True)
class Facts:
    """What the decision needs of an attempt and its job."""

    happened: Happened
    outcome: Outcome = Outcome.INFRA  # the ending (a failed report's: failed or error)
    earlier: Decision = NO  # what the attempt's earlier reports decided
    started: bool = False  # the test itself began
    own_reruns: int | None = None  # the job's reruns marker, over --devpool-reruns
    own_delay: float | None = None  # the job's reruns delay, over --devpool-reruns-delay
    spent_failed: int = 0
    spent_infra: int = 0
    requeues: int = 0  # times sent back untouched before
    counts: bool = True  # a send-back held against it (a fair-share cut is not)
    runs_alone: bool = False  # it is already run in a worker of its own


def budget(outcome: Outcome, own_reruns: int | None, limits: Limits) -> tuple[str, int]:
    """The option whose reruns an ending spends, and its limit (said in the reports)."""
    if outcome in _NOT_ITS_TEST:
        return "--devpool-reruns-infra", limits.reruns_infra
    if own_reruns is not None:
        return "its own reruns", own_reruns
    return "--devpool-reruns", limits.reruns


def decide(facts: Facts, limits: Limits) -> Decision:
    """The one decision: does this test run again, why, and how."""
    happened = facts.happened
    if happened is Happened.SENT_BACK:
        if facts.counts and facts.runs_alone and facts.requeues >= ALONE_AFTER:
            return NO  # next, alone in its worker, and sent back: its own ending (infra)
        alone = facts.requeues + int(facts.counts) >= ALONE_AFTER
        return Decision(Why.SENT_BACK, own_worker=alone)
    if happened is Happened.LOST_TRACK:
        return NO
    if happened is Happened.RAN_OUT_BESIDE:
        return Decision(Why.MEMORY, whole_device=True)
    if happened is Happened.FAILED_REPORT:
        if facts.earlier.runs:
            return facts.earlier  # a report already said RERUN: its later ones say so too
        return _settled(facts, limits) if _within(facts, limits) else NO
    if happened is Happened.FINISHED:  # its reports decided; the ending says how
        return _settled(facts, limits) if facts.earlier.runs else NO
    # ENDED: the ending decides afresh (a crash after a failed report spends a crash's)
    return _settled(facts, limits) if _within(facts, limits) else NO


def _within(facts: Facts, limits: Limits) -> bool:
    """The job has reruns left for this ending."""
    if facts.outcome in _NOT_ITS_TEST:
        return facts.spent_infra < limits.reruns_infra
    _, limit = budget(facts.outcome, facts.own_reruns, limits)
    return facts.spent_failed < limit


def _settled(facts: Facts, limits: Limits) -> Decision:
    """A rerun for this ending: what it spends, whether it was the test's own, its delay."""
    outcome = facts.outcome
    delay = limits.reruns_delay if facts.own_delay is None else facts.own_delay
    delay = 0.0 if outcome in _NOT_ITS_TEST else delay  # a crash reruns at once
    if facts.earlier.why is Why.MEMORY:
        return Decision(Why.MEMORY, whole_device=True, delay=delay)
    infra = outcome in _NOT_ITS_TEST
    return Decision(
        Why.RERUN_INFRA if infra else Why.RERUN,
        spends="infra" if infra else "failed",
        own_failure=facts.started and outcome is not Outcome.INFRA,
        delay=delay,
    )


class Tried(Protocol):
    """The attempt's part the decision reads and writes (run/attempts.Attempt)."""

    job: Job
    started_wall: float
    requeues: int
    again: Decision


def ask(
    attempt: Tried,
    happened: Happened,
    settings: Settings,
    outcome: Outcome = Outcome.INFRA,
    counts: bool = True,
) -> Decision:
    """Decide for an attempt, and keep the decision on it (the one writer of attempt.again).

    A send-back's decision is not kept: the attempt goes back as it was."""
    job = attempt.job
    facts = Facts(
        happened,
        outcome,
        attempt.again,
        attempt.started_wall > 0,
        job.request.reruns,
        job.request.reruns_delay,
        job.retries_failed,
        job.retries_infra,
        attempt.requeues,
        counts,
        job.runs_alone,
    )
    decision = decide(facts, Limits.of(settings))
    if happened is not Happened.SENT_BACK:
        attempt.again = decision
    return decision
