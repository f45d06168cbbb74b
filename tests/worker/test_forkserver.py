"""The fork server's two sides in one process: the template's safety checks, and the
controller's Template speaking its protocol over a real socket pair with a real process."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from devpool.backends.templates import ForkRequest, Template
from devpool.worker import template as forkserver


class _Config:
    """Just enough of pytest.Config for initialised_runtime: the plugin hook's answer."""

    def __init__(self, answer: str | None = None) -> None:
        self.hook = SimpleNamespace(pytest_devpool_device_initialised=lambda config: answer)


CHECK = """
import threading, time
from types import SimpleNamespace
from devpool.worker import template as forkserver

hook = SimpleNamespace(pytest_devpool_device_initialised=lambda config: None)
config = SimpleNamespace(hook=hook)
print(repr(forkserver.unsafe_reason(config)))
threading.Thread(target=time.sleep, args=(5,), name="uploader", daemon=True).start()
print(repr(forkserver.unsafe_reason(config)))
"""


def test_a_process_with_a_second_thread_is_unsafe_and_the_thread_is_named() -> None:
    # A process of its own: this one runs pytest's plugins' threads.
    done = subprocess.run(
        [sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=60, check=True
    )
    clean, threaded = done.stdout.splitlines()
    assert clean == "''"
    assert threaded == "'it runs 1 thread(s) besides the main one: uploader'"


def test_an_initialised_torch_runtime_or_a_plugins_own_is_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cuda = SimpleNamespace(is_initialized=lambda: True)
    monkeypatch.setitem(sys.modules, "torch", SimpleNamespace(cuda=cuda))
    assert forkserver.initialised_runtime(_Config()) == "torch.cuda"  # type: ignore[arg-type]
    cuda.is_initialized = lambda: False
    assert forkserver.initialised_runtime(_Config("acl")) == "acl"  # type: ignore[arg-type]
    assert forkserver.initialised_runtime(_Config()) is None  # type: ignore[arg-type]


def test_a_runtime_check_that_raises_counts_as_not_initialised(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken() -> bool:
        raise RuntimeError("no driver")

    monkeypatch.setitem(
        sys.modules, "torch", SimpleNamespace(npu=SimpleNamespace(is_initialized=broken))
    )
    assert forkserver.initialised_runtime(_Config()) is None  # type: ignore[arg-type]


def test_without_libcuda_loaded_the_cuda_driver_is_not_initialised() -> None:
    maps = Path("/proc/self/maps").read_text()
    assert "libcuda.so" not in maps  # this machine has no CUDA
    assert forkserver._cuda_driver_initialised() is False


# ---- the controller's side ---------------------------------------------------------------


@pytest.fixture
def template(tmp_path: Path) -> Iterator[tuple[Template, socket.socket]]:
    """A Template whose process is a real child (sleep) and whose socket's other end is ours."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    process = subprocess.Popen(["sleep", "60"], start_new_session=True)
    made = Template("0-device", process, ours, str(tmp_path / "t.log"), time.monotonic() + 60, 60)
    yield made, theirs
    process.kill()
    process.wait()
    theirs.close()
    ours.close()


def _request(key: int, fresh: list[int]) -> ForkRequest:
    commands, events = os.pipe(), os.pipe()
    log = os.open(os.devnull, os.O_WRONLY)
    return ForkRequest(
        key,
        {"A": "1"},
        commands[0],
        events[1],
        log,
        None,
        lambda request: fresh.append(request.key),
    )


def _say(sock: socket.socket, **message: object) -> None:
    sock.send(json.dumps(message).encode())


def test_requests_wait_for_ready_then_go_with_their_fds(
    template: tuple[Template, socket.socket],
) -> None:
    made, theirs = template
    fresh: list[int] = []
    process = made.fork(_request(1, fresh))
    assert made.queued and process.pid == 0
    _say(theirs, ev="ready", pid=made.process.pid)
    made.pump(1.0)
    data, fds, _, _ = socket.recv_fds(theirs, 1 << 16, 8)
    assert json.loads(data) == {"op": "fork", "key": 1, "env": {"A": "1"}}
    assert len(fds) == 3  # commands, events, log (no lease)
    for fd in fds:
        os.close(fd)
    _say(theirs, ev="forked", key=1, pid=424242)
    made.pump(1.0)
    assert process.pid == 424242 and process.code is None
    _say(theirs, ev="exit", pid=424242, code=-9)
    assert process.wait(timeout=2) == -9
    assert fresh == []


def test_a_worker_signalled_before_its_fork_never_starts(
    template: tuple[Template, socket.socket],
) -> None:
    made, _ = template
    fresh: list[int] = []
    request = _request(2, fresh)
    process = made.fork(request)
    process.signal_group(signal.SIGKILL)
    assert process.poll() == -signal.SIGKILL and not made.queued
    with pytest.raises(OSError):
        os.fstat(request.events)  # its event pipe's write end is closed: the loop sees EOF


def test_an_unsafe_template_turns_its_waiting_requests_into_fresh_interpreters(
    template: tuple[Template, socket.socket],
) -> None:
    made, theirs = template
    fresh: list[int] = []
    made.fork(_request(3, fresh))
    made.fork(_request(4, fresh))
    _say(theirs, ev="unsafe", why="it runs 1 thread(s) besides the main one: x")
    made.pump(1.0)
    assert made.state == "off" and fresh == [3, 4]
    assert made.notes == ["not safe to fork: it runs 1 thread(s) besides the main one: x"]


def test_a_template_that_dies_ends_its_children_and_starts_the_rest_fresh(
    template: tuple[Template, socket.socket],
) -> None:
    made, theirs = template
    fresh: list[int] = []
    _say(theirs, ev="ready", pid=made.process.pid)
    made.pump(1.0)
    child = made.fork(_request(5, fresh))
    socket.recv_fds(theirs, 1 << 16, 8)
    _say(theirs, ev="forked", key=5, pid=515151)
    made.pump(1.0)
    made.fork(_request(6, fresh))  # sent; not forked yet when the template dies
    made.process.kill()
    theirs.close()
    made.pump(1.0)
    assert child.wait(timeout=2) == -signal.SIGKILL
    assert fresh == [6] and made.state == "off" and "ended" in made.notes[0]


def test_a_template_that_does_not_collect_in_time_is_killed(
    template: tuple[Template, socket.socket],
) -> None:
    made, _ = template
    fresh: list[int] = []
    made.fork(_request(7, fresh))
    made.check(made.ready_by + 1)
    assert made.process.wait(timeout=5) == -signal.SIGKILL
    assert fresh == [7] and "did not finish collecting within 60s" in made.notes[0]
