"""The `devpool` command: everything around a run (locks now; reports, capacity, shards later)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from devpool import __version__
from devpool.errors import DevpoolError
from devpool.leases import LockDir, default_lock_dir


def _locks(args: argparse.Namespace) -> int:
    lock_dir = LockDir(Path(args.lock_dir) if args.lock_dir else default_lock_dir())
    states = lock_dir.status()
    if not states:
        print(f"no device lock files in {lock_dir.path}")
        return 0
    print(f"device locks in {lock_dir.path}:")
    for state in states:
        device = f"{state.platform}:{state.device}"
        if state.held:
            who = state.holder.describe() if state.holder else "an unknown holder"
            print(f"  {device:12} held by {who}")
        else:
            print(f"  {device:12} free")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="devpool",
        description="Around a devpool run: who holds which device on this host, and more.",
    )
    parser.add_argument("--version", action="version", version=f"devpool {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    locks = commands.add_parser("locks", help="list who holds which device on this host")
    locks.add_argument("--lock-dir", help="lock folder (default: the system temp folder's)")
    locks.set_defaults(func=_locks)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `devpool` command; a user mistake is one line and exit code 4."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
    except DevpoolError as exc:
        print(f"devpool: error: {exc}", file=sys.stderr)
        return 4
    return code


if __name__ == "__main__":
    sys.exit(main())
