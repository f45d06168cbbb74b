"""pytest hooks and options; decides whether this process is the controller or a worker."""

from __future__ import annotations

import os
from collections.abc import Generator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from devpool import compat
from devpool.backends import zygote
from devpool.config import (
    add_options,
    conflicting_flags,
    read_table,
    settings_from,
    spaced_path_sentence,
    spaced_paths,
    unknown_option,
)
from devpool.devices.inventory import resolve_inventory
from devpool.devices.lockdir import LockDir
from devpool.errors import DevpoolError
from devpool.plan.markers import MARKERS
from devpool.plan.once import PLUGIN as ONCE_PLUGIN
from devpool.plan.once import OnceCheck, parse_once
from devpool.plan.rules import RuleMarkers, rules_from
from devpool.report.terminal import file_name
from devpool.select import DEPENDS_ON_MARKER
from devpool.select.options import select_options
from devpool.session.plain_collection import is_controller
from devpool.worker import capture


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    from devpool import hooks

    pluginmanager.add_hookspecs(hooks)


def _worker_of_a_selecting_run(args: list[str]) -> bool:
    """A worker whose controller selects: it pins its mode with --devpool-select (workers.py)."""

    def given(name: str) -> bool:
        return any(a == name or a.startswith(name + "=") for a in args)

    return given("--devpool-worker") and given("--devpool-select")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_load_initial_conftests(
    early_config: pytest.Config, parser: pytest.Parser, args: list[str]
) -> Generator[None, None, None]:
    """In a worker, pytest's fd capture writes to files beside the worker log (see capture).

    pytest starts that capture here, before pytest_configure; tryfirst puts us around it."""
    wrong = unknown_option(args)
    if wrong is not None:
        raise pytest.UsageError(wrong)
    if _worker_of_a_selecting_run(args):
        from devpool.select.record import start_early

        start_early(early_config, args)  # a record run's worker watches imports from here on
    base = capture.worker_base(args, os.environ)
    if base is None:
        if is_controller(early_config, args):
            compat.rerunfailures.no_status_server()  # the controller forks templates
            early_config.stash[zygote.UNSET] = zygote.Unset.now()  # before pytest's own
        return (yield)
    with capture.named_capture_files(base):
        return (yield)


def _pyproject(config: pytest.Config) -> Path:
    if config.inipath is not None and config.inipath.name == "pyproject.toml":
        return config.inipath
    return config.rootpath / "pyproject.toml"


def _moved_rootdir(config: pytest.Config, spaced: list[tuple[str, str]]) -> str | None:
    """The spaced path option whose value changed pytest's rootdir or ini file, else None.

    pytest chose them counting the value as a test path; devpool chooses again without it
    (pytest's own determine_setup) and compares. Should pytest's inner API move, every
    spaced path option is refused, as before."""
    if not spaced:
        return None
    try:
        from _pytest.config.findpaths import determine_setup

        early = config.known_args_namespace
        here = config.invocation_params.dir
        values = {value for _, value in spaced}
        paths = [a for a in early.file_or_dir if a not in values]

        def chosen(args: list[str]) -> tuple[Path, Path | None]:
            rootpath, inipath, *_ = determine_setup(
                inifile=early.inifilename,
                override_ini=early.override_ini,
                args=args,
                rootdir_cmd_arg=early.rootdir or None,
                invocation_dir=here,
            )
            return rootpath, inipath

        # A folder this run makes (a new lock folder) counts as a path on the next run:
        # judge it by its nearest existing folder, so every run of one command agrees.
        standing = [str(_existing(here / value)) for value in values]
        without, beside = chosen(paths), chosen(paths + standing)
    except Exception:  # noqa: BLE001 - pytest's inner API changed: refuse, as before
        return spaced[0][0]
    if without == beside == (config.rootpath, config.inipath):
        return None
    return spaced[0][0]


def _existing(path: Path) -> Path:
    """path, or its nearest folder above that exists."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _idle_options(config: pytest.Config, backend: str, shard: str | None) -> None:
    """Options given on the command line that this run would ignore: one sentence each.

    Only the command line's: a project may keep them in [tool.devpool] for its CI runs."""
    for dest, needs, ok in (
        ("devpool_ray_address", "--devpool-backend ray", backend == "ray"),
        ("devpool_ray_ship_code", "--devpool-backend ray", backend == "ray"),
        ("devpool_shard_by_module", "--devpool-shard K/N", shard is not None),
    ):
        if config.getoption(dest) and not ok:
            option = "--" + dest.replace("_", "-")
            raise DevpoolError(f"{option} has no effect without {needs}; add it or drop {option}")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    for text in MARKERS.values():
        config.addinivalue_line("markers", text)
    config.addinivalue_line("markers", DEPENDS_ON_MARKER)
    worker_spec = config.getoption("devpool_worker")
    if worker_spec:
        from devpool.worker.session import WorkerSession
        from devpool.worker.threads import apply_budget

        apply_budget()  # pools a fork of the controller loaded before this budget was set

        config.pluginmanager.register(WorkerSession(config, worker_spec), "devpool-worker")
        try:
            table = read_table(_pyproject(config))
        except DevpoolError:
            table = {}  # the controller said so already
        select = config.getoption("devpool_select")
        if select is not None:  # a selecting controller pins its mode for every worker
            from devpool.select.record import register_worker

            register_worker(config, select, table)
        _register_rules(config, table, str(_pyproject(config)), warn=False)
        from devpool.worker.once import register_worker as register_once

        once = table.get("once")
        register_once(config, frozenset(once if isinstance(once, dict) else ()))
        return
    try:
        _configure_controller(config)
    except DevpoolError as exc:
        raise pytest.UsageError(str(exc)) from None


def _configure_controller(config: pytest.Config) -> None:
    args = config.invocation_params.args
    moved = _moved_rootdir(config, spaced_paths(args))
    wrong = (spaced_path_sentence(moved) if moved else None) or conflicting_flags(args)
    if wrong is not None:
        raise DevpoolError(wrong)
    pyproject = _pyproject(config)
    table = read_table(pyproject)
    settings = settings_from(
        vars(config.option), table, str(pyproject), fallback=compat.settings_fallback(config)
    )
    selecting = select_options(table, str(pyproject))  # checked whether or not selection is on
    rules = rules_from(table, str(pyproject), settings)  # checked whether or not devpool is on
    once = parse_once(table, str(pyproject), settings.platforms, settings.resources)
    if settings.devices is None:
        if config.getoption("devpool_queue"):  # else every job would run every test
            raise DevpoolError(
                "--devpool-queue needs --devices (auto, or this job's devices): each job "
                "claims the tests its devices can hold"
            )
        # devpool stays out of the way (plain pytest, markers registered), and says so
        # once when tests need devices.
        from devpool.session.dormant import DormantNotice

        # A host's lock folder is set for every run alike (CI scripts, test helpers).
        given = {a.split("=", 1)[0] for a in args if a.startswith("--devpool-")}
        given.discard("--devpool-lock-dir")
        config.pluginmanager.register(RuleMarkers(rules), "devpool-rules")
        config.pluginmanager.register(DormantNotice(sorted(given)), "devpool-dormant")
        return
    if getattr(config.option, "numprocesses", None):
        raise DevpoolError("--devices and -n (pytest-xdist) both start workers; drop -n")
    _idle_options(config, settings.backend, settings.shard)
    dist = getattr(config.option, "dist", "no")
    if dist not in (None, "no"):
        raise DevpoolError(
            f"--dist {dist} is pytest-xdist's and has no effect under --devices, where devpool "
            "places tests itself; drop it (one process per module: --devpool-isolation=module)"
        )
    compat.configure_controller(config)
    from devpool.folders import writable_folder

    if settings.run_dir is not None:
        from devpool.session.run_folder import run_folder_mode

        writable_folder(settings.run_dir, "--devpool-run-dir", run_folder_mode(settings))
    if settings.history is not None:
        from devpool.history.location import check_history

        try:
            check_history(settings.history)
        except DevpoolError:
            # A selective run whose fleet database is away runs everything, its select line
            # saying why (select/diff.py); a run that would write there is refused.
            mode = settings.select
            if mode == "auto":  # on a pull request it selects; where full runs belong it records
                from devpool.select.policy import auto_mode

                mode = auto_mode(selecting.full_on, os.environ, config.rootpath)[0]
            if mode not in ("on", "shadow") or isinstance(settings.history, Path):
                raise
    if settings.run_record is not None:
        if settings.run_record.is_dir():
            raise DevpoolError(
                f"--devpool-run-record {settings.run_record} is a folder, not a file"
            )
        writable_folder(settings.run_record.parent, "the folder of --devpool-run-record")
    if settings.backend == "ray":
        from devpool.backends.ray.cluster import cluster_inventory

        inventory = cluster_inventory(settings.devices, settings.platforms, settings.ray_address)
    else:
        inventory = resolve_inventory(settings.devices, settings.platforms, os.environ)
    if settings.devices_from != "--devices":  # the header names where the value came from
        told = inventory.source.replace("--devices ", f"{settings.devices_from} = ", 1)
        inventory = replace(inventory, source=told)
    lock_dir = LockDir(settings.lock_dir)
    from devpool.session.controller import Controller
    from devpool.session.finish_guard import FinishGuard

    config.pluginmanager.register(
        Controller(config, settings, inventory, lock_dir), "devpool-controller"
    )
    config.pluginmanager.register(FinishGuard(), "devpool-finish-guard")
    # [tool.devpool.once] and @devpool.once: checked against the collected suite (plan/once.py)
    platform = (inventory.platform.name, inventory.platform.kind)
    check = OnceCheck(
        once,
        str(pyproject),
        len(inventory.devices),
        settings.cpu_slots,
        platform,
        settings.skip_unsatisfiable,
        (settings.platforms, settings.resources),
    )
    config.pluginmanager.register(check, ONCE_PLUGIN)
    if settings.select != "off":  # selection's modules load only for a run that selects
        from devpool.select.session import register_controller

        register_controller(config, settings, read_table(pyproject), str(pyproject))
    # Registered after selection's plugin: its trylast collection hook runs first, so the
    # selection reads the devices the rules give too.
    config.pluginmanager.register(RuleMarkers(rules), "devpool-rules")


def _register_rules(config: pytest.Config, table: dict[str, Any], where: str, warn: bool) -> None:
    """A worker's rules, as its controller's: a mistake there was said by the controller."""
    try:
        settings = settings_from(vars(config.option), table, where)
        rules = rules_from(table, where, settings)
    except DevpoolError:
        return
    if rules:
        config.pluginmanager.register(RuleMarkers(rules, warn=warn), "devpool-rules")


@pytest.fixture
def devpool_devices() -> list[int]:
    """The physical ids of the devices this test holds (empty for a CPU-only test)."""
    ids = os.environ.get("DEVPOOL_DEVICES", "")
    return [int(part) for part in ids.split(",") if part]


@pytest.fixture
def devpool_ports() -> list[int]:
    """The TCP ports leased to this test's worker (ports(n), or one for a multi-rank test)."""
    ports = os.environ.get("DEVPOOL_PORTS", "")
    return [int(part) for part in ports.split(",") if part]


@pytest.fixture
def devpool_artifacts(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """A folder for this test's files; devpool keeps it when the test fails, else removes it."""
    root = os.environ.get("DEVPOOL_ARTIFACTS")
    if not root:
        return tmp_path_factory.mktemp("artifacts")
    test = os.environ.get("DEVPOOL_TEST_ID") or request.node.nodeid
    attempt = int(os.environ.get("DEVPOOL_ATTEMPT", "1"))
    path = Path(root) / file_name(test, attempt)
    path.mkdir(parents=True, exist_ok=True)
    return path


@dataclass(frozen=True)
class NodeInfo:
    """Where this rank of a multi-node test stands: rank, world size, rank 0's address."""

    rank: int
    world_size: int
    master_addr: str
    master_port: int
    peers: tuple[str, ...]  # every rank's address, by rank


@pytest.fixture
def devpool_node() -> NodeInfo:
    """This rank's place in a @pytest.mark.nodes(n) test (rank 0 of 1 outside one)."""
    env = os.environ
    peers = tuple(p for p in env.get("DEVPOOL_NODE_PEERS", "").split(",") if p)
    return NodeInfo(
        rank=int(env.get("DEVPOOL_NODE_RANK", "0")),
        world_size=int(env.get("DEVPOOL_NODE_WORLD_SIZE", "1")),
        master_addr=env.get("DEVPOOL_NODE_MASTER_ADDR", "127.0.0.1"),
        master_port=int(env.get("DEVPOOL_NODE_MASTER_PORT", "0")),
        peers=peers or ("127.0.0.1",),
    )


@dataclass(frozen=True)
class RankInfo:
    """This process's place in a @pytest.mark.ranks(n) test, from torchrun's variables."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    devices: tuple[int, ...]  # this rank's own devices (physical ids), of the test's
    master_addr: str
    master_port: int


@pytest.fixture
def devpool_rank() -> RankInfo:
    """This rank of a ranks(n) test (rank 0 of 1, the test's devices, outside one)."""
    env = os.environ
    own = env.get("DEVPOOL_RANK_DEVICES", env.get("DEVPOOL_DEVICES", ""))
    return RankInfo(
        rank=int(env.get("RANK", "0")),
        world_size=int(env.get("WORLD_SIZE", "1")),
        local_rank=int(env.get("LOCAL_RANK", "0")),
        local_world_size=int(env.get("LOCAL_WORLD_SIZE", "1")),
        devices=tuple(int(part) for part in own.split(",") if part),
        master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
        master_port=int(env.get("MASTER_PORT", "0")),
    )


@pytest.fixture
def devpool_platform() -> str | None:
    """The platform name of this session's devices, e.g. 'cuda' or 'sim'; None outside devpool."""
    return os.environ.get("DEVPOOL_PLATFORM") or None
