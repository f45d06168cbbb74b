"""Once-fixtures in the run record (`once_start`, `once_setup`, `once_teardown`,
`once_lost`, written by run/once.py): one OnceRun per fixture, its line in the reports, and
its lease in the devices' utilisation.

The record's reader (record.py) keeps jobs and leaks; these few lines are read here, from
the same file, by the summary that shows them."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devpool.devices.inventory import format_ids


@dataclass
class OnceRun:
    """One once-fixture of the run: where it ran, how its setup and teardown went."""

    fixture: str
    devices: list[int] = field(default_factory=list)
    ports: list[int] = field(default_factory=list)
    start: float | None = None  # its lease taken, its process started
    end: float | None = None  # torn down, or lost
    outcome: str = ""  # of its setup: value, error, skip ("": it never said)
    setup: float = 0.0
    teardown: float | None = None
    text: str = ""  # its setup's error or skip, one line
    error: bool = False  # its teardown raised
    lost: str = ""  # why its process died before its teardown

    def line(self, platform: str) -> str:
        """`server: set up in 3.02s on sim:3, port 21946, torn down in 0.41s`."""
        where = f"{platform}:{format_ids(self.devices)}" if self.devices else "cpu"
        if self.ports:
            where += ", port" + ("s " if len(self.ports) > 1 else " ")
            where += ",".join(map(str, self.ports))
        setup = {"value": "set up", "error": "setup failed", "skip": "setup skipped"}
        told = f"{self.fixture}: {setup.get(self.outcome, 'not set up')}"
        if self.outcome:
            told += f" in {self.setup:.2f}s"
        told += f" on {where}" + (f" ({self.text})" if self.text else "")
        if self.lost:
            return f"{told}; lost: {self.lost}"
        if self.teardown is not None:
            error = " with an error" if self.error else ""
            told += f", torn down in {self.teardown:.2f}s{error}"
        return told

    def held(self, last_time: float) -> float:
        """Seconds its lease was held."""
        if self.start is None:
            return 0.0
        return max(0.0, (self.end if self.end is not None else last_time) - self.start)


def apply(onces: list[OnceRun], event: Mapping[str, Any]) -> None:
    """One once_* line of the record into its fixture's OnceRun."""
    name = str(event.get("fixture", "?"))
    run = next((o for o in onces if o.fixture == name and o.end is None), None)
    if run is None:
        run = OnceRun(name)
        onces.append(run)
    kind, at = event["type"], float(event.get("time", 0.0))
    if "devices" in event:
        run.devices = [int(d) for d in event["devices"]]
    if "ports" in event:
        run.ports = [int(p) for p in event["ports"]]
    if kind == "once_start":
        run.start = at
    elif kind == "once_setup":
        run.outcome, run.setup = str(event.get("outcome", "")), float(event.get("seconds", 0))
        run.text = str(event.get("text", ""))
        run.start = run.start if run.start is not None else at - run.setup
    elif kind == "once_teardown":
        run.teardown, run.end = float(event.get("seconds", 0.0)), at
        run.error = bool(event.get("error", False))
    elif kind == "once_lost":
        run.lost, run.end = str(event.get("why", "")), at


def onces_of(path: Path) -> list[OnceRun]:
    """The once-fixtures a record names, in the order they started ([]: none, or no file)."""
    onces: list[OnceRun] = []
    try:
        with path.open("rb") as lines:
            for line in lines:
                if b'"once_' not in line:
                    continue  # most lines: no JSON parse
                try:
                    event = json.loads(line)
                except ValueError:
                    continue  # a cut last line: the record's reader says so
                if isinstance(event, dict) and str(event.get("type", "")).startswith("once_"):
                    apply(onces, event)
    except OSError:
        return []
    return onces
