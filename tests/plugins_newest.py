"""The plugin matrix (tests/e2e/test_plugins.py) against the newest version of every plugin.

The [dev] extra pins exact versions, so the README's test command gives the same result on
every machine. This command asks what a project that installs the newest plugins beside
devpool would get: a throwaway venv, devpool installed in it, each [dev] package named
without its pin and installed with --upgrade, then the matrix. It prints the versions it
got and exits with the matrix's exit status.

    python tests/plugins_newest.py [--keep DIR] [extra pytest arguments]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the [dev] set needs 3.11 for its numpy pin anyway
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
MATRIX = "tests/e2e/test_plugins.py"


def unpinned_dev_packages(pyproject: Path) -> list[str]:
    """The [dev] extra's names, without versions or environment markers, once each."""
    extras = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]
    names: list[str] = []
    for requirement in extras["dev"]:
        name = re.split(r"[=<>!~;\[ ]", requirement, maxsplit=1)[0].strip()
        if name and name not in names:
            names.append(name)
    return names


def run_matrix(env_dir: Path, pytest_args: list[str]) -> int:
    venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
    python = str(env_dir / "bin" / "python")
    pip = [python, "-m", "pip", "install", "--quiet", "--upgrade"]
    subprocess.run([*pip, "pip"], check=True)
    subprocess.run(
        [*pip, "-e", str(ROOT), *unpinned_dev_packages(ROOT / "pyproject.toml")], check=True
    )
    subprocess.run([python, "-m", "pip", "freeze", "--exclude-editable"], check=True)
    return subprocess.run([python, "-m", "pytest", MATRIX, *pytest_args], cwd=ROOT).returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=Path, help="build the venv in DIR and keep it")
    args, pytest_args = parser.parse_known_args(argv)
    if args.keep is not None:
        return run_matrix(args.keep.resolve(), pytest_args)
    with tempfile.TemporaryDirectory(prefix="devpool-newest-") as scratch:
        return run_matrix(Path(scratch) / "venv", pytest_args)


if __name__ == "__main__":
    sys.exit(main())
