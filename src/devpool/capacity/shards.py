"""Split a suite across CI runners: longest-processing-time first on estimated device-seconds.

A test costs max(device_count, 1) × estimate device-seconds (a CPU test costs its seconds).
A device_memory test holds only part of each device, so where the platform's memory is
configured ([tool.devpool.platforms] memory, less memory-reserve) it costs that much times
its share of a device, declared / capacity: sixteen 5 GiB tests on 80 GiB cards run side by
side on one device, and a shard of them charged as whole-device tests would get too little
work while the shards of whole-device tests got too much. The capacity comes from the
configuration only, never from a device query (NVML), so every runner, and a CI planner
with no accelerator, computes the same costs.
Tests with the same group stay in one shard; groups go, most costly first, to the shard
with the least cost so far, ties broken by group name and then shard number, so every
runner that computes the split from the same tests and the same history gets the same
shards. (Shard membership follows the estimates: runners must share one history file.)

The split is a pure function of the collected tests, their requests and a cost snapshot
(the estimates of the history as it was before the run: a shard run writes its own
durations to a pending per-run file, see history/durations.py). Its fingerprint hashes every test
id → shard assignment together with the costs, and every shard writes it into its run
record, so `devpool shard verify` can prove afterwards that the shards of one CI run
split alike and ran every test exactly once (see shardcheck.py).

The wall estimate of a shard on a runner with D devices is
max(sum of its costs / D, its longest single test): the work spread perfectly over the
runner's devices, but never shorter than the one test that cannot be split.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import math
import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from devpool.devices.inventory import Platform
from devpool.devices.memory import usable_memory
from devpool.errors import DevpoolError
from devpool.plan.jobs import DEFAULT_ESTIMATE
from devpool.plan.markers import Request


@dataclass(frozen=True)
class ShardItem:
    """One test as sharding sees it: its group, its devices and its estimated seconds."""

    nodeid: str
    group: str  # tests sharing a non-empty group stay in one shard; "" = the test alone
    device_count: int
    estimate: float  # seconds
    share: float = 1.0  # of each device it holds: declared memory / capacity, else 1 (whole)

    @property
    def cost(self) -> float:
        """Device-seconds: max(device_count, 1) × share × estimate (a CPU test: its seconds)."""
        return max(self.device_count, 1) * self.share * self.estimate

    @property
    def key(self) -> str:
        """The group this item moves with: its group, or its own node id."""
        return self.group or self.nodeid


def shard_capacity(platform: Platform, reserve: float) -> int | None:
    """Bytes a device hands out to memory tests, as sharding counts it: the platform's
    configured memory less the reserve; None (memory tests cost whole devices) without one."""
    if platform.memory is None:
        return None
    return usable_memory({0: platform.memory}, reserve)[0] or None


def shard_item(
    nodeid: str,
    request: Request,
    estimate: float,
    by_module: bool = False,
    capacity: int | None = None,
) -> ShardItem:
    """The one rule both `devpool shard` and `pytest --devpool-shard` use to make items.

    Group: the module path with by_module, else the test alone. A multi-node test counts
    the devices of all its nodes. capacity: shard_capacity() of the platform.
    """
    group = nodeid.split("::", 1)[0] if by_module else nodeid
    devices = request.device_count * request.nodes
    share = 1.0
    if capacity and devices and request.device_memory is not None:
        share = min(request.device_memory / capacity, 1.0)
    return ShardItem(nodeid, group, devices, estimate, share)


def wall_estimate(items: Iterable[ShardItem], devices: int) -> float:
    """max(sum(cost) / devices, longest single estimate): a shard's time on one runner."""
    total = longest = 0.0
    for item in items:
        total += item.cost
        longest = max(longest, item.estimate)
    return max(total / max(devices, 1), longest)


def _groups(items: Sequence[ShardItem]) -> list[tuple[float, str, list[ShardItem]]]:
    """(cost, key, items) per group, most costly first, ties by key: the LPT order."""
    by_key: dict[str, list[ShardItem]] = {}
    for item in items:
        by_key.setdefault(item.key, []).append(item)
    groups = [
        (sum(i.cost for i in members), key, sorted(members, key=lambda i: i.nodeid))
        for key, members in by_key.items()
    ]
    groups.sort(key=lambda g: (-g[0], g[1]))
    return groups


def assign(items: Sequence[ShardItem], shards: int) -> list[list[ShardItem]]:
    """LPT: each group, most costly first, to the least loaded shard; deterministic on ties.

    A shard's items are sorted by node id, so a shuffled input gives the same shards.
    Equal loads go to the shard with fewer tests (spreads zero-cost tests), then the lower number.
    """
    if shards < 1:
        raise DevpoolError(f"cannot split a suite into {shards} shards: need at least 1")
    result: list[list[ShardItem]] = [[] for _ in range(shards)]
    heap = [(0.0, 0, index) for index in range(shards)]
    for cost, _key, members in _groups(items):
        load, count, index = heapq.heappop(heap)
        result[index].extend(members)
        heapq.heappush(heap, (load + cost, count + len(members), index))
    for shard in result:
        shard.sort(key=lambda i: i.nodeid)
    return result


def shards_for_budget(items: Sequence[ShardItem], budget_s: float, devices_per_runner: int) -> int:
    """The fewest shards whose slowest wall estimate fits the budget; error if a group cannot."""
    groups = _groups(items)
    for _cost, key, members in groups:
        alone = wall_estimate(members, devices_per_runner)
        if alone > budget_s:
            raise DevpoolError(
                f"{key} needs {alone:,.0f} s alone on {devices_per_runner} devices; "
                f"the budget is {budget_s:,.0f} s"
            )
    if not groups:
        return 1
    total = sum(cost for cost, _, _ in groups)
    shards = max(1, math.ceil(total / devices_per_runner / budget_s))
    # Each group fits alone, so one shard per group always fits: the loop ends.
    while True:
        split = assign(items, shards)
        if max(wall_estimate(s, devices_per_runner) for s in split) <= budget_s:
            return shards
        shards += 1


_SHARD_RE = re.compile(r"\s*(\d+)\s*/\s*(\d+)\s*")


def parse_shard(text: str) -> tuple[int, int]:
    """'2/4' -> (2, 4): shard K of N, K in 1..N."""
    match = _SHARD_RE.fullmatch(text)
    if match is None:
        raise DevpoolError(f"--devpool-shard {text!r} is not K/N, e.g. 2/4 for shard 2 of 4")
    k, n = int(match[1]), int(match[2])
    if n < 1:
        raise DevpoolError(f"--devpool-shard {text!r} has no shards: N must be 1 or more")
    if not 1 <= k <= n:
        raise DevpoolError(f"--devpool-shard {text!r} is out of range: K must be 1..{n}")
    return k, n


_NUMBER = r"(\d+(?:\.\d*)?|\.\d+)"
_BUDGET_RE = re.compile(
    rf"(?:{_NUMBER}\s*h)?\s*(?:{_NUMBER}\s*m)?\s*(?:{_NUMBER}\s*s)?", re.IGNORECASE
)


def parse_budget(text: str) -> float:
    """'45m', '1h30m', '90s', '2700' -> seconds."""
    stripped = text.strip()
    seconds: float | None = None
    if re.fullmatch(_NUMBER, stripped):
        seconds = float(stripped)
    elif stripped and (match := _BUDGET_RE.fullmatch(stripped)) is not None:
        hours, minutes, secs = (float(part) if part else 0.0 for part in match.groups())
        seconds = hours * 3600 + minutes * 60 + secs
    if seconds is None:
        raise DevpoolError(f"budget {text!r} is not a duration like 45m, 1h30m or 90s")
    if seconds <= 0:
        raise DevpoolError(f"budget {text!r} leaves no time: give a duration above 0, like 45m")
    return seconds


@dataclass(frozen=True)
class Split:
    """The whole split of one suite into shards, and the fingerprints that identify it."""

    shards: tuple[tuple[str, ...], ...]  # node ids of shard 1..n, each sorted
    fingerprint: str  # every test id → shard number, and the cost snapshot
    costs: str  # the cost snapshot alone: each test's group, devices and estimate

    def members(self, k: int) -> set[str]:
        """The node ids of shard k (1-based)."""
        return set(self.shards[k - 1])


def _digest(data: object) -> str:
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def split_suite(nodeids_in_order: Sequence[str], items: Sequence[ShardItem], n: int) -> Split:
    """The split of the tests collected in this session into n shards, with fingerprints.

    Items of tests not collected are left out before splitting; a collected test with no
    item counts as a CPU test of DEFAULT_ESTIMATE seconds on its own.
    """
    collected = set(nodeids_in_order)
    known = {item.nodeid: item for item in items if item.nodeid in collected}
    chosen = list(known.values())
    chosen += [
        ShardItem(nodeid, nodeid, 0, DEFAULT_ESTIMATE)
        for nodeid in dict.fromkeys(nodeids_in_order)
        if nodeid not in known
    ]
    shards = tuple(tuple(item.nodeid for item in shard) for shard in assign(chosen, n))
    # repr() of a float is exact and stable: equal snapshots hash alike on every runner.
    costs = _digest(sorted(_cost_key(i) for i in chosen))
    assignment = sorted((nodeid, k) for k, shard in enumerate(shards, 1) for nodeid in shard)
    return Split(shards, _digest({"shards": n, "tests": assignment, "costs": costs}), costs)


def _cost_key(item: ShardItem) -> tuple[str | int, ...]:
    # A whole-device item hashes as before shares existed: old fingerprints stay valid.
    key: tuple[str | int, ...] = (item.nodeid, item.group, item.device_count, repr(item.estimate))
    return key if item.share == 1.0 else (*key, repr(item.share))


def select(nodeids_in_order: Sequence[str], items: Sequence[ShardItem], k: int, n: int) -> set[str]:
    """The node ids of shard k (1-based) of n, among the tests collected in this session."""
    if not 1 <= k <= n:
        raise DevpoolError(f"--devpool-shard '{k}/{n}' is out of range: K must be 1..{n}")
    return split_suite(nodeids_in_order, items, n).members(k)


class SplitStamp:
    """A run listener: right after session_start, writes the `shard` event into the record.

    The event holds the whole split and its fingerprint (for `devpool shard verify`) and
    this shard's tests that a later selection (`-k`, `-m`) dropped, so they are not missing.
    """

    def __init__(
        self,
        k: int,
        split: Split,
        emit: Callable[..., None],
        final: Callable[[], Collection[str]],
        **extra: object,
    ) -> None:
        self.k = k
        self.split = split
        self.emit = emit
        self.final = final
        self.extra = extra

    def event(self, event_type: str, fields: Mapping[str, Any]) -> None:
        """On session_start, emit the shard event (once)."""
        if event_type != "session_start":
            return
        n = len(self.split.shards)
        final = set(self.final())
        self.emit(
            "shard",
            shard=f"{self.k}/{n}",
            k=self.k,
            n=n,
            fingerprint=self.split.fingerprint,
            costs=self.split.costs,
            tests=sum(len(shard) for shard in self.split.shards),
            split=[list(shard) for shard in self.split.shards],
            deselected=sorted(self.split.members(self.k) - final),
            **self.extra,
        )
