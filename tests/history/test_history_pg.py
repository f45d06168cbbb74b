"""The fleet history in PostgreSQL (history/postgres.py) against a real server (tests/pg_server.py).

The SQLite history is the oracle: the same rows give the same answers from both. Each test
has a database of its own on the session's server.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from history_rows import T0, result

from devpool.cli import main
from devpool.errors import DevpoolError
from devpool.history.durations import History
from devpool.history.location import HistoryUrl, open_history
from devpool.history.postgres import PostgresHistory
from devpool.history.sql import SqlHistory
from pg_server import Server

DEVPOOL = "import sys; from devpool.cli import main; sys.exit(main(sys.argv[1:]))"
FAST = ("-p", "no:cacheprovider", "-p", "no:randomly", "-p", "no:hypothesispytest")


@pytest.fixture
def url(postgres: Server) -> Iterator[str]:
    """A fresh database on the session's server, dropped after the test."""
    import psycopg

    name = f"h_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres.url, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    yield postgres.url.rsplit("/", 1)[0] + f"/{name}"
    with psycopg.connect(postgres.url, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture
def both(tmp_path: Path, url: str) -> Iterator[tuple[SqlHistory, SqlHistory]]:
    """(a SQLite history, a PostgreSQL one), both empty."""
    with History(tmp_path / "h.sqlite") as sqlite, open_history(HistoryUrl(url)) as pg:
        yield sqlite, pg


MIXED = [
    result("t::a", 1.0, T0, "r1", memory_peak=100, cpu_load=1.0),
    result("t::a", 2.0, T0 + 10, "r2", memory_peak=300, cpu_load=3.0),
    result("t::a", 4.0, T0 + 20, "r3", outcome="timeout"),  # not counted
    result("t::a", 3.0, T0 + 30, "r4", platform="h100", runner_class="h100-8", cpu_load=2.0),
    result("t::b", 5.0, T0 + 5, "r1", outcome="flaky", device_count=2, leaks=2),
    result("t::b", 6.0, T0 + 15, "r2", outcome="failed", device_count=2),
    result("t::c", 0.5, T0 + 1, "", platform="h100", runner_class="h100-8"),
]


def test_postgres_answers_as_sqlite_does(both: tuple[SqlHistory, SqlHistory]) -> None:
    answers = []
    for history in both:
        assert history.add(MIXED) == len(MIXED)
        assert history.add(MIXED[:3]) == 0  # a result recorded twice is kept once
        history.add_run_cost("r1", "sim", 8, 3, wall=12.0, bound=10.0)
        answers.append(
            (
                list(history.results()),
                history.estimates(),
                history.estimates(platform="h100"),
                history.previous_estimates(),
                history.estimate("t::a", platform="sim"),
                history.previous("t::a"),
                history.peaks(),
                history.cpu_loads(),
                history.cpu_loads(platform="h100"),
                history.recent_outcomes("t::a", 3, [result("t::a", 1.0, T0 + 99)]),
                history.recent(platform="sim", limit=2),
                history.fixed_cost("sim", 8, 3),
            )
        )
    assert answers[0] == answers[1]
    results, every, h100, *_ = answers[1]
    assert results == sorted(MIXED, key=lambda r: r.time)
    assert every == {"t::a": 3.0, "t::b": 6.0, "t::c": 0.5}
    # On h100: its own figure for a and c; b never ran there, so the fleet's.
    assert h100 == {"t::a": 3.0, "t::b": 6.0, "t::c": 0.5}
    assert answers[1][4] == 2.0  # a's sim runs alone: p90 of 1.0, 2.0


def test_a_schema_3_history_is_upgraded_in_place_by_the_first_writer(url: str) -> None:
    """Leaks came with schema 4 (issue 52): an older fleet history keeps every row (NULL for
    leaks), a read-only reader reads it as it is, and the first writer adds the column to
    results and pending, once."""
    import psycopg

    with PostgresHistory(url) as made:
        made.add(MIXED[:2])
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET search_path TO devpool_history")
        conn.execute("ALTER TABLE results DROP COLUMN leaks")
        conn.execute("ALTER TABLE pending DROP COLUMN leaks")
        conn.execute("UPDATE meta SET value = '3' WHERE key = 'schema'")
    with open_history(HistoryUrl(url), read_only=True) as old:
        assert [r.leaks for r in old.results()] == [None, None]
    for _ in range(2):  # the second open finds it current
        with PostgresHistory(url) as history:
            history.add([result("t::a", 1.0, T0 + 50, "r9", leaks=1)])
            history.add_pending("shard-1", [result("t::b", 1.0, T0 + 60, "shard-1", leaks=3)])
            assert [r.leaks for r in history.results()] == [None, None, 1]
            assert history._version() == 4
    with PostgresHistory(url) as history:
        history.merge_pending()
        assert [r.leaks for r in history.results()][-1] == 3


def test_pending_runs_are_not_estimates_until_folded(url: str) -> None:
    with PostgresHistory(url) as history:
        history.add([result("t::a", 1.0, T0, "r1")])
        where = history.add_pending("shard-1", [result("t::a", 9.0, T0 + 1, "shard-1")])
        assert "pending run shard-1" in where and "postgresql://" in where
        history.add_pending("shard-2", [result("t::b", 2.0, T0 + 2, "shard-2")] * 2)
        assert history.estimates() == {"t::a": 1.0}
        assert history.merge_pending() == (2, ["shard-1", "shard-2"])
        assert history.estimates() == {"t::a": 9.0, "t::b": 2.0}
        assert history.merge_pending() == (0, [])


def test_export_and_merge_between_sqlite_and_postgres(
    tmp_path: Path, url: str, postgres: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    with PostgresHistory(url) as pg:
        pg.add(MIXED)
    export = tmp_path / "fleet.jsonl"
    assert main(["history", "export", str(export), "--history", url]) == 0
    local = tmp_path / "local.sqlite"
    assert main(["history", "merge", str(export), "--history", str(local)]) == 0
    # The reverse: a SQLite history into another database, and PostgreSQL as the SOURCE.
    other = f"{url}_2"
    import psycopg

    with psycopg.connect(postgres.url, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {other.rsplit('/', 1)[1]}")
    try:
        assert main(["history", "merge", str(local), "--history", other]) == 0
        again = tmp_path / "again.sqlite"
        assert main(["history", "merge", other, "--history", str(again)]) == 0
        with History(local) as a, PostgresHistory(other) as b, History(again) as c:
            assert list(a.results()) == list(b.results()) == list(c.results())
            assert len(list(a.results())) == len(MIXED)
    finally:
        with psycopg.connect(postgres.url, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE {other.rsplit('/', 1)[1]} WITH (FORCE)")
    out = capsys.readouterr().out
    assert f"merged {len(MIXED)} new results from {other} into {again}" in out


SUITE = """
import time
import pytest

def test_slow():
    time.sleep(0.3)

@pytest.mark.parametrize("i", range(3))
def test_fast(i):
    pass
"""


def _devpool(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "DEVPOOL_"))}
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=environ, capture_output=True, text=True, timeout=120
    )


def _run(project: Path, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """A pytest session on two simulated devices with the fleet history."""
    return _devpool(
        project, "-m", "pytest", *FAST, "--devices=sim:0-1", f"--devpool-history={url}",
        f"--devpool-lock-dir={project / 'locks'}", *args,
    )  # fmt: skip


def test_two_runners_share_one_history(tmp_path: Path, url: str) -> None:
    """The second runner splits its shards by the first's durations; its own results wait
    as a pending run until folded in; capacity and shard read the same history."""
    project = tmp_path / "proj"
    project.mkdir()
    (project / "pyproject.toml").write_text("[tool.pytest.ini_options]\naddopts = []\n")
    (project / "test_suite.py").write_text(SUITE)
    first = _run(project, url)
    assert first.returncode == 0, first.stdout + first.stderr
    record = project / "shard.jsonl"
    second = _run(project, url, "--devpool-shard=1/2", f"--devpool-run-record={record}")
    assert second.returncode == 0, second.stdout + second.stderr
    (shard,) = [e for e in map(json.loads, record.read_text().splitlines()) if e["type"] == "shard"]
    assert sorted(map(len, shard["split"])) == [1, 3]  # the slow test alone: measured
    assert shard["pending"].endswith(")") and "pending run" in shard["pending"]
    with PostgresHistory(url) as history:
        assert len(list(history.results())) == 4  # the shard's wait
        assert history.merge_pending()[0] > 0
        assert history.estimates(platform="sim")["test_suite.py::test_slow"] >= 0.3
    capacity = _devpool(
        project, "-c", DEVPOOL, "capacity", "--history", url, "--platform", "sim", "--format",
        "json", "--", *FAST,
    )  # fmt: skip
    assert capacity.returncode == 0, capacity.stderr
    assert json.loads(capacity.stdout)["estimates_from_history"] == 4
    shard_cmd = _devpool(
        project, "-c", DEVPOOL, "shard", "--history", url, "--platform", "sim", "--runners", "2",
        "--format", "json", "--", *FAST,
    )  # fmt: skip
    assert shard_cmd.returncode == 0, shard_cmd.stderr
    assert sorted(len(s["tests"]) for s in json.loads(shard_cmd.stdout)["split"]) == [1, 3]


def _one_sentence(args: list[str], cwd: Path, *, no_psycopg: bool = False) -> str:
    code = DEVPOOL
    if no_psycopg:
        code = "import sys; sys.modules['psycopg'] = None; " + code
    done = _devpool(cwd, "-c", code, *args)
    assert done.returncode == 4, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    return lines[0]


def _password_user(postgres: Server) -> str:
    """A role that logs in with a password (the session's server trusts every other one)."""
    import psycopg

    user = "devpool_password"
    hba = postgres.data / "pg_hba.conf"
    rules = hba.read_text()
    if user not in rules:
        hba.write_text(f"host all {user} 127.0.0.1/32 scram-sha-256\n{rules}")
    with psycopg.connect(postgres.url, autocommit=True) as admin:
        admin.execute(f"DROP ROLE IF EXISTS {user}")
        admin.execute(f"CREATE ROLE {user} LOGIN PASSWORD 'right'")
        admin.execute("SELECT pg_reload_conf()")
    wrong = postgres.url.replace("devpool@", f"{user}:wrong@")
    deadline = time.monotonic() + 10  # the server reads its rules again soon after
    while time.monotonic() < deadline:
        try:
            psycopg.connect(wrong).close()
        except psycopg.OperationalError as exc:
            if "password authentication failed" in str(exc):
                return user
    raise AssertionError("the server did not take the password rule")


def test_bad_input_is_one_sentence_and_exit_4(tmp_path: Path, postgres: Server) -> None:
    from pg_server import free_port

    out = str(tmp_path / "out.jsonl")
    closed = f"postgresql://devpool@127.0.0.1:{free_port()}/db"
    said = _one_sentence(["history", "export", out, "--history", closed], tmp_path)
    assert "cannot reach PostgreSQL at 127.0.0.1:" in said
    said = _one_sentence(["history", "export", out, "--history", "mysql://u:p@db:3306/h"], tmp_path)
    assert "--history must be a file or a PostgreSQL URL" in said and ":p@" not in said
    wrong = postgres.url.replace("devpool@", f"{_password_user(postgres)}:wrong@")
    said = _one_sentence(["capacity", "--history", wrong], tmp_path)
    assert f"PostgreSQL at 127.0.0.1:{postgres.port} refused the credentials" in said
    assert "wrong" not in said  # never the password
    said = _one_sentence(["history", "merge", "--history", postgres.url], tmp_path, no_psycopg=True)
    assert "--history needs psycopg 3" in said and "devpool[queue]" in said


def test_a_run_refuses_an_unreachable_history(tmp_path: Path) -> None:
    from pg_server import free_port

    (tmp_path / "test_one.py").write_text("def test_one():\n    pass\n")
    done = _run(tmp_path, f"postgresql://devpool@127.0.0.1:{free_port()}/fleet")
    assert done.returncode == 4, done.stdout + done.stderr
    assert "--devpool-history: cannot reach PostgreSQL at 127.0.0.1:" in done.stderr
    done = _run(tmp_path, "mysql://127.0.0.1/fleet")
    assert done.returncode == 4
    assert "--devpool-history must be a file or a PostgreSQL URL" in done.stderr


def test_a_database_without_a_history_is_refused_read_only(url: str) -> None:
    with pytest.raises(DevpoolError, match="holds no devpool history yet"):
        open_history(HistoryUrl(url), read_only=True)


def test_the_history_option_takes_a_file_or_a_postgresql_url() -> None:
    from devpool.config import settings_from

    fleet = "postgresql://ci:secret@db:5432/fleet"
    assert settings_from({}, {"history": fleet}, "pyproject.toml").history == HistoryUrl(fleet)
    assert str(HistoryUrl(fleet)) == "postgresql://ci:***@db:5432/fleet"
    local = settings_from({"devpool_history": "~/h.sqlite"}, {}, "pyproject.toml").history
    assert local == Path.home() / "h.sqlite"
    with pytest.raises(DevpoolError, match="history must be a file or a PostgreSQL URL"):
        settings_from({"devpool_history": "mysql://db/h"}, {}, "pyproject.toml")
    with pytest.raises(DevpoolError) as refused:  # the sentence never shows a password
        settings_from({}, {"history": "mysql://ci:secret@db/h"}, "pyproject.toml")
    assert "secret" not in str(refused.value) and "mysql://ci:***@db/h" in str(refused.value)


def test_a_literal_percent_reaches_postgresql_as_written(
    both: tuple[SqlHistory, SqlHistory],
) -> None:
    """The shared queries are written with SQLite's ?: a literal % (a LIKE) must stay one."""
    for history in both:
        history.add(MIXED)
        rows = history._rows(
            "SELECT count(*) FROM results WHERE nodeid LIKE 't::%' AND 1 = ?", (1,)
        )
        assert rows == [(len(MIXED),)]


def test_the_shards_of_one_ci_run_split_alike_while_the_fleet_writes(
    tmp_path: Path, url: str
) -> None:
    """Shard 2 starts after other runners changed the fleet's history: on GitHub Actions it
    still splits from what shard 1 read (same run and attempt), so no test runs twice or
    never; a shard outside such a run splits from the history as it is then."""
    project = tmp_path / "proj"
    project.mkdir()
    (project / "pyproject.toml").write_text("[tool.pytest.ini_options]\naddopts = []\n")
    (project / "test_suite.py").write_text(SUITE)
    slow, fast0 = "test_suite.py::test_slow", "test_suite.py::test_fast[0]"
    with PostgresHistory(url) as history:
        history.add([result(slow, 5.0, T0), result(fast0, 0.1, T0)])

    def split(k: int, github: bool) -> list[list[str]]:
        record = project / f"shard-{k}-{github}.jsonl"
        environ = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "DEVPOOL_"))}
        if github:
            environ.update(GITHUB_RUN_ID="4242", GITHUB_RUN_ATTEMPT="1")
        done = subprocess.run(
            [sys.executable, "-m", "pytest", *FAST, "--devices=sim:0-1",
             f"--devpool-history={url}", f"--devpool-lock-dir={project / 'locks'}",
             f"--devpool-shard={k}/2", f"--devpool-run-record={record}"],
            cwd=project, env=environ, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        events = map(json.loads, record.read_text().splitlines())
        (shard,) = [e for e in events if e["type"] == "shard"]
        return sorted(sorted(part) for part in shard["split"])

    first = split(1, github=True)
    assert [slow] in first  # the slow test alone
    with PostgresHistory(url) as history:  # meanwhile the fleet learns otherwise
        history.add([result(slow, 0.01, T0 + i) for i in range(1, 30)])
        history.add([result(fast0, 5.0, T0 + i) for i in range(1, 30)])
    assert split(2, github=True) == first
    assert split(2, github=False) != first  # the history did change: unpinned, it splits anew
