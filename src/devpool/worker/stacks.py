"""Stacks a timed-out test's worker dumped (faulthandler), made readable for a person.

A dump lists some 30 frames of pytest, pluggy and devpool's worker under the two or three
frames that matter: the test's own, with the line it hung on. Those runs of machinery
frames fold into one line, each kept frame gets its source line, and the thread that ran
the test comes last, so the tail of a log (what the summary shows) ends on the test.
"""

from __future__ import annotations

import linecache
import os
import re
from pathlib import Path, PurePath

_THREAD = re.compile(r"^(?P<current>Current thread|Thread) 0x[0-9a-fA-F]+")
_FRAME = re.compile(r'^\s+File "(?P<path>[^"]*)", line (?P<line>\d+) in (?P<name>.*)$')
_OWN = str(Path(__file__).resolve().parents[1]) + os.sep  # devpool's own package
_MACHINERY_PARTS = frozenset({"_pytest", "pluggy"})


def readable_stacks(text: str) -> str:
    """The text with every faulthandler thread block folded; other text is left as it is."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if _THREAD.match(line)), None)
    if start is None:
        return text
    blocks: list[tuple[bool, list[str]]] = []
    end = start
    while end < len(lines) and (header := _THREAD.match(lines[end])) is not None:
        title = lines[end]
        end += 1
        body: list[str] = []
        while end < len(lines) and not _THREAD.match(lines[end]) and _in_block(lines[end]):
            body.append(lines[end])
            end += 1
        blocks.append((header.group("current") == "Current thread", [title, *_fold(body)]))
    # The thread that ran the test (the one the signal interrupted) last: the tail shows it.
    blocks.sort(key=lambda block: block[0])
    out = lines[:start]
    for index, (_, block) in enumerate(blocks):
        if index:
            out.append("")
        out += block
    out += lines[end:]
    return "\n".join(out)


def _in_block(line: str) -> bool:
    """A line that belongs to a thread's stack: a frame, a faulthandler note, or a blank."""
    return not line.strip() or line.startswith(" ")


def _fold(body: list[str]) -> list[str]:
    """Machinery frames folded into one line per run; kept frames with their source line."""
    out: list[str] = []
    folded = 0
    for line in body:
        frame = _FRAME.match(line)
        if frame is not None and _machinery(frame.group("path")):
            folded += 1
            continue
        if folded:
            out.append(_folded(folded))
            folded = 0
        if not line.strip():
            continue
        out.append(line)
        if frame is not None:
            source = linecache.getline(frame.group("path"), int(frame.group("line"))).strip()
            if source:
                out.append(f"    {source}")
    if folded:
        out.append(_folded(folded))
    return out


def _folded(count: int) -> str:
    return f"  ({count} frame{'s' if count != 1 else ''} of pytest, pluggy and devpool)"


def _machinery(path: str) -> bool:
    """A frame of the runner itself (pytest, pluggy, devpool, runpy), not of the tests."""
    if path.startswith("<frozen"):
        return True
    pure = PurePath(path)
    if _MACHINERY_PARTS & set(pure.parts):
        return True
    if pure.parent.name == "pytest" and pure.name == "__main__.py":
        return True
    return path.startswith(_OWN)


def stacks_file(log: Path) -> Path:
    """Where a worker's faulthandler writes its stacks when the controller asks (SIGUSR1)."""
    return log.with_suffix(".stacks")
