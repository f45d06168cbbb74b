"""`--devpool-select auto`: a full, recording run where [tool.devpool.select] full-on says
(by default the main branch, the merge queue and scheduled runs), a selective run elsewhere.

Where a run stands is read from the CI environment (GitHub Actions, GitLab CI, Buildkite),
else from the branch git has checked out.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path

MERGE_QUEUE, SCHEDULE = "merge-queue", "schedule"


def where_run(environ: Mapping[str, str], root: Path) -> tuple[str | None, set[str]]:
    """The branch this run is for (None when unknown) and its kinds: merge-queue, schedule."""
    kinds: set[str] = set()
    if environ.get("GITHUB_ACTIONS") == "true":
        event = environ.get("GITHUB_EVENT_NAME", "")
        kinds |= {SCHEDULE} if event == "schedule" else set()
        kinds |= {MERGE_QUEUE} if event == "merge_group" else set()
        # A pull request's GITHUB_REF_NAME is "<n>/merge": its branch is the head ref.
        branch = environ.get("GITHUB_HEAD_REF") or (
            environ.get("GITHUB_REF_NAME") if event == "push" else None
        )
        return branch or None, kinds
    if environ.get("GITLAB_CI") == "true":
        kinds |= {SCHEDULE} if environ.get("CI_PIPELINE_SOURCE") == "schedule" else set()
        if environ.get("CI_MERGE_REQUEST_EVENT_TYPE") == "merge_train":
            kinds.add(MERGE_QUEUE)
        branch = environ.get("CI_COMMIT_BRANCH") or environ.get(
            "CI_MERGE_REQUEST_SOURCE_BRANCH_NAME"
        )
        return branch or None, kinds
    if environ.get("BUILDKITE") == "true":
        kinds |= {SCHEDULE} if environ.get("BUILDKITE_SOURCE") == "schedule" else set()
        return environ.get("BUILDKITE_BRANCH") or None, kinds
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "symbolic-ref", "--short", "-q", "HEAD"],  # 1: detached
            capture_output=True,
            text=True,
            check=False,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None, kinds
    branch = head.stdout.strip()
    return (branch if head.returncode == 0 and branch else None), kinds


def auto_mode(full_on: Iterable[str], environ: Mapping[str, str], root: Path) -> tuple[str, str]:
    """("record", why) where full runs belong, else ("on", why)."""
    wanted = set(full_on)
    branch, kinds = where_run(environ, root)
    hits = sorted(kinds & wanted) + ([f"branch {branch}"] if branch in wanted else [])
    if hits:
        return "record", f"auto: full run and new baseline ({', '.join(hits)} is in full-on)"
    return "on", f"auto: selective run (branch {branch or 'unknown'} is not in full-on)"
