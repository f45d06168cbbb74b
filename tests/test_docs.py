"""README.md's option and key tables name exactly what devpool validates (issue 30)."""

from __future__ import annotations

import re
from pathlib import Path

from devpool.config import OPTIONS, SELECT_KEYS, TABLE_KEYS

README = Path(__file__).resolve().parent.parent / "README.md"


def section(title: str) -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def test_the_options_table_lists_every_option_and_no_other() -> None:
    rows = [line for line in section("Options").splitlines() if line.startswith("| `--")]
    named = {name for row in rows for name in re.findall(r"--devpool-[a-z-]*[a-z]", row)}
    known = {option.cli for option in OPTIONS}
    known |= {"--devpool-no-" + option.name for option in OPTIONS if option.negatable}
    assert named <= known, f"in the README, not options: {sorted(named - known)}"
    missing = [
        option.cli
        for option in OPTIONS
        if option.cli not in named and "--devpool-no-" + option.name not in named
    ]
    assert missing == [], f"options the README's table leaves out: {missing}"


def test_the_keys_beyond_the_options_are_the_ones_validated() -> None:
    found = re.search(r"Keys beyond the\s+options:(.*?)\.\n", section("Options"), re.S)
    assert found is not None
    listed = set(re.findall(r"`([a-z-]+)`", found.group(1)))
    assert listed == set(TABLE_KEYS) - {option.name for option in OPTIONS}


def test_the_select_table_example_shows_every_select_key() -> None:
    block = section("Selective runs").split("[tool.devpool.select]\n", 1)[1].split("```")[0]
    keys = {line.split("=")[0].strip() for line in block.splitlines() if "=" in line}
    assert keys == set(SELECT_KEYS)
