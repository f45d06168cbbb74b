"""What the processes a recorded test starts run of the project: seen, and counted for it.

below.py finds the folder at every `import devpool`; this module is imported only where it
does. A recording worker (Below, from record.py) makes a folder of its own,
`/tmp/devpool-children-<uid>/<pid>`, writes its rootdir and its start time in it and names
it in DEVPOOL_RECORD_CHILDREN, which every process below it inherits. A Python process below
it boots a Child: any Python of the environment as it starts with that variable set
(devpool-children.pth, which a wheel installs beside the package), and one that imports
devpool also where a test gave it an environment of its own (it finds the worker among its
ancestors). The worker's own forks are adopted with its watch. A Child watches (watch.py)
and leaves `<pid>.started` in the folder; as it ends (its exit, os._exit, an exec, a SIGTERM
it left to the default) it writes what it ran and read as `<pid>.<n>.json` and takes its
mark away; a fork of it leaves a mark of its own. At the test's teardown the worker gathers
the folder: the spots and files of every process that ended join the test's. A process that
left its mark and said nothing (killed, or still running) makes the test `unseen`: any
change selects it (diff.py), and the reason names the pid.

A process that is not Python, or that neither the variable nor devpool's import reaches, is
not seen: docs/selective-runs.md says so.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from devpool import procfs
from devpool.select import below
from devpool.select.below import FOLDER, is_live, own_base
from devpool.select.fingerprints import ProjectPaths, file_hash
from devpool.select.watch import (
    Codes,
    Watch,
    data_read,
    module_spots,
    spots_of,
    watch_for_this_interpreter,
)

BASE = Path(below.BASE)
_STARTED = ".started"
WAIT = 1.0  # for a process started by the test, still ending (a session's last forks)


class Child:
    """This process, started below a recording worker: its watch, its reads, its mark."""

    def __init__(self, folder: Path, root: Path, watch: Watch | None = None) -> None:
        self.folder = folder
        self.paths = ProjectPaths(root)
        self.watch = watch or watch_for_this_interpreter(self._wanted)
        self.lost = "" if self.watch is not None else "every hook that could watch it was taken"
        self.on_exec: Callable[[str, tuple[Any, ...]], None] | None = None
        self.reads: set[str] = set()
        self.seen: Codes = {}
        self.written = 0  # dumps of this pid so far
        self.pid = -1
        self.retired = False

    def _wanted(self, filename: str) -> bool:
        return self.paths.source(filename) is not None

    def start(self) -> None:
        self._mark()
        if self.watch is not None:
            self.on_exec = getattr(self.watch, "audit", None)
            self.lost = self.watch.start()
        sys.addaudithook(self._audit)
        atexit.register(self.quietly_dump)
        os.register_at_fork(after_in_child=self._forked)
        with contextlib.suppress(ValueError):  # not the main thread: SIGTERM is left alone
            if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
                signal.signal(signal.SIGTERM, _terminated)

    def _mark(self) -> None:
        self.pid, self.written = os.getpid(), 0
        with contextlib.suppress(OSError):
            (self.folder / f"{self.pid}{_STARTED}").touch()

    def _forked(self) -> None:
        if not self.retired:
            self._mark()  # what the parent saw before the fork is the parent's to tell

    def _audit(self, event: str, args: tuple[Any, ...]) -> None:
        if event == "exec" and self.on_exec is not None:
            self.on_exec(event, args)
        elif event == "open" and (name := data_read(args)) is not None:
            self.reads.add(name)
        elif event == "os.exec":  # the image goes: what it ran is told now
            self.quietly_dump()
            with contextlib.suppress(OSError):
                (self.folder / f"{os.getpid()}{_STARTED}").unlink()

    def retire(self, why: str) -> None:
        """Tell the test above only why it cannot be told more (it fails closed), and from
        now on nothing: the watch, and this process's forks, are someone else's."""
        if self.watch is not None:
            self.watch.stop()
        self.watch, self.lost = None, why
        self.quietly_dump()
        self.retired = True

    def quietly_dump(self) -> None:
        """dump, where nothing of it may reach the process (its exit, an exec): a failure
        leaves the mark, and the test fails closed."""
        with contextlib.suppress(Exception):
            self.dump()

    def dump(self) -> None:
        """Write what this process ran and read; its mark goes."""
        if os.getpid() != self.pid or self.retired:
            return  # a fork whose after-fork hook did not run: the parent's mark and dumps
        payload: dict[str, Any] = {"pid": self.pid, "why": self.lost}
        if not self.lost and self.watch is not None:
            self.lost = self.watch.stop()
            codes, imported = self.watch.take()
            self.watch.start()
            self.seen |= codes | imported
            payload["why"] = self.lost
        if not payload["why"]:
            spots = spots_of(self.seen.values(), self.paths.source)
            spots |= module_spots(list(sys.modules.values()), self.paths.source)
            files = {}
            for path in self.reads:
                rel = self.paths.rel(path)
                if rel is not None and os.path.isfile(path):
                    files[rel] = file_hash(Path(path))
            payload |= {"spots": sorted(spots), "files": files}
        self.written += 1
        name = self.folder / f"{self.pid}.{self.written}.json"
        with contextlib.suppress(OSError):
            part = name.with_suffix(".part")
            part.write_text(json.dumps(payload))
            part.rename(name)
            (self.folder / f"{self.pid}{_STARTED}").unlink(missing_ok=True)


_CHILD: Child | None = None
_EXIT = os._exit


def _exit(status: int) -> NoReturn:
    """os._exit, after this process has told what it ran (forks end this way)."""
    if _CHILD is not None:
        _CHILD.quietly_dump()
    _EXIT(status)


def _terminated(signum: int, frame: object) -> None:
    """SIGTERM, where the process left it to the default (a server a test stops with
    terminate()): tell what it ran, then end by the signal as the default would."""
    if _CHILD is not None:
        _CHILD.quietly_dump()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def make_folder(root: Path) -> Path:
    """The recording worker's folder, for the processes below it; the folders of workers
    that are gone go (killed ones leave theirs). The base is this user's alone: another
    user's link or folder is refused."""
    BASE.mkdir(mode=0o700, exist_ok=True)
    if not own_base(str(BASE)):
        raise OSError(f"{BASE} is not a folder of this user's alone")
    for stale in BASE.iterdir():
        making = stale.name.startswith(".")  # a worker's, being made: gone when its pid is
        if not (procfs.alive(stale.name[1:]) if making else is_live(str(stale))):
            shutil.rmtree(stale, ignore_errors=True)
    folder, part = BASE / str(os.getpid()), BASE / f".{os.getpid()}"
    shutil.rmtree(part, ignore_errors=True)
    part.mkdir(mode=0o700)  # made whole, then named: another worker's sweep sees it live
    (part / "root").write_text(str(root))
    (part / "started").write_text(str(procfs.started("self")))
    shutil.rmtree(folder, ignore_errors=True)
    part.rename(folder)
    return folder


def boot(folder: str) -> None:
    """As devpool is imported (devpool/__init__.py), below the live recording worker whose
    folder below.find() found: watch."""
    if _CHILD is not None:
        return
    try:
        root = Path(folder, "root").read_text()
    except OSError:
        return
    _start(Child(Path(folder), Path(root)))


def _start(child: Child) -> None:
    global _CHILD
    _CHILD = child
    try:
        child.start()
    except Exception as error:  # never the process's own import: it tells why instead
        child.lost = child.lost or f"its watch did not start ({error!r})"
    os._exit = _exit


def adopt(folder: Path, root: Path, watch: Watch) -> None:
    """In a fork of the recording worker (a test's os.fork, multiprocessing): this process
    is one below it, watched by the worker's own watch."""
    if _CHILD is None:
        _start(Child(folder, root, watch))


def hand_over() -> None:
    """A recorder starts in this process (a nested recording run, record.py): a booted
    watch steps aside, and the test above fails closed."""
    global _CHILD
    if _CHILD is not None:
        _CHILD.retire("it records tests of its own")
        _CHILD = None


class Below:
    """The recording worker's side: the folder where the processes below the running test
    (or once-fixture) tell what they ran, made as the first one begins in this process (a
    template runs none), and forks of this process adopted as processes below it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.pid = -1  # the process the folder is this one's
        self.folder: Path | None = None
        self.watch: Watch | None = None
        self.since = 0.0
        self.lost = ""  # why the processes below cannot tell (no folder)

    def begin(self, watch: Watch | None) -> None:
        self.since = time.time()
        if self.pid == os.getpid() or watch is None:
            return
        first, self.pid, self.watch = self.pid == -1, os.getpid(), watch
        try:
            self.folder = make_folder(self.root)
        except OSError as error:
            self.lost = f"no folder for the processes it starts ({error})"
            return
        os.environ[FOLDER] = str(self.folder)
        if first:  # a fork of this process (os.fork, multiprocessing) is one below the test
            os.register_at_fork(after_in_child=self._forked)

    def _forked(self) -> None:
        if self.folder is not None and self.watch is not None and self.pid == os.getppid():
            adopt(self.folder, self.root, self.watch)

    def gather(self) -> Gathered:
        """What the processes started since `begin` told (gather), or why not."""
        if self.pid != os.getpid():
            return Gathered()
        if self.folder is None:
            return Gathered(why=self.lost)
        return gather(self.folder, self.since)

    def end(self) -> None:
        if self.pid == os.getpid() and self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)


@dataclass
class Gathered:
    """What the processes below a test ran and read, or why it is not known."""

    spots: set[tuple[str, int]] = field(default_factory=set)
    files: dict[str, str | None] = field(default_factory=dict)
    why: str = ""


def _ending(mark: Path, since: float) -> bool:
    try:
        fresh = mark.stat().st_mtime >= since
    except OSError:
        return False
    return fresh and procfs.alive(mark.name.split(".")[0])


def gather(folder: Path, since: float, wait: float = WAIT) -> Gathered:
    """The worker's side, at a test's teardown: what every process that ended below it said
    (their files go), and why not, when one was killed or still runs. One started since
    `since` (time.time()) and still running is waited for up to `wait` seconds: a session's
    last forks may be ending; an older one (a server of a wider fixture) is not."""
    gathered = Gathered()
    deadline = time.monotonic() + wait
    while True:
        try:
            names = os.listdir(folder)
        except OSError:
            gathered.why = f"the folder its processes tell in is gone ({folder})"
            return gathered
        running = [n for n in names if n.endswith(_STARTED) and _ending(folder / n, since)]
        if not running or time.monotonic() >= deadline:
            break
        time.sleep(0.02)
    names = os.listdir(folder)
    told = {n.split(".")[0] for n in names if n.endswith(".json")}
    for name in sorted(n for n in names if n.endswith(".json")):
        path = folder / name
        try:
            said = json.loads(path.read_text())
        except (OSError, ValueError):
            said = {"pid": name.split(".")[0], "why": "its account could not be read"}
        path.unlink(missing_ok=True)
        if said.get("why"):
            gathered.why = (
                gathered.why or f"a process it started (pid {said['pid']}): {said['why']}"
            )
            continue
        gathered.spots.update((str(rel), int(line)) for rel, line in said.get("spots", ()))
        gathered.files.update(said.get("files", {}))
    for name in (n for n in names if n.endswith(_STARTED)):
        pid = name.split(".")[0]
        if procfs.alive(pid):
            gathered.why = gathered.why or f"a process it started (pid {pid}) still runs"
            continue
        (folder / name).unlink(missing_ok=True)
        if pid not in told:
            why = f"a process it started (pid {pid}) ended before telling what it ran"
            gathered.why = gathered.why or why
    return gathered
