"""`devpool serve`: the subcommand, its options and the uvicorn server it runs."""

from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path
from typing import Any

from devpool.errors import DevpoolError
from devpool.serve.hosts import is_loopback
from devpool.serve.queue_view import NEWEST, QueueWatch

DEFAULT_PORT = 8470
TOKEN_ENV = "DEVPOOL_SERVE_TOKEN"


def _serve(args: argparse.Namespace) -> int:
    if args.token is not None:
        raise DevpoolError(
            "devpool serve --token is gone: a token on the command line is shown to every "
            f"user of the host by ps; use --token-file=PATH or {TOKEN_ENV}"
        )
    token = _token_from_file(args.token_file) if args.token_file else None
    token = token or os.environ.get(TOKEN_ENV) or None
    if not is_loopback(args.host) and token is None:
        raise DevpoolError(
            f"devpool serve on {args.host} (beyond loopback) needs --token-file or {TOKEN_ENV}"
        )
    try:
        import uvicorn

        from devpool.serve.app import build_app
    except ImportError as exc:
        raise DevpoolError(
            "devpool serve needs Starlette and uvicorn: "
            f"pip install '/path/to/devpool[serve]' ({exc})"
        ) from None
    if args.lock_dir:
        lock_dir = Path(args.lock_dir)
    else:
        from devpool.project import project_settings

        lock_dir = project_settings(Path.cwd(), (), {}).lock_dir
    if args.lock_dir:
        _named_folder(lock_dir, "--lock-dir", "lock folder")
    for name in args.folders:
        _named_folder(Path(name), "", ".devpool folder")
    folders = [Path(f) for f in args.folders] or [Path.cwd() / ".devpool"]
    for folder in folders:
        if folder.exists() and not folder.is_dir():
            raise DevpoolError(f"{folder} is not a .devpool folder")
    queue = _queue_watch(args.queue, args.queue_run)
    app = build_app(lock_dir, folders, token, args.ray_address, queue)
    listening = _listen(args.host, args.port)  # before the banner: a taken port says so
    where = f"http://{args.host}:{listening.getsockname()[1]}/"
    print(f"devpool serve: {where} (lock folder {lock_dir}; read only)", flush=True)
    # An open /events stream never ends by itself: give such clients a second at shutdown.
    config = uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=1)
    uvicorn.Server(config).run(sockets=[listening])
    return 0


def _queue_watch(url: str | None, run_id: str | None) -> QueueWatch | None:
    """The queue to show, its URL checked now: one not PostgreSQL's, one psycopg cannot
    parse, or no psycopg, is one sentence at start; a database that does not answer is a
    line on the page (it may come back)."""
    if url is None:
        if run_id is not None:
            raise DevpoolError("--devpool-queue-run names a run of --devpool-queue=URL: give both")
        return None
    from devpool.database import check_url, driver

    psycopg = driver()
    try:
        check_url(url)
        psycopg.conninfo.conninfo_to_dict(url)
        return QueueWatch(url, run_id or None)  # names the database as host:port
    except (ValueError, psycopg.ProgrammingError) as exc:
        said = str(exc).strip().replace(url, "the URL")  # which may hold a password
        raise DevpoolError(f"--devpool-queue is no valid PostgreSQL URL: {said}") from None


def _named_folder(path: Path, option: str, what: str) -> None:
    """A folder the user named: one a run has yet to make is shown once it is there (and
    said so); one whose parent is missing too is a mistake (a typo in the path)."""
    named = f"{option} {path}".strip()
    if path.is_dir():
        return
    if path.exists():
        raise DevpoolError(f"{named} is not a folder")
    if not path.parent.is_dir():
        raise DevpoolError(f"{named}: no such {what}, and no folder {path.parent} to hold one")
    print(f"devpool serve: {path} does not exist yet; shown once a run makes it", file=sys.stderr)


def _port(text: str) -> int:
    """--port: a TCP port number, 0 (any free one) up to 65535."""
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a port is a whole number 0-65535, got {text!r}")
    return port


def _listen(host: str, port: int) -> socket.socket:
    """A socket listening on host:port, or one sentence naming why it cannot."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise DevpoolError(f"--host {host}: {exc.strerror}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise DevpoolError(
            f"devpool serve cannot listen on {host}:{port}: {exc.strerror}"
        ) from None
    sock.set_inheritable(True)
    return sock


def _token_from_file(path: str) -> str:
    """The token, the first line of a file; one sentence when it cannot be read or is empty."""
    try:
        with open(path, encoding="utf-8") as handle:
            token = handle.read(4096).strip().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise DevpoolError(f"--token-file {path} cannot be read: {exc}") from None
    if not token or not token[0].strip():
        raise DevpoolError(f"--token-file {path} is empty")
    return token[0].strip()


def add_serve_command(commands: argparse._SubParsersAction[Any]) -> None:
    """Add `devpool serve` to the `devpool` command's subcommands."""
    serve = commands.add_parser(
        "serve", help="a live, read-only web page of this host's devices, waiting and runs"
    )
    serve.add_argument("--host", default="127.0.0.1", help="address (default 127.0.0.1)")
    serve.add_argument("--port", type=_port, default=DEFAULT_PORT, help="port (default 8470)")
    serve.add_argument("--lock-dir", help="lock folder (default: as for devpool locks)")
    serve.add_argument(
        "--token-file",
        metavar="PATH",
        help=f"a file holding the token every request must carry (or set {TOKEN_ENV}); "
        "needed off loopback",
    )
    serve.add_argument("--token", help=argparse.SUPPRESS)  # refused with a sentence: see _serve
    serve.add_argument(
        "--ray-address",
        action="append",
        default=[],
        metavar="ADDRESS",
        help="also show this Ray cluster: its dashboard URL (http://head:8265, read without "
        "loading Ray), a GCS address or auto; repeatable. Projects with backend = ray and "
        "live ray-backed runs show theirs anyway",
    )
    serve.add_argument(
        "--devpool-queue",
        dest="queue",
        metavar="URL",
        help="also show the runs of this shared queue (PostgreSQL URL, as for devpool queue "
        "status): their jobs and what is still queued",
    )
    serve.add_argument(
        "--devpool-queue-run",
        dest="queue_run",
        metavar="ID",
        help=f"show this run of --devpool-queue (default: its newest {NEWEST} runs)",
    )
    serve.add_argument(
        "folders",
        nargs="*",
        metavar="DEVPOOL_FOLDER",
        help="project .devpool/ folders (./.devpool)",
    )
    serve.set_defaults(func=_serve)
