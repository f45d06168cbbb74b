"""The Starlette app of `devpool serve`: pages, JSON under /api/v1, /events, run files.

Read only: GET (and HEAD) only. With a token every request needs it, as a bearer header,
``?token=`` or the cookie the first accepted request sets; without one (loopback) the
Host header must name loopback. Run files are served only from
inside a run folder, as plain text, never through a symlink.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import os
import re
import secrets
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Route

from devpool.serve import cluster, device_views, pages, views
from devpool.serve.hosts import names_loopback
from devpool.serve.queue_view import QueueWatch

COOKIE = "devpool_serve_token"
POLL_SECONDS = 0.5  # how often /events looks at the files' mtimes
STATUS_SECONDS = 2.0  # how often it also asks the lock files (a release changes no mtime)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": "default-src 'self'; script-src 'self' 'unsafe-inline'; "
    "style-src 'unsafe-inline'; img-src 'self' data:; frame-ancestors 'none'",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


@dataclass
class Sources:
    """What the server reads: the lock folder and the projects' .devpool folders."""

    lock_dir: Path
    projects: list[views.ProjectFolder]
    ray_addresses: list[str] = field(default_factory=list)  # --ray-address
    ray: cluster.RayWatch = field(default_factory=cluster.RayWatch)
    queue: QueueWatch | None = None  # --devpool-queue
    index: views.RunIndex = field(init=False)

    def __post_init__(self) -> None:
        self.index = views.RunIndex(self.projects)
        self._lock = threading.Lock()  # requests run in threads; the caches are shared
        self._looks_lock = threading.Lock()
        self._looks: dict[str, tuple[float, tuple[Any, ...]]] = {}
        # Per pyproject stamp: the files the tests view reads, the projects' Ray clusters.
        self._watched: tuple[tuple[Any, ...], list[Path], list[tuple[str, str]]] | None = None

    def overview(self) -> dict[str, Any]:
        """Every view at once (one read of the lock folder for devices and waiting)."""
        with self._lock:
            return self._overview()

    def run(self, key: str, run_id: str) -> dict[str, Any] | None:
        """One run's summary, from the same cache as the overview."""
        with self._lock:
            summaries = self.index.summaries()
        found = (s for s in summaries if s.project == key and s.run_id == run_id)
        summary = next(found, None)
        return None if summary is None else summary.to_json()

    def _overview(self) -> dict[str, Any]:
        states = device_views.lock_states(self.lock_dir)
        summaries = self.index.summaries()
        live = [s for s in summaries if s.live]
        # A ray-backed run's devices are the cluster's (the Ray view), not this host's.
        here = [s for s in live if s.ray_address is None]
        known = [(s.platform, d) for s in here for d in s.devices]
        memory = {(s.platform, d): size for s in here for d, size in s.memory.items()}
        live_runs = views.runs_view(summaries, live=True)
        clusters = self.clusters(live_runs["runs"])
        answers = self.ray.answers(address for address, _ in clusters)
        return {
            "schema": device_views.SCHEMA,
            "time": time.time(),
            "devices": device_views.devices_view(
                states, self.lock_dir, known, memory, views.last_leaks(summaries)
            ),
            "waiting": device_views.waiting_view(device_views.waiters(self.lock_dir), states),
            "live": live_runs,
            "recent": views.runs_view(summaries, live=False),
            "tests": self.tests(),
            "ray": cluster.ray_view(clusters, answers, live_runs["runs"]),
            "queue": self.queue_view(),
        }

    def queue_view(self) -> dict[str, Any]:
        """The shared queue's runs (queue_view.py); none without --devpool-queue."""
        if self.queue is None:
            return {"schema": device_views.SCHEMA, "database": None, "run": None, "runs": []}
        return self.queue.view()

    def clusters(self, live: list[dict[str, Any]]) -> list[tuple[str, list[str]]]:
        """The Ray clusters to show: --ray-address, the projects' tables, live runs'."""
        self.test_files()  # reads the projects' tables again when a pyproject moved
        assert self._watched is not None
        return cluster.wanted(self.ray_addresses, self._watched[2], live)

    def tests(self) -> dict[str, Any]:
        """The tests view, read again only when a history, pyproject or quarantine file
        changed."""
        stamp = tuple(_mtime(path) for path in self.test_files())
        if getattr(self, "_tests_stamp", None) != stamp:
            self._tests = views.tests_view(self.projects)
            self._tests_stamp = stamp
        return self._tests

    def test_files(self) -> list[Path]:
        """What the tests view reads: each history, and the pyproject.toml and quarantine
        file of each project (which file that is, asked again when a pyproject moved)."""
        from devpool.serve.history import watched_files

        pyprojects = tuple(_mtime(p.root / "pyproject.toml") for p in self.projects)
        with self._looks_lock:
            if self._watched is None or self._watched[0] != pyprojects:
                files = [p.folder / "history.sqlite" for p in self.projects]
                files += [f for p in self.projects for f in watched_files(p.root)]
                configured = [(p.key, cluster.configured_address(p.root)) for p in self.projects]
                ray = [(key, address) for key, address in configured if address is not None]
                self._watched = (pyprojects, files, ray)
            return self._watched[1]

    def signature(self) -> tuple[Any, ...]:
        """Sizes and mtimes of everything the views read; it moves when a view may have.
        Shared by every open /events stream for a moment, so ten tabs cost one look."""
        return self._shared("signature", POLL_SECONDS * 0.8, self._signature)

    def lock_signature(self) -> tuple[Any, ...]:
        """Who holds what: a release rewrites no file, so only the lock states show it."""
        return self._shared("locks", STATUS_SECONDS * 0.8, self._lock_signature)

    def _shared(
        self, name: str, seconds: float, compute: Callable[[], tuple[Any, ...]]
    ) -> tuple[Any, ...]:
        with self._looks_lock:
            at, value = self._looks.get(name, (-seconds, ()))
            if time.monotonic() - at < seconds:
                return value
        value = compute()
        with self._looks_lock:
            self._looks[name] = (time.monotonic(), value)
        return value

    def _signature(self) -> tuple[Any, ...]:
        marks: list[Any] = [_mtime(self.lock_dir), _mtime(self.lock_dir / "waiting")]
        for folder in (self.lock_dir, self.lock_dir / "waiting"):
            marks.extend(_entries(folder))
        for project in self.projects:
            marks.append(_mtime(project.runs))
        marks.extend((str(path), _mtime(path)) for path in self.test_files())
        for _, path in self.index.record_files():
            marks.append((str(path), _mtime(path)))
        return tuple(marks)

    def _lock_signature(self) -> tuple[Any, ...]:
        states = device_views.lock_states(self.lock_dir)
        held = tuple((s.platform, s.device, s.held, s.holder, s.shares) for s in states)
        with self._lock:
            live = views.runs_view(self.index.summaries(), live=True)["runs"]
        # Ray's and the queue's answers come in the background: what moved there is a change.
        queue = self.queue.signature() if self.queue is not None else ()
        return (held, self.ray.signature(a for a, _ in self.clusters(live)), queue)


def _mtime(path: Path) -> tuple[int, int] | None:
    try:
        info = os.lstat(path)
    except OSError:
        return None
    return (info.st_size, info.st_mtime_ns)


def _entries(folder: Path) -> list[tuple[str, int, int]]:
    try:
        with os.scandir(folder) as entries:
            out = []
            for entry in entries:
                info = entry.stat(follow_symlinks=False)
                out.append((entry.name, info.st_size, info.st_mtime_ns))
            return sorted(out)
    except OSError:
        return []


class TokenCheck(BaseHTTPMiddleware):
    """Every request carries the token: bearer header, ?token= or the cookie set here."""

    def __init__(self, app: Any, token: str | None) -> None:
        super().__init__(app)
        self.token = token
        self.cookie = "" if token is None else _derived(token)

    async def dispatch(
        self, request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        if request.method not in ("GET", "HEAD"):
            return PlainTextResponse("devpool serve is read only", 405, headers=_HEADERS)
        if self.token is None:
            # Without a token only loopback may ask, by name too: a web page elsewhere
            # must not read this one through a DNS name rebound to 127.0.0.1.
            if not names_loopback(request.headers.get("host", "")):
                return PlainTextResponse("devpool serve answers loopback names only", 403)
            response = await call_next(request)
            response.headers.update(_HEADERS)
            return response
        given = request.query_params.get("token")
        header = request.headers.get("authorization", "")
        if header.lower().startswith("bearer "):
            given = header[7:].strip()
        from_cookie = given is None
        if from_cookie:
            cookie = request.cookies.get(COOKIE)
            ok = cookie is not None and hmac.compare_digest(cookie, self.cookie)
        else:
            ok = given is not None and hmac.compare_digest(given.encode(), self.token.encode())
        if not ok:
            return PlainTextResponse(
                "devpool serve needs its token: Authorization: Bearer TOKEN or ?token=TOKEN\n",
                401,
                headers={**_HEADERS, "WWW-Authenticate": "Bearer"},
            )
        response = await call_next(request)
        response.headers.update(_HEADERS)
        if not from_cookie:
            # A value derived from the token, never the token: a stolen cookie is no token.
            secure = request.url.scheme == "https"
            response.set_cookie(
                COOKIE, self.cookie, httponly=True, samesite="strict", secure=secure
            )
        return response


def _derived(token: str) -> str:
    """The cookie's value: an HMAC of the token, salted per server start."""
    return hmac.new(_COOKIE_SALT, token.encode(), hashlib.sha256).hexdigest()


_COOKIE_SALT = secrets.token_bytes(16)


def build_app(
    lock_dir: Path,
    folders: Sequence[Path],
    token: str | None = None,
    ray_addresses: Sequence[str] = (),
    queue: QueueWatch | None = None,
) -> Starlette:
    """The app over one lock folder, the given .devpool folders, Ray clusters and queue."""
    sources = Sources(lock_dir, views.projects_of(folders), list(ray_addresses), queue=queue)

    def partial(request: Request) -> bool:
        return request.headers.get("x-devpool-partial") == "1"

    async def home(request: Request) -> Response:
        data = await asyncio.to_thread(sources.overview)
        body = pages.overview(data)
        if partial(request):
            return HTMLResponse(body)
        return HTMLResponse(pages.document("devpool · host", body))

    def api(view: str) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            data = await asyncio.to_thread(sources.overview)
            return JSONResponse(data if view == "overview" else data[view])

        return endpoint

    def find_run(request: Request) -> tuple[views.ProjectFolder, Path] | None:
        key, run_id = request.path_params["project"], request.path_params["run"]
        project = next((p for p in sources.projects if p.key == key), None)
        if project is None or not _NAME.match(run_id):
            return None
        folder = project.runs / run_id
        if folder.is_symlink() or not folder.is_dir():
            return None
        return project, folder

    def run_data(request: Request) -> dict[str, Any] | None:
        found = find_run(request)
        if found is None:
            return None
        return sources.run(found[0].key, found[1].name)

    async def run_page(request: Request) -> Response:
        run = await asyncio.to_thread(run_data, request)
        if run is None:
            return PlainTextResponse("no such run", 404)
        body = pages.run_page(run)
        if partial(request):
            return HTMLResponse(body)
        return HTMLResponse(pages.document(f"devpool · run {run['run']}", body))

    async def run_json(request: Request) -> Response:
        run = await asyncio.to_thread(run_data, request)
        if run is None:
            return JSONResponse({"schema": device_views.SCHEMA, "error": "no such run"}, 404)
        return JSONResponse({"schema": device_views.SCHEMA, "run": run})

    async def report(request: Request) -> Response:
        found = find_run(request)
        record = found[1] / "record.jsonl" if found else None
        if record is None or record.is_symlink() or not record.is_file():
            return PlainTextResponse("no such run", 404)
        from devpool.errors import DevpoolError
        from devpool.report.html import render_html
        from devpool.report.record import read_record

        try:
            text = await asyncio.to_thread(lambda: render_html(read_record(record)))
        except DevpoolError as exc:
            return PlainTextResponse(str(exc), 404)
        return HTMLResponse(text)

    async def run_file(request: Request) -> Response:
        found = find_run(request)
        if found is None:
            return PlainTextResponse("no such run", 404)
        path = safe_file(found[1], request.path_params["path"])
        if path is None:
            return PlainTextResponse("no such file in this run's folder", 404)
        data = await asyncio.to_thread(path.read_bytes)
        return Response(data, media_type="text/plain; charset=utf-8")

    async def events(request: Request) -> Response:
        return StreamingResponse(changes(sources, request), media_type="text/event-stream")

    routes = [
        Route("/", home),
        Route("/api/v1/overview", api("overview")),
        *(Route(f"/api/v1/{n}", api(n)) for n in ("devices", "waiting", "tests", "ray", "queue")),
        Route("/api/v1/runs/live", api("live")),
        Route("/api/v1/runs/recent", api("recent")),
        Route("/api/v1/runs/{project}/{run}", run_json),
        Route("/runs/{project}/{run}", run_page),
        Route("/runs/{project}/{run}/report.html", report),
        Route("/runs/{project}/{run}/files/{path:path}", run_file),
        Route("/events", events),
    ]

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # Read every record once while the first visitor is still on the way: a host with
        # hundreds of runs would otherwise make the first page wait for all of them.
        warming = threading.Thread(target=sources.overview, name="devpool-serve-warm", daemon=True)
        warming.start()
        yield
        if queue is not None:
            queue.close()

    return Starlette(
        routes=routes, middleware=[Middleware(TokenCheck, token=token)], lifespan=lifespan
    )


def safe_file(run_dir: Path, relative: str) -> Path | None:
    """A regular file inside the run folder, reached through no symlink; None otherwise."""
    if not relative or "\0" in relative or relative.startswith("/"):
        return None
    base = run_dir.resolve()
    candidate = base
    for part in Path(relative).parts:
        if part in ("", ".", ".."):
            return None
        candidate = candidate / part
        if candidate.is_symlink():
            return None
    resolved = candidate.resolve()
    if not resolved.is_relative_to(base) or not resolved.is_file():
        return None
    return resolved


async def changes(sources: Sources, request: Request) -> AsyncIterator[str]:
    """Server-sent events: one ``change`` message whenever the files or lock states move."""
    # The baseline comes before the first byte: the page refreshes once when the stream
    # opens, so whatever moved between its render and this baseline is shown too.
    seen = await asyncio.to_thread(sources.signature)
    locks = await asyncio.to_thread(sources.lock_signature)
    yield "retry: 1000\n\n"
    asked = time.monotonic()
    quiet = 0
    while not await request.is_disconnected():
        await asyncio.sleep(POLL_SECONDS)
        now = await asyncio.to_thread(sources.signature)
        moved = now != seen
        seen = now
        if moved or time.monotonic() - asked >= STATUS_SECONDS:
            asked = time.monotonic()
            current = await asyncio.to_thread(sources.lock_signature)
            moved = moved or current != locks
            locks = current
        quiet = 0 if moved else quiet + 1
        if moved:
            yield f"data: {time.time():.3f}\n\n"
        elif quiet % 30 == 0:
            yield ": keep-alive\n\n"  # lets a proxy (and the server) see a closed client
