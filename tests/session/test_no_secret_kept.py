"""No password given to a run, in any form libpq takes, is kept in a file the run writes or
shown on the host page (database.shown, used wherever a command line or option is kept)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from devpool.database import shown, shown_args

FORMS = {
    "postgresql://u:SECRET1@h:5432/db": "postgresql://u:***@h:5432/db",
    "--devpool-queue=postgres://u:SECRET2@h/db?sslmode=require": (
        "--devpool-queue=postgres://u:***@h/db?sslmode=require"
    ),
    "postgresql://h/db?password=SECRET3&sslmode=require": (
        "postgresql://h/db?password=***&sslmode=require"
    ),
    "host=h password=SECRET4 dbname=x": "host=h password=*** dbname=x",
    "host=h password = 'SECRET 5' dbname=x": "host=h password = *** dbname=x",
    "PGPASSWORD=SECRET6": "PGPASSWORD=***",
    "postgresql://u:SEC@RET7@h/db": "postgresql://u:***@h/db",
    "tests/test_a.py": "tests/test_a.py",
}


@pytest.mark.parametrize(("given", "kept"), FORMS.items())
def test_every_password_form_is_hidden(given: str, kept: str) -> None:
    assert shown(given) == kept
    assert shown_args(["-q", given]) == ["-q", kept]


def test_a_run_keeps_no_password_given_in_any_form(tmp_path: Path, postgres: object) -> None:
    url: str = postgres.url  # type: ignore[attr-defined]
    with_password = url.replace("devpool@", "devpool:SECRETURL@")
    (tmp_path / "test_it.py").write_text("def test_a():\n    pass\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEVPOOL_")}
    env["PGPASSWORD"] = "SECRETENV"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--devices", "sim:0-1"]
        + [f"--devpool-history={with_password}", "--junitxml=junit.xml"]
        + ["-W", "ignore:host=h password=SECRETKEY dbname=x", "-W", "ignore:PGPASSWORD=SECRETVAR"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.name == "record.jsonl" for p in written)
    for path in [*written]:
        data = path.read_bytes()
        for secret in (b"SECRETURL", b"SECRETENV", b"SECRETKEY", b"SECRETVAR"):
            assert secret not in data, f"{secret!r} in {path}"
    assert "SECRET" not in done.stdout + done.stderr
