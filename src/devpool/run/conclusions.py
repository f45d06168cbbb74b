"""Each attempt's one conclusion: its summary entry and its run record line.

The replay (replay.py) tells pytest; this part records. `conclude` is the one place a
job's ending is recorded: the tallies of the live display, the duration history's result
(or JUnit's earlier attempt, when it runs again), the `job_end` line of the run record,
and the test's artifacts folder, kept when it did not pass (or when asked to). The log
the replay writes for a test that gated or was flaky starts with `log_header`.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from devpool.backends import WorkerHandle
from devpool.history.durations import TestResult, runner_class
from devpool.outcomes import Outcome
from devpool.plan.jobs import Job
from devpool.report.junit import EarlierAttempt
from devpool.report.terminal import file_name, tail
from devpool.run import host_leases
from devpool.run.attempts import Attempt, State
from devpool.run.context import RunContext
from devpool.run.phase_reports import category_of


class Conclusions:
    """Records each attempt's ending once, and counts the endings for the live display."""

    def __init__(self, ctx: RunContext, where: Callable[[tuple[int, ...]], str]) -> None:
        self.ctx = ctx
        self.platform = ctx.inventory.platform
        self.where = where  # the replay's: devices as a test's report names them
        self.ended: dict[str, int] = {}  # final outcome → tests, for the live display
        # pytest's categories as its closing line counts them (xfailed apart from skipped)
        self.counted: dict[str, int] = {}

    def conclude(
        self,
        attempt: Attempt,
        outcome: Outcome,
        worker: WorkerHandle | None,
        detail: str,
        log: Path | None,
    ) -> None:
        """The one place an attempt's ending is recorded: summary entry and run record line."""
        ctx = self.ctx
        job = attempt.job
        retried = attempt.again.runs
        attempt.outcome = outcome
        attempt.log = log
        end = time.time()
        began = attempt.started_wall or end
        # The test's own time as pytest measured it in its process (setup + call +
        # teardown); the controller's clock adds the latency of hearing of the start.
        measured = sum(report.duration for report in attempt.phases)
        run_time = measured if len(attempt.phases) == 3 and measured > 0 else end - began
        devices = attempt.devices
        flaky_gates = outcome is Outcome.FLAKY and ctx.settings.flaky_result == "fail"
        quarantine = ctx.quarantined.get(job.nodeid)
        gating = (outcome.gates and not retried and quarantine is None) or flaky_gates
        lines = tail(log) if log is not None else []
        where = self.where(devices) if devices or not job.devices_needed else "not started"
        artifacts = self._artifacts(job, attempt.number, outcome, retried)
        for word in attempt.told:  # the live line's counts move with its done, at once
            self.counted[word] = self.counted.get(word, 0) + 1
        attempt.told.clear()
        if not retried:
            self.ended[outcome.value] = self.ended.get(outcome.value, 0) + 1
            if ctx.settings.repeat > 1:
                ctx.repeats.setdefault(job.nodeid, []).append((outcome, where))
            if worker is not None and outcome is not Outcome.SKIPPED:
                ctx.results.append(
                    TestResult(
                        job.nodeid,
                        outcome.value,
                        round(run_time, 4),
                        self.platform.name,
                        job.devices_needed,
                        runner_class(self.platform.name, len(ctx.inventory.devices)),
                        end,
                        ctx.run_id,
                        max(attempt.peak_memory.values(), default=None),
                        attempt.cpu_load,
                    )
                )
        elif attempt.started_wall > 0:  # an ending before the start is no attempt (setbacks)
            text = "\n".join(lines)
            message = f"attempt {attempt.number} on {where}: {detail or outcome.value}"
            ctx.retried.setdefault(job.display, []).append(
                EarlierAttempt(attempt.number, outcome.value, message, text)
            )
        ctx.emit(
            "job_end",
            job=job.id,
            nodeid=job.display,
            test=job.nodeid,
            outcome=outcome.value,
            retried=retried,
            gating=gating,
            devices=list(devices),
            host=ctx.host,
            worker_pid=worker.pid if worker is not None else None,
            start=round(began, 3),
            end=round(end, 3),
            run_time=round(run_time, 3),
            queue_wait=round(job.waited, 3),
            attempt=attempt.number,
            log=str(log) if log is not None else "",
            detail=detail,
            tail=lines,
            quarantined=quarantine.describe() if quarantine is not None else None,
            **category_of(attempt.phases, outcome),
            counted=[c for r in attempt.phases if (c := getattr(r, "devpool_counted", None))],
            artifacts=str(artifacts) if artifacts is not None else None,
            **_ranks(worker),
            **({"memory_peak": attempt.peak_memory} if attempt.peak_memory else {}),
            **({"cpu_load": attempt.cpu_load} if attempt.cpu_load is not None else {}),
            **({"cores": job.cpu_cores} if job.cpu_cores and job.devices_needed else {}),
            **({"memory": job.memory_needed} if ctx.memory and job.memory_needed else {}),
            **host_leases.record_fields(attempt),
        )
        attempt.move(State.CONCLUDED, ctx.emit, outcome=outcome.value, retried=retried)

    def _artifacts(self, job: Job, number: int, outcome: Outcome, retried: bool) -> Path | None:
        """Keep a test's devpool_artifacts folder when it did not pass (or when asked to)."""
        folder = self.ctx.artifacts_dir / file_name(job.display, number)
        if not folder.is_dir():
            return None
        keep = outcome.gates or outcome is Outcome.FLAKY or self.ctx.settings.keep_artifacts
        if keep and any(folder.iterdir()):
            return folder
        shutil.rmtree(folder, ignore_errors=True)
        return None

    def log_header(
        self, attempt: Attempt, worker: WorkerHandle | None, outcome: Outcome
    ) -> list[str]:
        job = attempt.job
        lines = [
            f"test:     {job.nodeid}",
            f"outcome:  {outcome.value}",
            f"request:  {job.request.describe()}",
            f"attempt:  {attempt.number}",
        ]
        if worker is not None:
            lines += [
                f"devices:  {self.where(worker.devices)}",
                f"worker:   pid {worker.pid}, log {worker.log}",
            ]
        return lines


def _ranks(worker: WorkerHandle | None) -> dict[str, Any]:
    """A multi-node worker's ranks (node, devices, log of each), for the run record."""
    ranks = worker.rank_info if worker is not None else []
    return {"ranks": ranks} if ranks else {}
