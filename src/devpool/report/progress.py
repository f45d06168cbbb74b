"""Live status on a terminal, one line: done, queued, devices busy, tests running now.

Only on an interactive terminal outside CI: a CI log gets no redraws, so no flicker.
pytest's own terminal output is routed through the live console so the two never
overwrite each other.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

REFRESH = 0.25  # seconds between redraws


@dataclass(frozen=True)
class RunningJob:
    nodeid: str
    where: str
    elapsed: float


@dataclass(frozen=True)
class Snapshot:
    """What the controller's loop knows at one moment."""

    devices_total: int
    devices_busy: int
    queued: int
    running: Sequence[RunningJob]
    done: int
    waiting_on: str = ""  # who holds the devices we wait for, when another run does
    counts: Mapping[str, int] = field(default_factory=dict)  # as pytest's closing line


def wanted(config_option: Any, environ: Mapping[str, str] | None = None) -> bool:
    """Live status only on a real terminal: never in CI, piped, or with -qq."""
    env = os.environ if environ is None else environ
    if env.get("CI", "").lower() not in ("", "0", "false") or env.get("GITHUB_ACTIONS"):
        return False
    if env.get("TERM") == "dumb":
        return False
    if getattr(config_option, "verbose", 0) < -1:
        return False
    return sys.stdout.isatty()


SHOWN_RUNNING = 2  # tests named in the line, the longest-running first


def line(snapshot: Snapshot) -> str:
    """The one status line: the counts first (done, queued, devices busy), then what runs
    now and who blocks us, so a narrow terminal cuts the names, never the counts."""
    longest = sorted(snapshot.running, key=lambda j: -j.elapsed)
    named = [f"{job.nodeid} {job.elapsed:.0f}s [{job.where}]" for job in longest[:SHOWN_RUNNING]]
    if len(longest) > SHOWN_RUNNING:
        named.append(f"+{len(longest) - SHOWN_RUNNING} more")
    running = f"running {len(longest)}" + (f": {', '.join(named)}" if named else "")
    counts = ", ".join(f"{n} {k}" for k, n in snapshot.counts.items() if n)
    parts = [
        f"done {snapshot.done}" + (f" ({counts})" if counts else ""),
        f"queued {snapshot.queued}",
        f"devices {snapshot.devices_busy}/{snapshot.devices_total} busy",
        running,
    ]
    if snapshot.waiting_on:
        parts.append(f"waiting for {snapshot.waiting_on}")
    return "devpool: " + " · ".join(parts)


def render(snapshot: Snapshot) -> Any:
    """The live status as a rich renderable: one line, cut to the terminal's width."""
    from rich.table import Table
    from rich.text import Text

    grid = Table.grid()  # a column holds its cell to one line (a bare Text would wrap)
    grid.add_column(no_wrap=True, overflow="ellipsis")
    grid.add_row(Text(line(snapshot)))  # Text: "[sim:0]" is no markup
    return grid


class LiveProgress:
    """A rich Live display fed by snapshots from the controller's event loop."""

    def __init__(self, terminal_writer: Any) -> None:
        from rich.console import Console
        from rich.live import Live

        self._tw = terminal_writer
        self._original = terminal_writer._file
        console = Console(file=self._original)
        self._live = Live(console=console, auto_refresh=False, transient=True)
        self._proxy = _LineProxy(console)
        self._last = 0.0

    def __enter__(self) -> LiveProgress:
        self._live.start()
        self._tw._file = self._proxy  # pytest's lines go above the live panel
        return self

    def update(self, snapshot: Snapshot, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._last >= REFRESH:
            self._last = now
            self._live.update(render(snapshot), refresh=True)

    def pause(self) -> None:
        """The terminal is lent to a debugger's prompt: the panel goes, pytest's lines so far
        (a partial line of progress letters too) are written out."""
        self._live.stop()
        self._tw._file = self._original
        self._original.write(self._proxy.pending)
        self._proxy.pending = ""
        self._original.flush()

    def resume(self) -> None:
        self._live.start()
        self._tw._file = self._proxy

    def __exit__(self, *exc: object) -> None:
        self._live.stop()
        self._tw._file = self._original
        self._original.write(self._proxy.pending)
        self._original.flush()


class _LineProxy:
    """pytest's terminal file while the panel is live: whole lines go above the panel."""

    def __init__(self, console: Any) -> None:
        self._console = console
        self.pending = ""

    def write(self, text: str) -> int:
        from rich.text import Text

        self.pending += text
        *lines, self.pending = self.pending.split("\n")
        for line in lines:
            self._console.print(Text.from_ansi(line))
        return len(text)

    def flush(self) -> None:
        """Partial lines (progress dots) wait for their newline; the panel shows progress."""

    def isatty(self) -> bool:
        return True
