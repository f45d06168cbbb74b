"""Fixtures of the end-to-end tests: a folder for what target tests record, a lock folder."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def out(pytester: pytest.Pytester) -> Path:
    """Where the target project's tests record what they saw (see sessions.PRELUDE)."""
    path = pytester.path / "out"
    path.mkdir()
    return path


@pytest.fixture
def lock(tmp_path: Path) -> Path:
    """A lock folder of the session's own, so no two tests share device leases."""
    path = tmp_path / "locks"
    path.mkdir()
    return path
