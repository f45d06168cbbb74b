"""The host page's queue view against a real PostgreSQL server and a real `devpool serve`:
its JSON is `devpool queue status --format json`'s, the page shows it and follows it, a
database that goes away is a line on the page, a bad URL is one sentence at start."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from serving import HOSTILE, Server, wait_for

from devpool.cli import main
from devpool.queue.store import QueuedTest, QueueStore
from docs_screenshots import keep_for_docs

_runs = itertools.count()
TESTS = [
    QueuedTest("t.py::test_cpu", 0, "cpu", 3.0),
    QueuedTest("t.py::test_one", 1, "1 device", 2.0),
    QueuedTest(f"t.py::test_two[{HOSTILE}]", 2, "2 devices", 4.0),
    QueuedTest("t.py::test_four", 4, "4 devices", 1.0),
    QueuedTest("t.py::test_eight", 8, "8 devices", 1.0),
]


def ending(test: str, outcome: str) -> dict[str, object]:
    return {"nodeid": test, "outcome": outcome, "start": 1.0, "end": 1.5, "devices": [0]}


def a_run(postgres: Any) -> QueueStore:
    """A run with a job that finished (2 devices: ran 2 tests, one failed) and a job killed
    while it held a claim (4 devices, its lease run out)."""
    store = QueueStore(postgres.url, f"71{next(_runs):04d}-1")  # as GitHub ids read
    store.publish(TESTS, "ci-a")
    finished = store.join("ci-a", 11, 2, "sim", 30)
    for claim in store.claim(finished, 2, 4.0):  # test_two, the longest it holds
        store.report(finished, claim, "passed", False, ending(claim.test_id, "passed"))
    for claim in store.claim(finished, 2, 0.1):  # then test_cpu
        store.report(finished, claim, "failed", True, ending(claim.test_id, "failed"))
    store.leave(finished)
    killed = store.join("ci-b", 12, 4, "sim", 30)
    assert [c.test_id for c in store.claim(killed, 4, 0.1)] == ["t.py::test_four"]
    # killed: its lease runs out unrenewed (set so, as a slow machine cannot claim in time)
    store.db.execute(
        "UPDATE devpool_queue_jobs SET expires_at = now() - interval '1 second' WHERE job_id = %s",
        (killed,),
    )
    wait_for(store.lapsed, "the killed job's lease to run out", 10)
    return store


def status_json(postgres: Any, run_id: str, capsys: pytest.CaptureFixture[str]) -> Any:
    args = ["queue", "status", f"--devpool-queue={postgres.url}", f"--devpool-queue-run={run_id}"]
    assert main([*args, "--format=json"]) == 0
    return json.loads(capsys.readouterr().out)


def answered(server: Server, after: float = 0.0) -> Callable[[], Any]:
    """The queue view once the server's database question answered after `after`."""

    def ask() -> Any:
        view = server.json("/api/v1/queue")
        return view if view["answered"] and view["answered"] > after else None

    return ask


def test_the_api_says_what_queue_status_says(
    postgres: Any, serve: Callable[..., Server], capsys: pytest.CaptureFixture[str]
) -> None:
    store = a_run(postgres)
    server = serve(f"--devpool-queue={postgres.url}", f"--devpool-queue-run={store.run_id}")
    view = wait_for(answered(server), "the queue view's first answer", 20)
    assert view["database"] == f"127.0.0.1:{postgres.port}" and view["problem"] is None
    [shown] = view["runs"]
    # The server writes nothing: the killed job is shown lost and its claim queued before
    # any job reaps it, as `devpool queue status` (which reaps) then says too.
    assert [(j["host"], j["state"], j["claimed"], j["done"]) for j in shown["jobs"]] == [
        ("ci-a", "left", 0, 2),
        ("ci-b", "lost", 0, 0),
    ]
    assert shown["states"] == {"done": 2, "claimed": 0, "queued": 3}
    assert shown["outcomes"] == {"passed": 1, "failed": 1}
    assert shown["largest_live_job"] is None and shown["unholdable"] == 3
    told = status_json(postgres, store.run_id, capsys)
    assert told.pop("schema") == 1 and shown.pop("published") is None
    assert shown == told
    # A job joins: the view follows, and still agrees.
    later = store.join("ci-c", 13, 2, "sim", 30)
    store.claim(later, 2, 0.1)
    since = time.time()
    view = wait_for(answered(server, since), "an answer after the job joined", 20)
    told = status_json(postgres, store.run_id, capsys)
    told.pop("schema")
    assert {**view["runs"][0], "published": None} == {**told, "published": None}
    assert told["largest_live_job"] == 2 and told["unholdable"] == 2
    assert told["queued"][0] == {"test": "t.py::test_four", "request": "4 devices",
                                 "holdable": False}  # fmt: skip
    store.close()


def test_without_a_run_the_newest_runs_show(
    postgres: Any, serve: Callable[..., Server], capsys: pytest.CaptureFixture[str]
) -> None:
    older, newer = a_run(postgres), a_run(postgres)
    server = serve(f"--devpool-queue={postgres.url}")
    view = wait_for(answered(server), "the queue view's first answer", 20)
    ids = [run["run"] for run in view["runs"]]
    assert ids[:2] == [newer.run_id, older.run_id] and view["run"] is None
    assert all(run["published"] for run in view["runs"])
    status, body = server.get("/")
    assert status == 200 and f'data-run="{newer.run_id}"' in body.decode()
    older.close()
    newer.close()


def test_a_database_that_goes_away_is_a_line_on_the_page(
    postgres: Any, serve: Callable[..., Server]
) -> None:
    store = a_run(postgres)
    store.close()
    server = serve(f"--devpool-queue={postgres.url}", f"--devpool-queue-run={store.run_id}")
    wait_for(answered(server), "the queue view's first answer", 20)
    postgres.stop()
    try:
        view = wait_for(
            lambda: (v := server.json("/api/v1/queue"))["problem"] and v, "the problem line", 30
        )
        assert view["problem"].startswith(f"PostgreSQL at 127.0.0.1:{postgres.port} did not answer")
        status, body = server.get("/")
        assert status == 200 and "queue-problem" in body.decode()
    finally:
        postgres.start()
    # It comes back: the next question connects again.
    view = wait_for(
        lambda: (v := server.json("/api/v1/queue"))["problem"] is None and v["runs"] and v,
        "the queue view to answer again",
        30,
    )
    assert view["runs"][0]["run"] == store.run_id
    assert server.proc.poll() is None


def _serve_fails(*args: str, prelude: str = "") -> str:
    """`devpool serve ARGS`' one line on stderr; it must exit 4 without serving."""
    code = f"{prelude}import sys; from devpool.cli import main; sys.exit(main(sys.argv[1:]))"
    done = subprocess.run(
        [sys.executable, "-c", code, "serve", "--port=0", *args],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 4, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    return lines[0]


def test_a_bad_queue_url_is_one_sentence_exit_4() -> None:
    said = _serve_fails("--devpool-queue=sqlite:///x.db")
    assert "--devpool-queue must be a PostgreSQL URL" in said
    said = _serve_fails("--devpool-queue=postgresql://u:s3cret@[::1:5432/db")
    assert "is no valid PostgreSQL URL" in said and "s3cret" not in said and "u:***@" in said
    assert "give both" in _serve_fails("--devpool-queue-run=r1")
    blocked = "import sys; sys.modules['psycopg'] = None; "  # as if the [queue] extra were missing
    said = _serve_fails("--devpool-queue=postgresql://u@127.0.0.1:1/db", prelude=blocked)
    assert "needs psycopg 3" in said and "devpool[queue]" in said


def test_the_page_shows_the_queue_and_follows_it(
    postgres: Any, serve: Callable[..., Server], browser: Any, tmp_path: Path
) -> None:
    store = a_run(postgres)
    server = serve(f"--devpool-queue={postgres.url}", f"--devpool-queue-run={store.run_id}")
    wait_for(answered(server), "the queue view's first answer", 20)
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    page.goto(server.url + "/")
    page.locator("#live-state", has_text="live").wait_for(timeout=5000)
    run = page.locator(f"#queue .queue-run[data-run='{store.run_id}']")
    assert "5 tests: 2 done (1 passed, 1 failed), 0 claimed, 3 queued" in run.inner_text()
    states = [row.get_attribute("data-state") for row in run.locator(".queue-job").all()]
    assert states == ["left", "lost"]
    assert run.locator(".unholdable").count() == 3
    # A job joins and claims: the page shows it without a reload (server-sent events).
    joined = store.join("ci-c", 13, 8, "sim", 30)
    store.claim(joined, 8, 0.1)
    run.locator(".queue-job[data-state=alive]").wait_for(timeout=15000)
    assert run.locator(".unholdable").count() == 0
    assert page.evaluate("document.body.hasAttribute('data-refreshed')")
    assert dialogs == [] and page.locator("img").count() == 0  # the hostile id is text
    page.set_viewport_size({"width": 800, "height": 900})  # test ids wrap: no sideways scroll
    assert page.evaluate("document.documentElement.scrollWidth") <= 800
    page.set_viewport_size({"width": 1000, "height": 900})
    page.locator("#queue").screenshot(path=str(tmp_path / "queue.png"))
    keep_for_docs(tmp_path / "queue.png", "host-page-queue.png")  # docs/host-page.md
    store.close()


def test_a_database_no_job_reached_is_a_line_and_no_table_is_made(
    postgres: Any, serve: Callable[..., Server]
) -> None:
    import psycopg

    name = f"empty_{time.time_ns()}"
    with psycopg.connect(postgres.url, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    url = postgres.url.rsplit("/", 1)[0] + f"/{name}"
    try:
        server = serve(f"--devpool-queue={url}")
        view = wait_for(answered(server), "the queue view's first answer", 20)
        assert "no devpool queue at" in view["problem"], view
        with psycopg.connect(url) as db:
            assert db.execute("SELECT to_regclass('devpool_queue_tests')").fetchone() == (None,)
    finally:
        with psycopg.connect(postgres.url, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
