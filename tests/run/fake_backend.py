"""A backend whose workers are scripts, not processes: the run loop's own decisions, alone.

Loaded into a pytester session with `-p fake_backend`, it replaces the run's backend: the
controller collects, plans and runs its real loop (run/loop.py, placing, endings, replay),
and each worker it starts answers a batch at once with the events a real worker would
send. What a test does is in its name:

- `test_pass*` passes, `test_fail*` fails (its call), `test_skip*` skips (its setup);
- `test_crash*` kills its worker under it (no finish, the pipe ends: a crash);
- `test_crash_once*` does so on its first attempt only, then passes;
- `test_missing*` is not collected by the worker;
- `test_hang*` hangs in its call: nothing more comes from its worker until it is signalled.

With SCRIPTED_CLOCK=1 in its environment the run's clock (run/clock.py) is the backend's:
a poll that finds nothing to say moves it forward by as long as the loop would have waited,
so deadlines of tens of seconds pass at once.

A worker started for a once-fixture (DEVPOOL_ONCE_SETUP in its environment) sets it up at
once and tears it down at its stop; one named `lost*` dies before its setup ends, one
named `dies*` right after it.

Every event goes through worker/protocol.py's encoding and decoding, as on a pipe.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from devpool.backends import Backend, WorkerHandle
from devpool.devices.leases import Lease
from devpool.plan.markers import Request
from devpool.run import clock
from devpool.session import workers
from devpool.worker import protocol, wire

PID = 4_000_000  # fake pids: no os.kill may ever reach a real process with these


class ScriptedWorker(WorkerHandle):
    """A worker that runs each batch at once, by the rules in the module's docstring."""

    def __init__(
        self, key: int, devices: tuple[int, ...], lease: Lease | None, log: Path, once: str = ""
    ) -> None:
        self.key = key
        self.once = once  # the once-fixture it sets up ("": a test worker)
        self.devices = devices
        self.lease = lease
        self.log = log
        self.exited = False
        self.code: int | None = None
        self.events: list[protocol.Message] = [protocol.Ready(pid=self.pid, collected=1)]
        self.eof = False
        log.write_text("")
        if once.startswith("lost"):
            self._end(-signal.SIGKILL)
        elif once:
            self.events.append(protocol.OnceUp(fixture=once, outcome="value", seconds=0.0))
            if once.startswith("dies"):
                self._end(-signal.SIGKILL)

    @property
    def pid(self) -> int:
        return PID + self.key

    @property
    def stacks(self) -> Path:
        return self.log.with_suffix(".stacks")

    def send(self, message: protocol.Message) -> bool:
        if self.eof:
            return False
        command = protocol.COMMANDS.decode(protocol.encode(message))  # as a pipe carries it
        if isinstance(command, protocol.Stop):
            if self.once:
                self.events.append(protocol.OnceDown(fixture=self.once, seconds=0.0))
            self._end(0)
        elif isinstance(command, (protocol.Run, protocol.More)):
            self._run(command)
        return True

    def _run(self, command: protocol.Run | protocol.More) -> None:
        skipped: list[str] = []
        for test in command.tests:
            name = test.nodeid.rsplit("::", 1)[-1]
            if name.startswith("test_missing"):
                self.events.append(protocol.Missing(nodeid=test.nodeid))
                continue
            location = [test.nodeid.split("::")[0], 0, name]
            self.events.append(protocol.Start(nodeid=test.nodeid, location=location))
            crash = name.startswith("test_crash") and not (
                name.startswith("test_crash_once") and test.attempt > 1
            )
            if crash:
                self.events.append(_report(test.nodeid, location, "setup", "passed"))
                self._end(-signal.SIGSEGV)
                return
            if name.startswith("test_hang"):
                self.events.append(_report(test.nodeid, location, "setup", "passed"))
                return  # the rest of the batch waits behind it, as in a real worker
            if name.startswith("test_skip"):
                self.events.append(_report(test.nodeid, location, "setup", "skipped"))
            else:
                self.events.append(_report(test.nodeid, location, "setup", "passed"))
                outcome = "failed" if name.startswith("test_fail") else "passed"
                self.events.append(_report(test.nodeid, location, "call", outcome))
            self.events.append(_report(test.nodeid, location, "teardown", "passed"))
            self.events.append(protocol.Finish(nodeid=test.nodeid, location=location))
        seq = command.seq if isinstance(command, protocol.More) else 0
        self.events.append(protocol.Done(job=command.job, skipped=skipped, through=seq))

    def _end(self, code: int) -> None:
        self.eof, self.code = True, code

    def signal_group(self, signum: int) -> None:
        if signum in (signal.SIGTERM, signal.SIGKILL):
            self._end(-signum)

    def dump_stacks(self) -> None:
        self.stacks.write_text("(a scripted worker has no stacks)\n")

    def poll(self) -> int | None:
        return self.code if self.eof and not self.events else None

    def wait(self, timeout: float | None = None) -> int:
        self._end(self.code if self.code is not None else 0)
        return int(self.code or 0)

    def close(self) -> None:
        pass

    def take(self) -> tuple[list[protocol.Message], bool]:
        """What it said since, decoded as the loop's pipes decode it, and whether it ended."""
        said, self.events = self.events, []
        data = b"".join(protocol.encode(message) for message in said)
        return wire.Reader(protocol.EVENTS).feed(data), self.eof


def _report(nodeid: str, location: list[Any], when: str, outcome: str) -> protocol.Report:
    longrepr: Any = None
    if outcome == "failed":
        longrepr = f"scripted failure of {nodeid}"
    elif outcome == "skipped":
        longrepr = [location[0], 1, "Skipped: scripted"]
    report = pytest.TestReport(nodeid, tuple(location), {}, outcome, longrepr, when)
    data = {**report._to_json(), "$report_type": "TestReport"}  # noqa: SLF001 - a worker's form
    return protocol.Report(data=data)


class ScriptedClock:
    """The run's clock, moved by the backend: from the real one's reading, forward."""

    def __init__(self) -> None:
        self.time = time.monotonic()

    def now(self) -> float:
        return self.time


class ScriptedBackend(Backend):
    """Starts ScriptedWorkers; its poll hands back what they said, and their ends."""

    local_leases = True

    def __init__(self, log_dir: Path, scripted_clock: ScriptedClock | None = None) -> None:
        self.log_dir = log_dir
        self.workers: dict[int, ScriptedWorker] = {}
        self.next_key = 0
        self.clock = scripted_clock

    def start(
        self,
        devices: tuple[int, ...],
        lease: Lease | None,
        env: Mapping[str, str],
        request: Request | None = None,
    ) -> WorkerHandle:
        self.next_key += 1
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = self.log_dir / f"w{self.next_key}.log"
        once = env.get("DEVPOOL_ONCE_SETUP", "")
        worker = ScriptedWorker(self.next_key, devices, lease, log, once)
        self.workers[worker.key] = worker
        return worker

    def poll(self, timeout: float) -> list[tuple[WorkerHandle, list[protocol.Message], bool]]:
        out: list[tuple[WorkerHandle, list[protocol.Message], bool]] = []
        for worker in list(self.workers.values()):
            said, eof = worker.take()
            if said or eof:
                out.append((worker, said, eof))
            if eof:
                del self.workers[worker.key]
        if not out and self.clock is not None:
            self.clock.time += timeout  # the loop's wait, passed at once
        return out

    def drain(self, worker: WorkerHandle) -> list[protocol.Message]:
        assert isinstance(worker, ScriptedWorker)
        self.workers.pop(worker.key, None)
        return worker.take()[0]

    def reap(self, worker: WorkerHandle, wait: float = 5.0) -> int | None:
        assert isinstance(worker, ScriptedWorker)
        worker.exited = True
        self.workers.pop(worker.key, None)
        return worker.code

    def close(self) -> None:
        self.workers.clear()


def pytest_configure(config: pytest.Config) -> None:
    mp = pytest.MonkeyPatch()
    config.add_cleanup(mp.undo)
    scripted_clock = ScriptedClock() if os.environ.get("SCRIPTED_CLOCK") else None
    if scripted_clock is not None:
        clock.use(scripted_clock.now)
        config.add_cleanup(lambda: clock.use(time.monotonic))
    mp.setattr(workers, "early_backend", lambda *args, **kwargs: None)
    mp.setattr(
        workers,
        "make_backend",
        lambda config, settings, inventory, run_dir, log_dir, *rest: ScriptedBackend(
            log_dir, scripted_clock
        ),
    )
