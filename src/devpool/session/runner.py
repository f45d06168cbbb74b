"""`devpool run -- ARGS`: pytest as a child, so its truth survives pipes, kills and step timeouts.

`pytest ... | tee log` reports tee's exit code unless the shell has `set -o pipefail`,
and a step timeout kills pytest before it prints a summary. This wrapper owns the run
record's path, forwards SIGINT/SIGTERM to pytest, and afterwards renders the summary
from the record (and appends it to GITHUB_STEP_SUMMARY), then exits with pytest's code.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from devpool.config import Settings
from devpool.errors import DevpoolError
from devpool.folders import devpool_dir
from devpool.project import project_settings
from devpool.report.github import write_step_summary
from devpool.report.record import read_record
from devpool.report.text import render_text
from devpool.session.output_log import OutputLog, pipe_warning, say
from devpool.session.run_folder import make_run_folder, prune_folders

_PYTHON = re.compile(r"python(\d+(\.\d+)?)?")


def pytest_arguments(args: Sequence[str]) -> list[str]:
    """pytest's arguments from what followed `devpool run`: without a leading `--`, and
    without a leading `pytest`, `py.test` or `python -m pytest` the user wrote out of habit."""
    rest = list(args[1:] if args and args[0] == "--" else args)
    # A folder named pytest here is a test path, not the command.
    if rest and Path(rest[0]).name in ("pytest", "py.test") and not Path(rest[0]).is_dir():
        return rest[1:]
    if len(rest) >= 3 and _PYTHON.fullmatch(Path(rest[0]).name) and rest[1:3] == ["-m", "pytest"]:
        return rest[3:]
    return rest


def run_pytest(args: Sequence[str], record: Path | None, log_path: Path | None = None) -> int:
    """Run `python -m pytest ARGS` under devpool; return its exit code (128+N if killed by N).

    The record, the logs and the exitcode file go to one run folder: the one the user
    chose (--devpool-run-dir, [tool.devpool] run-dir), else .devpool/runs/<run id> here.
    With `log_path`, everything printed also goes to that file as it is printed.
    """
    pytest_args = pytest_arguments(args)
    cwd = Path.cwd()
    given = {"devpool_run_record": str(record) if record is not None else None}
    settings = project_settings(cwd, pytest_args, given)
    if settings.devices is None and record is not None:
        raise DevpoolError(
            "devpool run --run-record needs devpool on: give --devices, or devices under "
            "[tool.devpool] in pyproject.toml"
        )
    log = OutputLog(log_path) if log_path is not None else None
    try:
        if settings.devices is None:
            return _plain(pytest_args, log)
        return _devpool(pytest_args, settings, log)
    finally:
        if log is not None:
            log.close()


def _devpool(pytest_args: list[str], settings: Settings, log: OutputLog | None) -> int:
    """The run with devpool on, in a run folder; the summary from its record afterwards."""
    cwd = Path.cwd()
    extra: list[str] = []
    ours: Path | None = None  # the run folder this wrapper made up (and keeps pruned)
    # One id for the run: its folder's name and the record's run_id (the controller takes it).
    stamp = time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"
    record = settings.run_record
    if record is None:
        run_dir = settings.run_dir
        if run_dir is None:
            run_dir = ours = devpool_dir(cwd) / "runs" / stamp
            extra.append(f"--devpool-run-dir={run_dir}")
        record = run_dir / "record.jsonl"
    env = dict(os.environ, DEVPOOL_SUMMARY_BY_PARENT="1", DEVPOOL_RUN_ID=stamp)
    argv = [sys.executable, "-m", "pytest", *pytest_args, *extra, f"--devpool-run-record={record}"]
    code = _wait(_start(argv, env, log))
    if log is not None:
        log.close_pipes()
    exit_code = 128 - code if code < 0 else code
    make_run_folder(record.parent, settings)  # the run made it, unless it stopped early
    (record.parent / "exitcode").write_text(f"{exit_code}\n", encoding="utf-8")
    _after(record, code, log)
    if ours is not None:
        # The run was given --devpool-run-dir, so it leaves pruning to us, as its chooser.
        prune_folders(ours.parent, settings.keep_runs)
    return exit_code


def _plain(pytest_args: Sequence[str], log: OutputLog | None) -> int:
    """devpool is off for this run (no --devices, no devices under [tool.devpool]): pytest
    runs as it would alone, and nothing is said of run records it could not write."""
    code = _wait(_start([sys.executable, "-m", "pytest", *pytest_args], None, log))
    if log is not None:
        log.close_pipes()
    exit_code = 128 - code if code < 0 else code
    say(
        f"devpool run: exit code {exit_code}; devpool was off (no --devices), so no run record", log
    )
    _warn_of_a_pipe(log)
    return exit_code


def _start(
    argv: list[str], env: dict[str, str] | None, log: OutputLog | None
) -> subprocess.Popen[bytes]:
    """pytest as our child: on our terminal, or through the log's pipes when there is one."""
    if log is None:
        return subprocess.Popen(argv, env=env)
    child = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    log.follow(child)
    return child


def _warn_of_a_pipe(log: OutputLog | None) -> None:
    warning = pipe_warning()
    if warning is not None:
        say(warning, log)


def _wait(child: subprocess.Popen[bytes]) -> int:
    """The child's status, SIGINT and SIGTERM passed on to it while it runs."""

    def forward(signum: int, frame: object) -> None:
        child.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        return child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _after(record_path: Path, code: int, log: OutputLog | None) -> None:
    """The summary from the record, also (above all) when pytest died before printing one."""
    if not record_path.exists():
        if code != 4:  # a usage error: pytest said why in its one line already
            say(f"devpool run: pytest exited with {code} and wrote no run record", log)
        _warn_of_a_pipe(log)
        return
    try:
        record = read_record(record_path)
    except DevpoolError as exc:
        say(f"devpool run: {exc}", log)
        return
    if not record.finished or code < 0:
        say(render_text(record).rstrip("\n"), log)
    if os.environ.get("GITHUB_ACTIONS") == "true" or os.environ.get("GITHUB_STEP_SUMMARY"):
        write_step_summary(record)
    say(f"devpool run: exit code {128 - code if code < 0 else code}, record {record_path}", log)
    _warn_of_a_pipe(log)
