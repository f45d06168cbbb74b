"""PostgreSQL, shared by the queue (queue/), the fleet's duration history (history/) and its
baselines (select/): its URLs checked and shown without their password, connections opened,
tables made once under a lock and their version read, and every way one fails said in one
sentence."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from devpool.errors import DevpoolError

if TYPE_CHECKING:
    import psycopg

# The schema the fleet's duration history and its baselines share (history/postgres.py,
# select/store_pg.py), beside whatever else the database holds.
FLEET_SCHEMA = "devpool_history"
CONNECT_TIMEOUT = 5  # seconds: an unreachable host is said in one sentence, not waited on
# A server cut off by the network (not restarted: that closes the connection) must not hold a
# query, a heartbeat or the host page's question forever: the connection fails within about
# 20 s, under the lease's default of 30 s (libpq's keepalive and TCP user timeout).
ALIVE = {
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "tcp_user_timeout": 20_000,  # ms: data sent and not acknowledged
}
SCHEMES = ("postgresql", "postgres")
_PASSWORD_PARAMETER = re.compile(r"([?&]password=)[^&#\s]*", re.IGNORECASE)
_URL_PASSWORD = re.compile(r"([a-z][a-z0-9+.-]*://[^:/@\s]*:)([^@\s]+)(@)", re.IGNORECASE)
# libpq's keyword form (`password=p`, `password = 'p q'`), and the variable it reads
_PASSWORD_KEYWORD = re.compile(
    r"(^|[^\w?&])((?:pg)?password\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s'&][^\s]*)",
    re.IGNORECASE,
)


def where(url: str) -> str:
    """'host:port' of a queue URL, for sentences (never its password)."""
    try:
        parts = urlsplit(url)
        return f"{parts.hostname or 'localhost'}:{parts.port or 5432}"
    except ValueError:  # check_url refuses it first; said as given, without its password
        return shown(url).partition("://")[2].rpartition("@")[2].partition("/")[0]


def check_url(url: str, option: str = "--devpool-queue") -> str:
    """The URL itself, or one sentence when it is not PostgreSQL's or cannot be read (an
    unclosed [, a port that is no number)."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (urlsplit reads the port only when asked)
    except ValueError as exc:
        raise DevpoolError(f"{option} {shown(url)!r} is no valid PostgreSQL URL: {exc}") from None
    if parts.scheme not in SCHEMES:
        scheme = parts.scheme
        raise DevpoolError(
            f"{option} must be a PostgreSQL URL (postgresql://USER@HOST:PORT/DB), "
            f"got {scheme + '://' if scheme else 'no scheme in'} {shown(url)!r}"
        )
    return url


def shown(url: str) -> str:
    """The text with every password in it hidden, for sentences, records and pages: a URL's
    (in its user part, even one urlsplit cannot read, or as a password= parameter), and a
    libpq keyword string's (`host=h password=p`, `PGPASSWORD=p`). Text without one is kept."""
    try:
        password = urlsplit(url).password
    except ValueError:
        password = url.rpartition("@")[0].partition("://")[2].partition(":")[2] or None
    if password:
        url = url.replace(f":{password}@", ":***@", 1)
    url = _URL_PASSWORD.sub(r"\1***\3", url)  # URLs inside a longer text (a command line)
    url = _PASSWORD_PARAMETER.sub(r"\1***", url)
    return _PASSWORD_KEYWORD.sub(r"\1\2***", url)


def shown_args(args: Sequence[object]) -> list[str]:
    """A command line as kept in a record or shown on a page, each word's passwords hidden."""
    return [shown(str(arg)) for arg in args]


def driver(option: str = "--devpool-queue") -> Any:
    """psycopg 3, or one sentence naming the extra that brings it."""
    try:
        import psycopg
    except ImportError:
        raise DevpoolError(
            f"{option} needs psycopg 3, which the [queue] extra installs: "
            "pip install '/path/to/devpool[queue]' (a clone of devpool's repository)"
        ) from None
    return psycopg


def connect(url: str, option: str = "--devpool-queue") -> psycopg.Connection[Any]:
    """An autocommit connection to the queue's database, or one sentence saying why not."""
    check_url(url, option)
    module = driver(option)
    try:
        connection: psycopg.Connection[Any] = module.connect(
            url, autocommit=True, connect_timeout=CONNECT_TIMEOUT, **ALIVE
        )
    except module.OperationalError as exc:
        raise DevpoolError(failure_sentence(url, str(exc), option)) from None
    except module.ProgrammingError as exc:  # a URL psycopg cannot parse
        raise DevpoolError(f"{option} {shown(url)!r} is no valid PostgreSQL URL: {exc}") from None
    return connection


def failure_sentence(url: str, message: str, option: str = "--devpool-queue") -> str:
    """One sentence for a failed connection: credentials, a missing database, or no server."""
    first = message.strip().splitlines()[-1] if message.strip() else "no answer"
    lowered = message.lower()
    if "password authentication failed" in lowered or "no password supplied" in lowered:
        return f"{option}: PostgreSQL at {where(url)} refused the credentials ({_last(first)})"
    if "does not exist" in lowered:
        return f"{option}: PostgreSQL at {where(url)} says {_last(first)}"
    return f"{option}: cannot reach PostgreSQL at {where(url)} ({_last(first)})"


def _last(line: str) -> str:
    return line.split("FATAL:", 1)[-1].strip().rstrip(".")


@contextmanager
def under_lock(conn: Any, key: int) -> Iterator[Any]:
    """A transaction holding an advisory lock: the first runner to open an empty (or older)
    database makes (or upgrades) its tables while the others wait, then find them made."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (key,))
        yield conn


def tables_version(conn: Any, meta: str) -> int | None:
    """The schema version in a meta table (`schema.table` of key/value rows); None where that
    table is not there yet."""
    if conn.execute(f"SELECT to_regclass('{meta}')").fetchone()[0] is None:
        return None
    row = conn.execute(f"SELECT value FROM {meta} WHERE key = 'schema'").fetchone()
    return int(row[0]) if row is not None else 0
