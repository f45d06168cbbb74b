"""Warm templates: the workers of each kind fork from a template that collected once.

Which kinds the plan needs and in what order, when each template starts (no more collecting
at once than the host has cores), which request sizes are still cold (their template has
not collected: no lease is taken for them, the scheduler reserves from when each is expected
ready), what a template sees of the devices, and what becomes of the templates guessed from
the history before the plan (session/early_kinds.py). The pool (pool.py) forks from them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from devpool.backends import Backend, Forks
from devpool.history import preload
from devpool.plan.jobs import Plan
from devpool.run.context import RunContext

RESTARTS = 3  # templates of a kind started again, each without one more unsafe test module


class Warm:
    """The run's templates, one per request size the plan needs."""

    def __init__(
        self, ctx: RunContext, backend: Backend, plan: Plan, modules_of_size: dict[int, Path]
    ) -> None:
        self.ctx = ctx
        self.backend = backend
        self._forking: Forks | None = backend.forks()
        self.modules_of_size = modules_of_size
        first: dict[int, tuple[float, int, int]] = {}
        for job in plan.jobs:
            key = job.priority()
            if job.devices_needed not in first or key < first[job.devices_needed]:
                first[job.devices_needed] = key
        self.kinds = sorted(first, key=lambda size: first[size])  # the first needed first
        # Test modules whose import made their kind's template unsafe (threads started at
        # import): their tests start on their own, the kind's others fork from a template
        # that does not import them.
        self.left_out: dict[int, set[str]] = {}
        self.told: set[tuple[str, float | None]] = set()  # (kind, its template's start)
        self.on = self._forks()
        if self.on:
            self._check_guesses()

    def _forks(self) -> bool:
        """Whether workers fork from templates this run (else every worker starts fresh)."""
        from devpool.compat.coverage import measuring

        if not self.ctx.settings.fork_server or self._forking is None:
            return False
        return measuring() is None  # a template that measures coverage may not fork

    def _forker(self) -> Forks:
        assert self._forking is not None
        return self._forking

    def _check_guesses(self) -> None:
        """Templates started from the history's guess before the plan: one of a kind the
        plan does not need, or that lacks a module its kind's tests live in, is ended (a
        new one starts when needed)."""
        backend = self._forker()
        kept, ended = [], []
        for size in range(1, len(self.ctx.inventory.devices) + 1):
            kind = template_kind(size)
            if backend.template_state(kind) is None:
                continue
            listed = self.modules_of_size.get(size)
            modules = frozenset(listed.read_text(encoding="utf-8").split()) if listed else None
            if size not in self.kinds or modules is None or not backend.covers(kind, modules):
                backend.discard(kind)
                ended.append(size)
            else:
                kept.append(size)
        if kept or ended:
            self.ctx.emit("early_templates", kept=kept, ended=ended)

    def _states(self, sizes: set[int] | None = None) -> dict[int, str | None]:
        backend = self._forker()
        wanted = [s for s in self.kinds if sizes is None or s in sizes]
        return {size: backend.template_state(template_kind(size)) for size in wanted}

    def start_next(self, queued: set[int]) -> bool:
        """Start the next templates of the sizes still queued, no more at once than the host
        has cores: they collect in parallel with each other and with the tests already
        running. True when one started."""
        if not self.on:
            return False
        self._leave_out_culprits()
        backend = self._forker()
        states = self._states(queued)
        starting = sum(1 for state in states.values() if state == "starting")
        started = False
        for size, state in states.items():
            if starting >= self.ctx.threads.cores.count:
                break
            if state is None:
                backend.prepare(template_kind(size), self.template_env(size))
                starting += 1
                started = True
        return started

    def _leave_out_culprits(self) -> None:
        """A template made unsafe by one test module's import (an OpenMP pool it started)
        starts again without that module, up to RESTARTS times a kind: one module's
        parallel op at import no longer sends every test of its kind to a fresh process."""
        backend = self._forker()
        for size in self.kinds:
            kind = template_kind(size)
            found = backend.culprit(kind)
            started = backend.template_started(kind)
            if found is None or (kind, started) in self.told:
                continue
            self.told.add((kind, started))  # each template's refusal is acted on once
            module, why = found
            listed = self.modules_of_size.get(size)
            left = self.left_out.setdefault(size, set())
            listed_modules = listed.read_text(encoding="utf-8").split() if listed else []
            rest = [m for m in listed_modules if m not in left and m != module]
            if not rest or module in left or len(left) >= RESTARTS:
                # Nothing would be left to fork, or leaving modules out did not help.
                self.say(f"fork server for {kind} workers off: {why}")
                continue
            left.add(module)
            self.say(
                f"fork server for {kind} workers: importing {os.path.relpath(module)} made "
                f"their template {why}; it is left out of it, and its tests start in "
                "processes of their own"
            )
            assert listed is not None
            without = listed.with_name(f"{listed.stem}-without-{len(left)}.txt")
            without.write_text("\n".join(rest) + "\n", encoding="utf-8")
            self.modules_of_size[size] = without
            backend.discard(kind)
            backend.prepare(kind, self.template_env(size))

    def leaves_out(self, size: int, module: str) -> bool:
        """Whether a test module's tests of this size start on their own (not forked)."""
        return module in self.left_out.get(size, ())

    def say(self, note: str) -> None:
        """A note on the fork server: said once at the end of the run and in the record."""
        self.ctx.run_notes.append(note)
        self.ctx.emit("fork_server", note=note)

    def cold_sizes(self, now: float, queued: set[int] | None = None) -> dict[int, float]:
        """Request sizes (of those queued) whose workers cannot start at fork cost yet (their
        template has not collected), each with when it is expected to have. No lease is taken
        for them until then (or until it turned out unsafe); the scheduler reserves for them
        meanwhile."""
        if not self.on:
            return {}
        backend = self._forker()
        cold = {}
        for size, state in self._states(queued).items():
            if state in (None, "starting"):
                since = backend.template_started(template_kind(size))
                cold[size] = (now if since is None else since) + self.ctx.startup_estimate
        return cold

    def template_env(self, size: int) -> dict[str, str]:
        """The environment of the template of a size: it sees as many devices as its workers
        will (an import-time `skipif(device_count() < 2)` decides alike) but initialises none,
        and imports only the modules of its size's tests."""
        env = templates_env(self.ctx, tuple(self.ctx.inventory.devices[:size]))
        modules = self.modules_of_size.get(size)
        if modules is not None:
            env["DEVPOOL_COLLECT_ONLY"] = str(modules)
        return env


def template_kind(devices: int) -> str:
    """The name of a fork server template's kind: the number of devices its workers hold."""
    return f"{devices}-device"


def templates_env(ctx: Any, devices: tuple[int, ...]) -> dict[str, str]:
    """A fork server template's environment: its workers', and no device runtime started;
    where earlier runs' workers imported modules, the file that lists them (preload.py)."""
    env = device_env(ctx, devices)
    listed = ctx.preload_file
    if ctx.settings.preload and listed.is_file():
        env[preload.PRELOAD_ENV] = str(listed)
    if ctx.inventory.platform.kind == "cuda":
        # torch.cuda.is_available() at import (a skipif) asks NVML instead of calling
        # cuInit, after which no child could use CUDA.
        env.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    return env


def device_env(ctx: Any, devices: tuple[int, ...]) -> dict[str, str]:
    """A worker's environment for these devices (ctx: the run's inventory, id, artifacts)."""
    env = dict(os.environ)
    platform = ctx.inventory.platform
    ids = ",".join(str(d) for d in devices)
    env["DEVPOOL_DEVICES"] = ids
    env["DEVPOOL_PLATFORM"] = platform.name
    env["DEVPOOL_RUN_ID"] = ctx.run_id
    env["DEVPOOL_ARTIFACTS"] = str(ctx.artifacts_dir)
    if platform.visible_env:
        # A CPU-only test sees no device at all: a stray device use fails loudly
        # instead of silently sharing a card another test holds.
        env[platform.visible_env] = ids
    if platform.kind == "cuda":
        env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # ids are nvidia-smi's order
    env.update(ctx.threads.env())  # OMP_NUM_THREADS and its kin: the process's share
    return env
