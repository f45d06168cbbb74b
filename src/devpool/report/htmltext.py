"""Text for the HTML report: one escaping rule for every part of the page, and the few
formats (device ranges, durations) its parts share."""

from __future__ import annotations

import html
import re
from collections.abc import Iterable

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


def ints(values: Iterable[object]) -> list[int]:
    out = []
    for value in values:
        try:
            out.append(int(str(value)))
        except ValueError:
            continue
    return out


def link(href: str, text: str, *, breaks: bool = False) -> str:
    """A link; breaks=True lets a long name (a test's log) wrap after its separators."""
    return f'<a href="{escape(href)}">{breakable(text) if breaks else escape(text)}</a>'
