"""A fleet's class mix for `devpool capacity --classes` and `devpool shard --classes`.

A class is a platform the fleet has runners of (h100, h200, …). Each class runs the tests
its platform admits (those whose platforms filter names it or its kind, and those without a
filter); each test's device-hours are estimated from the durations measured on that class's
platform first (history.estimates(platform=…)).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from devpool.capacity.collect import CollectedTest
from devpool.devices.inventory import Platform
from devpool.errors import DevpoolError
from devpool.wording import counted


def parse_mix(text: str, platforms: Mapping[str, Platform]) -> list[str]:
    """--classes h100,h200: known platform names; one sentence otherwise."""
    names = list(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    if not names:
        raise DevpoolError("--classes needs platform names, comma-separated (e.g. h100,h200)")
    unknown = [n for n in names if n not in platforms]
    if unknown:
        raise DevpoolError(
            f"--classes names unknown platform {unknown[0]!r}; known: "
            f"{', '.join(sorted(platforms))} (add others under [tool.devpool.platforms])"
        )
    return names


def admits(test: CollectedTest, platform: Platform) -> bool:
    """Whether a run on this platform runs the test (as its platforms filter says)."""
    return test.platforms is None or bool({platform.name, platform.kind} & set(test.platforms))


@dataclass(frozen=True)
class ClassRow:
    """One class of the mix: the tests it runs, those only it runs, and their device-hours."""

    platform: str
    tests: int
    own: int  # tests whose platforms filter admits this class (no filter: any class)
    device_hours: float
    at_default: int  # tests without a duration in the history

    def to_json(self) -> dict[str, object]:
        return {
            "platform": self.platform,
            "tests": self.tests,
            "own_tests": self.own,
            "device_hours": round(self.device_hours, 4),
            "estimates_at_default": self.at_default,
        }


def class_rows(
    tests: Sequence[CollectedTest],
    mix: Sequence[str],
    platforms: Mapping[str, Platform],
    estimates_of: Callable[[str], Mapping[str, float]],
    default: float,
) -> tuple[list[ClassRow], list[str]]:
    """A row per class of the mix, and the tests no class of it runs."""
    rows = []
    for name in mix:
        platform = platforms[name]
        estimates = estimates_of(name)
        mine = [t for t in tests if admits(t, platform) and not t.disabled]
        seconds = sum(
            estimates.get(t.nodeid, default) * max(1, t.device_count * t.nodes)
            for t in mine
            if t.device_count
        )
        rows.append(
            ClassRow(
                name,
                len(mine),
                sum(1 for t in mine if t.platforms is not None),
                seconds / 3600,
                sum(1 for t in mine if t.nodeid not in estimates),
            )
        )
    left = [
        t.nodeid
        for t in tests
        if not t.disabled and not any(admits(t, platforms[name]) for name in mix)
    ]
    return rows, left


def render(rows: Sequence[ClassRow], left: Sequence[str], fmt: str) -> str:
    """The class mix as text, Markdown or JSON."""
    if fmt == "json":
        data = {
            "schema": "devpool-capacity-classes/1",
            "classes": [row.to_json() for row in rows],
            "uncovered": list(left),
        }
        return json.dumps(data, indent=2) + "\n"
    head = ("class", "tests", "its own", "device-hours", "at default")
    body = [
        (r.platform, str(r.tests), str(r.own), f"{r.device_hours:,.2f}", str(r.at_default))
        for r in rows
    ]
    if fmt == "markdown":
        lines = ["| " + " | ".join(head) + " |", "| --- |" + " ---: |" * (len(head) - 1)]
        lines += ["| " + " | ".join(row) + " |" for row in body]
    else:
        widths = [max(len(c) for c in col) for col in zip(head, *body, strict=True)]
        lines = [
            "  ".join(
                c.rjust(w) if i else c.ljust(w)
                for i, (c, w) in enumerate(zip(r, widths, strict=True))
            )
            for r in [head, *body]
        ]
        lines.insert(0, "devpool capacity by class: device-hours of the tests each class runs "
                     "(tests without a platforms filter run on any class)")  # fmt: skip
    if left:
        lines.append(
            f"{counted(len(left), 'test')} no class of the mix runs (e.g. {left[0]}): a run "
            "of these classes leaves them out"
        )
    return "\n".join(lines) + "\n"
