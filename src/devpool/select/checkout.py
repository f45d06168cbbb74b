"""What git says about the checkout: the commit, the files changed since one, the files it
ignores. A selective run's inputs are what git tracks, and what a test read that git does
not ignore."""

from __future__ import annotations

import subprocess
from collections.abc import Iterable
from pathlib import Path


class BaselineProblem(Exception):
    """The baseline cannot be trusted; the message is the one-line reason for a full run."""


def git(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run git in root; the caller reads the return code (no git, no repository: not 0)."""
    return subprocess.run(
        ["git", "-C", str(root), *args], capture_output=True, text=True, check=False, timeout=60
    )


def source_state(root: Path) -> tuple[str | None, list[str]]:
    """The commit checked out and the tracked files that differ from it.

    Untracked files are no input of a baseline unless a test read them (then their hashes
    are in its database): scratch files and a run folder inside the project stay out."""
    head = git(root, "rev-parse", "HEAD")
    if head.returncode != 0:
        return None, []
    return head.stdout.strip(), changed_since(root, head.stdout.strip(), untracked=False)


def changed_since(root: Path, commit: str, untracked: bool = True) -> list[str]:
    """Files under root that differ from commit in the working tree, and (untracked) the
    new files git does not ignore."""
    diff = git(root, "diff", "--name-only", "--relative", commit)
    if diff.returncode != 0:
        raise BaselineProblem(
            f"git diff against the baseline's commit {commit[:12]} failed: "
            f"{diff.stderr.strip().splitlines()[-1:] or ['?']}"
        )
    found = set(diff.stdout.split("\n")) - {""}
    if untracked:
        new = git(root, "ls-files", "--others", "--exclude-standard")
        found |= set(new.stdout.split("\n")) - {""}
    # devpool's own folder and caches are no source, tracked or not.
    return sorted(p for p in found if not p.startswith(_NOT_SOURCE) and "__pycache__/" not in p)


_NOT_SOURCE = (".devpool/", ".pytest_cache/")


def git_ignored(root: Path, paths: Iterable[str]) -> set[str]:
    """Those of these untracked files (relative to root) that git ignores: no input of a
    selective run (a cache a test read, a build output), even when a test read them."""
    wanted = sorted(set(paths))
    if not wanted:
        return set()
    answer = subprocess.run(
        ["git", "-C", str(root), "check-ignore", "-z", "--stdin"],
        input="\0".join(wanted) + "\0",
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    if answer.returncode not in (0, 1):  # no git, no repository: none is known ignored
        return set()
    return set(answer.stdout.split("\0")) - {""}
