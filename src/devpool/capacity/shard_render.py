"""`devpool shard`'s split as text and JSON: per shard its tests, device-seconds, wall
estimate and the once-fixture setups it pays, and the command that runs it."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from devpool.capacity.shards import OnceSetup, ShardItem, Split, paid, shard_cost
from devpool.wording import counted

SHARDS_SCHEMA = "devpool-shards/1"


@dataclass(frozen=True)
class ShardedSuite:
    """One platform's split, as `devpool shard` prints it."""

    platform: str
    split: Split
    shards: list[list[ShardItem]]  # shard 1..n, each sorted by node id
    walls: list[float]  # each shard's wall estimate, fixed costs included
    commands: list[str]  # the pytest command that runs each shard
    setups: dict[str, OnceSetup]
    devices: int  # per runner
    budget: float | None
    by_module: bool
    known: int  # tests with an estimate from the history
    default: float  # seconds of a test without one

    @property
    def tests(self) -> int:
        return sum(len(shard) for shard in self.shards)

    def paid(self, shard: Sequence[ShardItem]) -> list[OnceSetup]:
        return paid(shard, self.setups)

    def cost(self, shard: Sequence[ShardItem]) -> float:
        return shard_cost(shard, self.setups)


def render_json(suite: ShardedSuite) -> str:
    count = len(suite.shards)
    data = {
        "schema": SHARDS_SCHEMA,
        "platform": suite.platform,
        "shards": count,
        "devices_per_runner": suite.devices,
        "budget_seconds": suite.budget,
        "by_module": suite.by_module,
        "estimates_from_history": suite.known,
        "estimates_at_default": suite.tests - suite.known,
        "default_estimate": suite.default,
        "fingerprint": suite.split.fingerprint,
        "split": [
            {
                "shard": f"{k}/{count}",
                "tests": [item.nodeid for item in shard],
                "device_seconds": round(suite.cost(shard), 3),
                "wall_seconds": round(wall, 3),
                "once_setups": [
                    {"fixture": s.name, "seconds": s.seconds, "device_seconds": round(s.cost, 3)}
                    for s in suite.paid(shard)
                ],
                "command": command,
            }
            for k, (shard, wall, command) in enumerate(
                zip(suite.shards, suite.walls, suite.commands, strict=True), 1
            )
        ],
    }
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def render_text(suite: ShardedSuite) -> str:
    count, tests = len(suite.shards), suite.tests
    over = f"; budget {suite.budget:,.0f} s" if suite.budget is not None else ""
    lines = [
        f"devpool shard: {counted(tests, 'test')} in {counted(count, 'shard')} on runners "
        f"of {counted(suite.devices, 'device')}"
        f"{over}; estimates: {suite.known} from history, {tests - suite.known} at "
        f"{suite.default:g} s",
        "device-s = devices x share x estimate (a device_memory test: declared / memory where "
        "the platform's memory is set; a CPU test: its seconds); devpool capacity counts "
        "whole devices",
    ]
    if any(suite.paid(shard) for shard in suite.shards):
        lines.append(
            "a shard with a test that uses a once-fixture sets it up once: its device-s and "
            "wall include that setup (devices x setup seconds)"
        )
    lines.append(f"  {'shard':>7}  {'tests':>6}  {'device-s':>10}  {'wall':>10}")
    for k, (shard, wall) in enumerate(zip(suite.shards, suite.walls, strict=True), 1):
        row = f"  {f'{k}/{count}':>7}  {len(shard):>6}  {suite.cost(shard):>10,.1f}  {wall:>10,.1f}"
        setups = ", ".join(f"{s.name} {s.cost:,.1f} device-s" for s in suite.paid(shard))
        lines.append(row + (f"  incl. once-fixture setups: {setups}" if setups else ""))
    lines.append(
        f"split fingerprint {suite.split.fingerprint}: each shard's record carries its own"
    )
    lines.append("commands:")
    lines += [f"  {command}" for command in suite.commands]
    return "\n".join(lines) + "\n"
