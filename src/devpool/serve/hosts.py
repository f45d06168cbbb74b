"""Which addresses and Host headers are loopback: the rule of `devpool serve`'s safety."""

from __future__ import annotations

import ipaddress


def is_loopback(host: str) -> bool:
    """True for localhost and loopback addresses (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def names_loopback(header: str) -> bool:
    """Whether a Host header names loopback: localhost, 127.x.y.z or [::1], any port."""
    host = header.rsplit(":", 1)[0] if not header.endswith("]") else header
    if header.startswith("["):
        host = header[1:].split("]", 1)[0]
    return bool(host) and is_loopback(host)
