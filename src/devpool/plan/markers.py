"""Test markers → Request, with errors that name the test and the marker."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

import pytest

from devpool.compat import benchmark, rerunfailures
from devpool.devices.sizes import format_size, parse_size
from devpool.errors import DevpoolError

MARKERS = {
    "device_count": "device_count(n): the test needs n devices of the session's platform.",
    "platforms": "platforms([names]): the test runs only where the session's platform is listed.",
    "nodes": "nodes(n): the test needs n machines, each with device_count devices (Ray backend).",
    "ranks": "ranks(n, devices_per_rank=1): the test runs as n processes, one per rank "
    "(torchrun's environment), merged into one outcome.",
    "isolate": "isolate: the test runs in a fresh worker process that nothing else uses.",
    "timeout": "timeout(seconds): devpool kills the test's process group after this many seconds.",
    "quarantine": "quarantine(reason=, owner=, until='YYYY-MM-DD'): runs, reported, never gates.",
    "device_memory": "device_memory('8GiB'): share devices, this much memory on each of them.",
    "device_exclusive": "device_exclusive: whole devices, even where device-memory is the default.",
    "ports": "ports(n): n TCP ports leased on the host for this test (DEVPOOL_PORTS).",
    "resources": "resources(name=k): k units of each named [tool.devpool.resources] resource.",
    "cpus": "cpus(n): the test keeps n cores busy: it holds n CPU slots and gets n threads.",
}


@dataclass(frozen=True)
class Request:
    """What one test asks for: the data the scheduler places."""

    device_count: int = 0
    platforms: tuple[str, ...] | None = None
    nodes: int = 1
    isolate: bool = False
    timeout: float | None = None
    peer_service: str | None = None  # nodes(n, peer_service="cmd"): run on ranks 1..n-1
    # pytest-rerunfailures' flaky(reruns=N, reruns_delay=S): this test's own reruns and the
    # wait before each; None: the run's --devpool-reruns / --devpool-reruns-delay.
    reruns: int | None = None
    reruns_delay: float | None = None
    # device_memory("8GiB"): bytes on each of its devices, shared with other such tests;
    # None: whole devices (the default, and always with device_exclusive).
    device_memory: int | None = None
    device_exclusive: bool = False  # said so explicitly, over a suite's device-memory default
    # A pytest-benchmark test: it times itself, so nothing else of the run runs beside it,
    # and it holds whole devices (compat/benchmark.py).
    quiet: bool = False
    ports: int = 0  # ports(n); multi-rank tests get one by default (see ports_needed)
    resources: tuple[tuple[str, int], ...] = ()  # resources(name=k), sorted by name
    # ranks(n): the test runs as n processes, one per rank; 0: an ordinary test.
    ranks: int = 0
    devices_per_rank: int = 1  # ranks(n, devices_per_rank=k): device_count is n × k
    # cpus(n): cores the test keeps busy (each rank's, for ranks(n)): n CPU slots and a
    # thread budget of n; 0: one slot for a CPU test, and the run's share of threads.
    cpus: int = 0

    @property
    def cpu_ranks(self) -> int:
        """CPU slots a CPU-only distributed test takes: one per rank (0: not one)."""
        return self.ranks if self.ranks and self.device_count == 0 else 0

    @property
    def cpus_total(self) -> int:
        """Cores a cpus(n) test holds: n for each of its processes (0: not asked)."""
        return self.cpus * max(1, self.ranks)

    @property
    def ports_needed(self) -> int:
        """Ports leased for the test: ports(n), else one for a multi-rank test (MASTER_PORT)."""
        if self.ports:
            return self.ports
        return 1 if self.device_count >= 2 or self.nodes >= 2 or self.ranks else 0

    def describe(self) -> str:
        """Short human form, e.g. '2 devices, isolate, timeout 30s' or '1 device × 8 GiB'."""
        parts = [f"{self.device_count} device{'s' if self.device_count != 1 else ''}"]
        if self.device_memory is not None:
            parts = [f"{parts[0]} × {format_size(self.device_memory)}"]
        elif self.device_exclusive:
            parts.append("exclusive")
        if self.device_count == 0:
            parts = ["cpu"]
        if self.ranks:
            each = self.devices_per_rank
            per_rank = f"{each} device{'s' if each != 1 else ''}" if each else "cpu"
            if self.device_memory is not None:
                per_rank += f" × {format_size(self.device_memory)}"
            parts = [f"{self.ranks} rank{'s' if self.ranks != 1 else ''} × {per_rank}"]
        if self.nodes > 1:
            parts[0] = f"{self.nodes} nodes × {parts[0]}"
        if self.isolate:
            parts.append("isolate")
        if self.timeout:
            parts.append(f"timeout {self.timeout:g}s")
        elif self.timeout == 0:
            parts.append("no timeout")
        if self.reruns:
            parts.append(f"reruns {self.reruns}")
        if self.quiet:
            parts.append("alone (benchmark)")
        if self.ports:
            parts.append(f"{self.ports} port{'s' if self.ports != 1 else ''}")
        parts.extend(f"{name}={count}" for name, count in self.resources)
        if self.cpus:
            cpus = f"{self.cpus} cpu{'s' if self.cpus != 1 else ''}"
            parts = [cpus] + parts[1:] if parts[0] == "cpu" else [*parts, cpus]
        return ", ".join(parts)


def _whole_number(
    nodeid: str, name: str, args: tuple[Any, ...], kwargs: Mapping[str, Any], minimum: int
) -> int:
    if len(args) != 1 or kwargs:
        raise DevpoolError(
            f"{nodeid}: @pytest.mark.{name} takes exactly one whole number, "
            f"got args={args!r} kwargs={dict(kwargs)!r}"
        )
    value = args[0]
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise DevpoolError(
            f"{nodeid}: @pytest.mark.{name}({value!r}) needs a whole number ≥ {minimum}, "
            f"got {type(value).__name__} {value!r}"
        )
    return value


def _bare(nodeid: str, marker: pytest.Mark | None) -> bool:
    """A marker that is on or off, written bare: isolate(False) would read as on."""
    if marker is not None and (marker.args or marker.kwargs):
        given = ", ".join(
            [*map(repr, marker.args), *(f"{k}={v!r}" for k, v in marker.kwargs.items())]
        )
        raise DevpoolError(
            f"{nodeid}: @pytest.mark.{marker.name} takes no arguments, got "
            f"{marker.name}({given}); write @pytest.mark.{marker.name}, or leave it off"
        )
    return marker is not None


def _platforms(nodeid: str, marker: pytest.Mark, known: Collection[str]) -> tuple[str, ...]:
    names: list[object] = []
    for arg in marker.args:
        names.extend(arg if isinstance(arg, (list, tuple)) else [arg])
    if not names or marker.kwargs or not all(isinstance(n, str) for n in names):
        raise DevpoolError(
            f"{nodeid}: @pytest.mark.platforms needs a list of platform names, "
            f"e.g. platforms(['cuda', 'sim']), got args={marker.args!r}"
        )
    unknown = [n for n in names if n not in known]
    if unknown:
        raise DevpoolError(
            f"{nodeid}: @pytest.mark.platforms names unknown platform {unknown[0]!r}; "
            f"known: {', '.join(sorted(known))} (add others under [tool.devpool.platforms])"
        )
    return tuple(str(n) for n in names)


def _timeout(nodeid: str, marker: pytest.Mark) -> float:
    """Seconds; 0 means no limit, not even the default one (pytest-timeout's meaning).

    pytest-timeout's forms are accepted: timeout(seconds), timeout(seconds, "thread"),
    timeout(timeout=seconds), with method= and func_only=. devpool kills the test's process
    group whatever the method; func_only does not narrow devpool's limit.
    """
    args = list(marker.args)
    if "timeout" in marker.kwargs and args:
        raise DevpoolError(f"{nodeid}: @pytest.mark.timeout gives its seconds twice")
    if "timeout" in marker.kwargs:
        args = [marker.kwargs["timeout"]]
    extra = set(marker.kwargs) - {"timeout", "method", "func_only"}
    method = args[1] if len(args) == 2 else marker.kwargs.get("method")
    if not args or len(args) > 2 or extra or method not in (None, "signal", "thread"):
        raise DevpoolError(
            f"{nodeid}: @pytest.mark.timeout takes one number of seconds "
            f"(and pytest-timeout's method=, func_only=), got args={marker.args!r} "
            f"kwargs={dict(marker.kwargs)!r}"
        )
    value = args[0]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise DevpoolError(
            f"{nodeid}: @pytest.mark.timeout({value!r}) needs a number of seconds ≥ 0 "
            f"(0: no limit), got {type(value).__name__} {value!r}"
        )
    return float(value)


def _device_memory(nodeid: str, marker: pytest.Mark) -> int:
    if len(marker.args) != 1 or marker.kwargs:
        raise DevpoolError(
            f"{nodeid}: @pytest.mark.device_memory takes one size, e.g. device_memory('8GiB'), "
            f"got args={marker.args!r} kwargs={dict(marker.kwargs)!r}"
        )
    try:
        return parse_size(marker.args[0])
    except ValueError as exc:
        raise DevpoolError(
            f"{nodeid}: @pytest.mark.device_memory({marker.args[0]!r}) needs {exc}"
        ) from None


def _resources(
    nodeid: str, marker: pytest.Mark, known: Mapping[str, int]
) -> tuple[tuple[str, int], ...]:
    if marker.args or not marker.kwargs:
        raise DevpoolError(
            f"{nodeid}: @pytest.mark.resources takes name=count pairs, e.g. resources(hccl=1), "
            f"got args={marker.args!r} kwargs={dict(marker.kwargs)!r}"
        )
    for name, count in marker.kwargs.items():
        if name not in known:
            names = ", ".join(sorted(known)) or "none"
            raise DevpoolError(
                f"{nodeid}: @pytest.mark.resources names unknown resource {name!r}; declared "
                f"under [tool.devpool.resources]: {names}"
            )
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise DevpoolError(
                f"{nodeid}: @pytest.mark.resources({name}={count!r}) needs a whole number ≥ 1"
            )
    return tuple(sorted(marker.kwargs.items()))


VALUE_MARKERS = (
    "device_count",
    "device_memory",
    "nodes",
    "platforms",
    "timeout",
    "ports",
    "ranks",
    "cpus",
)


_CHECKED = frozenset((*VALUE_MARKERS, "resources"))


def _conflicts(item: pytest.Item) -> None:
    """Two markers of one name with different values on the test itself are a mistake.

    Between levels (class, module) pytest's closest-wins rule stands; on one function
    `get_closest_marker` would silently keep the one written nearest the def."""
    seen: dict[str, list[tuple[Any, Any]]] = {}
    for mark in getattr(item, "own_markers", ()):
        if mark.name in _CHECKED:
            seen.setdefault(mark.name, []).append((mark.args, mark.kwargs))
    for name, own in seen.items():
        if any(values != own[0] for values in own[1:]):
            raise DevpoolError(
                f"{item.nodeid}: conflicting @pytest.mark.{name} markers on one test "
                f"({len(own)} of them); keep one"
            )


def closest_marks(item: pytest.Item) -> dict[str, pytest.Mark]:
    """Each marker name's closest mark (`item.get_closest_marker`'s), from one walk of the
    item's chain instead of one walk per name."""
    closest: dict[str, pytest.Mark] = {}
    for mark in item.iter_markers():
        closest.setdefault(mark.name, mark)
    return closest


def request_for(
    item: pytest.Item,
    known_platforms: Collection[str],
    default_memory: int | None = None,
    resources: Mapping[str, int] | None = None,
) -> Request:
    """Read one test's markers into a Request; DevpoolError names the test on bad input.

    default_memory ([tool.devpool] device-memory) applies to device tests that neither
    declare their own device_memory nor demand device_exclusive.
    """
    nodeid = item.nodeid
    _conflicts(item)
    closest = closest_marks(item)
    device_count = 0
    if (mark := closest.get("device_count")) is not None:
        device_count = _whole_number(nodeid, mark.name, mark.args, mark.kwargs, 1)
    device_memory = None
    if (mark := closest.get("device_memory")) is not None:
        device_memory = _device_memory(nodeid, mark)
    exclusive = _bare(nodeid, closest.get("device_exclusive"))
    if exclusive and device_memory is not None:
        raise DevpoolError(
            f"{nodeid}: @pytest.mark.device_exclusive and @pytest.mark.device_memory "
            "contradict each other; keep one"
        )
    if (device_memory is not None or exclusive) and device_count == 0:
        device_count = 1  # like device_count(1): a memory request is for a device
    if device_memory is None and not exclusive and device_count > 0:
        device_memory = default_memory
    nodes = 1
    peer_service = None
    if (mark := closest.get("nodes")) is not None:
        peer_service = mark.kwargs.get("peer_service")
        if peer_service is not None and (not isinstance(peer_service, str) or not peer_service):
            raise DevpoolError(
                f"{nodeid}: @pytest.mark.nodes(peer_service=...) must be a command string"
            )
        rest = {k: v for k, v in mark.kwargs.items() if k != "peer_service"}
        nodes = _whole_number(nodeid, mark.name, mark.args, rest, 1)
    platforms = None
    if (mark := closest.get("platforms")) is not None:
        platforms = _platforms(nodeid, mark, known_platforms)
    timeout = None
    if (mark := closest.get("timeout")) is not None:
        timeout = _timeout(nodeid, mark)
    isolate = _bare(nodeid, closest.get("isolate"))
    reruns, reruns_delay = rerunfailures.marker_reruns(item)
    quiet = benchmark.is_benchmark(item)
    if quiet and device_count > 0:
        device_memory, exclusive = None, True
    ports = 0
    if (mark := closest.get("ports")) is not None:
        ports = _whole_number(nodeid, mark.name, mark.args, mark.kwargs, 1)
    wanted: tuple[tuple[str, int], ...] = ()
    if (mark := closest.get("resources")) is not None:
        wanted = _resources(nodeid, mark, resources or {})
    cpus = 0
    if (mark := closest.get("cpus")) is not None:
        cpus = _whole_number(nodeid, mark.name, mark.args, mark.kwargs, 1)
    ranks, per_rank = 0, 1
    if (mark := closest.get("ranks")) is not None:
        ranks, per_rank = _ranks(nodeid, mark)
        if ranks % nodes:
            raise DevpoolError(
                f"{nodeid}: @pytest.mark.ranks({ranks}) over @pytest.mark.nodes({nodes}) needs "
                "as many ranks on every node: a multiple of the node count"
            )
        total = ranks // nodes * per_rank  # device_count is per node
        if closest.get("device_count") is not None and device_count != total:
            raise DevpoolError(
                f"{nodeid}: @pytest.mark.ranks({ranks}, devices_per_rank={per_rank}) holds "
                f"{total} device{'s' if total != 1 else ''}, but @pytest.mark.device_count"
                f"({device_count}) says otherwise; keep one, or make them agree"
            )
        device_count = total
        if per_rank == 0:
            device_memory, exclusive = None, False
        elif device_memory is None and not exclusive:
            device_memory = default_memory
    request = Request(
        device_count,
        platforms,
        nodes,
        isolate,
        timeout,
        peer_service,
        reruns=reruns,
        reruns_delay=reruns_delay,
        device_memory=device_memory,
        device_exclusive=exclusive,
        quiet=quiet,
        ports=ports,
        resources=wanted,
        ranks=ranks,
        devices_per_rank=per_rank,
        cpus=cpus,
    )
    if not request.ports_needed and "devpool_ports" in getattr(item, "fixturenames", ()):
        raise DevpoolError(
            f"{nodeid}: uses the devpool_ports fixture, but no @pytest.mark.ports(n) asks for "
            "ports, so it would get none; add @pytest.mark.ports(1)"
        )
    return request


def _ranks(nodeid: str, marker: pytest.Mark) -> tuple[int, int]:
    """ranks(n) or ranks(n, devices_per_rank=k): (n ≥ 1, k ≥ 0)."""
    kwargs = dict(marker.kwargs)
    per_rank = kwargs.pop("devices_per_rank", 1)
    if "n" in kwargs and not marker.args:
        marker_args: tuple[Any, ...] = (kwargs.pop("n"),)
    else:
        marker_args = marker.args
    if kwargs:
        raise DevpoolError(
            f"{nodeid}: @pytest.mark.ranks takes a number of ranks and devices_per_rank=, "
            f"got unknown {', '.join(sorted(kwargs))}="
        )
    n = _whole_number(nodeid, "ranks", marker_args, {}, 1)
    if isinstance(per_rank, bool) or not isinstance(per_rank, int) or per_rank < 0:
        raise DevpoolError(
            f"{nodeid}: @pytest.mark.ranks({n}, devices_per_rank={per_rank!r}) needs a whole "
            "number ≥ 0 of devices per rank (0: a CPU-only distributed test)"
        )
    return n, per_rank
