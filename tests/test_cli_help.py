"""Every option and argument of the `devpool` command says what it is in --help."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

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
