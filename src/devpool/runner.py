"""`devpool run -- ARGS`: pytest as a child, so its truth survives pipes, kills and step timeouts.

`pytest ... | tee log` reports tee's exit code unless the shell has `set -o pipefail`,
and a step timeout kills pytest before it prints a summary. This wrapper owns the run
record's path, forwards SIGINT/SIGTERM to pytest, and afterwards renders the summary
from the record (and appends it to GITHUB_STEP_SUMMARY), then exits with pytest's code.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from devpool.errors import DevpoolError
from devpool.record import read_record
from devpool.report.github import write_step_summary
from devpool.report.text import render_text


def run_pytest(args: Sequence[str], record: Path | None) -> int:
    """Run `python -m pytest ARGS` under devpool; return its exit code (128+N if killed by N)."""
    pytest_args = list(args[1:] if args and args[0] == "--" else args)
    if record is None:
        stamp = time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"
        record = Path.cwd() / ".devpool" / "runs" / stamp / "record.jsonl"
    env = dict(os.environ, DEVPOOL_SUMMARY_BY_PARENT="1")
    argv = [sys.executable, "-m", "pytest", *pytest_args, f"--devpool-run-record={record}"]
    child = subprocess.Popen(argv, env=env)

    def forward(signum: int, frame: object) -> None:
        child.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    exit_code = 128 - code if code < 0 else code
    (record.parent / "exitcode").parent.mkdir(parents=True, exist_ok=True)
    (record.parent / "exitcode").write_text(f"{exit_code}\n", encoding="utf-8")
    _after(record, code)
    return exit_code


def _after(record_path: Path, code: int) -> None:
    """The summary from the record, also (above all) when pytest died before printing one."""
    if not record_path.exists():
        print(f"devpool run: pytest exited with {code} and wrote no run record", file=sys.stderr)
        return
    try:
        record = read_record(record_path)
    except DevpoolError as exc:
        print(f"devpool run: {exc}", file=sys.stderr)
        return
    if not record.finished or code < 0:
        sys.stderr.write(render_text(record))
    if os.environ.get("GITHUB_ACTIONS") == "true" or os.environ.get("GITHUB_STEP_SUMMARY"):
        write_step_summary(record)
    print(
        f"devpool run: exit code {128 - code if code < 0 else code}, record {record_path}",
        file=sys.stderr,
    )
