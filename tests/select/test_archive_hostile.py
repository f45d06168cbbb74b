"""Archives come from elsewhere: a crafted one never writes outside the store, never shows a
traceback, and never unpacks without bound (select/archive.py, baseline.check_generation)."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from devpool.select import archive as archive_module
from devpool.select.archive import import_archive
from devpool.select.baseline import SCHEMA, BaselineProblem, Store

DATABASE = json.dumps({"tests": {}, "blocks": [], "files": [], "libs": []}).encode()


def manifest(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "schema": SCHEMA,
        "bucket": {"id": "0123456789abcdef", "paths": ["tests"], "markexpr": "", "keyword": ""},
        "generation": "20240101T000000.000000Z-abcdef",
        "db_sha256": hashlib.sha256(DATABASE).hexdigest(),
    }
    base.update(fields)
    return base


def tar_of(members: dict[str, bytes], mode: str = "w:gz") -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode=mode) as tar:  # type: ignore[call-overload]
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def one_generation(fields: dict[str, Any], folder: str = "g") -> bytes:
    return tar_of(
        {f"{folder}/manifest.json": json.dumps(fields).encode(), f"{folder}/deps.json": DATABASE}
    )


def files_under(root: Path) -> set[Path]:
    return {Path(dirpath) / name for dirpath, _, names in os.walk(root) for name in names} | {
        Path(dirpath) for dirpath, _, _ in os.walk(root)
    }


def import_checked(tmp: Path, data: bytes) -> str:
    """Import `data` into a store inside `tmp`; what changed outside the store must be
    nothing. Returns `ok` or the one-line problem."""
    store = tmp / "project" / ".devpool" / "select"
    archive = tmp / "in.tar.gz"
    store.mkdir(parents=True, exist_ok=True)
    archive.write_bytes(data)
    before = files_under(tmp) - files_under(store)
    try:
        import_archive(Store(store), archive)
        said = "ok"
    except BaselineProblem as exc:
        said = str(exc)
        assert "\n" not in said and said
    after = files_under(tmp) - files_under(store)
    assert after == before, f"written outside the store: {sorted(map(str, after - before))}"
    return said


ESCAPES = ["../../../../x", "/abs/x", "..", ".", "a/b", "", "x\0y", "../x", "..x", "a" * 300]


@pytest.mark.parametrize("field", ["bucket", "generation"])
@pytest.mark.parametrize("value", ESCAPES)
def test_an_id_that_is_not_a_plain_name_is_refused_before_any_path(
    tmp_path: Path, field: str, value: str
) -> None:
    fields = manifest()
    if field == "bucket":
        fields["bucket"] = {**fields["bucket"], "id": value}
    else:
        fields["generation"] = value
    said = import_checked(tmp_path, one_generation(fields))
    assert f"names no valid {field} id" in said


def test_the_plain_archive_imports_and_damaged_ones_get_one_sentence(tmp_path: Path) -> None:
    good = one_generation(manifest())
    assert import_checked(tmp_path / "a", good) == "ok"
    cases = {
        "truncated gzip": (good[: len(good) // 2], "damaged or not a tar archive"),
        "not a tar": (b"hello, world", "damaged or not a tar archive"),
        "no bucket": (one_generation({**manifest(), "bucket": None}), "no valid bucket id"),
        "bucket not a dict": (one_generation(manifest(bucket=[1])), "no valid bucket id"),
        "paths not a list": (
            one_generation(manifest(bucket={"id": "b", "paths": "x"})),
            "no list of paths",
        ),
        "no files": (tar_of({"x/notes.txt": b""}), "holds no manifest.json"),
        "manifest not json": (
            tar_of({"g/manifest.json": b"{", "g/deps.json": DATABASE}),
            "not JSON",
        ),
    }
    for name, (data, expected) in cases.items():
        assert expected in import_checked(tmp_path / name.replace(" ", "-"), data), name


def test_members_are_bounded_in_size_and_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(archive_module, "DATABASE_LIMIT", 1000)
    monkeypatch.setattr(archive_module, "MEMBERS_LIMIT", 20)
    # A gzip bomb in miniature: 100 kB of zeros compresses to a few hundred bytes.
    bomb = tar_of({"g/manifest.json": b"{}", "g/deps.json": bytes(100_000)})
    assert len(bomb) < 2000
    assert "too big" in import_checked(tmp_path / "bomb", bomb)
    many = tar_of({f"g{i}/other.txt": b"" for i in range(30)})
    assert "more than 20 files" in import_checked(tmp_path / "many", many)


names = st.one_of(st.sampled_from(ESCAPES), st.text(max_size=12))


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    bucket=st.one_of(names, st.integers(), st.none()),
    generation=st.one_of(names, st.integers(), st.none()),
    folder=names,
    cut=st.one_of(st.none(), st.integers(min_value=0, max_value=400)),
    flip=st.one_of(st.none(), st.tuples(st.integers(min_value=0), st.integers(0, 255))),
)
def test_fuzzed_archives_never_write_outside_and_never_raise_anything_else(
    tmp_path_factory: pytest.TempPathFactory,
    bucket: object,
    generation: object,
    folder: str,
    cut: int | None,
    flip: tuple[int, int] | None,
) -> None:
    fields = manifest(generation=generation)
    fields["bucket"] = {**fields["bucket"], "id": bucket}
    try:
        data = one_generation(fields, folder or "g")
    except (ValueError, UnicodeEncodeError):
        return  # tarfile itself refuses to write that name
    if cut is not None:
        data = data[:cut]
    if flip is not None and data:
        raw = bytearray(gzip.decompress(data) if cut is None else data)
        raw[flip[0] % len(raw)] = flip[1]
        data = gzip.compress(bytes(raw)) if cut is None else bytes(raw)
    import_checked(tmp_path_factory.mktemp("fuzz"), data)


def test_the_command_says_one_sentence_for_an_escaping_archive(tmp_path: Path) -> None:
    fields = manifest(generation="../../../escaped")
    (tmp_path / "evil.tar.gz").write_bytes(one_generation(fields))
    done = subprocess.run(
        [sys.executable, "-m", "devpool.cli", "select", "import", "evil.tar.gz"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 4, done.stderr
    assert "names no valid generation id" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path.parent / "escaped").exists()
