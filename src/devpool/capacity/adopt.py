"""`devpool adopt [PATHS]`: what each test will ask for and the rule that gave it, the tests
that probably use a device with no request, and a [tool.devpool.paths] table covering them.

It collects as `devpool capacity` does (run nothing, the same rules applied), so its counts
by device count are capacity's.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import PurePosixPath
from typing import Any

from devpool.capacity.collect import CollectedTest, Collection, collect_suite
from devpool.capacity.costs import size_label
from devpool.capacity.device_scan import Finding, scan

ADOPT_SCHEMA = "devpool-adopt/1"


@dataclass(frozen=True)
class Adopted:
    """One test: its request and where its devices came from."""

    nodeid: str
    request: str
    device_count: int
    nodes: int
    rule: str  # "marker", "alias NAME", "path KEY" or "none": the source of its devices
    sources: dict[str, str]  # every part of its request → its source
    ranks: int = 0  # ranks(n): n processes, one test (0: an ordinary test)


@dataclass
class AdoptReport:
    tests: list[Adopted] = field(default_factory=list)
    undeclared: list[Finding] = field(default_factory=list)
    suggested: dict[str, int] = field(default_factory=dict)  # path key → tests it covers
    by_devices: dict[str, int] = field(default_factory=dict)  # capacity's row labels
    unmatched: list[str] = field(default_factory=list)


def _file(nodeid: str) -> PurePosixPath:
    return PurePosixPath(nodeid.split("::", 1)[0])


def _suggest(undeclared: list[Finding], bare: list[CollectedTest]) -> dict[str, int]:
    """The widest folders whose tests without a request all seem to use a device; a file
    where no such folder is (its other tests get the request too, as a path key gives it)."""
    seen = {f.nodeid for f in undeclared}
    keys: Counter[str] = Counter()
    for finding in undeclared:
        file = _file(finding.nodeid)
        chosen = str(file)
        for depth in range(1, len(file.parts)):
            folder = PurePosixPath(*file.parts[:depth])
            under = [t for t in bare if folder in _file(t.nodeid).parents]
            if all(t.nodeid in seen for t in under):
                chosen = str(folder)
                break
        keys[chosen] += 1
    return dict(sorted(keys.items()))


def adopt_report(seen: Collection) -> AdoptReport:
    """The report of a collected suite (collect_suite)."""
    rep = AdoptReport(unmatched=list(seen.unmatched))
    counts: Counter[tuple[int, int]] = Counter()
    bare = []
    for test in sorted(seen.tests, key=lambda t: t.nodeid):
        sources = seen.sources.get(test.nodeid, {})
        rule = sources.get("devices", "none")
        rep.tests.append(
            Adopted(
                test.nodeid,
                test.request.describe(),
                test.device_count,
                test.nodes,
                rule,
                dict(sources),
                test.ranks,
            )
        )
        counts[(test.nodes, test.device_count)] += 1
        if test.device_count == 0 and rule == "none":
            bare.append(test)
            path, _ = seen.locations.get(test.nodeid, (None, None))
            finding = scan(test.nodeid, path) if path is not None else None
            if finding is not None:
                rep.undeclared.append(finding)
    rep.by_devices = {size_label(d, n): counts[(n, d)] for n, d in sorted(counts)}
    rep.suggested = _suggest(rep.undeclared, bare)
    return rep


def _where(finding: Finding) -> str:
    return f"{_file(finding.nodeid)}:{finding.line}"


def render_text(rep: AdoptReport) -> str:
    counts = ", ".join(f"{label}: {n}" for label, n in rep.by_devices.items())
    lines = [f"{len(rep.tests)} tests by devices: {counts or 'none'}", "", "requests:"]
    width = max((len(t.nodeid) for t in rep.tests), default=0)
    for test in rep.tests:
        lines.append(f"  {test.nodeid:{width}}  {test.request:14}  {test.rule}")
    lines += ["", f"probably use a device, with no request ({len(rep.undeclared)}):"]
    for finding in rep.undeclared:
        lines.append(f"  {finding.nodeid}  {_where(finding)}: {finding.text}")
    if rep.suggested:
        lines += ["", "suggested:", "", "[tool.devpool.paths]"]
        for key, tests in rep.suggested.items():
            lines.append(f'"{key}" = {{ device_count = 1 }}  # {tests} seen to use a device')
    return "\n".join(lines) + "\n"


def render_markdown(rep: AdoptReport) -> str:
    counts = ", ".join(f"{label}: {n}" for label, n in rep.by_devices.items())
    lines = [f"**{len(rep.tests)} tests** by devices: {counts or 'none'}", ""]
    lines += ["| test | request | from |", "|---|---|---|"]
    lines += [f"| `{t.nodeid}` | {t.request} | {t.rule} |" for t in rep.tests]
    lines += ["", f"**Probably use a device, with no request** ({len(rep.undeclared)})", ""]
    if rep.undeclared:
        lines += ["| test | line | source |", "|---|---|---|"]
        lines += [f"| `{f.nodeid}` | {_where(f)} | `{f.text}` |" for f in rep.undeclared]
    if rep.suggested:
        lines += ["", "Suggested:", "", "```toml", "[tool.devpool.paths]"]
        lines += [f'"{key}" = {{ device_count = 1 }}' for key in rep.suggested]
        lines += ["```"]
    return "\n".join(lines) + "\n"


def to_json(rep: AdoptReport) -> dict[str, Any]:
    return {
        "schema": ADOPT_SCHEMA,
        "by_devices": rep.by_devices,
        "tests": [asdict(t) for t in rep.tests],
        "undeclared": [
            {**asdict(f), "path": str(f.path), "where": _where(f)} for f in rep.undeclared
        ],
        "suggested_paths": {key: {"device_count": 1} for key in rep.suggested},
        "unmatched_paths": rep.unmatched,
    }


def render_json(rep: AdoptReport) -> str:
    return json.dumps(to_json(rep), indent=2, ensure_ascii=False) + "\n"


def adopt(args: argparse.Namespace) -> int:
    """The command: collect, report, and warn of path keys that cover no collected test."""
    rep = adopt_report(collect_suite(args.paths))
    renderers = {"text": render_text, "markdown": render_markdown, "json": render_json}
    sys.stdout.write(renderers[args.format](rep))
    for key in rep.unmatched:
        print(
            f"devpool: warning: [tool.devpool.paths] {key!r} matches no collected test",
            file=sys.stderr,
        )
    return 0


def add_adopt_command(commands: argparse._SubParsersAction[Any]) -> None:
    what = (
        "show what each test will ask for and the rule that gave it, the tests that seem to "
        "use a device with no request, and a [tool.devpool.paths] table for them; runs nothing"
    )
    parser = commands.add_parser("adopt", help=what, description=what.capitalize() + ".")
    parser.add_argument(
        "paths",
        nargs="*",
        help="what pytest collects (default: testpaths); after --, pytest options too",
    )
    parser.add_argument(
        "--format", choices=("text", "markdown", "json"), default="text", help="(default text)"
    )
    parser.set_defaults(func=adopt)
