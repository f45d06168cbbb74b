"""Words in what devpool prints: counts ('1 device', '2 devices', never '1 devices'),
durations, how a process ended."""

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


def duration(seconds: float) -> str:
    """A span of time as every view says it: '2.00 s', '12.3 s', '4 m 05 s', '2 h 03 m'."""
    if seconds < 10:
        return f"{seconds:.2f} s"
    if seconds < 120:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes} m {rest:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} m"


def ago(moment: float | None, now: float) -> str:
    """How long before now a moment was, as duration() says it ("" for none)."""
    if not moment:
        return ""
    return duration(max(0.0, now - moment))
