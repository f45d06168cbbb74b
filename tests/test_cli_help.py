"""Every option and argument of the `devpool` command says what it is in --help."""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from devpool import cli
from devpool.devices.lockdir import default_lock_dir
from devpool.select.cli import build_transfer_parser


def parsers() -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """The main parser, each subcommand's, and the ones cli.parse builds on the side."""
    pending = [("devpool", cli.build_parser())]
    while pending:
        name, parser = pending.pop()
        yield name, parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                pending += [(f"{name} {sub}", p) for sub, p in action.choices.items()]
    for verb in ("export", "import"):
        yield f"devpool select {verb}", build_transfer_parser(argparse.ArgumentParser, verb)
    yield "devpool shard verify", cli.build_verify_parser()


@pytest.mark.parametrize("name, parser", list(parsers()), ids=[n for n, _ in parsers()])
def test_every_argument_has_a_help_string(name: str, parser: argparse.ArgumentParser) -> None:
    missing = [
        "/".join(action.option_strings) or action.dest
        for action in parser._actions
        if not isinstance(action, argparse._SubParsersAction) and not action.help
    ]
    assert not missing, f"{name}: {missing} have no help"
    if name.count(" ") >= 2:  # a command of its own parser: a line on what it does
        assert parser.description, f"{name} has no description"


def test_locks_help_names_the_default_a_run_here_uses() -> None:
    locks = dict(parsers())["devpool locks"]
    text = locks.format_help()
    assert "[tool.devpool]" in text and str(default_lock_dir()) in "".join(text.split())


def test_pytest_help_exits_0_with_devpool_installed(tmp_path: Path) -> None:
    """The plugin loads in every pytest of the venv: `pytest --help` must work there."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--help"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "--devpool-memory-reserve" in done.stdout and "(5%)" in done.stdout


@pytest.mark.parametrize("name", [n for n, _ in parsers()])
def test_every_devpool_help_exits_0(name: str, tmp_path: Path) -> None:
    words = name.split()[1:]
    argv = [sys.executable, "-c", "import sys; from devpool.cli import main; sys.exit(main())"]
    done = subprocess.run(
        [*argv, *words, "--help"], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, f"{name} --help: {done.stderr[-2000:]}"
    assert "usage:" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr
