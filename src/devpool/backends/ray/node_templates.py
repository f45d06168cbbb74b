"""A run's templates on one Ray node: the actor that keeps them (one per run and node).

For each kind of worker the controller asks for (forks.py), the actor starts a template, a
`python -m pytest ... --devpool-worker template,SOCK,PARENT,PATH` process that collects once
and then listens on PATH, a Unix socket of this node (worker/template.py). The node's rank
actors fork their workers there (actor.fork_from). The template is checked as on a host
before it says ready; one that may not fork says why, and the ranks start fresh.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from devpool import procfs
from devpool.backends.ray.actor import STOP_WAIT, RankSpec, node_env, write_lists
from devpool.backends.ray.cluster import import_ray
from devpool.backends.spawn import pytest_process
from devpool.worker import protocol
from devpool.worker.stacks import stacks_file

PREFIX = "devpool-templates-"  # then the actor's pid: its folder on the node


def _sweep() -> None:
    """Remove this user's template folders on this node whose actor is gone: one killed with
    its run (a SIGKILLed controller, a lost node) never removed its own."""
    for path in Path(tempfile.gettempdir()).glob(f"{PREFIX}*-*"):
        pid = path.name[len(PREFIX) :].split("-", 1)[0]
        with contextlib.suppress(OSError):
            info = path.lstat()
            mine = stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid()
            if mine and pid.isdigit() and not procfs.alive(pid):
                shutil.rmtree(path, ignore_errors=True)


@dataclass
class NodeTemplate:
    """One kind's template on this node: its process, and what it said."""

    process: subprocess.Popen[bytes]
    sock: socket.socket
    path: str
    log: str
    state: str = "starting"  # → ready, or off
    why: str = ""


class NodeTemplates:
    """The actor body, one per run and node: a template per kind of worker, which the node's
    rank actors fork their workers from (worker/template.py)."""

    def __init__(self) -> None:
        _sweep()
        self.folder = tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-")
        self.templates: dict[str, NodeTemplate] = {}
        self.cond = threading.Condition()
        self.written: list[str] = []

    def prepare(self, kind: str, spec: RankSpec, limit: float) -> None:
        """Start the template of a kind (once): it collects in the background."""
        ray = import_ray()

        with self.cond:
            if kind in self.templates:
                return
            index = len(self.templates) + 1
            path = os.path.join(self.folder, f"{index}.sock")
            log = os.path.join(self.folder, f"template-{index}.log")
            cwd = os.getcwd() if spec.ship_code else spec.cwd
            node_id = ray.get_runtime_context().get_node_id()
            env = node_env(spec, list(range(spec.count)), node_id)
            env["DEVPOOL_STACKS_FILE"] = str(stacks_file(Path(log)))
            self.written += write_lists(spec, cwd, env)
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            worker = f"template,{theirs.fileno()},{os.getpid()},{path}"
            process = pytest_process(spec.args, worker, cwd, env, log, (theirs.fileno(),))
            theirs.close()
            template = NodeTemplate(process, ours, path, log)
            self.templates[kind] = template
            self.cond.notify_all()
        threading.Thread(target=self._listen, args=(template, limit), daemon=True).start()

    def _listen(self, template: NodeTemplate, limit: float) -> None:
        """What the template says: ready, or why it cannot fork (then it ends)."""
        template.sock.settimeout(limit)
        try:
            data = template.sock.recv(1 << 16)
        except OSError:  # it did not collect in time
            data = b""
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(template.process.pid, signal.SIGKILL)
        message = protocol.TEMPLATE_EVENTS.decode(data) if data else None
        with self.cond:
            if isinstance(message, protocol.TemplateReady):
                template.state = "ready"
            else:
                template.state = "off"
                why = message.why if isinstance(message, protocol.Unsafe) else ""
                template.why = why or self._ended(template)
            self.cond.notify_all()

    def _ended(self, template: NodeTemplate) -> str:
        try:
            code = template.process.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            return f"did not finish collecting in time; see {template.log}"
        return f"the template ended with {code} before it was ready; see {template.log}"

    def wait(self, kind: str, timeout: float) -> tuple[str, str]:
        """("ready", socket path) or ("off", why) once the template of a kind has said, or
        ("starting", "") after timeout seconds."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                template = self.templates.get(kind)  # None: prepare() has not run yet
                if template is not None and template.state == "ready":
                    return "ready", template.path
                if template is not None and template.state == "off":
                    return "off", template.why
                left = deadline - time.monotonic()
                if left <= 0:
                    return ("starting", "") if template else ("off", "no template was started")
                self.cond.wait(left)

    def discard(self, kind: str) -> None:
        """End the template of a kind (its forked workers end with it)."""
        with self.cond:
            template = self.templates.pop(kind, None)
        if template is not None:
            self._end(template)

    def _end(self, template: NodeTemplate) -> None:
        with contextlib.suppress(OSError):
            template.sock.close()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(template.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            template.process.wait(timeout=STOP_WAIT)

    def stop(self) -> None:
        """End every template of this node, and remove what this actor wrote."""
        with self.cond:
            templates, self.templates = list(self.templates.values()), {}
        for template in templates:
            self._end(template)
        for path in self.written:
            with contextlib.suppress(OSError):
                os.unlink(path)
        shutil.rmtree(self.folder, ignore_errors=True)
