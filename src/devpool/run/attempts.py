"""One attempt of one job: the unit of truth of a run.

An attempt carries everything that belongs to one try of one test: its devices, its
deadline, its reports, its log and its outcome. A worker is only where it runs. Every
attempt moves through explicit states, and each move is written to the run record:

    queued → sent → started → reported | timed-out | crashed | lost → concluded
    queued → leased → sent …            (the first attempt of a placement takes the lease)
    sent → queued                       (returned untouched: batched behind a failure)
    started → lost → queued             (its worker was killed for another attempt)
    queued | leased | sent → concluded  (ended without running: infra, skipped, missing)

A deadline can only act on the attempt that owns it, and is void once that attempt has
reported: nothing that belongs to one test can end another.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from devpool.outcomes import Outcome
from devpool.plan.jobs import Job
from devpool.run import clock
from devpool.run.again import NO, Decision


class State(str, enum.Enum):
    """Where an attempt stands."""

    QUEUED = "queued"
    LEASED = "leased"
    SENT = "sent"
    STARTED = "started"
    REPORTED = "reported"
    TIMED_OUT = "timed-out"
    CRASHED = "crashed"
    LOST = "lost"
    CONCLUDED = "concluded"


_ENDED_RUNNING = {State.REPORTED, State.TIMED_OUT, State.CRASHED, State.LOST}

# The moves an attempt may make; anything else is a bug in devpool, raised at once.
ALLOWED: dict[State, frozenset[State]] = {
    State.QUEUED: frozenset({State.LEASED, State.SENT, State.CONCLUDED}),
    State.LEASED: frozenset({State.SENT, State.QUEUED, State.CONCLUDED}),
    State.SENT: frozenset({State.STARTED, State.QUEUED, State.LOST, State.CONCLUDED}),
    State.STARTED: frozenset(_ENDED_RUNNING),
    State.REPORTED: frozenset({State.CONCLUDED}),
    State.TIMED_OUT: frozenset({State.CONCLUDED}),
    State.CRASHED: frozenset({State.CONCLUDED}),
    State.LOST: frozenset({State.CONCLUDED, State.QUEUED}),
    State.CONCLUDED: frozenset(),
}

Emit = Callable[..., None]


class TransitionError(RuntimeError):
    """An attempt was asked to make a move its state does not allow (a devpool bug)."""


@dataclass(eq=False)
class Attempt:
    """One try of one job, from the queue to its conclusion."""

    job: Job
    number: int
    state: State = State.QUEUED
    devices: tuple[int, ...] = ()
    ports: tuple[int, ...] = ()  # leased TCP ports of its worker (run/host_leases.py)
    resources: tuple[tuple[str, int], ...] = ()  # named host resources its worker holds
    worker: int | None = None  # the key of the worker it was sent to
    deadline: float | None = None  # monotonic; only while started
    left_at_prompt: float | None = None  # its deadline's time left, while at a debugger
    started: float = 0.0  # monotonic, at the worker's start event
    started_wall: float = 0.0  # time.time() at the start, for the record
    output_from: int = 0  # the worker log's size when it started: its own output follows
    phases: list[pytest.TestReport] = field(default_factory=list)
    told: list[str] = field(default_factory=list)  # its reports' closing-line words, until it ends
    failed: bool = False  # a phase report failed
    again: Decision = NO  # whether its job runs again, and why (again.py decides it)
    outcome: Outcome | None = None
    log: Path | None = None  # the test's own log, for endings that did not pass
    kill_stage: int = 0  # 0 none, 1 stacks asked, 2 SIGTERM sent, 3 SIGKILL sent
    kill_at: float = 0.0
    requeues: int = 0  # times it went back to the queue untouched (not its fault)
    overrun: str = ""  # it used more device memory than it declared: why it failed
    alone: bool = False  # a run alone after running out of memory beside other tests
    peak_memory: dict[int, int] = field(default_factory=dict)  # device → bytes, when watched
    cpu_load: float | None = None  # cores its device test kept busy (worker/cpu_load.py)
    history: list[tuple[State, float]] = field(default_factory=list)

    @property
    def nodeid(self) -> str:
        return self.job.nodeid

    @property
    def display(self) -> str:
        return self.job.display

    @property
    def running(self) -> bool:
        """Started and not yet ended: the one attempt its worker is running now."""
        return self.state is State.STARTED

    @property
    def final(self) -> bool:
        return self.state is State.CONCLUDED

    def move(self, state: State, emit: Emit, **fields: Any) -> None:
        """Make one move and write it to the run record."""
        if state not in ALLOWED[self.state]:
            raise TransitionError(
                f"attempt {self.number} of {self.display}: {self.state.value} → {state.value}"
            )
        self.state = state
        self.history.append((state, clock.now()))
        if state is not State.STARTED:
            self.deadline = None  # a deadline lives only while its attempt runs
            self.kill_stage = 0
        emit(
            "attempt",
            job=self.job.id,
            nodeid=self.display,
            attempt=self.number,
            state=state.value,
            devices=list(self.devices),
            **fields,
        )

    def start(self, emit: Emit, worker_log_size: int, **fields: Any) -> None:
        """The worker began running it: its deadline starts now. fields: what its worker's
        start cost it (startup, lease_to_start), for the run record."""
        self.started = clock.now()
        self.started_wall = time.time()
        self.output_from = worker_log_size
        timeout = self.job.request.timeout
        self.move(State.STARTED, emit, **fields)
        self.deadline = self.started + timeout if timeout else None

    def due(self, now: float) -> bool:
        """Whether its deadline has passed while it still runs."""
        return self.running and self.deadline is not None and now >= self.deadline

    def pause(self, now: float) -> None:
        """At a debugger's prompt: its deadline stops, as pytest-timeout's does there."""
        if self.deadline is not None and self.left_at_prompt is None:
            self.left_at_prompt = max(0.0, self.deadline - now)
            self.deadline = None

    def resume(self, now: float) -> None:
        """Back from the prompt: the time it had left runs on."""
        if self.left_at_prompt is not None:
            if self.running:
                self.deadline = now + self.left_at_prompt
            self.left_at_prompt = None

    def requeue(self, emit: Emit, why: str, counts: bool = True) -> None:
        """Back to the queue untouched: the same attempt number, no retry spent (counts:
        towards running alone, see endings.requeue)."""
        self.requeues += int(counts)
        self.worker = None
        self.devices = ()
        self.phases = []
        self.failed = False
        self.move(State.QUEUED, emit, reason=why)


def first_attempt(job: Job) -> Attempt:
    return Attempt(job, job.attempt)
