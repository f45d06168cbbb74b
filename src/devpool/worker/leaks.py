"""What a test left in its worker: processes, threads, device memory; named and ended.

After each test (and after each wider fixture's teardown) the worker looks at what is still
there that the test started: its live descendant processes (the worker is their subreaper,
devices/leftovers.py), non-daemon threads it started that still run, and device memory it
still holds in this process (torch's caching allocator on cuda when torch is loaded; a file
the test writes on sim). Processes are ended at once, before the test's finish goes to the
controller, so no later test ever runs beside them. A thread cannot be ended, and memory
above a share of the next test's declaration is not given back: the worker is retired.

A process set up by a module- or session-scoped fixture belongs to that fixture: it is
checked when the fixture ends, and charged to the test that set it up.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from devpool.devices import leftovers, memory
from devpool.report.record import LeakLine
from devpool.worker import protocol

LEAKS_ENV = "DEVPOOL_LEAKS"  # MODE[:SHARE]: warn | fail | off, and the memory share
SIM_HELD_ENV = "DEVPOOL_SIM_HELD_FILE"  # sim: bytes per device this process keeps allocated
MODES = ("warn", "fail", "off")
DEFAULT_SHARE = 0.1


def mode_env(mode: str, share: float) -> dict[str, str]:
    """The workers' environment for a run's leak mode (set by the controller)."""
    return {LEAKS_ENV: f"{mode}:{share:g}"}


@dataclass
class _Owned:
    """Processes a wider fixture's setup started: its own until its teardown."""

    label: str  # "server (module)"
    nodeid: str  # the test whose setup set the fixture up
    pids: set[int] = field(default_factory=set)
    # The command lines of its processes: one started again with the same line (a test
    # that restarts the fixture's server) is the fixture's too, not that test's leak.
    commands: set[str] = field(default_factory=set)


class LeakWatch:
    """The worker's plugin: checks after each test; the messages go out with its finish."""

    def __init__(self, environ: dict[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        mode, _, share = env.get(LEAKS_ENV, "warn").partition(":")
        self.mode = mode if mode in MODES else "warn"
        try:
            self.share = float(share) if share else DEFAULT_SHARE
        except ValueError:
            self.share = DEFAULT_SHARE
        self.active = self.mode != "off"
        self.pending: list[protocol.Leak] = []  # leak messages not yet sent
        self.retire = False  # a leak the worker cannot undo: retire it after this test
        self._threads: set[int] = set()
        self._held: dict[int, int] = {}
        self._owned: dict[int, _Owned] = {}  # id(fixturedef) → what its setup started
        self._current = ""

    def start_worker(self) -> None:
        """In the process that runs tests (not a template): become the subreaper."""
        if self.active:
            leftovers.make_subreaper()

    # ---- around each test -------------------------------------------------------------------

    def before(self, nodeid: str) -> None:
        if not self.active:
            return
        self._current = nodeid
        self._threads = {t.ident or 0 for t in threading.enumerate()}
        self._held = self._memory()

    def after(self, nodeid: str) -> list[protocol.Leak]:
        """The test's leaks, each already ended where it can be; pending fixture leaks too."""
        if not self.active:
            return []
        found = self._processes(nodeid, None, self._free_descendants())
        found += self._leaked_threads(nodeid)
        found += self._leaked_memory(nodeid)
        self._current = ""
        messages, self.pending = [*self.pending, *found], []
        return messages

    def failure_text(self, messages: list[protocol.Leak], nodeid: str) -> str:
        """fail mode: the text of the teardown failure a test's own leaks become."""
        own = [m for m in messages if m.nodeid == nodeid and not m.fixture]
        if self.mode != "fail" or not own:
            return ""
        return "\n".join(f"[devpool] LEAK {line(m)}" for m in own)

    # ---- wider fixtures -----------------------------------------------------------------------

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(self, fixturedef: Any, request: Any) -> Generator[None, Any, Any]:
        if not self.active or fixturedef.scope == "function":
            return (yield)
        before = {p.pid for p in self._descendants()} if leftovers.has_children() else set()
        try:
            return (yield)
        finally:
            if leftovers.has_children():
                new = {p.pid for p in self._descendants()} - before
                if new:
                    label = f"{fixturedef.argname} ({fixturedef.scope})"
                    owned = self._owned.setdefault(id(fixturedef), _Owned(label, self._current))
                    owned.pids |= new
                    owned.commands |= {leftovers.command(pid) for pid in new} - {""}

    def pytest_fixture_post_finalizer(self, fixturedef: Any) -> None:
        owned = self._owned.pop(id(fixturedef), None)
        if owned is None:
            return
        procs = {p.pid: p for p in self._descendants()}
        alive = [procs[pid] for pid in owned.pids if pid in procs]
        below: list[leftovers.Proc] = []
        for proc in alive:
            below += [p for p in leftovers.descendants(proc.pid, procs.values()) if p not in alive]
        self.pending += self._processes(owned.nodeid, owned.label, alive + below)

    def at_exit(self) -> list[protocol.Leak]:
        """The worker ends: whatever is still below it is ended with it."""
        if not self.active or not leftovers.has_children():
            return self.pending
        found = self._processes(self._current or "", "the worker's end", self._descendants())
        messages, self.pending = [*self.pending, *found], []
        return messages

    # ---- what is looked at ----------------------------------------------------------------

    def _descendants(self) -> list[leftovers.Proc]:
        return leftovers.descendants(os.getpid())

    def _free_descendants(self) -> list[leftovers.Proc]:
        """The live processes below this worker that no wider fixture owns."""
        if not leftovers.has_children():
            return []
        procs = self._descendants()
        if any(fixture.commands for fixture in self._owned.values()):
            # A fixture's server restarted by a test (its command line again) is still the
            # fixture's; each process's command line is read once.
            taken = {pid for fixture in self._owned.values() for pid in fixture.pids}
            lines = {p.pid: leftovers.command(p.pid) for p in procs if p.pid not in taken}
            for fixture in self._owned.values():
                fixture.pids |= {pid for pid, line in lines.items() if line in fixture.commands}
        owned = {pid for o in self._owned.values() for pid in o.pids}
        if owned:
            for proc in [p for p in procs if p.pid in owned]:
                owned |= {p.pid for p in leftovers.descendants(proc.pid, procs)}
        return [p for p in procs if p.pid not in owned]

    def _processes(
        self, nodeid: str, fixture: str | None, procs: list[leftovers.Proc]
    ) -> list[protocol.Leak]:
        procs = leftovers.settled(procs)
        if not procs:
            return []
        described = [leftovers.describe(p) for p in procs]
        own = leftovers.command(os.getpid())
        for left in described:
            if left.command == own:  # a fork that never exec'd shows the worker's
                left.command = f"fork of the test's process pid {os.getpid()} (never exec'd)"
        # Only the outermost of each tree is signalled to its group; its children go with it.
        how = leftovers.end(procs)
        messages = []
        for proc, left in zip(procs, described, strict=False):
            ended = how.get(proc.pid, "")
            if ended == "not permitted":
                self.retire = True
            messages.append(
                protocol.Leak(
                    nodeid=nodeid,
                    kind="process",
                    pid=proc.pid,
                    command=left.command,
                    user=left.user,
                    holds=left.holds(os.environ),
                    fixture=fixture,
                    ended=ended,
                )
            )
        return messages

    def _leaked_threads(self, nodeid: str) -> list[protocol.Leak]:
        alive = [
            t
            for t in threading.enumerate()
            if t.is_alive() and not t.daemon and (t.ident or 0) not in self._threads
        ]
        if not alive:
            return []
        self.retire = True  # it runs on beside the next test: a fresh process instead
        return [
            protocol.Leak(
                nodeid=nodeid,
                kind="thread",
                pid=os.getpid(),
                command=_thread_name(t),
                user=leftovers.user(os.getuid()),
                holds=[],
                fixture=None,
                ended="retired",
            )
            for t in alive
        ]

    def _memory(self) -> dict[int, int]:
        """Bytes this process holds on each of its devices now."""
        held = os.environ.get(SIM_HELD_ENV)
        if held:
            ids = [int(d) for d in os.environ.get("DEVPOOL_DEVICES", "").split(",") if d.isdigit()]
            return memory.read_sim_usage(Path(held), ids)
        torch = sys.modules.get("torch")
        cuda = getattr(torch, "cuda", None)
        if cuda is None or not cuda.is_initialized():
            return {}  # never imported or initialised for this: nothing of ours there
        try:
            return {i: int(cuda.memory_allocated(i)) for i in range(cuda.device_count())}
        except Exception:  # noqa: BLE001 - a broken context is the health check's to name
            return {}

    def _leaked_memory(self, nodeid: str) -> list[protocol.Leak]:
        now = self._memory()
        grown = {d: b - self._held.get(d, 0) for d, b in now.items() if b > self._held.get(d, 0)}
        if not grown:
            return []
        declared = _declared() or _torch_total()
        retire = bool(declared) and any(b > declared * self.share for b in now.values())
        self.retire = self.retire or retire
        platform = os.environ.get("DEVPOOL_PLATFORM", "device")
        devices = [d for d in os.environ.get("DEVPOOL_DEVICES", "").split(",") if d]
        holds = [
            f"{platform}:{devices[d] if d < len(devices) else d} {_size(b)}"
            for d, b in sorted(grown.items())
        ]
        return [
            protocol.Leak(
                nodeid=nodeid,
                kind="memory",
                pid=os.getpid(),
                command="",
                user=leftovers.user(os.getuid()),
                holds=holds,
                fixture=None,
                ended="retired" if retire else "",
            )
        ]


def _declared() -> int:
    """The memory the worker's tests declare per device, or a whole device's; 0: unknown."""
    for name in (memory.DEVICE_MEMORY, memory.DEVICE_TOTAL):
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 0


def _torch_total() -> int:
    """A whole cuda device's memory, when torch has initialised CUDA in this process."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is None or not cuda.is_initialized():
        return 0
    try:
        return int(cuda.get_device_properties(0).total_memory)
    except Exception:  # noqa: BLE001 - no answer is no limit
        return 0


def _thread_name(thread: threading.Thread) -> str:
    target = getattr(thread, "_target", None)
    where = getattr(target, "__qualname__", "") if target is not None else ""
    return thread.name + (f" running {where}" if where else "")


def _size(count: int) -> str:
    return f"{count / (1 << 30):.1f} GiB" if count >= 1 << 30 else f"{count / (1 << 20):.1f} MiB"


def line(message: protocol.Leak) -> str:
    """One leak in words, as every report says it (report/record.py)."""
    return LeakLine.of(protocol.to_object(message)).what()
