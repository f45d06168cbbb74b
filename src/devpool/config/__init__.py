"""devpool's options: one table drives the command line (--devpool-NAME) and [tool.devpool]."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from devpool.config.values import (
    backend,
    count,
    delay,
    flag,
    flaky_result,
    fraction,
    history,
    isolation,
    leaks,
    names,
    positive_int,
    seconds,
    select_mode,
    text,
)
from devpool.config.values import read_table as read_table
from devpool.database import shown
from devpool.devices.cores import usable_cores
from devpool.devices.inventory import Platform, load_platforms
from devpool.devices.lockdir import default_lock_dir
from devpool.devices.ports import DEFAULT_RANGE, overlap_error, parse_range
from devpool.devices.resources import parse_resources
from devpool.devices.sizes import parse_size
from devpool.errors import DevpoolError, check_keys, did_you_mean
from devpool.history.location import HistorySpec


@dataclass(frozen=True)
class Option:
    """One devpool option: `--devpool-<name>` on the command line, `<name>` in [tool.devpool]."""

    name: str
    convert: Callable[[object], Any]
    help: str
    flag: bool = False
    negatable: bool = False  # also --devpool-no-<name>, for flags that default on (or detect)
    path: str = ""  # "DIR" or "FILE" for a path option, which must be written with "="

    @property
    def dest(self) -> str:
        return "devpool_" + self.name.replace("-", "_")

    @property
    def cli(self) -> str:
        return "--devpool-" + self.name


OPTIONS: tuple[Option, ...] = (
    Option("profile", text, "a [tool.devpool.profiles.NAME] table to apply (CI=true: 'ci')"),
    Option("max-parallel", positive_int, "most jobs running at once (default: devices or cores)"),
    Option(
        "cpu-slots",
        positive_int,
        "cores the tests may keep busy: a CPU-only test takes one, a CPU-bound device test "
        "its load, a cpus(n) test n (default: the cores this process may use, by affinity and "
        "cgroup quota)",
    ),
    Option(
        "lock-dir", text, "folder of per-device lock files shared by runs on this host", path="DIR"
    ),
    Option("lease-timeout", seconds, "seconds a test waits for devices held by other runs"),
    Option("test-timeout", seconds, "default per-test time limit in seconds (marker wins)"),
    Option("worker-start-timeout", seconds, "seconds a worker may take to start and collect"),
    Option("timeout-grace", seconds, "seconds between SIGTERM and SIGKILL on a timeout"),
    Option(
        "rank-straggle",
        seconds,
        "a ranks(n) test's ranks still in it this long after another rank finished it are "
        "ended, their stacks dumped (default 60)",
    ),
    Option(
        "slow-timeout", seconds, "a test running this long is said SLOW, again at each multiple"
    ),
    Option("skip-unsatisfiable", flag, "skip tests needing more than the pool has", flag=True),
    Option("plan", flag, "print the jobs and their planned order, run nothing", flag=True),
    Option(
        "isolation",
        isolation,
        "'worker': reuse warm workers; 'module': a fresh process per test module; "
        "'job': a fresh process per test",
    ),
    Option(
        "leaks",
        leaks,
        "what a test leaves behind (processes, threads, device memory) is ended and "
        "reported: 'warn' (default), 'fail' (the leak fails the test) or 'off'",
    ),
    Option(
        "leak-memory-share",
        fraction,
        "a warm worker that still holds more than this share of its tests' device memory "
        "after a test is retired, not reused (default 10%)",
    ),
    Option(
        "fork-server",
        flag,
        "workers fork from a warm template of their kind that has collected (default on)",
        flag=True,
        negatable=True,
    ),
    Option(
        "preload",
        flag,
        "templates import first the library modules their kind's tests imported last run "
        "(default on)",
        flag=True,
        negatable=True,
    ),
    Option("ports", parse_range, "TCP ports leased to tests, outside the ephemeral range"),
    Option(
        "keep-master-port",
        flag,
        "a MASTER_PORT exported by the caller stays for tests that lease ports "
        "(default: the leased port wins)",
        flag=True,
    ),
    Option("device-memory", parse_size, "memory each device test declares unless it says (8GiB)"),
    Option("memory-reserve", fraction, "share of each device's memory never handed out (5%)"),
    Option("reruns", count, "retry a failed/error/timeout test this many times, fresh worker"),
    Option("reruns-delay", delay, "seconds to wait before each rerun of a failed test (0)"),
    Option(
        "fresh-after-failure",
        flag,
        "a worker ends after any failed test; the rest of its batch runs elsewhere",
        flag=True,
    ),
    Option("reruns-infra", count, "retry a crashed/infra test this many times (default 1)"),
    Option("flaky-result", flaky_result, "'pass' or 'fail': does a flaky test gate the run"),
    Option("repeat", positive_int, "run each selected test this many times, across devices"),
    Option(
        "keep-artifacts", flag, "keep devpool_artifacts folders of passing tests too", flag=True
    ),
    Option(
        "quarantine-file", text, "TOML file of quarantine entries keyed by node id", path="FILE"
    ),
    Option("strict-quarantine", flag, "an expired quarantine entry is an error", flag=True),
    Option(
        "probe",
        flag,
        "probe devices for foreign processes before a lease (default on)",
        flag=True,
        negatable=True,
    ),
    Option(
        "history",
        history,
        "duration history: a SQLite FILE (default .devpool/history.sqlite) or a PostgreSQL "
        "URL, a fleet's history (postgresql://USER@HOST:PORT/DB)",
        path="FILE",
    ),
    Option("default-estimate", seconds, "seconds assumed for a test with no history (1.0)"),
    Option("shard", text, "run only shard K of N (e.g. 2/4), split by estimated cost"),
    Option("shard-by-module", flag, "shards keep each module together", flag=True),
    Option("backend", backend, "where workers run: local (this host) or ray (a cluster)"),
    Option("ray-address", text, "Ray cluster address (default: $RAY_ADDRESS, else local)"),
    Option("ray-ship-code", flag, "ship the test code with Ray's runtime_env", flag=True),
    Option("peer-service", text, "command started on every non-zero rank of a nodes(n) test"),
    Option(
        "run-dir", text, "folder for this run's logs (default .devpool/runs/<run id>)", path="DIR"
    ),
    Option("keep-runs", positive_int, "run folders kept under .devpool/runs (default 20)"),
    Option(
        "share-runs",
        flag,
        "run folders devpool makes are readable by the group (mode 0750), not only by this "
        "user (0700); for a shared host where a team reads each other's runs",
        flag=True,
    ),
    Option(
        "run-record",
        text,
        "the run record, JSON lines (default <run dir>/record.jsonl)",
        path="FILE",
    ),
    Option("select", select_mode, "selective runs: record, on, shadow, auto or off (default)"),
    Option("select-base", text, "the revision a baseline's commit must precede (HEAD)"),
    Option(
        "queue",
        text,
        "one run across many CI jobs: the PostgreSQL URL of their shared queue (postgresql://…)",
    ),
    Option(
        "queue-run",
        text,
        "the run every job joins on the queue (default $GITHUB_RUN_ID-$GITHUB_RUN_ATTEMPT)",
    ),
    Option(
        "queue-lease",
        seconds,
        "seconds a job may miss its heartbeat before its claims go back to the queue (30)",
    ),
    Option(
        "queue-classes",
        names,
        "the platform classes a queue run covers on purpose, e.g. h100,h200 (default all): "
        "the others' tests are deselected, with the reason",
    ),
    Option(
        "github",
        flag,
        "GitHub Actions output (default: when GITHUB_ACTIONS=true)",
        flag=True,
        negatable=True,
    ),
)
_BY_NAME = {option.name: option for option in OPTIONS}
TABLE_KEYS = frozenset(_BY_NAME) | {
    "devices",
    "platforms",
    "quarantine",
    "fatal-patterns",
    "profiles",
    "resources",
    "paths",
    "markers",
    "once",
}
# A profile changes how a run runs, not what a test asks for (paths, markers, once).
PROFILE_KEYS = TABLE_KEYS - {"profiles", "profile", "paths", "markers", "once"}


def spaced_paths(args: Sequence[str]) -> list[tuple[str, str]]:
    """(option, value) for each path option given its value as the next argument.

    pytest picks its rootdir from the arguments that are not options before it knows
    devpool's options, so the value of `--devpool-lock-dir DIR` counts as a path there."""
    paths = {option.cli for option in OPTIONS if option.path}
    return [(arg, args[i + 1]) for i, arg in enumerate(args[:-1]) if arg in paths]


def spaced_path_sentence(option: str) -> str:
    """Why a spaced path option is refused: it moved pytest's rootdir or ini file."""
    what = next(o.path for o in OPTIONS if o.cli == option)
    return (
        f"write {option}={what}: written with a space, its value changed the rootdir or "
        "ini file pytest chose before it knew devpool's options"
    )


def unknown_option(args: Sequence[str]) -> str | None:
    """The sentence for a `--devpool-…` option devpool does not have, with a close one."""
    known = {"--devpool-worker"}
    for option in OPTIONS:
        known.add(option.cli)
        if option.negatable:
            known.add("--devpool-no-" + option.name)
    for arg in args:
        if arg == "--":
            break
        name = arg.split("=", 1)[0]
        if name.startswith("--devpool-") and name not in known:
            bare = [k.removeprefix("--devpool-") for k in known]
            hint = did_you_mean(name.removeprefix("--devpool-"), bare, prefix="--devpool-")
            return f"unknown option {name}{hint or ' (see pytest --help, group devpool)'}"
    return None


def conflicting_flags(args: Sequence[str]) -> str | None:
    """The sentence for a flag given both ways (`--devpool-github --devpool-no-github`)."""
    for option in OPTIONS:
        negative = "--devpool-no-" + option.name
        if option.negatable and option.cli in args and negative in args:
            return f"{option.cli} and {negative} contradict each other; give one"
    return None


def add_options(parser: pytest.Parser) -> None:
    """Register --devices and every --devpool-<name> option."""
    group = parser.getgroup("devpool", "devpool: accelerator-aware test scheduling")
    group.addoption(
        "--devices",
        dest="devpool_devices",
        default=None,
        metavar="SPEC",
        help="devices for this run: auto, PLATFORM, PLATFORM:IDS (cuda:0-7, sim:0-3) or IDS",
    )
    for option in OPTIONS:
        # argparse formats help with %: a literal one (5%) must be written %%.
        text = option.help.replace("%", "%%")
        if option.flag:
            group.addoption(
                option.cli, dest=option.dest, action="store_true", default=None, help=text
            )
            if option.negatable:
                group.addoption(
                    "--devpool-no-" + option.name,
                    dest=option.dest,
                    action="store_false",
                    default=None,
                    help=f"turn {option.cli} off",
                )
        else:
            group.addoption(option.cli, dest=option.dest, default=None, help=text)
    # The worker role: how a child pytest finds its controller. Not for users.
    group.addoption(
        "--devpool-worker",
        dest="devpool_worker",
        default=None,
        help="internal: run as a devpool worker on these pipe fds",
    )


@dataclass(frozen=True)
class Settings:
    """Every devpool setting after the command line, [tool.devpool] and defaults are merged."""

    devices: str | None
    platforms: Mapping[str, Platform]
    profile: str | None = None
    profile_note: str = ""  # which profile applies, why, and what it sets ("": none does)
    devices_from: str = "--devices"  # where `devices` was set
    max_parallel: int | None = None
    cpu_slots: int = field(default_factory=lambda: usable_cores().count)
    lock_dir: Path = field(default_factory=default_lock_dir)
    lease_timeout: float = 600.0
    test_timeout: float | None = None
    timeout_grace: float = 5.0
    rank_straggle: float = 60.0
    slow_timeout: float = 60.0
    worker_start_timeout: float = 300.0
    skip_unsatisfiable: bool = False
    plan: bool = False
    isolation: str = "worker"
    leaks: str = "warn"
    leak_memory_share: float = 0.1
    fork_server: bool = True
    preload: bool = True
    device_memory: int | None = None  # bytes per device for tests that do not declare it
    memory_reserve: float = 0.05
    run_dir: Path | None = None
    reruns: int = 0
    reruns_delay: float = 0.0
    reruns_infra: int = 1
    fresh_after_failure: bool = False
    flaky_result: str = "pass"
    repeat: int = 1
    run_record: Path | None = None
    select: str = "off"
    select_base: str = "HEAD"
    keep_runs: int = 20
    share_runs: bool = False
    github: bool | None = None
    keep_artifacts: bool = False
    history: HistorySpec | None = None  # a file, or a PostgreSQL URL (history/location.py)
    default_estimate: float = 1.0
    shard: str | None = None
    shard_by_module: bool = False
    backend: str = "local"
    ray_address: str | None = None
    ray_ship_code: bool = False
    peer_service: str | None = None
    quarantine_file: Path | None = None
    strict_quarantine: bool = False
    probe: bool = True
    quarantine: Mapping[str, Any] = field(default_factory=dict)
    fatal_patterns: Mapping[str, Any] = field(default_factory=dict)
    ports: tuple[int, int] = DEFAULT_RANGE  # leased TCP ports (devices/ports.py)
    keep_master_port: bool = False
    resources: Mapping[str, int] = field(default_factory=dict)  # name → capacity
    queue: str | None = None  # the shared queue's PostgreSQL URL (queue/)
    queue_run: str | None = None
    queue_lease: float = 30.0
    queue_classes: tuple[str, ...] = ()  # the classes a queue run covers ((): all)


SELECT_KEYS = frozenset(
    {"mode", "inputs", "ignore", "key-packages", "max-age-days", "full-on", "keep"}
)


def check_tables(table: Mapping[str, Any], where: str) -> None:
    """Every [tool.devpool…] table's keys, checked alike: the top level, select, each profile.

    Platforms and resources check their own entries (devices/); this runs whether or not
    a profile applies, so a misspelt key in an unused profile is found too."""
    check_keys(table, TABLE_KEYS, "tool.devpool", where)
    select = table.get("select")
    if isinstance(select, Mapping):
        check_keys(select, SELECT_KEYS, "tool.devpool.select", where)
    profiles = table.get("profiles", {})
    if not isinstance(profiles, dict) or not all(isinstance(p, dict) for p in profiles.values()):
        raise DevpoolError(f"{where}: [tool.devpool.profiles] must hold one table per profile")
    for name, profile in profiles.items():
        check_keys(profile, PROFILE_KEYS, f"tool.devpool.profiles.{name}", where)


def _with_profile(
    options: Mapping[str, Any], table: Mapping[str, Any], where: str, environ: Mapping[str, str]
) -> tuple[dict[str, Any], dict[str, str], str]:
    """[tool.devpool] with one profile's keys laid over it, as nextest's profiles are, and
    the table each key came from.

    The profile is --devpool-profile, else `profile` in the table, else "ci" when
    CI=true and the project defines one; none applies otherwise.
    """
    merged = {key: value for key, value in table.items() if key != "profiles"}
    profiles = table.get("profiles", {})
    name = options.get("devpool_profile") or merged.pop("profile", None)
    why = "--devpool-profile" if options.get("devpool_profile") else "profile in [tool.devpool]"
    if name is None and environ.get("CI") == "true" and "ci" in profiles:
        name, why = "ci", "CI=true"
    if name is None:
        return merged, {}, ""
    if name not in profiles:
        known = ", ".join(sorted(profiles)) or "none defined"
        raise DevpoolError(
            f"--devpool-profile {name!r} is not in [tool.devpool.profiles] of {where} "
            f"(known: {known})"
        )
    merged.update(profiles[name])
    keys = ", ".join(f"{key} = {value!r}" for key, value in profiles[name].items()) or "no keys"
    note = f"profile {name!r} applies ({why}): {keys}"
    return merged, {key: f"tool.devpool.profiles.{name}" for key in profiles[name]}, note


def settings_from(
    options: Mapping[str, Any],
    table: Mapping[str, Any],
    where: str,
    environ: Mapping[str, str] | None = None,
    fallback: Mapping[str, tuple[Any, str]] | None = None,
) -> Settings:
    """Merge command-line values (dest → value, None when not given) over [tool.devpool].

    fallback: option name → (value, where it was set), used when neither gives one: other
    plugins' equivalents (pytest-timeout's --timeout, pytest-rerunfailures' --reruns).
    """
    fallback = fallback or {}
    check_tables(table, where)
    table, sources, profile = _with_profile(
        options, table, where, os.environ if environ is None else environ
    )

    def named(key: str) -> str:
        return f"{where}: [{sources.get(key, 'tool.devpool')}] {key}"

    platforms_table = table.get("platforms")
    if platforms_table is not None and not isinstance(platforms_table, dict):
        raise DevpoolError(f"{named('platforms')} must be a table")
    values: dict[str, Any] = {"platforms": load_platforms(platforms_table)}
    if "devices" in table and not isinstance(table["devices"], str):
        raise DevpoolError(f"{named('devices')} must be a string like 'sim:0-7'")
    devices = options.get("devpool_devices")
    if devices is None and "devices" in table:
        devices = table["devices"]
        values["devices_from"] = named("devices")
    values["devices"] = devices
    values["profile_note"] = profile
    for option in OPTIONS:
        raw, source = options.get(option.dest), option.cli
        if raw is None and option.name in table:
            raw, source = table[option.name], named(option.name)
        if raw is None and option.name in fallback:
            raw, source = fallback[option.name]
        if raw is None:
            continue
        try:
            values[option.name.replace("-", "_")] = option.convert(raw)
        except ValueError as exc:
            given = shown(raw) if isinstance(raw, str) else raw  # a URL's password hidden
            raise DevpoolError(f"{source} must be {exc}, got {given!r}") from None
    for key, name in (("quarantine", "quarantine"), ("fatal_patterns", "fatal-patterns")):
        if name in table:
            if not isinstance(table[name], dict):
                raise DevpoolError(f"{where}: [tool.devpool.{name}] must be a table")
            values[key] = table[name]
    if "ports" in values and (overlap := overlap_error(values["ports"])) is not None:
        raise DevpoolError(overlap)
    if "resources" in table:
        try:
            values["resources"] = parse_resources(table["resources"], where)
        except ValueError as exc:
            raise DevpoolError(str(exc)) from None
    for key in ("lock_dir", "run_dir", "run_record", "quarantine_file"):
        if key in values:
            values[key] = Path(values[key]).expanduser()
    return Settings(**values)
