"""Attempts' endings, told to pytest: reports replayed into its hooks, and one conclusion each.

Reports a worker sent are replayed as they are (judged first: a failure that will run again
shows as RERUN, a pass after failures as FLAKY). Endings pytest could not see (a timeout,
a crash, a test that never got devices) become real TestReports here, so the terminal,
--junitxml, -x and other plugins count every test once. `conclude` (conclusions.py) is the
one place a job's ending is recorded: summary entry and run record line.
"""

from __future__ import annotations

from typing import Any, Literal

import pytest

from devpool.backends import WorkerHandle
from devpool.devices.inventory import Platform, format_ids
from devpool.outcomes import RERUN, Outcome
from devpool.plan.jobs import Job
from devpool.report.terminal import log_path, where_ran, write_apart, write_test_log
from devpool.run import again, host_leases
from devpool.run.again import Happened
from devpool.run.attempts import Attempt
from devpool.run.conclusions import Conclusions
from devpool.run.context import RunContext
from devpool.run.phase_reports import UnseenEnding, cause_of, is_subtest, outcome_of
from devpool.worker import serialized
from devpool.worker.stacks import readable_stacks

Phase = Literal["setup", "call", "teardown"]
Status = Literal["passed", "failed", "skipped"]


class Replay:
    """Turns attempts into pytest reports, and has each concluded once (conclusions.py)."""

    def __init__(self, ctx: RunContext, session: pytest.Session) -> None:
        self.ctx = ctx
        self.session = session
        self.hook = session.config.hook
        self.platform: Platform = ctx.inventory.platform
        self.conclusions = Conclusions(ctx, self.where)  # summary entry, record line, log
        # The terminal writes a test's node id at logstart and its result at logreport; with
        # tests of several workers interleaved, -v would show ids with no result. Without its
        # logstart, each report writes one whole line (id and result), as pytest's own -v does.
        manager = session.config.pluginmanager
        terminal = manager.get_plugin("terminalreporter")
        self._verbose = terminal is not None and session.config.get_verbosity() > 0
        self._logstart = (
            manager.subset_hook_caller("pytest_runtest_logstart", [terminal])
            if terminal is not None
            else self.hook.pytest_runtest_logstart
        )

    def logstart(self, nodeid: str, location: tuple[str, int | None, str]) -> None:
        """pytest_runtest_logstart for every plugin but the terminal (see __init__)."""
        self._logstart(nodeid=nodeid, location=location)

    # ---- reports a worker sent ----------------------------------------------------------

    def replay(self, attempt: Attempt, data: dict[str, Any], worker: WorkerHandle) -> None:
        """One phase report from the worker, judged and handed to pytest."""
        serialized.restore_subtest_values(data)
        report = self.hook.pytest_report_from_serializable(config=self.session.config, data=data)
        if isinstance(report.longrepr, list):
            # A skip's (path, line, reason) tuple comes back from JSON as a list.
            report.longrepr = tuple(report.longrepr)
        report.nodeid = attempt.display
        if report.failed:
            attempt.failed = True
        self._judge(report, attempt)
        if report.when == "teardown":
            outcome = outcome_of([*attempt.phases, report])
            self._properties(report, attempt, outcome)
        attempt.phases.append(report)
        if not attempt.again.whole_device:  # the memory retry is not an attempt of the test
            self.tell(report, attempt)
        self.ctx.emit(
            "report",
            nodeid=report.nodeid,
            when=report.when,
            outcome=report.outcome,
            duration=round(report.duration, 4),
        )

    def tell(self, report: pytest.TestReport, attempt: Attempt) -> None:
        """Hand a report to pytest, and keep the category its closing line counts it in, for
        the run record: every report form counts as the terminal did (report.summary).

        Under -v, the report names where it ran as xdist's name their worker: pytest's
        terminal writes `[sim:2,3] [ 50%] PASSED test_x.py::test_a` (report.terminal)."""
        if self._verbose:
            report.node = where_ran(self.where(attempt.devices))  # type: ignore[attr-defined]
        # The summaries list tests in collection order, as plain pytest ran them (lend_endings).
        report.devpool_place = attempt.job.id  # type: ignore[attr-defined]
        self.hook.pytest_runtest_logreport(report=report)
        if not getattr(report, "count_towards_summary", True):
            return
        status = self.hook.pytest_report_teststatus(report=report, config=self.session.config)
        if status and status[0]:
            report.devpool_counted = str(status[0])  # type: ignore[attr-defined]
            attempt.told.append(str(status[0]))  # counted when it ends, with done (_record)

    def _judge(self, report: pytest.TestReport, attempt: Attempt) -> None:
        """Rerun or flaky, decided before pytest sees the report, so it counts it right."""
        job = attempt.job
        if report.failed:
            outcome = Outcome.FAILED if report.when == "call" else Outcome.ERROR
            if again.ask(attempt, Happened.FAILED_REPORT, self.ctx.settings, outcome).runs:
                report.outcome = RERUN  # type: ignore[assignment]
                report.devpool_outcome = RERUN  # type: ignore[attr-defined]
            elif job.nodeid in self.ctx.quarantined:
                self._excuse(report, job)
        elif (
            report.when == "call" and report.passed and job.own_failures and not is_subtest(report)
        ):
            report.devpool_outcome = Outcome.FLAKY.value  # type: ignore[attr-defined]
            if self.ctx.settings.flaky_result == "fail":
                report.outcome = "failed"
                report.longrepr = (
                    f"[devpool] FLAKY: passed on attempt {attempt.number} after "
                    f"{job.own_failures} failed attempt(s); --devpool-flaky-result fail gates it"
                )

    def _rerun_note(self, attempt: Attempt, outcome: Outcome) -> str:
        """What says that this ending runs again, or ran after others that did ("": none)."""
        limits = again.Limits.of(self.ctx.settings)
        option, limit = again.budget(outcome, attempt.job.request.reruns, limits)
        if attempt.again.runs:
            return f"it runs again: attempt {attempt.number + 1} ({option} {limit})"
        if attempt.number > 1:
            earlier = attempt.number - 1
            return f"attempt {attempt.number}, after {earlier} that did not pass ({option} {limit})"
        return ""

    def _excuse(self, report: pytest.TestReport, job: Job) -> None:
        """A quarantined test's failure: reported and kept, but pytest counts it as xfail."""
        entry = self.ctx.quarantined[job.nodeid]
        report.devpool_quarantined = True  # type: ignore[attr-defined]
        report.outcome = "skipped"
        report.wasxfail = f"quarantined: {entry.describe()}"

    def finished(self, attempt: Attempt, worker: WorkerHandle) -> Outcome:
        """A test the worker ran to its end: conclude it from its own reports."""
        outcome = outcome_of(attempt.phases)
        log = None
        if outcome.gates or outcome is Outcome.FLAKY:
            log = log_path(self.ctx.log_dir, attempt.display, attempt.number)
            write_test_log(
                log, self.conclusions.log_header(attempt, worker, outcome), attempt.phases
            )
        detail = (cause_of(attempt.phases) or outcome.value) if log else ""
        self.conclusions.conclude(attempt, outcome, worker, detail, log)
        return outcome

    # ---- endings pytest could not see ---------------------------------------------------

    def synthesize(
        self,
        attempt: Attempt,
        outcome: Outcome,
        detail: str,
        duration: float,
        worker: WorkerHandle | None = None,
        extra: str = "",
    ) -> None:
        """Report an ending pytest could not see (timeout, crash, infra, skip) as real reports."""
        job = attempt.job
        item = self.ctx.items.get(job.nodeid)
        keywords = {name: 1 for name in item.keywords} if item is not None else {}
        seen = {r.when: r for r in attempt.phases}
        # A rank group holds its ranks' reports until every rank has finished: the phases its
        # ranks reached say whether the test's body ran.
        reached = (worker.reached(job.nodeid) if worker is not None else set()) - set(seen)
        started = attempt.started_wall > 0
        # An ending before the test started that will run again is no attempt of the test:
        # pytest hears nothing of it (no rerun in the closing line); the run record and
        # JUnit's properties keep it.
        silent = attempt.again.runs and not started
        if silent:
            job.setbacks.append(f"{outcome.value} before it started: {detail}")
        if not started and not silent:
            self.logstart(job.display, job.location)
        phases: list[tuple[Phase, Status, Any]]
        when: Phase
        if outcome is Outcome.SKIPPED:
            longrepr: Any = (job.location[0], (job.location[1] or 0) + 1, f"Skipped: {detail}")
            phases = [("setup", "skipped", longrepr), ("teardown", "passed", None)]
        else:
            if "setup" not in seen and "setup" not in reached:
                when = "setup"
            elif ("setup" in reached or seen["setup"].passed) and "call" not in seen:
                when = "call"
            else:
                when = "teardown"
            text = f"[devpool] {outcome.value.upper()}: {detail}"
            rerun = self._rerun_note(attempt, outcome)
            if rerun:
                text += f"\n[devpool] {rerun}"
                if attempt.again.runs and not silent:
                    self.say(f"{job.display} {outcome.value}; {rerun}")
            if extra:
                text += "\n" + readable_stacks(extra)
            phases = [(when, "failed", UnseenEnding(text, detail, job.location))]
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
            if attempt.again.runs and status == "failed":
                report.outcome = RERUN  # type: ignore[assignment]
                report.devpool_outcome = RERUN  # type: ignore[attr-defined]
            elif status == "failed" and job.nodeid in self.ctx.quarantined:
                self._excuse(report, job)
            if when == "teardown":
                self._properties(report, attempt, outcome)
            reports.append(report)
            if not silent:
                self.tell(report, attempt)
        attempt.phases = reports
        log = None
        if outcome.gates:
            log = log_path(self.ctx.log_dir, job.display, attempt.number)
            self.ctx.log_dir.mkdir(parents=True, exist_ok=True)
            write_test_log(log, self.conclusions.log_header(attempt, worker, outcome), reports)
        self.conclusions.conclude(attempt, outcome, worker, detail, log)
        if not silent:
            self.hook.pytest_runtest_logfinish(nodeid=job.display, location=job.location)

    def _properties(self, report: pytest.TestReport, attempt: Attempt, outcome: Outcome) -> None:
        """devpool's facts on the report closing a test; --junitxml writes them as properties.

        Only facts that say something, so a green run's file stays near plain pytest's size:
        the devices of a test that held any, the attempt when it is not the first, its outcome
        where pytest has no word for it (timeout, crashed, infra, flaky), setbacks, ports,
        resources and memory peaks when there were any."""
        job = attempt.job
        said: list[tuple[str, object]] = []
        if attempt.devices or job.devices_needed:
            said.append(("devpool.devices", self.where(attempt.devices)))
        if outcome in (Outcome.TIMEOUT, Outcome.CRASHED, Outcome.INFRA, Outcome.FLAKY):
            said.append(("devpool.outcome", outcome.value))
        if job.attempt > 1:
            said.append(("devpool.attempt", str(job.attempt)))
        report.user_properties = [
            *report.user_properties,
            *said,
            *host_leases.properties(attempt),
        ]
        if job.setbacks:  # not attempts of the test, but the record of the run says them
            report.user_properties.append(("devpool.setbacks", " | ".join(job.setbacks)))
        if attempt.peak_memory:  # bytes at the peak on each device, as the watch saw them
            peaks = ",".join(f"{d}:{b}" for d, b in sorted(attempt.peak_memory.items()))
            report.user_properties.append(("devpool.memory_peak", peaks))

    def where(self, devices: tuple[int, ...]) -> str:
        return f"{self.platform.name}:{format_ids(devices)}" if devices else "cpu"

    def show(self, text: str) -> None:
        """What a worker's pytest wrote to its terminal mid-test (--setup-show), as written."""
        terminal = self.session.config.pluginmanager.get_plugin("terminalreporter")
        if terminal is not None:
            terminal._tw.write(text)  # noqa: SLF001 - pytest's own writer, as its plugins use
            terminal._tw.flush()  # noqa: SLF001
            if self._verbose:  # -v: the report's line starts a line of its own (as after xdist's)
                terminal.currentfspath = -2

    def say(self, text: str) -> None:
        terminal = self.session.config.pluginmanager.get_plugin("terminalreporter")
        if terminal is not None:
            write_apart(terminal, f"devpool: {text}")
