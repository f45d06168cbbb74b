"""Where a project's baselines live, as a run and the `devpool select` commands find them:
the fleet's PostgreSQL when the history (--devpool-history, else [tool.devpool] history) is
a postgresql:// URL, else <rootdir>/.devpool/select.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from devpool.config import check_tables, read_table
from devpool.errors import DevpoolError
from devpool.folders import devpool_dir
from devpool.project import find_pyproject
from devpool.select.baseline import Store
from devpool.select.options import SelectOptions, select_options

if TYPE_CHECKING:
    from devpool.select.store_pg import PgStore


def store_for(root: Path) -> Store:
    """The project's baseline store: <rootdir>/.devpool/select."""
    return Store(devpool_dir(root) / "select")


class Project:
    """The rootdir (the folder of the nearest pyproject.toml, else here), its [tool.devpool]
    table and selection options, and where its baselines are."""

    def __init__(self, cwd: Path, history: str | None = None) -> None:
        pyproject = find_pyproject(cwd)
        self.root = pyproject.parent if pyproject is not None else cwd
        self.table = read_table(pyproject)
        check_tables(self.table, str(pyproject))  # every [tool.devpool…] table, as a run does
        self.options: SelectOptions = select_options(self.table, str(pyproject))
        self.store: Store | PgStore = baseline_store(history, self.root, self.table)


def baseline_store(history: str | None, root: Path, table: Any) -> Store | PgStore:
    """The fleet's PostgreSQL when the history (--devpool-history, else [tool.devpool]
    history) is a postgresql:// URL, as a run reads it; else the project's folder."""
    from devpool.history.place import HistoryUrl, history_spec

    text = history or table.get("history")
    try:
        spec = history_spec(str(text)) if text else None
    except ValueError as exc:
        raise DevpoolError(f"--devpool-history {text}: expected {exc}") from None
    if isinstance(spec, HistoryUrl):
        from devpool.select.store_pg import PgStore

        return PgStore(spec.url)
    return store_for(root)
