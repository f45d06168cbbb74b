"""Text for the HTML report: one escaping rule for every part of the page, and the few
formats (device ranges, durations) its parts share."""

from __future__ import annotations

import html
import re
from collections.abc import Iterable, Sequence

from devpool.report.terminal import strip_ansi

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_SURROGATE = re.compile(r"[\ud800-\udfff]")


def escape(value: object) -> str:
    """Text safe anywhere in the page: ANSI and control codes gone, markup and quotes escaped."""
    text = strip_ansi(str(value)).replace("\r\n", "\n")
    text = _CONTROL.sub("", text)
    # Lone surrogates (from JSON "\udc80") cannot be written as UTF-8; show them as U+FFFD.
    text = _SURROGATE.sub("\ufffd", text)
    return html.escape(text, quote=True)


_BREAKS = re.compile(r"(::|[/\[\].,_-])")


def breakable(value: object) -> str:
    """A node id or path, escaped, that wraps after its separators ('::', '/', '[', '-', '_',
    ...) rather than mid-word: a <wbr> after each (CSS breaks anywhere only if it must)."""
    return _BREAKS.sub(r"\1<wbr>", escape(value))


def ranges(ids: Sequence[int]) -> str:
    """[0, 1, 2, 3, 5] → '0-3,5'."""
    parts: list[str] = []
    ordered = sorted(set(ids))
    index = 0
    while index < len(ordered):
        end = index
        while end + 1 < len(ordered) and ordered[end + 1] == ordered[end] + 1:
            end += 1
        first, last = ordered[index], ordered[end]
        parts.append(str(first) if first == last else f"{first}-{last}")
        index = end + 1
    return ",".join(parts)


def duration(seconds: float) -> str:
    if seconds < 10:
        return f"{seconds:.2f} s"
    if seconds < 120:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes} m {rest:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} m"


def ints(values: Iterable[object]) -> list[int]:
    out = []
    for value in values:
        try:
            out.append(int(str(value)))
        except ValueError:
            continue
    return out
