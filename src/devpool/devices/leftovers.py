"""Processes a test left behind: found through /proc, named, and ended.

A worker is a child subreaper (PR_SET_CHILD_SUBREAPER): whatever a test starts stays in the
worker's tree even when it leaves its process group or session, or double-forks, because an
orphan is handed to its nearest subreaper ancestor, not to init. So what a test left is the
worker's live descendants at its end, and "has the worker any child at all" (one waitid
call) is the whole check after a test that started nothing.

Every devpool process of a run also carries its mark: DEVPOOL_RUN_MARK in the environment
of each process exec'd below it (a server started with subprocess), or, for a fork that
never exec'd, a shared mapping of a memfd named after the mark (/proc/PID/maps shows it;
the controller maps it before its first fork, and an exec drops it) and a `devpool-*` name.
Another run started alike (the same command line and environment) has its own mark, so
none of its forks is taken for this run's. The controller's sweep after a worker died, its
sweep at the run's end, and the guard (a small process that outlives a SIGKILLed
controller: this file run as a script) end what carries it.

Standard library only: the guard runs it with no site packages.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

MARK_ENV = "DEVPOOL_RUN_MARK"
# The names devpool gives its own processes (prctl PR_SET_NAME); a fork that never exec'd
# keeps its parent's.
OUR_NAMES = ("devpool-worker", "devpool-tmpl", "devpool-zygote")
PR_SET_CHILD_SUBREAPER = 36
GRACE = 2.0  # seconds between SIGTERM and SIGKILL for a leftover
# Seconds a process found after a test has to end on its own before it is a leftover (as
# cargo-nextest's leak-timeout, 100 ms there; more here, for a loaded host): a child the
# test SIGKILLed that the kernel has not yet ended (a hung tool's), or one exiting on the
# SIGTERM a fixture's teardown just sent, is no leak.
SETTLE = 0.25
COMMAND_LIMIT = 200  # characters of a command line said in a LEAK line
_ENVIRON_LIMIT = 1 << 20  # an environment larger than this is not read whole


@dataclass(frozen=True)
class Proc:
    """One process as /proc shows it."""

    pid: int
    ppid: int
    pgid: int
    sid: int
    comm: str
    state: str
    start: int  # clock ticks after boot
    uid: int

    @property
    def zombie(self) -> bool:
        return self.state in ("Z", "X")


@dataclass
class Leftover:
    """A process that outlived what started it: what it is, what it sees, how it ended."""

    pid: int
    command: str
    user: str
    environ: dict[str, str] = field(default_factory=dict)
    ports: tuple[int, ...] = ()  # TCP ports it listens on
    ended: str = ""  # terminated | killed | exited | not permitted

    def holds(self, inherited: Mapping[str, str]) -> list[str]:
        """What it can still see or hold: the devices its environment shows (inherited's,
        for a fork that never exec'd), and the TCP ports it listens on."""
        env = self.environ if "DEVPOOL_DEVICES" in self.environ else inherited
        platform = env.get("DEVPOOL_PLATFORM", "")
        devices = [f"{platform}:{d}" for d in env.get("DEVPOOL_DEVICES", "").split(",") if d]
        return devices + [f"port {port}" for port in self.ports]


def this_run() -> str:
    """The mark of the run this process controls: its pid and start, unique on the host."""
    proc = read(os.getpid())
    return f"{os.getpid()}.{proc.start if proc else 0}"


_mapped: set[str] = set()  # marks this process mapped (forks inherit the mapping, not this)


def mark_forks(mark: str) -> bool:
    """Map a memfd named after mark into this process, kept across fork: every fork that
    never exec'd shows it in /proc/PID/maps. No Python object keeps its descriptor (a fork
    closes every descriptor it did not ask for). False where the kernel offers none."""
    if mark in _mapped:
        return True
    if not hasattr(os, "memfd_create") or not sys.platform.startswith("linux"):
        return False
    try:
        fd = os.memfd_create(f"devpool-run-{mark}", os.MFD_CLOEXEC)
    except OSError:
        return False
    try:
        os.ftruncate(fd, 4096)
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int]
        libc.mmap.argtypes += [ctypes.c_int, ctypes.c_long]
        address = libc.mmap(None, 4096, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
        if address in (None, ctypes.c_void_p(-1).value):
            return False
    except (OSError, AttributeError):
        return False
    finally:
        os.close(fd)
    _mapped.add(mark)
    return True


def carries_fork_mark(pid: int, mark: str) -> bool:
    """Whether the process maps the memfd of mark (a fork of that run that never exec'd)."""
    wanted = f"/memfd:devpool-run-{mark} ".encode()
    try:
        with open(f"/proc/{pid}/maps", "rb") as handle:
            return any(line.find(wanted) >= 0 for line in handle)
    except OSError:
        return False


def make_subreaper() -> bool:
    """Become the reaper of every orphan below this process (Linux 3.4+)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def has_children() -> bool:
    """Whether this process has any child, alive or not, without reaping one."""
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    except OSError:
        return True
    return True


def read(pid: int) -> Proc | None:
    """One process's /proc/PID/stat and owner, None once it is gone."""
    # devpool.procfs reads the same for the rest of devpool; the guard runs this file alone
    # (python -I -S), where no devpool module can be imported.
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            raw = handle.read().decode(errors="replace")
        uid = os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None
    # comm may hold spaces and parentheses: the fields after it follow the last ')'.
    left, right = raw.find("("), raw.rfind(")")
    if left < 0 or right < 0:
        return None
    fields = raw[right + 2 :].split()
    try:
        return Proc(
            pid,
            int(fields[1]),
            int(fields[2]),
            int(fields[3]),
            raw[left + 1 : right],
            fields[0],
            int(fields[19]),
            uid,
        )
    except (IndexError, ValueError):
        return None


def processes() -> Iterator[Proc]:
    """Every process /proc lists now."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return
    for name in names:
        if name.isdigit() and (proc := read(int(name))) is not None:
            yield proc


def descendants(root: int, procs: Iterable[Proc] | None = None) -> list[Proc]:
    """The live (not zombie) processes below root, parents before children."""
    by_parent: dict[int, list[Proc]] = {}
    for proc in processes() if procs is None else procs:
        by_parent.setdefault(proc.ppid, []).append(proc)
    found: list[Proc] = []
    todo = [root]
    while todo:
        for child in by_parent.get(todo.pop(), ()):
            todo.append(child.pid)
            if not child.zombie:
                found.append(child)
    return found


def environ(pid: int) -> dict[str, str]:
    """A process's environment as it was exec'd ({} when not ours to read)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            raw = handle.read(_ENVIRON_LIMIT)
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {key.decode(errors="replace"): value.decode(errors="replace") for key, value in pairs}


def command(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            raw = handle.read(4096)
    except OSError:
        return ""
    # One line, however the arguments were written (a `python -c` script spans several).
    words = " ".join(part.decode(errors="replace") for part in raw.split(b"\0") if part)
    words = " ".join(words.split())
    return words if len(words) <= COMMAND_LIMIT else words[: COMMAND_LIMIT - 1] + "…"


def user(uid: int) -> str:
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return str(uid)


def listening(pid: int) -> tuple[int, ...]:
    """TCP ports the process listens on (its socket inodes matched in /proc/net/tcp*)."""
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
    if not inodes:
        return ()
    ports = set()
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/net/{table}") as handle:
            next(handle, None)
            for line in handle:
                parts = line.split()
                if len(parts) > 9 and parts[3] == "0A" and parts[9] in inodes:  # LISTEN
                    ports.add(int(parts[1].rsplit(":", 1)[1], 16))
    return tuple(sorted(ports))


def describe(proc: Proc) -> Leftover:
    return Leftover(
        proc.pid,
        command(proc.pid) or proc.comm,
        user(proc.uid),
        environ(proc.pid),
        listening(proc.pid),
    )


def _alive(pid: int) -> bool:
    proc = read(pid)
    return proc is not None and not proc.zombie


def _reap(pids: Iterable[int]) -> None:
    """Collect the exit of those that are our children (no zombie stays behind)."""
    for pid in pids:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)


def settled(procs: list[Proc], within: float = SETTLE) -> list[Proc]:
    """Those of procs still alive after they had `within` seconds to end; no wait when none
    is alive. Not reaped: a zombie is dead here, and its exit status stays its parent's
    (a test's Popen that waits on it later gets it)."""
    left = set(_outlive([proc.pid for proc in procs], within, reap=False))
    return [proc for proc in procs if proc.pid in left]


def end(procs: list[Proc], grace: float = GRACE) -> dict[int, str]:
    """SIGTERM each to its group (its own pid where it shares ours), SIGKILL whoever is left
    after grace; how each ended: terminated, killed, exited (gone already), not permitted.
    Each is signalled through a pidfd opened on the process it was when found (its start
    matched): a pid ended and reused since, by another run's controller say, is left alone."""
    by_pid = {proc.pid: proc for proc in procs}
    procs = list(by_pid.values())  # each once
    how: dict[int, str] = {}
    own_group = os.getpgrp()
    ending = {proc.pid for proc in procs}
    leaders = {proc.pgid for proc in procs if proc.pgid == proc.pid and proc.pgid != own_group}
    if leaders:  # a group is signalled whole only where all of it is being ended
        others = (p for p in processes() if p.pgid in leaders and not p.zombie)
        leaders -= {p.pgid for p in others if p.pid not in ending}
    handles = {proc.pid: _handle(proc) for proc in procs}
    try:
        for proc in procs:
            try:
                if proc.pid in leaders and handles[proc.pid] is not None:
                    os.killpg(proc.pgid, signal.SIGTERM)
                else:
                    _signal(proc, handles[proc.pid], signal.SIGTERM)
                how[proc.pid] = "terminated"
            except ProcessLookupError:
                how[proc.pid] = "exited"
            except PermissionError:
                how[proc.pid] = "not permitted"
        waiting = _outlive([p.pid for p in procs if how[p.pid] == "terminated"], grace)
        for pid in waiting:
            with contextlib.suppress(OSError):
                _signal(by_pid[pid], handles[pid], signal.SIGKILL)
            how[pid] = "killed"
        _outlive(waiting, grace)
    finally:
        for handle in handles.values():
            if handle is not None and handle >= 0:
                os.close(handle)
    return how


def _handle(proc: Proc) -> int | None:
    """A pidfd on proc (-1 where the kernel has none: the pid, checked), None where its pid
    is gone or is another process's now."""
    try:
        handle = os.pidfd_open(proc.pid)
    except ProcessLookupError:
        return None
    except (OSError, AttributeError):  # before Linux 5.3, or not offered here
        handle = -1
    now = read(proc.pid)  # after the open: the pidfd is on this process, or on none
    if now is None or now.start != proc.start:
        if handle >= 0:
            os.close(handle)
        return None
    return handle


def _signal(proc: Proc, handle: int | None, signum: int) -> None:
    """Signal proc as it was found: through its pidfd, else by its pid while its start
    still matches (ProcessLookupError once it is gone, or another process has its pid)."""
    if handle is None:
        raise ProcessLookupError(proc.pid)
    if handle >= 0:
        try:
            signal.pidfd_send_signal(handle, signum)
            return
        except (ProcessLookupError, PermissionError):
            raise
        except OSError:  # pidfds refused here (a sandbox): the pid, checked again below
            pass
    now = read(proc.pid)
    if now is None or now.start != proc.start:
        raise ProcessLookupError(proc.pid)
    os.kill(proc.pid, signum)


def _outlive(pids: list[int], grace: float, reap: bool = True) -> list[int]:
    """Those of pids still alive after grace (reaping the ones that are our children, unless
    not to: a zombie counts as gone either way)."""
    deadline = time.monotonic() + grace
    while pids and time.monotonic() < deadline:
        if reap:
            _reap(pids)
        pids = [pid for pid in pids if _alive(pid)]
        if pids:
            time.sleep(0.01)
    return pids


@dataclass(frozen=True)
class RunMark:
    """What marks a run's processes: its mark, and its controller's pid, environment and
    start (a fork that never exec'd shows the controller's environment)."""

    mark: str
    controller: int
    home: bytes
    since: int
    argv: str = ""  # the controller's command line, which a fork of it shows too
    mapped: bool = False  # its forks carry the mark's memfd (mark_forks): told by that alone

    @classmethod
    def of(cls, mark: str, controller: int) -> RunMark:
        proc = read(controller)
        start = proc.start if proc else 0
        home, argv = _environ_bytes(controller), command(controller)
        return cls(mark, controller, home, start, argv, carries_fork_mark(controller, mark))

    def controls(self, proc: Proc | None) -> bool:
        """Whether proc (as read of the controller's pid) is the run's controller, alive."""
        return proc is not None and not proc.zombie and proc.start == self.since


def orphans(run: RunMark, spare: Iterable[int] = ()) -> list[Proc]:
    """Processes of this run that nothing of the run owns any more: those exec'd with its
    mark, and forks that never exec'd (a devpool name and the mark's memfd) that lost the
    devpool process they were forked below. spare: live processes of the run, whose
    descendants are theirs to check."""
    procs = {proc.pid: proc for proc in processes() if proc.uid == os.getuid()}
    keep = set(spare) | {os.getpid()}
    if run.controls(procs.get(run.controller)):
        # Alive: what is below it is its own. Dead (the guard's sweep), its workers dying by
        # their death signal still hold the test's processes below them: those are orphans.
        keep.add(run.controller)
    found = []
    for proc in procs.values():
        if proc.pid in keep or proc.zombie or proc.start < run.since:
            continue
        if _below(proc, keep, procs):
            continue
        if environ(proc.pid).get(MARK_ENV) == run.mark or _lost_fork(proc, run, procs):
            found.append(proc)
    return found


def _lost_fork(proc: Proc, run: RunMark, procs: dict[int, Proc]) -> bool:
    """A fork of the run's that never exec'd and whose parent is no longer a fork of it or
    its controller (a live devpool process's fork is not an orphan). Where the controller
    could map no memfd, a fork is told by the controller's environment and command line,
    which a run started alike shares."""
    if proc.comm not in OUR_NAMES:
        return False
    if run.mapped:
        if not carries_fork_mark(proc.pid, run.mark):
            return False
        parent = proc.ppid
        return parent not in procs or not (
            parent == run.controller or carries_fork_mark(parent, run.mark)
        )
    if not run.home or command(proc.pid) != run.argv:
        return False
    if _environ_bytes(proc.pid) != run.home:
        return False
    return proc.ppid not in procs or _environ_bytes(proc.ppid) != run.home


def _below(proc: Proc, keep: set[int], procs: dict[int, Proc]) -> bool:
    """Whether a live process the run keeps is its ancestor (a running worker's child)."""
    seen = set()
    pid = proc.ppid
    while pid > 1 and pid not in seen:
        if pid in keep:
            return True
        seen.add(pid)
        parent = procs.get(pid)
        if parent is None:
            return False
        pid = parent.ppid
    return False


def _environ_bytes(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            return handle.read(_ENVIRON_LIMIT)
    except OSError:
        return b""


def guard(mark: str, controller: int, fd: int) -> None:
    """Wait for the controller's pipe to close; unless it said the run ended cleanly
    first, end every process that carries the run's mark (the controller was killed)."""
    run = RunMark.of(mark, controller)
    said = b""
    with contextlib.suppress(OSError):
        while chunk := os.read(fd, 64):
            said += chunk
    if b"done" in said:
        return
    # A process closes its files before it is gone: until the controller is, what is below
    # it would still count as its own (orphans() keeps a live controller's tree).
    deadline = time.monotonic() + 5.0
    while run.controls(read(controller)) and time.monotonic() < deadline:
        time.sleep(0.01)
    # The workers die with the controller (PR_SET_PDEATHSIG): their orphans are what is left,
    # whoever adopted them. Swept until none is, briefly: nothing left, the guard is gone.
    deadline = time.monotonic() + 1.0
    while found := orphans(run):
        end(found, grace=1.0)
        if time.monotonic() > deadline:
            break


if __name__ == "__main__":  # the guard: python -I -S leftovers.py MARK PID FD
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C to the terminal's group
    guard(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
