"""Device health during a run: devices other runs hold or use, and devices that met errors.

Two questions, one room. Before a lease: does any process that is not ours compute on
these devices (`Foreign`)? After a test failed: did its own output name a fatal error
(`DeviceHealth`)? A device-level error (Xid, uncorrectable ECC, a lost GPU) retires the
device at once. An error that poisons only the process (a device-side assert, an illegal
memory access) sends the device to a health check in a fresh process once no worker of
ours holds it; it is retired only if that check fails.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from devpool.devices import probes
from devpool.devices.leases import Blocked, Holder, Lease
from devpool.devices.lockdir import describe_holders
from devpool.devices.probes import CONTEXT, Fatal
from devpool.run import clock
from devpool.run.context import RunContext
from devpool.wording import counted

FOREIGN_RETRY = 0.5  # seconds before retrying a device another run held
BUSY_RETRY = 2.0  # seconds before probing again a device a foreign process used
CHECK_TIMEOUT = 60.0  # seconds a health check may take before it counts as failed

Say = Callable[[str], None]


class Foreign:
    """Devices that other runs lease, or that processes that are not ours compute on."""

    def __init__(self, ctx: RunContext, say: Say) -> None:
        self.ctx = ctx
        self.say = say
        self.platform = ctx.inventory.platform.name
        self.blocked: dict[int, Blocked] = {}
        self.retry_at: dict[int, float] = {}
        self.busy_notes: dict[int, str] = {}  # device → the foreign processes the probe saw
        self.probe_unknown = False
        self.named: set[tuple[str, int] | None] = set()  # runs the waiting line has named
        self.needs = 0  # devices the job we wait for needs, for the waiting line

    def __bool__(self) -> bool:
        return bool(self.blocked)

    def unavailable(self, now: float) -> list[int]:
        return [d for d, at in self.retry_at.items() if at > now]

    def next_retry(self, now: float) -> float:
        return min(self.retry_at.values(), default=now + FOREIGN_RETRY)

    def leased(self, devices: Iterable[int]) -> None:
        """We hold these now: no longer blocked."""
        for device in devices:
            self.blocked.pop(device, None)
            self.retry_at.pop(device, None)

    def probe_lease(
        self, devices: tuple[int, ...], lease: Lease, now: float, ours: set[int]
    ) -> bool:
        """Probe newly leased devices: a card another process computes on is never handed out."""
        if self.ctx.probe is None:
            return True
        seen = self.ctx.probe(devices)
        if seen is None:
            if not self.probe_unknown:
                self.probe_unknown = True
                self.say(
                    f"cannot tell whether {self.platform} devices are used by other "
                    "processes (the probe is missing or timed out); running without that check"
                )
            return True
        busy = {d: procs for d, procs in probes.foreign(seen, ours).items() if procs}
        if not busy:
            return True
        lease.release()
        for device, procs in busy.items():
            note = probes.describe_busy(self.platform, {device: procs})
            if self.busy_notes.get(device) != note:
                self.say(note + " (not ours): not handing it out")
            self.busy_notes[device] = note
            self.blocked[device] = Blocked(device, None)
            self.retry_at[device] = now + BUSY_RETRY
        return False

    def describe(self) -> str:
        """Who holds or uses the devices we wait for, in one line: one part per holder."""
        parts = [self._held()] if self._leased() else []
        parts += [self.busy_notes[d] for d in sorted(self.blocked) if d in self.busy_notes]
        return "; ".join(parts)

    def mark(self, blocked: list[Blocked], now: float, needs: int = 0) -> None:
        """Other runs hold these devices: wait, and say so once per holder.

        A run's tests come and go on its devices, and its devices on and off our list as
        we recheck them: the line is said again only when a run it has not named yet holds
        what we wait for, and it names only such runs, each once with all the devices it
        holds now. Our own run is never named: a memory request may not fit beside our own
        shares. `needs`: the devices of the job that waits (0: the last one said).
        """
        for entry in blocked:
            self.blocked[entry.device] = entry
            self.retry_at[entry.device] = now + FOREIGN_RETRY
        self.waiting(self._holders(), needs)

    def waiting(self, held: Sequence[tuple[str, Holder | None]], needs: int = 0) -> None:
        """Say what this run waits for (`2 sim devices of 4`) and who holds them: the runs
        in `held` that no waiting line has named yet, once each; nothing if there are none."""
        self.needs = needs or self.needs
        fresh = [(what, h) for what, h in held if _run(h) not in self.named]
        if not fresh:
            return
        self.named |= {_run(h) for _, h in fresh}
        need = ""
        if self.needs:
            wanted = counted(self.needs, f"{self.platform} device")
            need = f" (this run needs {wanted} of {len(self.ctx.inventory.devices)})"
        self.say(f"waiting for devices held by other runs{need}: {describe_holders(fresh)}")

    def _holders(self) -> list[tuple[str, Holder | None]]:
        """(device, holder) for each other run's hold on a device we wait for."""
        found: list[tuple[str, Holder | None]] = []
        for entry in self._leased():
            name = f"{self.platform}:{entry.device}"
            holders = [s.holder for s in entry.shares] if entry.shares else [entry.holder]
            found += [(name, h) for h in holders if h is None or h.session != self.ctx.run_id]
        return found

    def _leased(self) -> list[Blocked]:
        """Devices we wait for that another run's lease holds (not a foreign process)."""
        return [b for d, b in sorted(self.blocked.items()) if d not in self.busy_notes]

    def _held(self) -> str:
        """The leased devices grouped by the run that holds them: `sim:0,1 held by pid ...`,
        each run and each of its tests named once."""
        return describe_holders(self._holders())

    def recheck(self, now: float) -> None:
        """Forget devices that other runs released, so waits are charged to them only while true."""
        for device in [d for d, at in self.retry_at.items() if at <= now]:
            holder = Holder.for_this_process(self.ctx.run_id, "probe")
            got = self.ctx.lock_dir.try_acquire(self.platform, [device], holder)
            # Shares, or a lock file made unusable: the next placement tries it (and retires
            # the device if its lock file still cannot be used).
            shared = isinstance(got, list) and any(b.shares or b.unusable for b in got)
            if isinstance(got, Lease) or shared:
                # Free, or shared by partial holders: a memory request may still fit there,
                # so the next placement tries it (and marks it again if it does not fit).
                if isinstance(got, Lease):
                    got.release()
                self.blocked.pop(device, None)
                self.retry_at.pop(device, None)
                self.busy_notes.pop(device, None)  # the probe runs again at the next lease
            else:
                self.mark(got, now)


def _run(holder: Holder | None) -> tuple[str, int] | None:
    """The run a holder belongs to (None: a lock file whose holder is unknown)."""
    return None if holder is None else (holder.session, holder.pid)


@dataclass(eq=False)
class Check:
    """A health check of one device, running in a fresh process."""

    device: int
    why: str  # the error that sent the device here
    process: subprocess.Popen[str]
    lease: Lease | None
    deadline: float


class DeviceHealth:
    """Fatal errors in a test's own output: retire the device, or check it first."""

    def __init__(self, ctx: RunContext, say: Say, local: bool = True) -> None:
        self.ctx = ctx
        self.say = say
        self.local = local  # the devices are on this host: checks run here
        self.platform = ctx.inventory.platform
        self.suspect: dict[int, str] = {}  # device → the error; checked once free
        self.suspect_since: dict[int, float] = {}
        self.checks: dict[int, Check] = {}
        self.retired: list[int] = []  # retired since the loop last asked

    @property
    def pending(self) -> bool:
        return bool(self.suspect or self.checks)

    def unavailable(self) -> set[int]:
        return set(self.suspect) | set(self.checks)

    def judge(self, devices: tuple[int, ...], text: str, test: str) -> Fatal | None:
        """After a failed test: the fatal error its own output names, and what it means."""
        if not devices:
            return None
        found = self.ctx.fatal.classify(text)
        if found is None:
            return None
        why = f"{found.text!r} in {test}"
        for device in devices:
            if device in self.ctx.bad_devices or device in self.suspect:
                continue
            if found.kind == CONTEXT and not self.local:
                # The device is on another machine (Ray): its worker is gone, and the
                # device is not ours to check from here. It stays in service.
                note = f"{self._name(device)}: {why} poisoned only that process; kept in service"
                self.ctx.device_notes.append(note)
                self.say(note)
            elif found.kind == CONTEXT:
                self.suspect[device] = why
                self.suspect_since[device] = clock.now()
                self.ctx.emit("device_suspect", device=device, reason=why, kind=found.kind)
                self.say(
                    f"{self._name(device)}: {why} poisons only that process; "
                    "checking the device in a fresh process before it runs anything else"
                )
            else:
                self.retire(device, f"device error {why}")
        return found

    def start_checks(self, held: set[int], now: float) -> None:
        """Check suspect devices that no worker of ours holds any more."""
        for device in [d for d in self.suspect if d not in held and d not in self.checks]:
            holder = Holder.for_this_process(self.ctx.run_id, "health check")
            got = self.ctx.lock_dir.try_acquire(self.platform.name, [device], holder)
            lease = got if isinstance(got, Lease) else None
            if lease is None:
                if now - self.suspect_since.get(device, now) > CHECK_TIMEOUT:
                    # Another run has held it all along: it runs there, so it answers there.
                    why = self.suspect.pop(device)
                    note = (
                        f"{self._name(device)} could not be checked after {why}: "
                        "other runs held it; kept in service"
                    )
                    self.ctx.device_notes.append(note)
                    self.say(note)
                continue  # another run holds it now: check when it is back
            env = dict(os.environ)
            if self.platform.visible_env:
                env[self.platform.visible_env] = str(device)
            process = subprocess.Popen(
                [sys.executable, "-m", "devpool.devices.devcheck", self.platform.kind, str(device)],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                pass_fds=tuple(lease.fds()),
                start_new_session=True,
            )
            why = self.suspect[device]
            self.checks[device] = Check(device, why, process, lease, now + CHECK_TIMEOUT)

    def poll(self, now: float) -> None:
        """Conclude the checks that ended (or ran out of time)."""
        for device, check in list(self.checks.items()):
            code = check.process.poll()
            if code is None and now < check.deadline:
                continue
            if code is None:
                check.process.kill()
                check.process.wait()
                code, said = 1, f"the check did not finish within {CHECK_TIMEOUT:g}s"
            else:
                said = (check.process.stdout.read() if check.process.stdout else "").strip()
            if check.process.stdout is not None:
                check.process.stdout.close()
            if check.lease is not None:
                check.lease.release()
            del self.checks[device]
            del self.suspect[device]
            if code == 1:
                self.retire(device, f"{check.why}, then its health check failed: {said}")
                continue
            verdict = "passed its health check" if code == 0 else "could not be checked"
            note = f"{self._name(device)} {verdict} after {check.why} ({said}); kept in service"
            self.ctx.device_notes.append(note)
            self.ctx.emit("device_ok", device=device, reason=check.why, check=said)
            self.say(note)

    def retire(self, device: int, why: str) -> None:
        if device in self.ctx.bad_devices:
            return
        self.ctx.bad_devices[device] = why
        self.retired.append(device)
        self.ctx.emit("device_bad", device=device, reason=why)
        self.say(f"retiring {self._name(device)} for this session: {why}")

    def close(self) -> None:
        """End checks still running (the run is over)."""
        for check in self.checks.values():
            check.process.kill()
            check.process.wait()
            if check.process.stdout is not None:
                check.process.stdout.close()
            if check.lease is not None:
                check.lease.release()
        self.checks.clear()

    def _name(self, device: int) -> str:
        return f"{self.platform.name}:{device}"
