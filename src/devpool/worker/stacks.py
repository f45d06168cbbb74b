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
    """The text with every faulthandler thread block folded (each rank's dump in a rank
    group's, alike); other text is left as it is."""
    lines = text.splitlines()
    out: list[str] = []
    index = 0
    while index < len(lines):
        if _THREAD.match(lines[index]) is None:
            out.append(lines[index])
            index += 1
            continue
        blocks, index = _blocks(lines, index)
        # The thread that ran the test (the one the signal interrupted) last: the tail shows it.
        blocks.sort(key=lambda block: block[0])
        for number, (_, block) in enumerate(blocks):
            if number:
                out.append("")
            out += block
    return "\n".join(out) if out != lines else text


def _blocks(lines: list[str], start: int) -> tuple[list[tuple[bool, list[str]]], int]:
    """One dump's thread blocks from `start`, each folded, and where the dump ends."""
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
    return blocks, end


def _in_block(line: str) -> bool:
    """A line that belongs to a thread's stack: a frame, a faulthandler note, or a blank."""
    return not line.strip() or line.startswith(" ")


def _fold(body: list[str]) -> list[str]:
    """Machinery frames folded into one line per run; kept frames with their source line."""
    out: list[str] = []
    folded = repeated = 0
    last = None
    for line in body:
        frame = _FRAME.match(line)
        if frame is not None and _machinery(frame.group("path")):
            folded += 1
            continue
        if folded:
            out.append(_folded(folded))
            folded = 0
        if frame is not None and line == last:  # recursion: said once, as Python's tracebacks
            repeated += 1
            continue
        if repeated:
            out.append(_repeated(repeated))
            repeated = 0
        last = line if frame is not None else None
        if not line.strip():
            continue
        out.append(line)
        if frame is not None:
            source = linecache.getline(frame.group("path"), int(frame.group("line"))).strip()
            if source:
                out.append(f"    {source}")
    if repeated:
        out.append(_repeated(repeated))
    if folded:
        out.append(_folded(folded))
    return out


def _repeated(count: int) -> str:
    return f"  [the frame above {count} more time{'s' if count != 1 else ''}]"


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
