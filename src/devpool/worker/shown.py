"""What pytest writes to the terminal mid-test (--setup-show's SETUP and TEARDOWN lines and
the test's own line), carried to the controller's terminal.

pytest writes them through `config.get_terminal_writer()`. A worker's terminal is its log,
so under --setup-show, --setup-only or --setup-plan that writer is swapped for one whose
text goes, as it is flushed, to the controller as `shown` events, in order with the
reports: the controller writes them where plain pytest would have.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TextIO, cast

import pytest
from _pytest._io.terminalwriter import TerminalWriter


class _Sink:
    """A text file whose flushed writes go to a callback."""

    def __init__(self, tell: Callable[[str], None]) -> None:
        self._tell = tell
        self._text: list[str] = []

    def write(self, text: str) -> int:
        self._text.append(text)
        return len(text)

    def flush(self) -> None:
        if self._text:
            text, self._text = "".join(self._text), []
            self._tell(text)

    def isatty(self) -> bool:
        return False


def carry(config: pytest.Config, tell: Callable[[str], None]) -> None:
    """Under --setup-show (and the options that imply it), what pytest writes through
    config.get_terminal_writer() goes to `tell`; otherwise nothing changes."""
    if not config.getoption("setupshow", False):
        return
    writer = TerminalWriter(cast(TextIO, _Sink(tell)))
    original: Any = config.get_terminal_writer
    try:
        shown = original()
    except (AssertionError, AttributeError):  # no terminal reporter: pytest's defaults
        shown = None
    if shown is not None:  # assertion diffs use its highlighting: keep the worker's settings
        writer.hasmarkup = shown.hasmarkup
        writer.code_highlight = shown.code_highlight
        writer.fullwidth = shown.fullwidth
    config.get_terminal_writer = lambda: writer  # type: ignore[method-assign]
