"""Where a project's duration history lives, and the one way to open it.

`--devpool-history` (and `--history` of the commands) takes a file, a SQLite history (the
default, .devpool/history.sqlite), or a PostgreSQL URL, a fleet's history (postgres.py).
The value is parsed once (`history_spec`) into a Path or a HistoryUrl; `open_history`
opens either as an SqlHistory, so no caller knows which it has.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from devpool.database import SCHEMES, shown
from devpool.errors import DevpoolError

if TYPE_CHECKING:
    from devpool.history.results import TestResult
    from devpool.history.sql import SqlHistory

URL_FORM = "a file or a PostgreSQL URL (postgresql://USER@HOST:PORT/DB)"


@dataclass(frozen=True)
class HistoryUrl:
    """A history in PostgreSQL: its URL, and the option that named it (for sentences)."""

    url: str
    option: str = "--devpool-history"

    def __str__(self) -> str:
        return shown(self.url)


HistorySpec = Path | HistoryUrl


def history_spec(value: str | Path, option: str = "--devpool-history") -> HistorySpec:
    """A file (~ expanded) or a PostgreSQL URL; ValueError for another database's URL."""
    text = str(value)
    if "://" not in text:
        return Path(text).expanduser()
    if urlsplit(text).scheme not in SCHEMES:
        raise ValueError(URL_FORM)
    return HistoryUrl(text, option)


def named_history(text: str, option: str) -> HistorySpec:
    """A history a user named on a command line or in a config: history_spec, its mistake
    one sentence naming the option (a URL shown without its password)."""
    try:
        return history_spec(text, option)
    except ValueError as exc:
        raise DevpoolError(f"{option} must be {exc}, got {shown(text)!r}") from None


def open_history(spec: HistorySpec, read_only: bool = False) -> SqlHistory:
    """The history a spec names, opened (and made, unless read_only); DevpoolError when it
    cannot be, in one sentence."""
    if isinstance(spec, HistoryUrl):
        from devpool.history.postgres import PostgresHistory

        return PostgresHistory(spec.url, read_only=read_only, option=spec.option)
    from devpool.history.durations import History

    return History(spec, read_only=read_only)


def check_history(spec: HistorySpec) -> None:
    """Refuse, in one sentence, a history a run cannot use: a folder, or a database it cannot
    reach, log in to, or read. Said before the run starts: a fleet's history that silently
    stayed empty (a wrong password, a moved server) would be found out only much later."""
    if isinstance(spec, HistoryUrl):
        open_history(spec).close()
    elif spec.is_dir():
        raise DevpoolError(f"--devpool-history {spec} is a folder, not a file")


def history_found(spec: HistorySpec, pending: bool = False) -> bool:
    """Whether there is a history to read (with `pending`: or shard runs' pending results to
    fold in): a file history's file (or pending files); a database says when it is opened."""
    if isinstance(spec, HistoryUrl):
        return True
    from devpool.history.durations import pending_files

    return spec.exists() or (pending and bool(pending_files(spec)))


def add_pending(spec: HistorySpec, run_id: str, results: Iterable[TestResult]) -> str:
    """A shard run's results, kept apart until folded in (a file history need not exist for
    its pending files); returns where they went."""
    if isinstance(spec, HistoryUrl):
        with open_history(spec, read_only=True) as history:
            return history.add_pending(run_id, results)
    from devpool.history.durations import write_pending

    return str(write_pending(spec, run_id, results))


def pending_location(spec: HistorySpec, run_id: str) -> str:
    """Where a shard run's results wait until folded in: a per-run file beside a file
    history (durations.pending_dir), rows marked with its run id in a database."""
    if isinstance(spec, HistoryUrl):
        return f"{spec} (pending run {run_id})"
    from devpool.history.durations import pending_dir

    return str(pending_dir(spec) / f"{run_id}.jsonl")


def preload_file(spec: HistorySpec, root: Path) -> Path:
    """Where a run keeps what its templates preload: beside a file history, and in the
    project's .devpool folder for a database (it is this host's, not the fleet's)."""
    from devpool.history.durations import default_history_path
    from devpool.history.preload import preload_path

    return preload_path(default_history_path(root) if isinstance(spec, HistoryUrl) else spec)


def merge(history: SqlHistory, source: HistorySpec) -> int:
    """Add to `history` the results of an export, a history file or a PostgreSQL history;
    returns the rows that were new."""
    return history.add(source_results(source))


def source_results(source: HistorySpec) -> list[TestResult]:
    """Every result of a merge source: a PostgreSQL history, a history file, or an export."""
    from devpool.history.durations import SQLITE_MAGIC, read_sqlite
    from devpool.history.results import read_export

    if isinstance(source, HistoryUrl):
        with open_history(source, read_only=True) as other:
            return list(other.results())
    source = Path(source)
    try:
        with open(source, "rb") as file:
            magic = file.read(len(SQLITE_MAGIC))
    except OSError as exc:
        raise DevpoolError(f"cannot read {source}: {exc.strerror or exc}") from None
    return read_sqlite(source) if magic == SQLITE_MAGIC else list(read_export(source))
