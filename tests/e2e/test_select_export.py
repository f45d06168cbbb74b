"""`devpool select export ARCHIVE` with no paths (issue 46, 1.3): every bucket's newest.

In a project without testpaths, `pytest tests --devpool-select record` records the bucket
`tests`; an export with no paths looked for the bucket `.` and found nothing. Real
sessions record two buckets; the export and the import run as the `devpool` command.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from select_project import PROJECT, git_project, record

pytestmark = pytest.mark.usefixtures("selective_env")

SELECT = [sys.executable, "-m", "devpool.cli", "select"]


def _select(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SELECT, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_an_export_without_paths_carries_every_buckets_newest_baseline(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    project = git_project(pytester.path, PROJECT)
    assert "testpaths" not in (project / "pyproject.toml").read_text()
    record(pytester, tmp_path)
    record(pytester, tmp_path, name="only-add", more=("-k", "add"))
    store = project / ".devpool" / "select"
    generations = sorted(path.name for path in store.glob("*/*"))
    assert len(generations) == 2

    archive = tmp_path / "baselines.tar.gz"
    exported = _select(project, "export", str(archive))
    assert exported.returncode == 0, exported.stderr
    assert sorted(generations) == sorted(
        line.split()[4] for line in exported.stdout.splitlines() if "exported baseline" in line
    )

    # On another runner: both buckets arrive, each checked.
    other = git_project(tmp_path / "other", PROJECT)
    imported = _select(other, "import", str(archive))
    assert imported.returncode == 0, imported.stderr
    arrived = sorted(path.name for path in (other / ".devpool" / "select").glob("*/*"))
    assert arrived == generations

    # A bucket that has none names the ones that exist, in one sentence.
    missing = _select(project, "export", str(tmp_path / "x.tar.gz"), "tests/test_math.py")
    assert missing.returncode == 4
    assert missing.stderr.splitlines() == [
        "devpool: error: no baseline for the bucket tests/test_math.py to export; baselines "
        "exist for the buckets: tests, tests -k 'add'"
    ]


def test_an_export_that_finds_no_baseline_at_all_says_so(tmp_path: Path) -> None:
    project = git_project(tmp_path / "empty", PROJECT)
    done = _select(project, "export", str(tmp_path / "x.tar.gz"))
    assert done.returncode == 4
    (line,) = done.stderr.splitlines()
    assert line.startswith("devpool: error: no baseline to export in ")
    assert "--devpool-select=record" in line and not (tmp_path / "x.tar.gz").exists()
