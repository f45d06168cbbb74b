"""The template role of a worker session: collect as a fresh worker would, then serve forks.

A template (worker/template.py) imports and collects the suite like any worker, but runs no
test: it forks only what a fresh worker would have collected the same way, and ends when
collection initialised a device runtime or failed. Each fork becomes a worker
(worker/worker_role.py) in the child.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from devpool.history import preload
from devpool.worker import native_threads
from devpool.worker import template as forkserver


class TemplateRole:
    """A template's part of its worker session: watches collection, preloads, serves forks."""

    def __init__(self, config: pytest.Config, server: forkserver.ForkServer) -> None:
        self.config = config
        self.server = server
        # The threads it runs, and the first test module after whose import it ran more (an
        # OpenMP pool started at import): that module may be left out of it.
        self.tasks = native_threads.thread_count()
        self.culprit: str | None = None

    def check(self, report: pytest.CollectReport) -> None:
        """A template forks only what a fresh worker would have collected the same way."""
        why = ""
        runtime = forkserver.initialised_runtime(self.config)
        if runtime:
            # A device context cannot be shared with children, and the template holds no
            # lease: it ends now rather than keep a context on a device it does not own.
            why = f"importing {report.nodeid or 'the conftest files'} initialised {runtime}"
        elif report.failed:
            why = f"collecting {report.nodeid or 'the conftest files'} failed in the template"
        module = report.nodeid.split("::")[0]
        path = os.path.normpath(self.config.rootpath / module) if module.endswith(".py") else None
        if why:
            self.server.refuse(why, path)
            os._exit(0)
        if path is not None and "::" not in report.nodeid and self.culprit is None:
            tasks = native_threads.thread_count()
            if tasks > self.tasks:
                self.culprit = path
            self.tasks = tasks

    def serve(self, prepare: Callable[[dict[str, str]], None]) -> forkserver.Fork | None:
        """Preload, then fork a worker per request: returns in each child, None here when
        the template's work is done. prepare: what every child would do first with its
        environment, done here once instead."""
        preloaded = self._preload()
        gc.freeze()  # what collection built is shared by every child, copy-on-write
        return self.server.serve(self.config, preloaded, self.culprit, prepare)

    def _preload(self) -> Callable[[str], str]:
        """Import what this kind's tests imported last run (history/preload.py); returns
        what the template says if it is then unsafe to fork (and what it learnt is kept)."""
        path = os.environ.get(preload.PRELOAD_ENV)
        size = len([d for d in os.environ.get("DEVPOOL_DEVICES", "").split(",") if d])
        if not path:
            return str
        names = preload.modules_of(Path(path), size)
        done = forkserver.preload(names)
        if done.warned:
            preload.write(Path(path), {}, never={size: done.warned})
        if not done.count:
            return str

        def unsafe(why: str) -> str:
            # Its threads came with these imports: never again. Else who knows: drop all.
            if done.threaded:
                preload.write(Path(path), {}, never={size: done.threaded})
            else:
                preload.write(Path(path), {}, dropped=[size])
            return (
                f"{why} (after importing {done.count} modules its tests imported last run; "
                "they are not imported first again)"
            )

        return unsafe
