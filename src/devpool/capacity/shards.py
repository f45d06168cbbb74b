"""Split a suite across CI runners: longest-processing-time first on estimated device-seconds.

A test costs max(device_count, 1) × estimate device-seconds (a CPU test costs its seconds).
A device_memory test holds only part of each device, so where the platform's memory is
configured ([tool.devpool.platforms] memory, less memory-reserve) it costs that much times
its share of a device, declared / capacity: sixteen 5 GiB tests on 80 GiB cards run side by
side on one device, and a shard of them charged as whole-device tests would get too little
work while the shards of whole-device tests got too much. The capacity comes from the
configuration only, never from a device query (NVML), so every runner, and a CI planner
with no accelerator, computes the same costs.
A once-fixture ([tool.devpool.once]) is set up by every shard with a test that uses it
(each CI job sets up its own), holding its devices meanwhile: such a shard pays
max(device_count, 1) × its setup's estimate once (the history's setup seconds, else the
default estimate), whatever the number of its users there.
Tests with the same group stay in one shard; groups go, most costly first (ties by group
name), to the shard whose cost after it is least, counting the setups it would be the
first there to need, ties broken by fewer tests and then shard number, so every runner
that computes the split from the same tests and the same history gets the same shards.
(Shard membership follows the estimates: runners must share one history file.) The
groups whose tests share once-fixtures go as one where that costs no more than every
shard paying those setups: the users of a costly once-fixture gather rather than each
shard paying for it (_units).

The split is a pure function of the collected tests, their requests and a cost snapshot
(the estimates of the history as it was before the run: a shard run writes its own
durations to a pending per-run file, see history/durations.py). Its fingerprint hashes every test
id → shard assignment together with the costs, and every shard writes it into its run
record, so `devpool shard verify` can prove afterwards that the shards of one CI run
split alike and ran every test exactly once (see shardcheck.py).

The wall estimate of a shard on a runner with D devices is
max((sum of its costs + its setups) / D, its longest single test after the setups of its
once-fixtures): the work spread perfectly over the runner's devices, but never shorter
than the one test that cannot be split, which waits for its once-fixtures to be up.
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
from devpool.plan.once import OnceFixture, setup_estimate


@dataclass(frozen=True)
class ShardItem:
    """One test as sharding sees it: its group, its devices and its estimated seconds."""

    nodeid: str
    group: str  # tests sharing a non-empty group stay in one shard; "" = the test alone
    device_count: int
    estimate: float  # seconds
    share: float = 1.0  # of each device it holds: declared memory / capacity, else 1 (whole)
    once: tuple[str, ...] = ()  # the once-fixtures it uses, sorted

    @property
    def cost(self) -> float:
        """Device-seconds: max(device_count, 1) × share × estimate (a CPU test: its seconds)."""
        return max(self.device_count, 1) * self.share * self.estimate

    @property
    def key(self) -> str:
        """The group this item moves with: its group, or its own node id."""
        return self.group or self.nodeid


@dataclass(frozen=True)
class OnceSetup:
    """A once-fixture as sharding sees it: each shard with a user of it sets it up once."""

    name: str
    device_count: int
    seconds: float  # its setup's estimate

    @property
    def cost(self) -> float:
        """Device-seconds of one setup: max(device_count, 1) × seconds."""
        return max(self.device_count, 1) * self.seconds


Setups = Mapping[str, OnceSetup]  # by fixture name
NO_SETUPS: Setups = {}


def once_setups(
    fixtures: Iterable[OnceFixture],
    platform: str,
    kind: str,
    estimates: Mapping[str, float],
    default: float,
) -> dict[str, OnceSetup]:
    """The setups a shard may pay, by name: of the fixtures that run once on this platform
    (elsewhere each is an ordinary fixture, in its tests' time), estimated as capacity does."""
    return {
        f.name: OnceSetup(
            f.name, f.request.device_count, setup_estimate(f.name, estimates, default)
        )
        for f in fixtures
        if f.runs_on(platform, kind)
    }


def paid(items: Iterable[ShardItem], setups: Setups) -> list[OnceSetup]:
    """The setups a shard of these items pays: each once-fixture one of them uses, once."""
    return [setups[name] for name in sorted({n for i in items for n in i.once if n in setups})]


def shard_cost(items: Iterable[ShardItem], setups: Setups = NO_SETUPS) -> float:
    """A shard's device-seconds: its tests' costs and the setups it pays."""
    items = list(items)
    # fsum: exact whatever the order, so runners that collected in another order agree.
    return math.fsum(item.cost for item in items) + math.fsum(s.cost for s in paid(items, setups))


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
    once: Iterable[str] = (),
) -> ShardItem:
    """The one rule both `devpool shard` and `pytest --devpool-shard` use to make items.

    Group: the module path with by_module, else the test alone. A multi-node test counts
    the devices of all its nodes. capacity: shard_capacity() of the platform. once: the
    once-fixtures the test uses.
    """
    group = nodeid.split("::", 1)[0] if by_module else nodeid
    devices = request.device_count * request.nodes
    share = 1.0
    if capacity and devices and request.device_memory is not None:
        share = min(request.device_memory / capacity, 1.0)
    return ShardItem(nodeid, group, devices, estimate, share, tuple(sorted(set(once))))


def wall_estimate(items: Iterable[ShardItem], devices: int, setups: Setups = NO_SETUPS) -> float:
    """max(shard_cost / devices, longest single estimate after its once-fixtures' setups):
    a shard's time on one runner."""
    items = list(items)
    longest = 0.0
    for item in items:
        ahead = max((setups[n].seconds for n in item.once if n in setups), default=0.0)
        longest = max(longest, ahead + item.estimate)
    return max(shard_cost(items, setups) / max(devices, 1), longest)


def _groups(items: Sequence[ShardItem]) -> list[tuple[float, str, list[ShardItem]]]:
    """(cost, key, items) per group, most costly first, ties by key: the LPT order."""
    by_key: dict[str, list[ShardItem]] = {}
    for item in items:
        by_key.setdefault(item.key, []).append(item)
    groups = [
        (math.fsum(i.cost for i in members), key, sorted(members, key=lambda i: i.nodeid))
        for key, members in by_key.items()
    ]
    groups.sort(key=lambda g: (-g[0], g[1]))
    return groups


def assign(
    items: Sequence[ShardItem], shards: int, setups: Setups = NO_SETUPS
) -> list[list[ShardItem]]:
    """LPT: each group, most costly first, to the shard whose load after it is least (with
    the setups it would be the first there to need); deterministic on ties.

    A shard's items are sorted by node id, so a shuffled input gives the same shards.
    Equal loads go to the shard with fewer tests (spreads zero-cost tests), then the lower number.
    """
    if shards < 1:
        raise DevpoolError(f"cannot split a suite into {shards} shards: need at least 1")
    result: list[list[ShardItem]] = [[] for _ in range(shards)]
    loads, counts = [0.0] * shards, [0] * shards
    paying: list[set[str]] = [set() for _ in range(shards)]
    # The least loaded shard, for a group with no once-fixture; an entry whose shard has
    # taken a group since is stale (its count grew) and is dropped when it comes up.
    heap = [(0.0, 0, index) for index in range(shards)]
    for cost, _key, members in _units(items, shards, setups):
        used = paid(members, setups)
        if used:
            extra = [_new_setups(used, paying[i]) for i in range(shards)]
            index = min(range(shards), key=lambda i: (loads[i] + extra[i], counts[i], i))
        else:
            while heap[0][:2] != (loads[heap[0][2]], counts[heap[0][2]]):
                heapq.heappop(heap)
            index = heap[0][2]
        result[index].extend(members)
        loads[index] += cost + _new_setups(used, paying[index])
        counts[index] += len(members)
        paying[index].update(setup.name for setup in used)
        heapq.heappush(heap, (loads[index], counts[index], index))
    for shard in result:
        shard.sort(key=lambda i: i.nodeid)
    return result


def _units(
    items: Sequence[ShardItem], shards: int, setups: Setups
) -> list[tuple[float, str, list[ShardItem]]]:
    """What assign places, in LPT order: the groups, but the users of a once-fixture go as
    one where that costs no more, with the setups they need, than a shard's share of the
    suite if every shard paid them (where the rule alone would spread them and each shard
    pay). Fixtures are taken costliest setup first, each on its own: a cheap one most tests
    use does not tie the users of a costly one to everything else. Ordered by cost with the
    setups a unit needs, ties by key."""
    groups = _groups(items)
    if not paid(items, setups):
        return groups  # the plain LPT order, so splits without once-fixtures stay as they were
    linked = list(range(len(groups)))  # union-find over groups, through their once-fixtures

    def root(index: int) -> int:
        while linked[index] != index:
            index = linked[index]
        return index

    users: dict[str, list[int]] = {}
    for index, (_cost, _key, members) in enumerate(groups):
        for setup in paid(members, setups):
            users.setdefault(setup.name, []).append(index)
    total = shard_cost(items, setups)
    for name in sorted(users, key=lambda n: (-setups[n].cost, n)):
        tops = sorted({root(index) for index in users[name]})
        joined = [m for i, group in enumerate(groups) if root(i) in tops for m in group[2]]
        together = shard_cost(joined, setups)
        spread = (total + (shards - 1) * (together - shard_cost(joined))) / shards
        if together <= spread:  # each shard paying its setups would cost more
            for top in tops[1:]:
                linked[top] = tops[0]
    units: dict[int, tuple[float, str, list[ShardItem]]] = {}
    for index, (cost, key, members) in enumerate(groups):
        top = root(index)
        found = units.get(top)
        units[top] = (
            (cost, key, members)
            if found is None
            else (found[0] + cost, min(found[1], key), found[2] + members)
        )
    placed = [(cost, key, sorted(members, key=lambda i: i.nodeid))
              for cost, key, members in units.values()]  # fmt: skip
    placed.sort(key=lambda unit: (-shard_cost(unit[2], setups), unit[1]))
    return placed


def _new_setups(used: Sequence[OnceSetup], paying: Collection[str]) -> float:
    """Device-seconds of the setups among `used` that a shard paying for `paying` lacks."""
    return math.fsum(setup.cost for setup in used if setup.name not in paying)


def shards_for_budget(
    items: Sequence[ShardItem],
    budget_s: float,
    devices_per_runner: int,
    setups: Setups = NO_SETUPS,
) -> int:
    """The fewest shards whose slowest wall estimate fits the budget; error if a group cannot.
    At most a shard per group: should users of a once-fixture that go together (_units) not
    fit even then, that count (the wall `devpool shard` shows for their shard is then over)."""
    groups = _groups(items)
    for _cost, key, members in groups:
        alone = wall_estimate(members, devices_per_runner, setups)
        if alone > budget_s:
            raise DevpoolError(
                f"{key} needs {alone:,.0f} s alone on {devices_per_runner} devices; "
                f"the budget is {budget_s:,.0f} s"
            )
    if not groups:
        return 1
    total = shard_cost(items, setups)  # every setup paid once at least
    shards = max(1, math.ceil(total / devices_per_runner / budget_s))
    # Each group fits alone, and with a shard per group each gets one of its own (an empty
    # shard is never costlier to join), unless users of a once-fixture go together (_units):
    # should that not fit, a shard per group is the answer, its slowest near the budget.
    while shards < len(groups):
        split = assign(items, shards, setups)
        if max(wall_estimate(s, devices_per_runner, setups) for s in split) <= budget_s:
            return shards
        shards += 1
    return shards


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
    costs: str  # the cost snapshot alone: each test's group, devices, estimate, once-fixtures
    # and the setups of those

    def members(self, k: int) -> set[str]:
        """The node ids of shard k (1-based)."""
        return set(self.shards[k - 1])


def _digest(data: object) -> str:
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def split_suite(
    nodeids_in_order: Sequence[str],
    items: Sequence[ShardItem],
    n: int,
    setups: Setups = NO_SETUPS,
) -> Split:
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
    shards = tuple(tuple(item.nodeid for item in shard) for shard in assign(chosen, n, setups))
    # repr() of a float is exact and stable: equal snapshots hash alike on every runner.
    tests = sorted(_cost_key(i, setups) for i in chosen)
    used = [(s.name, s.device_count, repr(s.seconds)) for s in paid(chosen, setups)]
    costs = _digest({"tests": tests, "once": used} if used else tests)
    assignment = sorted((nodeid, k) for k, shard in enumerate(shards, 1) for nodeid in shard)
    return Split(shards, _digest({"shards": n, "tests": assignment, "costs": costs}), costs)


def _cost_key(item: ShardItem, setups: Setups) -> tuple[str | int, ...]:
    # A whole-device item hashes as before shares existed, one that uses no once-fixture as
    # before those were counted: old fingerprints stay valid.
    key: tuple[str | int, ...] = (item.nodeid, item.group, item.device_count, repr(item.estimate))
    key = key if item.share == 1.0 else (*key, repr(item.share))
    once = tuple(name for name in item.once if name in setups)
    return (*key, "once", *once) if once else key


def select(
    nodeids_in_order: Sequence[str],
    items: Sequence[ShardItem],
    k: int,
    n: int,
    setups: Setups = NO_SETUPS,
) -> set[str]:
    """The node ids of shard k (1-based) of n, among the tests collected in this session."""
    if not 1 <= k <= n:
        raise DevpoolError(f"--devpool-shard '{k}/{n}' is out of range: K must be 1..{n}")
    return split_suite(nodeids_in_order, items, n, setups).members(k)


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
