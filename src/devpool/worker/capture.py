"""A test's output kept on disk as it is written, so that it outlives a dead worker.

pytest's fd capture sends file descriptors 1 and 2 to anonymous temporary files and reads
("snaps") and truncates them after each test phase. In a worker those two files are
named files beside the worker log instead (`worker-3.stdout`, `worker-3.stderr`): reports
carry the captured output as usual, and when the worker dies under a test (os._exit, a
segfault, a timeout's SIGKILL) the files still hold what that test wrote since its
phase began. The controller reads them with crash_output().
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

STREAMS = {1: "stdout", 2: "stderr"}  # file descriptor → the file's suffix
TAIL_LINES = 40


def output_file(worker_log: Path, stream: str) -> Path:
    """The file a worker's fd capture of one stream ("stdout", "stderr") writes to."""
    return worker_log.with_suffix(f".{stream}")


def worker_base(args: Sequence[str], environ: Mapping[str, str]) -> Path | None:
    """In a worker process, the path its output files are named after; None elsewhere.

    The backends set DEVPOOL_STACKS_FILE beside the worker log in every worker."""
    if not any(a == "--devpool-worker" or a.startswith("--devpool-worker=") for a in args):
        return None
    stacks = environ.get("DEVPOOL_STACKS_FILE")
    return Path(stacks) if stacks else None


@contextmanager
def named_capture_files(base: Path) -> Iterator[None]:
    """While pytest starts its global capture, its fd 1 and 2 files are named files."""
    import _pytest.capture

    module: Any = _pytest.capture  # it binds TemporaryFile by name: swap that name
    anonymous: Callable[..., IO[bytes]] = module.TemporaryFile

    def capture_file(*args: Any, **kwargs: Any) -> IO[bytes]:
        # Called from FDCaptureBase.__init__, whose targetfd says which stream this is.
        targetfd = sys._getframe(1).f_locals.get("targetfd")  # noqa: SLF001
        stream = STREAMS.get(targetfd) if isinstance(targetfd, int) else None
        if stream is None:
            return anonymous(*args, **kwargs)
        return open(output_file(base, stream), "w+b", buffering=0)  # noqa: SIM115

    module.TemporaryFile = capture_file
    try:
        yield
    finally:
        module.TemporaryFile = anonymous


def remove_empty(base: Path) -> None:
    """A worker that ends normally leaves no empty output files behind."""
    for stream in STREAMS.values():
        path = output_file(base, stream)
        try:
            if path.stat().st_size == 0:
                path.unlink()
        except OSError:
            continue


def crash_output(worker_log: Path, lines: int = TAIL_LINES) -> str:
    """The last lines of stdout and stderr a dead worker's current test wrote, labelled.

    Empty when the test wrote nothing (or ran with -s: its output is in the worker log)."""
    parts: list[str] = []
    for stream in STREAMS.values():
        path = output_file(worker_log, stream)
        try:
            with open(path, "rb") as file:
                file.seek(max(0, os.fstat(file.fileno()).st_size - 64 * 1024))
                text = file.read().decode("utf-8", errors="replace")
        except OSError:
            continue
        kept = text.splitlines()[-lines:]
        if kept:
            last = "last line" if len(kept) == 1 else f"last {len(kept)} lines"
            parts.append(
                f"---- {stream} of the test until the worker ended ({last}, {path.name}) ----"
            )
            parts.extend(kept)
    return "\n".join(parts)
