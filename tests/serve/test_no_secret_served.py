"""No password given to a run, in any form libpq takes, is on any page `devpool serve` hands
out, while the run holds its devices and after it ended (the run's own files:
tests/session/test_no_secret_kept.py)."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from serving import Project, Server, Session, wait_for

SECRETS = ("SECRETURL", "SECRETQUERY", "SECRETKEY", "SECRETVAR", "SECRETENV")
# Each form on the run's command line, as ids to deselect that name no test: the run is as
# plain as can be, and no database is needed to hold them.
GIVEN = (
    "postgresql://u:SECRETURL@h:5432/db",
    "postgresql://h/db?password=SECRETQUERY&sslmode=require",
    "host=h password=SECRETKEY dbname=x",
    "PGPASSWORD=SECRETVAR",
)
API = ("overview", "devices", "waiting", "tests", "ray", "queue", "runs/live", "runs/recent")
LINK = re.compile(rb"""(?:href|src)=["'](/[^"'#?]*)""")
PAGE = re.compile(rb'"page": ?"(/runs/[^/"]+/[^/"]+)"')  # a run's page, named in the API


def crawl(server: Server, project: Project) -> dict[str, bytes]:
    """Every page reachable from the host page and the API, and every file of every run
    folder through the files route ("/events" only says when to refresh: no content)."""
    todo = ["/", *(f"/api/v1/{name}" for name in API)]
    seen: dict[str, bytes] = {}
    while todo and len(seen) < 300:
        path = todo.pop()
        if path in seen or path == "/events":
            continue
        status, body = server.get(path)
        assert status == 200, (path, status, body[:300])
        seen[path] = body
        todo += [link.decode() for link in LINK.findall(body)]
        todo += [page.decode() for page in PAGE.findall(body)]
    runs = [path for path in seen if re.fullmatch(r"/runs/[^/]+/[^/]+", path)]
    assert runs, sorted(seen)  # the crawl reached the run's own page
    for page in runs:
        folder = project.devpool / "runs" / page.rsplit("/", 1)[1]
        for file in (p for p in folder.rglob("*") if p.is_file()):
            for path in (f"{page}/files/{file.relative_to(folder)}", f"/api/v1{page}"):
                status, seen[path] = server.get(path)
                assert status == 200, (path, status)
        seen[f"{page}/report.html"] = server.get(f"{page}/report.html")[1]
    return seen


def no_secret_in(pages: dict[str, bytes]) -> None:
    for path, body in pages.items():
        for secret in SECRETS:
            assert secret.encode() not in body, f"{secret} on {path}"


def test_no_page_serve_returns_shows_a_password_given_to_a_run(
    project: Project,
    serve: Callable[..., Server],
    sessions: Callable[..., Session],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PGPASSWORD", "SECRETENV")
    given = [f"--deselect={form}" for form in GIVEN]
    run = sessions("secret", "test_hold.py::test_plain", "--devices", "sim:0-3", *given)
    server = serve()

    def holding() -> bool:
        assert run.proc.poll() is None, run.output()
        return (project.flags / "plain.started").exists()

    wait_for(holding, "the run to hold sim:0")
    held = crawl(server, project)
    assert any(b"test_plain" in body for body in held.values())  # the live run is shown
    no_secret_in(held)

    run.release()
    assert run.wait() == 0, run.output()
    ended = crawl(server, project)
    assert any(path.endswith("record.jsonl") for path in ended), sorted(ended)
    # The forms did reach what serve hands out, each hidden: this test proves something.
    for hidden in (b"u:***@h:5432", b"password=***&", b"password=*** dbname", b"PGPASSWORD=***"):
        assert any(hidden in body for body in ended.values()), hidden
    no_secret_in(ended)
