"""Every message between devpool's processes, typed: the types are the schema.

Three conversations share one codec, each message one JSON object tagged with its kind:

- controller → worker (`COMMANDS`, key "op") and worker → controller (`EVENTS`, key "ev"):
  JSON lines over a pair of pipes (on Ray, a rank actor's pipes and a bridge thread);
- controller or rank actor → template (`FORK_COMMANDS`) and template → asker
  (`TEMPLATE_EVENTS`): one JSON object per SOCK_SEQPACKET packet (worker/template.py);
- controller → zygote (`ZYGOTE_COMMANDS`) and zygote → controller (`ZYGOTE_EVENTS`), the
  same way (backends/zygote.py).

Each side decodes a message once, where it reads it, into its frozen type; a tag its
channel does not know, or a message that lacks a field or has one too many, raises
ProtocolError (a devpool bug, said loudly). A new message is one class here, registered
on its channel, and (for a worker's event) one `_on_<tag>` handler in run/worker_events.py.

This module imports nothing but the standard library: Ray's rank actors use it too.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar


class ProtocolError(Exception):
    """A message its reader does not know, or with fields its type does not have."""


@dataclass(frozen=True, slots=True)
class Message:
    """The base of every message: `tag` is its kind on the wire."""

    tag: ClassVar[str] = ""


M = TypeVar("M", bound=type[Message])


class Channel:
    """One direction of one conversation: its tag key ("op" or "ev") and its types by tag."""

    def __init__(self, name: str, key: str) -> None:
        self.name = name
        self.key = key
        self.types: dict[str, type[Message]] = {}

    def __call__(self, cls: M) -> M:
        """Register a message type on this channel (a class decorator)."""
        if cls.tag in self.types:
            raise ProtocolError(f"two {self.name} types are tagged {cls.tag!r}")
        self.types[cls.tag] = cls
        _KEYS[cls] = self.key
        _FIELDS[cls] = tuple(
            (f.name, f.name.rstrip("_"), f.default is None) for f in dataclasses.fields(cls)
        )
        return cls

    def decode(self, raw: bytes | str) -> Message:
        """The typed message of one JSON object; ProtocolError when it is not one of ours."""
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise ProtocolError(f"a {self.name} that is not JSON: {raw[:200]!r}") from exc
        if not isinstance(data, dict):
            raise ProtocolError(f"a {self.name} that is not an object: {raw[:200]!r}")
        return self.decode_object(data)

    def decode_object(self, data: dict[str, Any]) -> Message:
        tag = data.pop(self.key, None)
        cls = self.types.get(tag) if isinstance(tag, str) else None
        if cls is None:
            known = ", ".join(sorted(self.types))
            raise ProtocolError(f"unknown {self.name} {tag!r} (known: {known}): {data!r:.200}")
        if "as" in data:  # a field named as a Python keyword carries a trailing underscore
            data["as_"] = data.pop("as")
        try:
            return cls(**data)
        except TypeError as exc:
            raise ProtocolError(f"a malformed {self.name} {tag!r}: {exc}") from exc


_KEYS: dict[type[Message], str] = {}
# Per type: (attribute, name on the wire, left out when None).
_FIELDS: dict[type[Message], tuple[tuple[str, str, bool], ...]] = {}

COMMANDS = Channel("worker command", "op")
EVENTS = Channel("worker event", "ev")
FORK_COMMANDS = Channel("template command", "op")
TEMPLATE_EVENTS = Channel("template event", "ev")
ZYGOTE_COMMANDS = Channel("zygote command", "op")
ZYGOTE_EVENTS = Channel("zygote event", "ev")


def to_object(message: Message) -> dict[str, Any]:
    """A message's JSON object: its tag, its fields (None-defaulted ones left out if None)."""
    cls = type(message)
    data: dict[str, Any] = {_KEYS[cls]: cls.tag}
    for attribute, wire, optional in _FIELDS[cls]:
        value = getattr(message, attribute)
        if type(value) is tuple and value and type(value[0]) is Test:
            value = [
                {"nodeid": t.nodeid, "display": t.display, "attempt": t.attempt} for t in value
            ]
        if value is not None or not optional:
            data[wire] = value
    return data


# One encoder for every message: json.dumps with options builds a new one per call.
_encode = json.JSONEncoder(separators=(",", ":"), default=str).encode


def packet(message: Message) -> bytes:
    """One message as one packet (a socket's, for the template and the zygote)."""
    return _encode(to_object(message)).encode()


def encode(message: Message) -> bytes:
    """One message as one JSON line (a pipe's)."""
    return (_encode(to_object(message)) + "\n").encode()


# ---- controller → worker -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Test:
    """One test of a batch: the worker's node id, the id pytest shows, its attempt number."""

    nodeid: str
    display: str
    attempt: int


def _tests(tests: list[Any]) -> tuple[Test, ...]:
    return tuple(t if isinstance(t, Test) else Test(**t) for t in tests)


@COMMANDS
@dataclass(frozen=True, slots=True)
class Run(Message):
    """Run a batch of one job (its first part): stop early after any failure when
    fresh_after_failure, or after a failure whose text matches a fatal pattern; stdin: its
    tests' input() reads this file (worker/terminal.py)."""

    tag: ClassVar[str] = "run"
    job: int
    tests: tuple[Test, ...]
    fresh_after_failure: bool = False
    fatal: tuple[str, ...] = ()
    stdin: str | None = None  # -s, one test at a time: the path of the run's stdin
    once: dict[str, str] | None = None  # on Ray: its tests' once-fixtures, as OnceUp.result

    def __post_init__(self) -> None:
        object.__setattr__(self, "tests", _tests(list(self.tests)))
        object.__setattr__(self, "fatal", tuple(self.fatal))


@COMMANDS
@dataclass(frozen=True, slots=True)
class More(Message):
    """The same batch goes on (part seq, from 1): sent before the worker runs dry, so no
    round trip separates two parts of a batch."""

    tag: ClassVar[str] = "more"
    job: int
    seq: int
    tests: tuple[Test, ...]
    once: dict[str, str] | None = None  # as Run's

    def __post_init__(self) -> None:
        object.__setattr__(self, "tests", _tests(list(self.tests)))


@COMMANDS
@dataclass(frozen=True, slots=True)
class Cancel(Message):
    """Skip the rest of the batch."""

    tag: ClassVar[str] = "cancel"


@COMMANDS
@FORK_COMMANDS
@dataclass(frozen=True, slots=True)
class Stop(Message):
    """End: a worker after its batch, a template once every child it forked has ended."""

    tag: ClassVar[str] = "stop"


@COMMANDS
@dataclass(frozen=True, slots=True)
class Lend(Message):
    """The answer to `debugger`: the controller's terminal, lent to process pid until it sends
    `debugger_left` (worker/terminal.py). lent: the controller's own streams, by the paths a
    worker on its host opens (None: that stream is closed); false for a worker on another
    host, which keeps its own."""

    tag: ClassVar[str] = "terminal"
    pid: int
    lent: bool = False
    stdin: str | None = None
    stdout: str | None = None
    stderr: str | None = None


# ---- worker → controller --------------------------------------------------------------------


@EVENTS
@dataclass(frozen=True, slots=True)
class Ready(Message):
    """The worker has collected (collected: its items) and waits for commands."""

    tag: ClassVar[str] = "ready"
    pid: int
    collected: int = 0


@EVENTS
@dataclass(frozen=True, slots=True)
class Start(Message):
    """A test starts (pytest_runtest_logstart); location as pytest gives it."""

    tag: ClassVar[str] = "start"
    nodeid: str
    location: list[Any]


@EVENTS
@dataclass(frozen=True, slots=True)
class Report(Message):
    """One phase's report: pytest_report_to_serializable's data (worker/serialized.py
    adds what it leaves out)."""

    tag: ClassVar[str] = "report"
    data: dict[str, Any]


@EVENTS
@dataclass(frozen=True, slots=True)
class Finish(Message):
    """A test ended (pytest_runtest_logfinish); cpu: its device test's CPU load, if measured."""

    tag: ClassVar[str] = "finish"
    nodeid: str
    location: list[Any]
    cpu: float | None = None


@EVENTS
@dataclass(frozen=True, slots=True)
class Leak(Message):
    """What a test (or a wider fixture it set up) left behind, found after it and ended
    where it could be (worker/leaks.py); sent before that test's finish.

    kind: process | thread | memory; ended: terminated | killed | exited | not permitted
    (another user's: its devices are not handed over) | retired (the worker ends after this
    test) | "" (only reported)."""

    tag: ClassVar[str] = "leak"
    nodeid: str
    kind: str
    pid: int
    command: str = ""
    user: str = ""
    holds: list[str] = dataclasses.field(default_factory=list)
    fixture: str | None = None
    ended: str = ""


@EVENTS
@dataclass(frozen=True, slots=True)
class Shown(Message):
    """What pytest wrote to its terminal mid-test under --setup-show (worker/shown.py), in
    order with the reports: the controller writes it as written."""

    tag: ClassVar[str] = "shown"
    text: str


@EVENTS
@dataclass(frozen=True, slots=True)
class Debugger(Message):
    """A test of process pid is entering pytest's debugger: it waits for `terminal` (Lend),
    and its deadline stops meanwhile. post_mortem (--pdb): its failure is shown at the
    prompt, so pytest's summary leaves it out."""

    tag: ClassVar[str] = "debugger"
    pid: int
    post_mortem: bool = False


@EVENTS
@dataclass(frozen=True, slots=True)
class DebuggerLeft(Message):
    """Process pid left the debugger (or its test ended): the terminal goes back."""

    tag: ClassVar[str] = "debugger_left"
    pid: int


@EVENTS
@dataclass(frozen=True, slots=True)
class Quit(Message):
    """pytest.exit() in a test, `q` at the debugger's prompt: the run ends as plain
    pytest's does."""

    tag: ClassVar[str] = "quit"
    msg: str
    returncode: int | None = None


@EVENTS
@dataclass(frozen=True, slots=True)
class Missing(Message):
    """The worker did not collect this test."""

    tag: ClassVar[str] = "missing"
    nodeid: str


@EVENTS
@dataclass(frozen=True, slots=True)
class Renamed(Message):
    """Collected at the same place under another parametrize id (`as`); its events use the
    controller's id."""

    tag: ClassVar[str] = "renamed"
    nodeid: str
    as_: str


@EVENTS
@dataclass(frozen=True, slots=True)
class Warned(Message):
    """A warning a test raised. once: {"key", and for a fixture "node", "fixture", "param"}:
    the import or wider fixture setup that raised it, which plain pytest shows once
    (worker/warned.py)."""

    tag: ClassVar[str] = "warning"
    nodeid: str
    location: list[Any] | None
    message: str
    category: str
    filename: str
    lineno: int
    line: str | None = None
    once: dict[str, Any] | None = None


@EVENTS
@dataclass(frozen=True, slots=True)
class Output(Message):
    """Its plugins' config.workeroutput at its session's end (base64 pickle)."""

    tag: ClassVar[str] = "output"
    pid: int
    data: str


@EVENTS
@dataclass(frozen=True, slots=True)
class Imported(Message):
    """Modules its tests imported without a warning, in order (history/preload.py)."""

    tag: ClassVar[str] = "imported"
    modules: list[str]


@EVENTS
@dataclass(frozen=True, slots=True)
class Done(Message):
    """A batch ended: the node ids not run, and the last "more" it had (a done with a lower
    `through` than the controller sent is not the end: the worker still answers the rest)."""

    tag: ClassVar[str] = "done"
    job: int
    skipped: list[str]
    through: int = 0


@EVENTS
@dataclass(frozen=True, slots=True)
class OnceUp(Message):
    """A once-fixture's setup ended in its own process (worker/once.py): value, error, skip."""

    tag: ClassVar[str] = "once_up"
    fixture: str
    outcome: str
    seconds: float
    text: str = ""
    result: str | None = None  # on Ray: its file's bytes (base64), for the other nodes


@EVENTS
@dataclass(frozen=True, slots=True)
class OnceDown(Message):
    """A once-fixture was torn down; error: its teardown report, serialized, if it raised."""

    tag: ClassVar[str] = "once_down"
    fixture: str
    seconds: float
    error: dict[str, Any] | None = None


# ---- the fork server: controller or rank actor → template → asker ---------------------------


@FORK_COMMANDS
@dataclass(frozen=True, slots=True)
class ForkWorker(Message):
    """Fork a worker with this environment; the packet's fds: commands, events, log, lease's."""

    tag: ClassVar[str] = "fork"
    key: int
    env: dict[str, str]


@TEMPLATE_EVENTS
@dataclass(frozen=True, slots=True)
class TemplateReady(Message):
    """The template has collected and forks on request."""

    tag: ClassVar[str] = "ready"
    pid: int


@TEMPLATE_EVENTS
@dataclass(frozen=True, slots=True)
class Unsafe(Message):
    """The template cannot fork (and ends); module: the test module whose import did it."""

    tag: ClassVar[str] = "unsafe"
    why: str
    module: str | None = None


@TEMPLATE_EVENTS
@dataclass(frozen=True, slots=True)
class Forked(Message):
    """The fork asked for as key is process pid."""

    tag: ClassVar[str] = "forked"
    key: int
    pid: int


@TEMPLATE_EVENTS
@dataclass(frozen=True, slots=True)
class ForkFailed(Message):
    """The fork asked for as key was refused: the template became unsafe since."""

    tag: ClassVar[str] = "failed"
    key: int
    why: str


@TEMPLATE_EVENTS
@ZYGOTE_EVENTS
@dataclass(frozen=True, slots=True)
class Exited(Message):
    """A process the sender forked has ended with this status (negative: a signal)."""

    tag: ClassVar[str] = "exit"
    pid: int
    code: int


# ---- the zygote: controller → zygote → controller -------------------------------------------


@ZYGOTE_COMMANDS
@dataclass(frozen=True, slots=True)
class Spawn(Message):
    """Start `pytest args` as a template (the packet's fd: its socket) or as a worker that
    collects for itself (its command and event pipes, then its lease's fds)."""

    tag: ClassVar[str] = "spawn"
    args: list[str]
    env: dict[str, str]
    cwd: str
    log: str
    template: bool


@ZYGOTE_EVENTS
@dataclass(frozen=True, slots=True)
class Spawned(Message):
    """The process a Spawn asked for is pid."""

    tag: ClassVar[str] = "spawned"
    pid: int
