"""A run's folder under .devpool/runs: its id, made private, and the old folders pruned."""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path

from devpool.config import Settings
from devpool.folders import new_folder

RUN_ID = re.compile(r"\d{8}-\d{6}-\d+")  # the folders devpool itself made under .devpool/runs


def run_id() -> str:
    """This run's id: the one `devpool run` gave its run folder (DEVPOOL_RUN_ID), else new."""
    given = os.environ.get("DEVPOOL_RUN_ID", "")
    if RUN_ID.fullmatch(given):
        return given
    return time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"


def run_folder_mode(settings: Settings) -> int:
    """0700: a run's record, logs and artifacts are this user's alone (they name tests,
    hosts and options); 0750, readable by the group, with --devpool-share-runs."""
    return 0o750 if settings.share_runs else 0o700


def make_run_folder(run_dir: Path, settings: Settings) -> Path:
    """The run folder, made if missing with ``run_folder_mode``; one that exists already (a
    --devpool-run-dir the user made) keeps its mode."""
    new_folder(run_dir, run_folder_mode(settings))
    return run_dir


def prune_runs(run_dir: Path, settings: Settings) -> None:
    """Keep the newest --devpool-keep-runs run folders under .devpool/runs, not all ever."""
    if settings.run_dir is not None:
        return  # the user chose where this run goes: leave their folders alone
    prune_folders(run_dir.parent, settings.keep_runs)


def prune_folders(runs: Path, keep: int) -> None:
    """Keep the newest ``keep`` of the run folders devpool made under ``runs``."""
    old = sorted(
        (p for p in runs.iterdir() if p.is_dir() and RUN_ID.fullmatch(p.name)),
        key=lambda p: p.name,
    )
    for folder in old[: max(0, len(old) - keep)]:
        shutil.rmtree(folder, ignore_errors=True)
