"""The queue's tests run against a real PostgreSQL server this session starts (pg_server.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from pg_server import Server, remove, server_bin, start_server


@pytest.fixture(scope="session")
def postgres() -> Iterator[Server]:
    """One server for the session; each test uses run ids of its own."""
    if server_bin() is None:
        why = "no PostgreSQL server binaries (initdb, pg_ctl) on PATH or in /usr/lib/postgresql"
        if os.environ.get("CI") == "true":
            pytest.fail(why + ": .ci/run installs them", pytrace=False)
        pytest.skip(why)
    pytest.importorskip("psycopg", reason="psycopg is not installed (the [queue] extra)")
    server = start_server()
    try:
        yield server
    finally:
        server.stop()
        remove(server)
