"""What every worker of a run shares, and the backend that starts them.

Their pytest arguments and environment (other plugins' settings too: see compat), the
final selection, and the fork server's template that collects while this process does.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from devpool import compat
from devpool.backends import Backend, zygote
from devpool.backends.local import LocalBackend
from devpool.compat import coverage
from devpool.config import Settings
from devpool.devices import leftovers
from devpool.devices.inventory import Inventory
from devpool.folders import devpool_dir
from devpool.run import once_process as once
from devpool.run.warm import template_kind, templates_env
from devpool.session.early_kinds import early_kinds
from devpool.session.run_folder import make_run_folder
from devpool.worker import leaks, worklist
from devpool.worker import template as forkserver


def _select_options(config: pytest.Config) -> list[str]:
    if not config.pluginmanager.has_plugin("devpool-select"):
        return []  # a run that does not select never loads selection's modules
    from devpool.select import session as select_session

    return select_session.worker_options(config)


def worker_setup(config: pytest.Config, settings: Settings) -> tuple[list[str], dict[str, str]]:
    """Every worker's pytest arguments, and the environment all of them share: with the
    run's mark on every process below them (devices/leftovers.py) and the leak mode."""
    # Other plugins' settings that every worker must share (seed, coverage): see compat.
    args = [
        *worklist.worker_args(config),
        *compat.worker_options(config),
        *_select_options(config),
    ]
    env = compat.worker_env(config)
    env[leftovers.MARK_ENV] = leftovers.this_run()
    env.update(leaks.mode_env(settings.leaks, settings.leak_memory_share))
    return args, env


def early_backend(
    config: pytest.Config, settings: Settings, log_dir: Path, ctx: Any
) -> LocalBackend | None:
    """While this process collects, the fork server templates of the kinds the run will
    likely need collect too (session/early_kinds.py): workers fork from them once the plan
    is made, instead of each collecting again.

    None where no template may start; ctx is the controller (see run.pool.templates_env)."""
    if settings.backend != "local" or not settings.fork_server or settings.plan:
        return None
    if config.option.collectonly:
        return None
    if coverage.measuring() is not None:
        return None  # workers measure coverage: no template would be safe to fork (forkserver)
    args, env = worker_setup(config, settings)
    env.update(once.worker_env(config, log_dir.parent))  # [tool.devpool.once]
    cwd = config.invocation_params.dir
    backend = LocalBackend(args, cwd, log_dir, env, settings.worker_start_timeout)
    if settings.run_dir is None:
        devpool_dir(config.rootpath)  # with its .gitignore
    make_run_folder(log_dir.parent, settings)  # private before anything goes in it
    log_dir.mkdir(parents=True, exist_ok=True)
    # The kinds the history says these tests need start now, no more templates collecting at
    # once than the host has cores (this process collects as well). Without a history that
    # knows them: the CPU-only one, as every suite has CPU tests but few need devices alone.
    guessed = early_kinds(
        ctx.history_path,
        ctx.inventory.platform.name,
        len(ctx.inventory.devices),
        config.rootpath,
        config.args,
        cwd,
    )
    # Forked from this process (through the zygote), a template only collects; started
    # afresh, it imports pytest, the plugins and the conftests first.
    if forkserver.unsafe_reason(config) == "":
        backend.start_zygote(config.stash.get(zygote.UNSET, None))
    if not guessed or 0 in {kind.size for kind in guessed}:
        backend.prepare(template_kind(0), templates_env(ctx, ()))
    room = len(guessed) if backend.zygote else max(1, ctx.threads.cores.count - 1)
    for kind in [k for k in guessed if k.size > 0][:room]:
        env = templates_env(ctx, tuple(ctx.inventory.devices[: kind.size]))
        modules = log_dir.parent / "collect" / f"early-{kind.size}.txt"
        modules.parent.mkdir(parents=True, exist_ok=True)
        modules.write_text("\n".join(sorted(kind.modules)) + "\n", encoding="utf-8")
        env["DEVPOOL_COLLECT_ONLY"] = str(modules)
        backend.prepare(template_kind(kind.size), env)
    return backend


def make_backend(
    config: pytest.Config,
    settings: Settings,
    inventory: Inventory,
    run_dir: Path,
    log_dir: Path,
    items: Mapping[str, pytest.Item],
    early: LocalBackend | None,
) -> Backend:
    """Local child processes, or Ray actors when --devpool-backend ray.

    Workers get this process's rootdir, inifile and final selection (see worklist)."""
    cwd = config.invocation_params.dir
    args, env = worker_setup(config, settings)
    if not settings.plan:  # --devpool-plan starts no worker and leaves no folder
        make_run_folder(run_dir, settings)  # private before anything goes in it
        selected = worklist.write_selection(items.values(), run_dir / "collect")
        env[worklist.NODEIDS_ENV] = str(selected)
    if settings.backend == "local":  # on Ray, outcomes travel with the batches (run/once.py)
        env.update(once.worker_env(config, run_dir))  # [tool.devpool.once]
    if settings.backend == "ray":
        from devpool.backends.ray.backend import RayBackend

        return RayBackend(args, cwd, log_dir, settings, inventory, env)
    if early is not None:
        early.worker_env.update(env)  # the selection, now that it is known
        return early
    return LocalBackend(args, cwd, log_dir, env, settings.worker_start_timeout)
