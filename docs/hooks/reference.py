"""MkDocs hook: the options and commands references, rendered from the code.

`devpool.config.OPTIONS` drives the command line (`--devpool-NAME`) and `[tool.devpool]`;
`Settings` holds each default. docs/reference/options.md holds two markers that this hook
replaces at build time, so the page cannot drift from the code; docs/reference/commands.md
holds one that becomes every `devpool` command's --help. tests/test_docs.py reads the same
renderings.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
from pathlib import Path
from typing import Any

from devpool.config import OPTIONS, TABLE_KEYS, Option, Settings
from devpool.devices.lockdir import default_lock_dir

OPTIONS_MARKER = "<!-- devpool:options -->"
KEYS_MARKER = "<!-- devpool:table-keys -->"

# The value an option takes, by its converter's name; a few free-text options by name.
_VALUES = {
    "_positive_int": "N",
    "_count": "N",
    "_seconds": "S",
    "_delay": "S",
    "parse_size": "SIZE",
    "_fraction": "SHARE",
    "parse_range": "LOW-HIGH",
    "_flaky_result": "pass|fail",
    "_isolation": "worker|module|job",
    "_backend": "local|ray",
    "select_mode": "record|on|shadow|auto|off",
}
_TEXT_VALUES = {
    "profile": "NAME",
    "shard": "K/N",
    "ray-address": "ADDRESS",
    "peer-service": "CMD",
    "select-base": "REV",
    "queue": "URL",
    "queue-run": "ID",
}
# Settings fields whose default is computed on the host that runs.
_COMPUTED = {
    "cpu_slots": "the host's cores",
    "lock_dir": "`/run/lock/devpool`, else `/dev/shm/devpool`, else `/tmp/devpool-locks`",
}


def value_of(option: Option) -> str:
    """How the option is written on the command line, e.g. `--devpool-lock-dir=DIR`."""
    if option.flag:
        forms = [f"`{option.cli}`"]
        if option.negatable:
            forms.append(f"`--devpool-no-{option.name}`")
        return " / ".join(forms)
    if option.path:
        return f"`{option.cli}={option.path}`"
    name = getattr(option.convert, "__name__", "")
    value = _TEXT_VALUES.get(option.name) or _VALUES.get(name, "VALUE")
    # Python-Markdown's tables leave a | inside a code span alone.
    return f"`{option.cli} {value}`"


def default_of(option: Option) -> str:
    """The default from Settings, as a reader writes it; '—' where the meaning says it."""
    field = {f.name: f for f in dataclasses.fields(Settings)}.get(option.name.replace("-", "_"))
    if field is None:  # an option Settings does not hold (read elsewhere): its help says
        return "—"
    if field.name in _COMPUTED:
        return _COMPUTED[field.name]
    value: Any = field.default
    if value is dataclasses.MISSING or value is None:
        return "—"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, tuple):
        return "`" + "-".join(str(v) for v in value) + "`"
    if isinstance(value, float):
        return f"`{value:g}`"
    return f"`{value}`"


def _pages_naming(docs: Path, needles: list[str], here: str) -> list[tuple[str, str]]:
    """(title, link from `here`) of each page under docs/ whose text holds a needle."""
    found = []
    for page in sorted(docs.rglob("*.md")):
        rel = page.relative_to(docs).as_posix()
        if rel == here:
            continue
        text = page.read_text(encoding="utf-8")
        if any(re.search(needle, text, re.M) for needle in needles):
            heading = re.search(r"^# (.+)$", text, re.M)
            title = heading.group(1) if heading else rel
            up = "../" * here.count("/")
            found.append((title, up + rel))
    return found


def _see(docs: Path | None, needles: list[str], here: str) -> str:
    if docs is None:
        return ""
    return ", ".join(f"[{t}]({link})" for t, link in _pages_naming(docs, needles, here))


def options_table(docs: Path | None = None, here: str = "reference/options.md") -> str:
    """The options as one Markdown table: option, key, default, meaning, pages that use it."""
    rows = [
        "| option | `[tool.devpool]` key | default | meaning | see |",
        "| --- | --- | --- | --- | --- |",
    ]
    for option in sorted(OPTIONS, key=lambda o: o.name):
        needles = [re.escape(option.cli) + r"\b(?!-)"]
        if option.negatable:
            needles.append(re.escape(f"--devpool-no-{option.name}") + r"\b(?!-)")
        meaning = option.help.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")
        rows.append(
            f"| {value_of(option)} | `{option.name}` | {default_of(option)} | {meaning} "
            f"| {_see(docs, needles, here)} |"
        )
    return "\n".join(rows) + "\n"


def table_keys(docs: Path | None = None, here: str = "reference/options.md") -> str:
    """The [tool.devpool] keys that are no option, each with the pages that describe it."""
    names = {option.name for option in OPTIONS}
    lines = []
    for key in sorted(TABLE_KEYS - names):
        needles = [re.escape(f"[tool.devpool.{key}"), rf"^{re.escape(key)} = "]
        see = _see(docs, needles, here)
        lines.append(f"- `{key}`" + (f": {see}" if see else ""))
    return "\n".join(lines) + "\n"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """MkDocs event: fill the reference page's markers from the code."""
    if COMMANDS_MARKER in markdown:
        return markdown.replace(COMMANDS_MARKER, commands_reference())
    if OPTIONS_MARKER not in markdown and KEYS_MARKER not in markdown:
        return markdown
    docs = Path(config["docs_dir"])
    here = page.file.src_uri
    markdown = markdown.replace(OPTIONS_MARKER, options_table(docs, here))
    return markdown.replace(KEYS_MARKER, table_keys(docs, here))


COMMANDS_MARKER = "<!-- devpool:commands -->"


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """A parser's subcommands by name (argparse keeps them in its subparsers action)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _parsers() -> list[tuple[str, argparse.ArgumentParser]]:
    """Every `devpool` command line, as the command itself parses it, in the order of
    `devpool --help`; the forms parsed apart (shard verify, select export/import) too."""
    from devpool.cli import _Parser, build_parser, build_verify_parser
    from devpool.select.cli import build_transfer_parser

    top = build_parser()
    found = [("devpool", top)]
    for name, sub in _subcommands(top).items():
        found.append((f"devpool {name}", sub))
        found += [(f"devpool {name} {n}", p) for n, p in _subcommands(sub).items()]
        if name == "shard":
            found.append(("devpool shard verify", build_verify_parser()))
        if name == "select":
            found += [
                (f"devpool select {v}", build_transfer_parser(_Parser, v))
                for v in ("export", "import")
            ]
    return found


def commands_reference() -> str:
    """`--help` of every devpool command, each under a heading of its own."""
    columns = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "92"  # argparse wraps to the terminal: one width for the page
    try:
        parts = []
        for name, parser in _parsers():
            text = parser.format_help().replace(str(default_lock_dir()), "/run/lock/devpool")
            parts.append(f"## `{name}`\n\n```text\n{text.rstrip()}\n```\n")
        return "\n".join(parts)
    finally:
        if columns is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = columns
