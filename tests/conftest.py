"""Fixtures shared by devpool's unit and end-to-end tests."""

from __future__ import annotations

from collections.abc import Callable

import pytest

pytest_plugins = ["pytester"]


def _unfenced(lines: list[str]) -> list[str]:
    """The lines GitHub would read as commands: those outside every stop-commands fence."""
    outside: list[str] = []
    token: str | None = None
    for line in lines:
        if token is None:
            if line.startswith("::stop-commands::"):
                token = line[len("::stop-commands::") :]
                assert token, "a stop-commands line needs a token"
            else:
                outside.append(line)
        elif line == f"::{token}::":
            token = None
    assert token is None, "a stop-commands fence was never closed"
    return outside


@pytest.fixture
def unfenced() -> Callable[[list[str]], list[str]]:
    """Lines of a GitHub log that are outside every ::stop-commands:: fence."""
    return _unfenced
