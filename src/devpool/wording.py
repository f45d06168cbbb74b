"""Words for counts in what devpool prints: '1 device', '2 devices', never '1 devices'."""

from __future__ import annotations


def counted(number: int, word: str, many: str | None = None) -> str:
    """'1 device', '3 devices'; `many` for a plural that is not word + 's'."""
    return f"{number} {word if number == 1 else (many or word + 's')}"
