"""The controller's event loop: schedule, start workers, watch them, replay their reports.

One Loop runs one session's jobs to the end: it places jobs with the scheduler, takes
device leases, starts and retires workers through the backend, enforces timeouts,
turns crashes and lost nodes into reports, and replays every report into pytest's
own hooks so the terminal, --junitxml, -x and other plugins see ordinary tests.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import pytest

from devpool import probes
from devpool.backends import Backend
from devpool.backends import WorkerHandle as Worker
from devpool.fairshare import Waiter, WaitingRoom, fair_limit
from devpool.history import TestResult, runner_class
from devpool.inventory import format_ids
from devpool.leases import Blocked, Holder, Lease, describe_blockers
from devpool.outcomes import RERUN, Outcome
from devpool.plan import Job, Plan
from devpool.policies import Backfill
from devpool.report import progress
from devpool.report.junit import Attempt
from devpool.report.terminal import (
    Trouble,
    file_name,
    log_path,
    read_log,
    tail,
    write_test_log,
)
from devpool.scheduler import IdleWorker, Placement, Scheduler

if TYPE_CHECKING:
    from devpool.controller import Controller

FOREIGN_RETRY = 0.5  # seconds before retrying a device another run held
BUSY_RETRY = 2.0  # seconds before probing again a device a foreign process used
BATCH_SECONDS = 1.0  # estimated work sent to a worker at once, for small tests
BATCH_MAX = 64
UNKNOWN_SMALL = 0.1  # seconds assumed, for batching only, of a test with no history
STACKS_WAIT = 0.5  # seconds given to faulthandler to write the stacks before SIGTERM
TICK = 1.0  # longest sleep of the event loop when nothing is due

Phase = Literal["setup", "call", "teardown"]
Status = Literal["passed", "failed", "skipped"]


@dataclass(eq=False)
class Slot:
    """The controller's view of one worker: its job, its running test, its fate."""

    worker: Worker
    job: Job | None = None  # the job whose test runs now (or runs next)
    head: Job | None = None  # the job the scheduler placed: devices are its until "done"
    batch: list[Job] = field(default_factory=list)  # sent to the worker, not started yet
    later: list[Job] = field(default_factory=list)  # back to the queue once head is released
    test: str | None = None  # node id running now
    test_started: float = 0.0
    test_wall: float = 0.0  # time.time() at the test's start, for the record
    deadline: float | None = None
    phases: list[pytest.TestReport] = field(default_factory=list)
    failed: bool = False
    retry: bool = False  # the running test failed and will be run again
    kill_stage: int = 0  # 0 alive, 1 stacks asked, 2 SIGTERM sent, 3 SIGKILL sent
    kill_at: float = 0.0
    stopping: bool = False
    ready_by: float | None = None  # the worker must have collected by then (None: it has)
    stuck: str = ""  # why devpool killed a worker that never got ready

    @property
    def key(self) -> int:
        return self.worker.key


class Loop:
    """One run of the event loop: schedule, start, watch, replay, until every job ended."""

    def __init__(
        self, controller: Controller, session: pytest.Session, plan: Plan, backend: Backend
    ) -> None:
        self.c = controller
        self.session = session
        self.hook = session.config.hook
        self.plan = plan
        settings = controller.settings
        self.platform = controller.inventory.platform
        self.scheduler = Scheduler(
            controller.inventory.devices,
            Backfill(),
            controller.max_parallel,
            settings.cpu_slots,
            isolate_all=settings.isolation == "job",
        )
        self.backend = backend
        self.slots: dict[int, Slot] = {}
        self.idle: dict[int, Slot] = {}
        self.starting: dict[int, tuple[Placement, set[int]]] = {}  # job id → waiting on retirees
        self.foreign: dict[int, Blocked] = {}
        self.retry_at: dict[int, float] = {}
        self.blocked_since: dict[int, float] = {}
        self.stopped = False
        self.live: progress.LiveProgress | None = None
        self.room = WaitingRoom(controller.lock_dir.path, controller.run_id)
        self.limit: int | None = None  # most devices we may hold while other runs wait
        self.shared_at = 0.0
        self.waiting_since: float | None = None  # wall clock, while other runs block us
        self.busy_notes: dict[int, str] = {}  # device → the foreign processes the probe saw
        self.probe_unknown = False
        self.ended: dict[str, int] = {}
        self.modules_for = self._module_lists()

    def _module_lists(self) -> dict[tuple[int, bool], Path]:
        """Per kind of worker, the test modules its jobs live in: a worker imports only those.

        A worker runs jobs of one size only, so it never needs the modules of the others
        (and an 8-device module's heavy imports stay out of CPU workers)."""
        modules: dict[tuple[int, bool], set[str]] = {}
        for job in self.plan.jobs:
            item = self.c.items.get(job.nodeid)
            if item is None:
                return {}  # a job devpool cannot place in a file: let workers collect all
            key = (job.devices_needed, job.request.isolate)
            modules.setdefault(key, set()).add(str(item.path))
        folder = self.c.run_dir / "collect"
        folder.mkdir(parents=True, exist_ok=True)
        lists = {}
        for (size, isolate), paths in modules.items():
            target = folder / f"size-{size}{'-isolate' if isolate else ''}.txt"
            target.write_text("\n".join(sorted(paths)) + "\n", encoding="utf-8")
            lists[(size, isolate)] = target
        return lists

    # ---- main loop ------------------------------------------------------------------------

    def run(self) -> None:
        now = time.monotonic()
        for job in self.plan.jobs:
            job.queued_at = now
            self.scheduler.add(job)
        for job, reason in self.plan.unsatisfiable:
            if self.c.settings.skip_unsatisfiable:
                self._synthesize(job, Outcome.SKIPPED, reason, (), 0.0)
            else:
                self._synthesize(job, Outcome.INFRA, reason, (), 0.0)
        try:
            while self.slots or self.starting or (len(self.scheduler.queue) and not self.stopped):
                now = time.monotonic()
                self._escalate_timeouts(now)
                if not self.stopped:
                    self._probe_foreign(now)
                    self._share(now)
                    self._start(now)
                    self._expire_lease_waits(now)
                for worker, messages, eof in self.backend.poll(self._sleep(now)):
                    slot = self.slots[worker.key]
                    for message in messages:
                        self._on_message(slot, message)
                    if eof:
                        self._on_exit(slot)
                self._check_exits()
                if not self.stopped and (self.session.shouldfail or self.session.shouldstop):
                    self._stop_dispatch()
                if self.stopped or (not self.scheduler.queue and not self.starting):
                    self._retire_all_idle()
                if self.live is not None:
                    self.live.update(self._snapshot())
        finally:
            self._shutdown()

    def _snapshot(self) -> progress.Snapshot:
        now = time.monotonic()
        running = [
            progress.RunningJob(
                slot.test, self._where(slot.worker.devices), now - slot.test_started
            )
            for slot in self.slots.values()
            if slot.test is not None
        ]
        busy = {d for run in self.scheduler.running.values() for d in run.devices}
        waiting = ""
        if self.foreign:
            waiting = self._blockers()
        return progress.Snapshot(
            devices_total=len(self.c.inventory.devices),
            devices_busy=len(busy),
            queued=len(self.scheduler.queue) + len(self.starting),
            running=running,
            done=sum(self.ended.values()),
            waiting_on=waiting,
            counts=self.ended,
        )

    def _sleep(self, now: float) -> float:
        due = [now + (progress.REFRESH if self.live is not None else TICK)]
        for slot in self.slots.values():
            if slot.kill_stage:
                due.append(slot.kill_at)
            elif slot.deadline is not None:
                due.append(slot.deadline)
        if self.foreign:
            due.append(min(self.retry_at.values(), default=now + FOREIGN_RETRY))
        return max(0.0, min(due) - now)

    # ---- starting jobs --------------------------------------------------------------------

    def _held(self) -> set[int]:
        return {d for s in self.slots.values() if not s.stopping for d in s.worker.devices}

    def _share(self, now: float) -> None:
        """Hold no more than a fair share of the pool while other runs wait for it."""
        newly_blocked = bool(self.blocked_since) and self.waiting_since is None
        if now - self.shared_at < FOREIGN_RETRY and not newly_blocked:
            return
        self.shared_at = now
        mine = None
        if self.blocked_since:
            if self.waiting_since is None:
                self.waiting_since = time.time() - (now - min(self.blocked_since.values()))
            wants = min(self.blocked_since, key=lambda k: self.blocked_since[k])
            mine = Waiter(
                self.c.run_id,
                os.getpid(),
                self.c.host,
                self.platform.name,
                round(self.waiting_since, 3),
                wants,
            )
        else:
            self.waiting_since = None
        self.room.wait(mine)
        pool = len(self.c.inventory.devices)
        self.limit = fair_limit(pool, mine, self.room.others(self.platform.name))
        if self.limit is None:
            return
        held = len(self._held())
        for key, slot in sorted(self.idle.items(), key=lambda kv: -len(kv[1].worker.devices)):
            if held <= self.limit:
                break
            held -= len(slot.worker.devices)
            self._retire(self.idle.pop(key))

    def _start(self, now: float) -> None:
        while True:
            unavailable = [d for d, at in self.retry_at.items() if at > now]
            unavailable += self._retiring_devices()
            if self.limit is not None:
                held = self._held()
                cold = sorted(set(self.c.inventory.devices) - held - set(unavailable))
                unavailable += cold[max(0, self.limit - len(held)) :]
            idle = [IdleWorker(s.key, s.worker.devices) for s in self.idle.values()]
            placements = self.scheduler.schedule(now, unavailable, idle)
            if not placements:
                return
            retried = False
            for placement in placements:
                if not self._launch(placement, now):
                    retried = True
            if not retried:
                return

    def _launch(self, placement: Placement, now: float) -> bool:
        """Start one placement; False when a device turned out to be held by another run."""
        job = placement.job
        if placement.reuse is not None:
            slot = self.idle.pop(placement.reuse)
            self._assign(slot, job, now)
            return True
        if placement.retire:
            for key in placement.retire:
                self._retire(self.idle.pop(key))
            self.starting[job.id] = (placement, set(placement.retire))
            return True
        return self._spawn(placement, now)

    def _spawn(self, placement: Placement, now: float) -> bool:
        job = placement.job
        lease: Lease | None = None
        if placement.devices and self.backend.local_leases:
            holder = Holder.for_this_process(self.c.run_id, job.nodeid)
            got = self.c.lock_dir.try_acquire(self.platform.name, placement.devices, holder)
            if not isinstance(got, Lease):
                self.scheduler.unplace(job)
                self._mark_foreign(got, now)
                return False
            lease = got
            if not self._healthy(placement.devices, lease, now):
                self.scheduler.unplace(job)
                return False
            self.c.emit(
                "lease",
                job=job.id,
                nodeid=job.nodeid,
                devices=list(placement.devices),
                wait=round(job.foreign_wait, 3),
            )
            for device in placement.devices:
                self.foreign.pop(device, None)
                self.retry_at.pop(device, None)
        worker = self.backend.start(
            placement.devices, lease, self._env(placement.devices, job), job.request
        )
        if lease is not None:
            lease.set_job(job.nodeid, worker.pid)
        start_limit = self.c.settings.worker_start_timeout
        if not self.backend.local_leases:  # a cluster may first wait for room, up to this
            start_limit += self.c.settings.lease_timeout
        slot = Slot(worker, ready_by=now + start_limit)
        self.slots[worker.key] = slot
        self._assign(slot, job, now)
        return True

    def _assign(self, slot: Slot, job: Job, now: float) -> None:
        slot.head = job
        slot.failed = False
        slot.batch = [job, *self._batch_after(job)]
        slot.job = job
        self._job_started(slot, job, now)
        self.blocked_since.pop(job.devices_needed, None)
        if slot.worker.lease is not None and slot.worker.lease.holder.job != job.nodeid:
            slot.worker.lease.set_job(job.nodeid, slot.worker.pid)
        message = {
            "op": "run",
            "job": job.id,
            "tests": [
                {"nodeid": j.nodeid, "display": j.display, "attempt": j.attempt} for j in slot.batch
            ],
        }
        if not slot.worker.send(message):
            slot.worker.signal_group(signal.SIGKILL)  # its exit is handled as a crash

    def _job_started(self, slot: Slot, job: Job, now: float) -> None:
        job.waited = now - job.queued_at
        for device in slot.worker.devices:
            job.device_uses[device] = job.device_uses.get(device, 0) + 1
        self.c.emit(
            "job_start",
            job=job.id,
            nodeid=job.display,
            devices=list(slot.worker.devices),
            host=self.c.host,
            worker_pid=slot.worker.pid,
            queue_wait=round(job.waited, 3),
            attempt=job.attempt,
            log=str(slot.worker.log),
        )

    def _batch_after(self, head: Job) -> list[Job]:
        """More small jobs of the head's size for the same worker: per-test messaging stays
        negligible. Sized from expected durations, and never more than a fair part of what is
        left, so the end of the run stays balanced."""
        k = head.devices_needed
        settings = self.c.settings
        if k > 1 or head.request.isolate or settings.isolation == "job" or self.stopped:
            return []
        queue = self.scheduler.queue
        workers = max(1, settings.cpu_slots if k == 0 else len(self.scheduler.devices))
        cap = min(BATCH_MAX, queue.of_size_count(k) // (2 * workers))
        budget = BATCH_SECONDS - _small(head)
        batch: list[Job] = []
        while len(batch) < cap and queue.of_size_count(k):
            following = queue.peek(k)
            if following.request.isolate or _small(following) > budget:
                break
            batch.append(queue.pop(k))
            budget -= _small(following)
        return batch

    def _env(self, devices: tuple[int, ...], job: Job) -> dict[str, str]:
        env = dict(os.environ)
        modules = self.modules_for.get((job.devices_needed, job.request.isolate))
        if modules is not None:
            env["DEVPOOL_COLLECT_ONLY"] = str(modules)
        ids = ",".join(str(d) for d in devices)
        env["DEVPOOL_DEVICES"] = ids
        env["DEVPOOL_PLATFORM"] = self.platform.name
        env["DEVPOOL_RUN_ID"] = self.c.run_id
        env["DEVPOOL_ARTIFACTS"] = str(self.c.artifacts_dir)
        if self.platform.visible_env:
            # A CPU-only test sees no device at all: a stray device use fails loudly
            # instead of silently sharing a card another test holds.
            env[self.platform.visible_env] = ids
        if self.platform.kind == "cuda":
            env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # ids are nvidia-smi's order
        return env

    # ---- devices held by other runs -------------------------------------------------------

    def _healthy(self, devices: tuple[int, ...], lease: Lease, now: float) -> bool:
        """Probe newly leased devices: a card another process computes on is never handed out."""
        if self.c.probe is None:
            return True
        seen = self.c.probe(devices)
        if seen is None:
            if not self.probe_unknown:
                self.probe_unknown = True
                self._say(
                    f"cannot tell whether {self.platform.name} devices are used by other "
                    "processes (the probe is missing or timed out); running without that check"
                )
            return True
        ours = {s.worker.pid for s in self.slots.values()}
        busy = {d: procs for d, procs in probes.foreign(seen, ours).items() if procs}
        if not busy:
            return True
        lease.release()
        for device, procs in busy.items():
            note = probes.describe_busy(self.platform.name, {device: procs})
            if self.busy_notes.get(device) != note:
                self._say(note + " (not ours): not handing it out")
            self.busy_notes[device] = note
            self.foreign[device] = Blocked(device, None)
            self.retry_at[device] = now + BUSY_RETRY
        return False

    def _blockers(self) -> str:
        """Who holds or uses the devices we wait for, in one line."""
        leased = [b for d, b in self.foreign.items() if d not in self.busy_notes]
        parts = [describe_blockers(self.platform.name, leased)] if leased else []
        parts += [self.busy_notes[d] for d in sorted(self.foreign) if d in self.busy_notes]
        return "; ".join(parts)

    def _retiring_devices(self) -> list[int]:
        """Devices of workers told to stop: theirs until the process has exited."""
        return [d for s in self.slots.values() if s.stopping for d in s.worker.devices]

    def _mark_foreign(self, blocked: list[Blocked], now: float) -> None:
        changed = False
        for entry in blocked:
            old = self.foreign.get(entry.device)
            # Say it again only when another run (not merely another test) holds it.
            if old is None or _run_of(old) != _run_of(entry):
                changed = True
            self.foreign[entry.device] = entry
            self.retry_at[entry.device] = now + FOREIGN_RETRY
        if changed:
            self._say(
                "waiting for devices held by other runs: "
                + describe_blockers(self.platform.name, list(self.foreign.values()))
            )

    def _probe_foreign(self, now: float) -> None:
        """Forget devices that other runs released, so waits are charged to them only while true."""
        for device in [d for d, at in self.retry_at.items() if at <= now]:
            holder = Holder.for_this_process(self.c.run_id, "probe")
            got = self.c.lock_dir.try_acquire(self.platform.name, [device], holder)
            if isinstance(got, Lease):
                got.release()
                self.foreign.pop(device, None)
                self.retry_at.pop(device, None)
                self.busy_notes.pop(device, None)  # the probe runs again at the next lease
            else:
                self._mark_foreign(got, now)

    def _expire_lease_waits(self, now: float) -> None:
        """Jobs blocked by other runs' leases end `infra` after --devpool-lease-timeout."""
        busy = {d for run in self.scheduler.running.values() for d in run.devices}
        busy.update(self._retiring_devices())
        free = len(set(self.c.inventory.devices) - busy - set(self.foreign))
        for head in self.scheduler.queue.heads():
            k = head.devices_needed
            if k == 0 or k <= free or not self.foreign:
                self.blocked_since.pop(k, None)
                continue
            since = self.blocked_since.setdefault(k, now)
            if now - since < self.c.settings.lease_timeout:
                continue
            self.scheduler.queue.pop(k)
            waited = now - since
            head.foreign_wait = waited
            reason = (
                f"no lease on {k} {self.platform.name} device{'s' if k != 1 else ''} within "
                f"--devpool-lease-timeout {self.c.settings.lease_timeout:g}s "
                f"(waited {waited:.0f}s): " + self._blockers()
            )
            self._synthesize(head, Outcome.INFRA, reason, (), 0.0)

    # ---- worker events --------------------------------------------------------------------

    def _on_message(self, slot: Slot, message: dict[str, Any]) -> None:
        event = message.get("ev")
        if event == "ready":
            slot.ready_by = None
        elif event == "start":
            self._next_in_batch(slot, message["nodeid"])
            slot.test = slot.job.display if slot.job is not None else message["nodeid"]
            slot.test_started = time.monotonic()
            slot.test_wall = time.time()
            slot.phases = []
            timeout = slot.job.request.timeout if slot.job else None
            slot.deadline = slot.test_started + timeout if timeout else None
            self.hook.pytest_runtest_logstart(nodeid=slot.test, location=tuple(message["location"]))
        elif event == "report":
            report = self.hook.pytest_report_from_serializable(
                config=self.session.config, data=message["data"]
            )
            if isinstance(report.longrepr, list):
                # A skip's (path, line, reason) tuple comes back from JSON as a list.
                report.longrepr = tuple(report.longrepr)
            if report.failed:
                slot.failed = True
            if slot.job is not None:
                report.nodeid = slot.job.display
                self._judge(report, slot, slot.job)
            self._annotate(report, slot)
            slot.phases.append(report)
            self.hook.pytest_runtest_logreport(report=report)
            self.c.emit(
                "report",
                nodeid=report.nodeid,
                when=report.when,
                outcome=report.outcome,
                duration=round(report.duration, 4),
            )
        elif event == "finish":
            nodeid = slot.test or message["nodeid"]
            self._finished_test(slot)
            self.hook.pytest_runtest_logfinish(nodeid=nodeid, location=tuple(message["location"]))
        elif event == "missing":
            self._next_in_batch(slot, message["nodeid"])
            job = slot.job
            if job is not None:
                self._synthesize(
                    job,
                    Outcome.INFRA,
                    f"the worker did not collect {job.nodeid} (see {slot.worker.log})",
                    slot.worker.devices,
                    0.0,
                )
                slot.failed = True
        elif event == "done":
            skipped = set(message.get("skipped", ()))
            slot.later += [job for job in slot.batch if job.nodeid in skipped]
            slot.batch = []
            self._job_done(slot)

    def _next_in_batch(self, slot: Slot, nodeid: str) -> None:
        """The worker started the next test of its batch: that job is now the slot's job."""
        for index, job in enumerate(slot.batch):
            if job.nodeid == nodeid:
                del slot.batch[index]
                if job is not slot.head:
                    self._job_started(slot, job, time.monotonic())
                slot.job = job
                return
        slot.job = None

    def _judge(self, report: pytest.TestReport, slot: Slot, job: Job) -> None:
        """Rerun or flaky, decided before pytest sees the report, so it counts it right."""
        settings = self.c.settings
        if report.failed:
            outcome = Outcome.FAILED if report.when == "call" else Outcome.ERROR
            if slot.retry or self._can_retry(job, outcome):
                slot.retry = True
                report.outcome = RERUN  # type: ignore[assignment]
                report.devpool_outcome = RERUN  # type: ignore[attr-defined]
            elif job.nodeid in self.c.quarantined:
                self._excuse(report, job)
        elif report.when == "call" and report.passed and job.attempt > 1:
            report.devpool_outcome = Outcome.FLAKY.value  # type: ignore[attr-defined]
            if settings.flaky_result == "fail":
                report.outcome = "failed"
                report.longrepr = (
                    f"[devpool] FLAKY: passed on attempt {job.attempt} after "
                    f"{job.attempt - 1} failed attempt(s); --devpool-flaky-result fail gates it"
                )

    def _excuse(self, report: pytest.TestReport, job: Job) -> None:
        """A quarantined test's failure: reported and kept, but pytest counts it as xfail."""
        entry = self.c.quarantined[job.nodeid]
        report.devpool_quarantined = True  # type: ignore[attr-defined]
        report.outcome = "skipped"
        report.wasxfail = f"quarantined: {entry.describe()}"

    def _can_retry(self, job: Job, outcome: Outcome) -> bool:
        settings = self.c.settings
        if outcome in (Outcome.CRASHED, Outcome.INFRA):
            return job.retries_infra < settings.reruns_infra
        return job.retries_failed < settings.reruns

    def _prepare_retry(self, job: Job, outcome: Outcome) -> None:
        """Count a failed attempt that will run again (in a fresh worker, other devices first)."""
        if outcome in (Outcome.CRASHED, Outcome.INFRA):
            job.retries_infra += 1
        else:
            job.retries_failed += 1
        job.attempt += 1
        job.queued_at = time.monotonic()

    def _release_head(self, slot: Slot) -> None:
        """The worker is done with its placement: free it, and queue what must run again."""
        if slot.head is not None:
            self.scheduler.finish(slot.head)
            slot.head = None
        for job in slot.later:
            self.scheduler.add(job)
        slot.later = []

    def _annotate(self, report: pytest.TestReport, slot: Slot) -> None:
        if report.when == "teardown" and slot.job is not None:
            outcome = _outcome_of([*slot.phases, report])
            self._properties(report, slot.job, slot.worker.devices, outcome)

    def _properties(
        self, report: pytest.TestReport, job: Job, devices: tuple[int, ...], outcome: Outcome
    ) -> None:
        """devpool's facts on the report closing a test; --junitxml writes them as properties."""
        report.user_properties = [
            *report.user_properties,
            ("devpool.outcome", outcome.value),
            ("devpool.devices", self._where(devices)),
            ("devpool.platform", self.platform.name),
            ("devpool.host", self.c.host),
            ("devpool.queue_wait", f"{job.waited:.3f}"),
            ("devpool.attempt", str(job.attempt)),
        ]

    def _finished_test(self, slot: Slot) -> None:
        job = slot.job
        if job is not None:
            outcome = _outcome_of(slot.phases)
            log = None
            if outcome.gates or outcome is Outcome.FLAKY:
                log = log_path(self.c.log_dir, job.display, job.attempt)
                write_test_log(log, self._log_header(job, slot.worker, outcome), slot.phases)
            detail = f"{outcome.value} (worker log {slot.worker.log.name})" if log else ""
            self._conclude(
                job,
                outcome,
                slot.worker,
                slot.worker.devices,
                detail,
                log,
                slot.test_wall,
                retried=slot.retry,
            )
            if slot.retry:
                self._prepare_retry(job, outcome)
                slot.later.append(job)
            if outcome.gates or slot.retry:
                slot.failed = True
        if slot.failed and slot.batch:
            # The device may be in a bad state: the rest of the batch goes to a fresh worker.
            slot.worker.send({"op": "cancel"})
        slot.job = None
        slot.retry = False
        slot.test = None
        slot.deadline = None
        slot.phases = []

    def _job_done(self, slot: Slot) -> None:
        job = slot.head
        slot.job = None
        self._release_head(slot)
        isolate = job is not None and job.request.isolate
        over_share = self.limit is not None and len(self._held()) > self.limit
        if isolate or slot.failed or over_share or self.c.settings.isolation == "job":
            self._retire(slot)  # a failed test may have left the device in a bad state
        else:
            self.idle[slot.key] = slot

    def _check_exits(self) -> None:
        """Workers that died without their pipe closing (a forked child kept it open)."""
        for slot in list(self.slots.values()):
            if slot.worker.poll() is not None and not slot.worker.exited:
                for message in self.backend.drain(slot.worker):
                    self._on_message(slot, message)
                self._on_exit(slot)

    def _on_exit(self, slot: Slot) -> None:
        worker = slot.worker
        if worker.exited:
            return
        code = self.backend.reap(worker)
        worker.signal_group(signal.SIGKILL)  # nothing the test started may outlive it
        if worker.lease is not None:
            worker.lease.release()
        self.slots.pop(worker.key, None)
        self.idle.pop(worker.key, None)
        if slot.test is not None and slot.job is not None:
            self._lost_test(slot, code)
        elif slot.batch and not slot.stopping:
            self._worker_failed(slot.batch.pop(0), slot, code)
        # Tests the worker had not reached run again in a fresh worker.
        slot.later += slot.batch
        slot.batch = []
        slot.job = None
        self._release_head(slot)
        self._retiree_gone(worker.key)

    def _lost_test(self, slot: Slot, code: int | None) -> None:
        """The worker died under a test: a timeout we enforced, or a crash."""
        job = slot.job
        assert job is not None and slot.test is not None
        worker = slot.worker
        duration = time.monotonic() - slot.test_started
        how = _describe_exit(code)
        # The worker log first, so that the stacks (for a timeout) end the log and its tail.
        extra = _worker_log_tail(worker)
        if slot.kill_stage:
            outcome = Outcome.TIMEOUT
            limit = job.request.timeout or 0.0
            detail = f"exceeded its {limit:g}s limit; stacks dumped, then {how}"
            stacks = read_log(worker.stacks)
            extra += "\n---- stacks at the timeout (faulthandler) ----\n" + (
                stacks or "(the process wrote no stacks)"
            )
        else:
            outcome = Outcome.CRASHED
            detail = f"worker pid {worker.pid} {how} while running the test"
            lost = getattr(worker, "lost", None)
            if lost:  # the machine went away, not the test: infra, retried elsewhere
                outcome = Outcome.INFRA
                detail = f"{lost} while running the test"
        retry = self._can_retry(job, outcome)
        self._synthesize(
            job, outcome, detail, worker.devices, duration, slot=slot, extra=extra, retry=retry
        )
        slot.job = None
        if retry:
            self._prepare_retry(job, outcome)
            slot.later.append(job)

    def _worker_failed(self, job: Job, slot: Slot, code: int | None) -> None:
        """A worker died before it ran its test (e.g. a conftest that fails to import)."""
        worker = slot.worker
        if self._can_retry(job, Outcome.INFRA):
            self._prepare_retry(job, Outcome.INFRA)
            slot.later.append(job)
            return
        how = slot.stuck or getattr(worker, "lost", None) or _describe_exit(code)
        reason = f"worker pid {worker.pid} {how} before running the test; see {worker.log}"

        self._synthesize(
            job,
            Outcome.INFRA,
            reason,
            worker.devices,
            0.0,
            extra=_worker_log_tail(worker),
        )

    # ---- ending processes -----------------------------------------------------------------

    def _escalate_timeouts(self, now: float) -> None:
        for slot in self.slots.values():
            if slot.ready_by is not None and now >= slot.ready_by and not slot.stuck:
                # A conftest or an import that hangs must not hang the whole run.
                limit = self.c.settings.worker_start_timeout
                slot.stuck = f"did not finish starting (collection) within {limit:g}s"
                slot.worker.signal_group(signal.SIGKILL)
            if slot.kill_stage == 0 and slot.deadline is not None and now >= slot.deadline:
                slot.kill_stage, slot.kill_at = 1, now + STACKS_WAIT
                dump = getattr(slot.worker, "dump_stacks", None)  # a remote worker's own way
                if dump is not None:
                    dump()
                else:
                    with suppress(ProcessLookupError):
                        os.kill(slot.worker.pid, signal.SIGUSR1)
            elif slot.kill_stage == 1 and now >= slot.kill_at:
                slot.kill_stage, slot.kill_at = 2, now + self.c.settings.timeout_grace
                slot.worker.signal_group(signal.SIGTERM)
            elif slot.kill_stage == 2 and now >= slot.kill_at:
                slot.kill_stage, slot.kill_at = 3, now + TICK
                slot.worker.signal_group(signal.SIGKILL)

    def _retire(self, slot: Slot) -> None:
        slot.stopping = True
        if not slot.worker.send({"op": "stop"}):
            slot.worker.signal_group(signal.SIGKILL)

    def _retiree_gone(self, key: int) -> None:
        for job_id, (placement, waiting) in list(self.starting.items()):
            waiting.discard(key)
            if not waiting:
                del self.starting[job_id]
                self._spawn(placement, time.monotonic())

    def _retire_all_idle(self) -> None:
        for key in list(self.idle):
            self._retire(self.idle.pop(key))

    def _stop_dispatch(self) -> None:
        """-x / --maxfail reached: start nothing new, let running tests finish."""
        self.stopped = True
        for slot in self.slots.values():
            if slot.batch:
                slot.worker.send({"op": "cancel"})
        while len(self.scheduler.queue):
            self.scheduler.queue.pop(self.scheduler.queue.heads()[0].devices_needed)
        for job_id, (placement, _) in list(self.starting.items()):
            self.scheduler.finish(placement.job)
            del self.starting[job_id]

    def _shutdown(self) -> None:
        """Always: end every worker (their whole process groups) and free every lease."""
        self.room.wait(None)
        slots = list(self.slots.values())
        for slot in slots:
            if not slot.stopping:
                self._retire(slot)
        deadline = time.monotonic() + 2.0
        for slot in slots:
            try:
                slot.worker.wait(timeout=max(0.0, deadline - time.monotonic()))
            except Exception:  # noqa: BLE001 - timeout or interrupted: escalate below
                slot.worker.signal_group(signal.SIGTERM)
        for slot in slots:
            try:
                slot.worker.wait(timeout=1.0)
            except Exception:  # noqa: BLE001
                slot.worker.signal_group(signal.SIGKILL)
                slot.worker.wait()
            slot.worker.signal_group(signal.SIGKILL)
            slot.worker.close()
            if slot.worker.lease is not None:
                slot.worker.lease.release()
        self.slots.clear()
        self.backend.close()

    # ---- reports devpool writes itself ----------------------------------------------------

    def _synthesize(
        self,
        job: Job,
        outcome: Outcome,
        detail: str,
        devices: tuple[int, ...],
        duration: float,
        slot: Slot | None = None,
        extra: str = "",
        retry: bool = False,
    ) -> None:
        """Report an ending pytest could not see (timeout, crash, infra, skip) as real reports."""
        item = self.c.items.get(job.nodeid)
        keywords = {name: 1 for name in item.keywords} if item is not None else {}
        seen = {r.when: r for r in slot.phases} if slot is not None else {}
        started = slot is not None and slot.test is not None
        if not started:
            self.hook.pytest_runtest_logstart(nodeid=job.display, location=job.location)
        phases: list[tuple[Phase, Status, Any]]
        when: Phase
        if outcome is Outcome.SKIPPED:
            longrepr: Any = (job.location[0], (job.location[1] or 0) + 1, f"Skipped: {detail}")
            phases = [("setup", "skipped", longrepr), ("teardown", "passed", None)]
        else:
            if "setup" not in seen:
                when = "setup"
            elif seen["setup"].passed and "call" not in seen:
                when = "call"
            else:
                when = "teardown"
            text = f"[devpool] {outcome.value.upper()}: {detail}"
            if extra:
                text += "\n" + extra
            phases = [(when, "failed", text)]
            if when != "teardown":
                phases.append(("teardown", "passed", None))
        reports = list(seen.values())
        for when, status, longrepr in phases:
            report = pytest.TestReport(
                job.display,
                job.location,
                keywords,
                status,
                longrepr,
                when,
                duration=duration if status == "failed" else 0.0,
            )
            report.devpool_outcome = outcome.value  # type: ignore[attr-defined]
            if retry and status == "failed":
                report.outcome = RERUN  # type: ignore[assignment]
                report.devpool_outcome = RERUN  # type: ignore[attr-defined]
            elif status == "failed" and job.nodeid in self.c.quarantined:
                self._excuse(report, job)
            if when == "teardown":
                self._properties(report, job, devices, outcome)
            reports.append(report)
            self.hook.pytest_runtest_logreport(report=report)
        log = None
        if outcome.gates:
            log = log_path(self.c.log_dir, job.display, job.attempt)
            self.c.log_dir.mkdir(parents=True, exist_ok=True)
            write_test_log(
                log, self._log_header(job, slot.worker if slot else None, outcome), reports
            )
        worker = slot.worker if slot is not None else None
        began = slot.test_wall if slot is not None and slot.test is not None else time.time()
        self._conclude(job, outcome, worker, devices, detail, log, began, retried=retry)
        if slot is not None:
            slot.test = None
            slot.deadline = None
            slot.phases = []
        self.hook.pytest_runtest_logfinish(nodeid=job.display, location=job.location)

    def _conclude(
        self,
        job: Job,
        outcome: Outcome,
        worker: Worker | None,
        devices: tuple[int, ...],
        detail: str,
        log: Path | None,
        started: float,
        retried: bool = False,
    ) -> None:
        """The one place a job's ending is recorded: summary entry and run record line."""
        end = time.time()
        flaky_gates = outcome is Outcome.FLAKY and self.c.settings.flaky_result == "fail"
        quarantine = self.c.quarantined.get(job.nodeid)
        gating = (outcome.gates and not retried and quarantine is None) or flaky_gates
        lines = tail(log) if log is not None else []
        where = self._where(devices) if devices or not job.devices_needed else "not started"
        artifacts = self._artifacts(job, outcome, retried)
        if outcome.gates and log is not None:
            self._check_fatal(job, devices, log, worker)
        if not retried:
            self.ended[outcome.value] = self.ended.get(outcome.value, 0) + 1
            trouble = Trouble(
                job.display, outcome, where, end - started, detail, log or Path(), gating, artifacts
            )
            if log is not None and (gating or outcome is Outcome.FLAKY):
                self.c.troubles.append(trouble)
            elif log is not None and quarantine is not None and outcome.gates:
                self.c.quarantine_failures.append(trouble)
            if self.c.settings.repeat > 1:
                self.c.repeats.setdefault(job.nodeid, []).append((outcome, where))
            if worker is not None and outcome is not Outcome.SKIPPED:
                self.c.results.append(
                    TestResult(
                        job.nodeid,
                        outcome.value,
                        round(end - started, 4),
                        self.platform.name,
                        job.devices_needed,
                        runner_class(self.platform.name, len(self.c.inventory.devices)),
                        end,
                        self.c.run_id,
                    )
                )
        else:
            text = "\n".join(lines)
            message = f"attempt {job.attempt} on {where}: {detail or outcome.value}"
            self.c.retried.setdefault(job.display, []).append(
                Attempt(job.attempt, outcome.value, message, text)
            )
        self.c.emit(
            "job_end",
            job=job.id,
            nodeid=job.display,
            test=job.nodeid,
            outcome=outcome.value,
            retried=retried,
            gating=gating,
            devices=list(devices),
            host=self.c.host,
            worker_pid=worker.pid if worker is not None else None,
            start=round(started, 3),
            end=round(end, 3),
            run_time=round(end - started, 3),
            queue_wait=round(job.waited, 3),
            attempt=job.attempt,
            log=str(log) if log is not None else "",
            detail=detail,
            tail=lines,
            quarantined=quarantine.describe() if quarantine is not None else None,
            artifacts=str(artifacts) if artifacts is not None else None,
            **_ranks(worker),
        )

    def _artifacts(self, job: Job, outcome: Outcome, retried: bool) -> Path | None:
        """Keep a test's devpool_artifacts folder when it did not pass (or when asked to)."""
        folder = self.c.artifacts_dir / file_name(job.display, job.attempt)
        if not folder.is_dir():
            return None
        keep = outcome.gates or outcome is Outcome.FLAKY or self.c.settings.keep_artifacts
        if keep and any(folder.iterdir()):
            return folder
        shutil.rmtree(folder, ignore_errors=True)
        return None

    def _check_fatal(
        self, job: Job, devices: tuple[int, ...], log: Path, worker: Worker | None
    ) -> None:
        """A fatal device error in a failed test's output retires its devices for the session."""
        if not devices:
            return
        text = read_log(log)
        if worker is not None:
            text += "\n".join(tail(worker.log, 200))
        found = self.c.fatal.find(text)
        if found is None:
            return
        for device in devices:
            if device in self.c.bad_devices:
                continue
            why = f"fatal error {found!r} in {job.display}"
            self.c.bad_devices[device] = why
            self.scheduler.retire_device(device)
            self.c.emit("device_bad", device=device, reason=why)
            self._say(f"retiring {self.platform.name}:{device} for this session: {why}")
        self._fail_unplaceable()

    def _fail_unplaceable(self) -> None:
        """Tests needing more devices than remain healthy end `infra`, never silently skipped."""
        healthy = len(self.scheduler.devices)
        for size in [k for k in self.scheduler.queue.sizes() if k > healthy]:
            while self.scheduler.queue.of_size_count(size):
                job = self.scheduler.queue.pop(size)
                retired = ", ".join(
                    f"{self.platform.name}:{d} ({why})" for d, why in self.c.bad_devices.items()
                )
                reason = (
                    f"needs {size} {self.platform.name} devices; only {healthy} healthy "
                    f"remain after retiring {retired}"
                )
                self._synthesize(job, Outcome.INFRA, reason, (), 0.0)

    def _log_header(self, job: Job, worker: Worker | None, outcome: Outcome) -> list[str]:
        lines = [
            f"test:     {job.nodeid}",
            f"outcome:  {outcome.value}",
            f"request:  {job.request.describe()}",
            f"attempt:  {job.attempt}",
        ]
        if worker is not None:
            lines += [
                f"devices:  {self._where(worker.devices)}",
                f"worker:   pid {worker.pid}, log {worker.log}",
            ]
        return lines

    def _where(self, devices: tuple[int, ...]) -> str:
        return f"{self.platform.name}:{format_ids(devices)}" if devices else "cpu"

    def _say(self, text: str) -> None:
        terminal = self.session.config.pluginmanager.get_plugin("terminalreporter")
        if terminal is not None:
            terminal.write_line(f"devpool: {text}")


def _ranks(worker: Worker | None) -> dict[str, Any]:
    """A multi-node worker's ranks (node, devices, log of each), for the run record."""
    ranks = getattr(worker, "rank_info", None)
    return {"ranks": ranks} if ranks else {}


def _small(job: Job) -> float:
    """A job's expected seconds for batching; a test with no history is taken as small."""
    return job.estimate if job.estimate_known else UNKNOWN_SMALL


def _run_of(blocked: Blocked) -> tuple[str, int] | None:
    holder = blocked.holder
    return (holder.session, holder.pid) if holder is not None else None


def _outcome_of(phases: list[pytest.TestReport]) -> Outcome:
    """A finished test's outcome from its phase reports, as pytest's own summary would count it."""
    if any(getattr(r, "devpool_outcome", None) == Outcome.FLAKY for r in phases):
        return Outcome.FLAKY
    failed = [
        r
        for r in phases
        if r.failed
        or getattr(r, "devpool_outcome", None) == RERUN
        or getattr(r, "devpool_quarantined", False)
    ]
    if failed:
        return Outcome.FAILED if any(r.when == "call" for r in failed) else Outcome.ERROR
    if any(r.skipped for r in phases):
        return Outcome.SKIPPED
    return Outcome.PASSED


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "vanished"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name} (signal {-code})"
    return f"exited with code {code}"


def _worker_log_tail(worker: Worker) -> str:
    """The end of a worker's own output, for the log of a test it died under."""
    return "---- worker log (tail) ----\n" + "\n".join(tail(worker.log, 60))
