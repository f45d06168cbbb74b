"""Leased TCP ports: one flock per port in the lock folder, across every run on the host.

A port is ``<lock dir>/port-<p>.lease``, locked exclusively by its holder (and inherited
by its worker), so the kernel frees it when every holder has exited, even under SIGKILL.
A port is handed out only when it is also bindable on 127.0.0.1 and 0.0.0.0 right then,
without SO_REUSEADDR: nothing listens on it and no closed connection lingers on it.

The range comes from ``[tool.devpool] ports`` (default 20000-29999) and must stay clear of
the kernel's ephemeral range, from which every outgoing connection takes its own port.
"""

from __future__ import annotations

import fcntl
import os
import re
import socket
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from devpool.devices.leases import Unusable, _close_all, _Handle, _open_lock_file

DEFAULT_RANGE = (20000, 29999)
EPHEMERAL_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
PORT_NAME = re.compile(r"^port-(?P<port>[1-9][0-9]*)\.lease$")
_RANGE = re.compile(r"^\s*(\d+)\s*-\s*(\d+)\s*$")


def parse_range(value: object) -> tuple[int, int]:
    """'20000-29999' → (20000, 29999); ValueError says what a range looks like."""
    match = _RANGE.match(value) if isinstance(value, str) else None
    if match is None:
        raise ValueError("a range of TCP ports like '20000-29999'")
    low, high = int(match[1]), int(match[2])
    if not 1024 <= low <= high <= 65535:
        raise ValueError("a range of TCP ports within 1024-65535, low first, like '20000-29999'")
    return low, high


def ephemeral_range(path: Path | None = None) -> tuple[int, int] | None:
    """The kernel's ephemeral port range, or None where it cannot be read (not Linux)."""
    path = EPHEMERAL_FILE if path is None else path
    try:
        low, high = path.read_text(encoding="ascii").split()[:2]
        return int(low), int(high)
    except (OSError, ValueError):
        return None


def overlap_error(ports: tuple[int, int], path: Path | None = None) -> str | None:
    """One sentence when the range overlaps the kernel's ephemeral range, else None."""
    path = EPHEMERAL_FILE if path is None else path
    ephemeral = ephemeral_range(path)
    if ephemeral is None or ports[1] < ephemeral[0] or ports[0] > ephemeral[1]:
        return None
    return (
        f"ports range {ports[0]}-{ports[1]} ([tool.devpool] ports, --devpool-ports) overlaps "
        "the kernel's ephemeral port "
        f"range {ephemeral[0]}-{ephemeral[1]} ({path}), where any outgoing connection may take "
        "a leased port; choose a range outside it"
    )


def port_path(folder: Path, port: int) -> Path:
    return folder / f"port-{port}.lease"


def bindable(port: int) -> bool:
    """True when a plain listener could bind the port on 127.0.0.1 and 0.0.0.0 now."""
    for address in ("127.0.0.1", "0.0.0.0"):  # noqa: S104 - a probe, closed at once
        probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            probe.bind((address, port))
        except OSError:
            return False
        finally:
            probe.close()
    return True


def _scan(ports: tuple[int, int], start: int) -> Iterator[int]:
    """Every port of the range once, from a start of the caller's choosing (spreads runs)."""
    low, high = ports
    size = high - low + 1
    for step in range(size):
        yield low + (start + step) % size


def acquire_ports(
    folder: Path, count: int, ports: tuple[int, int], start: int | None = None
) -> list[_Handle] | None:
    """Lock ``count`` bindable ports of the range, non-blocking; None when fewer are free.

    The handles' ``device`` field holds the port. Records are written by the caller.
    """
    if count <= 0:
        return []
    taken: list[_Handle] = []
    first = os.getpid() * 7919 if start is None else start
    try:
        for port in _scan(ports, first):
            try:
                handle = _open_lock_file(port, port_path(folder, port))
            except Unusable:
                continue  # planted by another user: another port will do
            try:
                fcntl.flock(handle.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(handle.fd)
                continue
            except BaseException:
                os.close(handle.fd)
                raise
            if not bindable(port):  # someone outside devpool has it: leave it alone
                _close_all([handle])
                continue
            taken.append(handle)
            if len(taken) == count:
                return taken
    except BaseException:
        _close_all(taken)
        raise
    _close_all(taken)
    return None


def ports_env(
    ports: Sequence[int],
    master_addr: str,
    environ: Mapping[str, str],
    keep_caller: bool = False,
) -> dict[str, str]:
    """A test's view of its ports: DEVPOOL_PORTS, and MASTER_ADDR / MASTER_PORT (the first
    port) for torch.distributed. The leased port wins over a MASTER_PORT the caller
    exported (two tests side by side on one port collide), unless keep_caller
    (--devpool-keep-master-port)."""
    if not ports:
        return {}
    env = {"DEVPOOL_PORTS": ",".join(str(port) for port in ports)}
    if not (keep_caller and "MASTER_PORT" in environ):
        env["MASTER_ADDR"] = master_addr
        env["MASTER_PORT"] = str(ports[0])
    return env
