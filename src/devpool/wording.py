"""Words for counts in what devpool prints: '1 device', '2 devices', never '1 devices'."""

from __future__ import annotations

import signal


def counted(number: int, word: str, many: str | None = None) -> str:
    """'1 device', '3 devices'; `many` for a plural that is not word + 's'."""
    return f"{number} {word if number == 1 else (many or word + 's')}"


def describe_exit(code: int | None) -> str:
    """'exited with code 1', 'was killed by SIGKILL (signal 9)', or 'vanished'."""
    if code is None:
        return "vanished"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name} (signal {-code})"
    return f"exited with code {code}"
