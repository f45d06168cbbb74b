"""The typed protocol (worker/protocol.py): every message survives its wire, a message no
channel knows fails loudly, and the run loop has a handler for every worker event."""

from __future__ import annotations

import json
import os

import pytest

from devpool.run.worker_events import WorkerEvents
from devpool.worker import protocol, wire

TESTS = (protocol.Test("t.py::a[1]", "t.py::a[1]", 1), protocol.Test("t.py::b", "t.py::b", 2))

# One example of every message type; a new type needs one here (checked below).
EXAMPLES: list[protocol.Message] = [
    protocol.Run(job=7, tests=TESTS, fresh_after_failure=True, fatal=("CUDA error",)),
    protocol.Run(job=8, tests=TESTS[:1]),
    protocol.Run(job=9, tests=TESTS[:1], stdin="/proc/1/fd/0"),
    protocol.Lend(pid=456, lent=True, stdin=None, stdout="/proc/1/fd/1", stderr="/proc/1/fd/2"),
    protocol.Lend(pid=456),
    protocol.More(job=7, seq=2, tests=TESTS),
    protocol.Cancel(),
    protocol.Stop(),
    protocol.Ready(pid=123, collected=40),
    protocol.Start(nodeid="t.py::a", location=["t.py", 3, "a"]),
    protocol.Report(data={"$report_type": "TestReport", "nodeid": "t.py::a", "when": "call"}),
    protocol.Finish(nodeid="t.py::a", location=["t.py", 3, "a"], cpu=0.25),
    protocol.Finish(nodeid="t.py::a", location=["t.py", None, "a"]),
    protocol.Leak(
        nodeid="t.py::a",
        kind="process",
        pid=4242,
        command="python -m http.server",
        user="ci",
        holds=["sim:0", "port 30001"],
        ended="terminated",
    ),
    protocol.Leak(nodeid="t.py::a", kind="thread", pid=7, fixture="srv (module)"),
    protocol.Shown(text="\n        SETUP    F fix"),
    protocol.Debugger(pid=456, post_mortem=True),
    protocol.Debugger(pid=456),
    protocol.DebuggerLeft(pid=456),
    protocol.Quit(msg="Quitting debugger", returncode=2),
    protocol.Quit(msg="enough"),
    protocol.Missing(nodeid="t.py::gone"),
    protocol.Renamed(nodeid="t.py::a[x1]", as_="t.py::a[x2]"),
    protocol.Warned(
        nodeid="t.py::a",
        location=["t.py", 3, "a"],
        message="deprecated",
        category="builtins:DeprecationWarning",
        filename="t.py",
        lineno=4,
        line=None,
        once={"key": "module t.py"},
    ),
    protocol.Output(pid=123, data="gASVAAAAAAAAAAB9lC4="),
    protocol.Imported(modules=["numpy", "torch"]),
    protocol.Done(job=7, skipped=["t.py::b"], through=2),
    protocol.OnceUp(fixture="server", outcome="value", seconds=3.25),
    protocol.OnceUp(fixture="server", outcome="error", seconds=0.5, text="RuntimeError: boom"),
    protocol.OnceDown(fixture="server", seconds=0.25),
    protocol.OnceDown(fixture="server", seconds=0.25, error={"when": "teardown"}),
    protocol.ForkWorker(key=3, env={"A": "1"}),
    protocol.TemplateReady(pid=99),
    protocol.Unsafe(why="it runs 2 threads", module="/p/t.py"),
    protocol.Unsafe(why="torch.cuda is initialised"),
    protocol.Forked(key=3, pid=456),
    protocol.ForkFailed(key=3, why="a thread started"),
    protocol.Exited(pid=456, code=-9),
    protocol.Spawn(args=["-q"], env={"A": "1"}, cwd="/p", log="/p/l.log", template=True),
    protocol.Spawned(pid=457),
]

CHANNELS = (
    protocol.COMMANDS,
    protocol.EVENTS,
    protocol.FORK_COMMANDS,
    protocol.TEMPLATE_EVENTS,
    protocol.ZYGOTE_COMMANDS,
    protocol.ZYGOTE_EVENTS,
)


def test_every_message_type_has_an_example() -> None:
    registered = {cls for channel in CHANNELS for cls in channel.types.values()}
    assert registered == {type(message) for message in EXAMPLES}


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda m: type(m).__name__)
def test_every_message_decodes_to_itself_on_each_of_its_channels(
    message: protocol.Message,
) -> None:
    channels = [c for c in CHANNELS if c.types.get(message.tag) is type(message)]
    assert channels
    for channel in channels:
        assert channel.decode(protocol.encode(message)) == message
        assert channel.decode(protocol.packet(message)) == message


def test_the_wire_keeps_the_names_the_other_side_reads() -> None:
    line = protocol.encode(protocol.Renamed(nodeid="t.py::a", as_="t.py::b"))
    assert json.loads(line) == {"ev": "renamed", "nodeid": "t.py::a", "as": "t.py::b"}
    # An optional field that is None stays off the wire.
    finish = protocol.Finish(nodeid="t.py::a", location=["t.py", 1, "a"])
    assert "cpu" not in json.loads(protocol.encode(finish))
    run = json.loads(protocol.encode(protocol.Run(job=1, tests=TESTS[:1])))
    assert run["tests"] == [{"nodeid": "t.py::a[1]", "display": "t.py::a[1]", "attempt": 1}]


def test_a_pipe_carries_messages_split_anywhere() -> None:
    read_end, write_end = os.pipe()
    events = [m for m in EXAMPLES if type(m) in protocol.EVENTS.types.values()]
    try:
        wire.write(write_end, *events)
        data = os.read(read_end, 1 << 20)
    finally:
        os.close(read_end)
        os.close(write_end)
    reader = wire.Reader(protocol.EVENTS)
    got = []
    for start in range(0, len(data), 7):
        got += reader.feed(data[start : start + 7])
    assert got == events


def test_an_unknown_event_fails_loudly_naming_it() -> None:
    with pytest.raises(protocol.ProtocolError, match="unknown worker event 'lurk'"):
        protocol.EVENTS.decode(b'{"ev": "lurk", "nodeid": "t.py::a"}')
    # A command is no event, and an event no command.
    with pytest.raises(protocol.ProtocolError, match="unknown worker event None"):
        protocol.EVENTS.decode(protocol.encode(protocol.Run(job=1, tests=())))
    with pytest.raises(protocol.ProtocolError, match="unknown worker command None"):
        protocol.COMMANDS.decode(protocol.encode(protocol.Ready(pid=1)))


def test_a_malformed_message_fails_loudly() -> None:
    with pytest.raises(protocol.ProtocolError, match="malformed worker event 'start'"):
        protocol.EVENTS.decode(b'{"ev": "start", "nodeid": "t.py::a", "extra": 1}')
    with pytest.raises(protocol.ProtocolError, match="not JSON"):
        protocol.EVENTS.decode(b'{"ev": "start", "nodeid"')


def test_the_run_loop_handles_every_worker_event() -> None:
    assert set(wire.handlers(WorkerEvents, protocol.EVENTS)) == set(protocol.EVENTS.types.values())


def test_an_owner_without_a_handler_is_named() -> None:
    class Partial:
        def _on_ready(self, slot: object, event: protocol.Ready) -> None: ...

    with pytest.raises(protocol.ProtocolError, match="Partial handles no Debugger, DebuggerLeft"):
        wire.handlers(Partial(), protocol.EVENTS)


def test_a_worker_reads_typed_commands_and_a_stop_when_the_controller_is_gone() -> None:
    read_end, write_end = os.pipe()
    commands = wire.Commands(read_end)
    try:
        wire.write(write_end, protocol.Run(job=1, tests=TESTS), protocol.Cancel())
        assert commands.next() == protocol.Run(job=1, tests=TESTS)
        wire.write(write_end, protocol.More(job=1, seq=1, tests=TESTS[:1]))
        assert commands.take(protocol.More) == [protocol.More(job=1, seq=1, tests=TESTS[:1])]
        assert commands.pending() == [protocol.Cancel()]
        commands.drop(protocol.Cancel)
        os.close(write_end)
        assert commands.pending() == [protocol.Stop()]
        assert commands.next() is None
    finally:
        os.close(read_end)


def test_a_worker_at_a_debugger_takes_its_own_grant_and_keeps_other_commands() -> None:
    """A ranks(n) test's grant goes to each of its ranks: one rank takes the one for its pid,
    and one meant for another rank is not taken for its own later."""
    read_end, write_end = os.pipe()
    commands = wire.Commands(read_end)
    mine = protocol.Lend(pid=2, lent=True, stdin="/proc/1/fd/0")
    try:
        wire.write(write_end, protocol.Lend(pid=1), protocol.Cancel(), mine)
        assert commands.wait_for(protocol.Lend, lambda lend: lend.pid == 2) == mine
        assert commands.pending() == [protocol.Cancel()]
        os.close(write_end)
        assert commands.wait_for(protocol.Lend) is None
    finally:
        os.close(read_end)
