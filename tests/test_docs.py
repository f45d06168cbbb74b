"""The docs site (docs/, mkdocs.yml) and the README against the code (issues 30 and 39).

The options reference is rendered from devpool.config.OPTIONS by the MkDocs hook
docs/hooks/reference.py; these tests read the same rendering, and check that the
prose of every page names only options that exist. `mkdocs build --strict` (in .ci/run)
checks the links and the navigation.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from devpool.config import OPTIONS, SELECT_KEYS, TABLE_KEYS
from docs_screenshots import FOLDER_VARIABLE, keep_for_docs

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README = ROOT / "README.md"
OPTION = re.compile(r"--devpool-[a-z-]*[a-z]")
KNOWN = {option.cli for option in OPTIONS} | {
    "--devpool-no-" + option.name for option in OPTIONS if option.negatable
}


def _hook() -> ModuleType:
    path = DOCS / "hooks" / "reference.py"
    spec = importlib.util.spec_from_file_location("reference_hook", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("reference_hook", module)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def hook() -> ModuleType:
    return _hook()


def _rows(table: str) -> dict[str, str]:
    """First cell's option names → the row, for each row of a rendered options table."""
    rows = {}
    for line in table.splitlines():
        if line.startswith("| `--"):
            first = line.split(" | ")[0]
            for name in OPTION.findall(first):
                rows[name] = line
    return rows


def test_the_reference_lists_every_option_and_no_other(hook: ModuleType) -> None:
    rows = _rows(hook.options_table(DOCS))
    assert set(rows) == KNOWN
    assert len([r for r in hook.options_table().splitlines() if r.startswith("| `--")]) == len(
        OPTIONS
    )


def test_the_reference_takes_defaults_and_meanings_from_the_code(hook: ModuleType) -> None:
    rows = _rows(hook.options_table(DOCS))
    assert "| `lease-timeout` | `600` |" in rows["--devpool-lease-timeout"]
    assert "| `ports` | `20000-29999` |" in rows["--devpool-ports"]
    assert "| `fork-server` | on |" in rows["--devpool-no-fork-server"]
    assert "`--devpool-lock-dir=DIR`" in rows["--devpool-lock-dir"]  # a path option, with =
    for option in OPTIONS:
        meaning = option.help.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")
        assert meaning in rows[option.cli]
    # "see" links each option to the pages that use it, relative to the reference page.
    assert "[Sharing devices, ports and resources](../sharing.md)" in rows["--devpool-ports"]


def test_the_reference_lists_the_keys_beyond_the_options(hook: ModuleType) -> None:
    listed = set(re.findall(r"^- `([a-z-]+)`", hook.table_keys(DOCS), re.M))
    assert listed == set(TABLE_KEYS) - {option.name for option in OPTIONS}


def test_the_reference_page_holds_the_markers_the_hook_fills(hook: ModuleType) -> None:
    page = (DOCS / "reference" / "options.md").read_text(encoding="utf-8")
    assert hook.OPTIONS_MARKER in page and hook.KEYS_MARKER in page

    class Page:
        class file:
            src_uri = "reference/options.md"

    built = hook.on_page_markdown(page, Page, {"docs_dir": str(DOCS)}, None)
    assert hook.OPTIONS_MARKER not in built and hook.KEYS_MARKER not in built
    assert set(_rows(built)) == KNOWN


def test_every_option_the_docs_and_the_readme_name_exists() -> None:
    pages = [README, *sorted(DOCS.rglob("*.md"))]
    named = {
        (page.relative_to(ROOT).as_posix(), name)
        for page in pages
        for name in OPTION.findall(page.read_text(encoding="utf-8"))
    }
    assert [(page, name) for page, name in sorted(named) if name not in KNOWN] == []


def test_the_select_table_example_shows_every_select_key() -> None:
    page = (DOCS / "selective-runs.md").read_text(encoding="utf-8")
    block = page.split("[tool.devpool.select]\n", 1)[1].split("```")[0]
    keys = {line.split("=")[0].strip() for line in block.splitlines() if "=" in line}
    assert keys == set(SELECT_KEYS)


def test_the_readme_keeps_its_two_commands_and_ci_runs_the_test_command_last() -> None:
    readme = README.read_text(encoding="utf-8")
    blocks = re.findall(r"```bash\n(.*?)\n```", readme, re.S)
    demo = "pip install -e . && python -m pytest examples --devices sim:0-7"
    tests = "pip install -e '.[dev]' && python -m pytest tests"
    assert demo in blocks and tests in blocks
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    commands = [line for line in ci.splitlines() if line.strip() and not line.startswith("#")]
    assert commands[-1] == tests.split(" && ")[1]
    # One screen or two (issue 39). A new section goes to its page under docs/ (a CI recipe to
    # docs/ci.md, a marker to docs/markers.md, ...), with a link from the README if need be.
    assert len(readme.splitlines()) <= 120, "README.md grew: move the new text into docs/"


def test_the_readme_links_only_to_pages_that_exist() -> None:
    links = re.findall(r"\]\((docs/[^)#]+)", README.read_text(encoding="utf-8"))
    assert links, "the README links into the docs"
    assert [link for link in links if not (ROOT / link).is_file()] == []


def test_screenshots_are_kept_for_the_docs_only_when_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shot = tmp_path / "shot.png"
    shot.write_bytes(b"\x89PNG picture")
    monkeypatch.delenv(FOLDER_VARIABLE, raising=False)
    assert keep_for_docs(shot, "report.png") is None
    monkeypatch.setenv(FOLDER_VARIABLE, str(tmp_path / "img"))
    kept = keep_for_docs(shot, "report.png")
    assert kept == tmp_path / "img" / "report.png"
    assert kept.read_bytes() == shot.read_bytes()


@pytest.mark.parametrize("page", ["README.md", "docs/getting-started.md"])
def test_the_first_example_of_a_page_runs_under_devpool(page: str, tmp_path: Path) -> None:
    """The README's example and the ten-line suite of Getting started pass as written."""
    text = (ROOT / page).read_text(encoding="utf-8")
    example = re.findall(r"```python\n(.*?)```", text, re.S)[0]
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_example.py").write_text(example, encoding="utf-8")
    (tmp_path / "pyproject.toml").write_text("[tool.pytest.ini_options]\naddopts = []\n")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "tests", "--devices", "sim:0-3", "-p", "no:randomly"]
        + [f"--devpool-lock-dir={tmp_path / 'locks'}", "-p", "no:cacheprovider"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    collected = example.count("\ndef test_")
    assert re.search(rf"\b{collected} passed\b", done.stdout), done.stdout


def test_the_commands_reference_shows_every_commands_help(hook: ModuleType) -> None:
    from devpool.cli import build_parser

    page = (DOCS / "reference" / "commands.md").read_text(encoding="utf-8")
    assert hook.COMMANDS_MARKER in page
    built = hook.on_page_markdown(page, None, {"docs_dir": str(DOCS)}, None)
    headings = re.findall(r"^## `(devpool[a-z ]*)`$", built, re.M)
    commands = set(hook._subcommands(build_parser()))
    assert commands and {f"devpool {name}" for name in commands} <= set(headings)
    assert {"devpool shard verify", "devpool select export", "devpool history merge"} <= set(
        headings
    )
    assert built.count("usage: devpool") == len(headings)  # each with its own --help
