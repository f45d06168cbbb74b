"""Every report form tells one story (issue 29, item 1).

Hypothesis writes run records the way a run writes them (every ending a test can have: pass,
fail, setup error, a pass then a teardown error, skip, xfail, xpass, flaky, timeout, crashed,
infra, quarantined; runs that end, that SIGTERM or SIGINT interrupts, that SIGKILL cuts), and
a model says what pytest's closing line counts and which tests each category holds. Every
form is read back as a reader would: the terminal's closing block, `devpool report` text,
Markdown, JSON and HTML, the GitHub annotations, the host page's API and run page. Each must
give the model's counts and name the model's tests. Real sessions: tests/e2e/test_one_story.py.
"""

from __future__ import annotations

import html
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from devpool.report.github import GitHubLog
from devpool.report.html import render_html
from devpool.report.jsonout import render_json
from devpool.report.markdown import render_markdown
from devpool.report.record import read_record
from devpool.report.summary import INTERRUPTED, NAMED, NOT_RUN, summarize
from devpool.report.terminal import print_summary
from devpool.report.text import render_text
from devpool.serve import pages, views

T0 = 1_800_000_000.0
GATING = ("failed", "error", "timeout", "crashed", "infra")

# kind → its attempts: (outcome, counted categories, retried), the last one final
KINDS: dict[str, list[tuple[str, list[str], bool]]] = {
    "pass": [("passed", ["passed"], False)],
    "fail": [("failed", ["failed"], False)],
    "error": [("error", ["error"], False)],
    "teardown_error": [("error", ["passed", "error"], False)],
    "skip": [("skipped", ["skipped"], False)],
    "xfail": [("skipped", ["xfailed"], False)],
    "xpass": [("passed", ["xpassed"], False)],
    "flaky": [("failed", ["rerun"], True), ("flaky", ["flaky"], False)],
    "flaky_then_teardown_error": [
        ("failed", ["rerun"], True),
        ("error", ["flaky", "error"], False),
    ],
    "timeout": [("timeout", ["rerun"], True), ("timeout", ["timeout"], False)],
    "crashed": [("crashed", ["crashed"], False)],
    "infra": [("infra", ["infra"], False)],
    "quarantined": [("failed", ["quarantined"], False)],
}


class Terminal:
    """What print_summary writes, line by line, as pytest's terminal reporter would."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def write_sep(self, sep: str, title: str, **markup: Any) -> None:
        self.lines.append(f"{sep * 3} {title} {sep * 3}")

    def write_line(self, line: str, **markup: Any) -> None:
        self.lines.append(line)


@st.composite
def runs(draw: st.DrawFn) -> tuple[list[dict[str, Any]], str, int, int]:
    """(events, how the run ended, index of the test running at an interrupt, how many of its
    attempts ended (retried) before the one the signal caught)."""
    kinds = draw(st.lists(st.sampled_from(sorted(KINDS)), min_size=1, max_size=9))
    ending = draw(st.sampled_from(["finished", "sigterm", "sigint", "sigkill"]))
    cut = len(kinds) if ending == "finished" else draw(st.integers(0, len(kinds) - 1))
    ids = [f"tests/t.py::test_{i}_{kind}" for i, kind in enumerate(kinds)]
    events: list[dict[str, Any]] = [
        {
            "type": "session_start",
            "time": T0,
            "run_id": "r",
            "platform": "sim",
            "devices": [0, 1],
            "tests": len(kinds),
            "planned": ids,
        }
    ]
    now, job, before = T0, 0, 0
    for index, (nodeid, kind) in enumerate(zip(ids, kinds, strict=True)):
        if index > cut:
            break
        attempts = KINDS[kind]
        if index == cut:  # running at the signal: maybe after a retried attempt
            attempts = attempts[:-1] if len(attempts) > 1 and draw(st.booleans()) else []
            before = len(attempts)
            attempts = [*attempts, ("", [], False)]
        devices = [index % 2] if kind != "infra" else []
        for number, (outcome, counted, retried) in enumerate(attempts, 1):
            job += 1
            if kind != "infra" or not outcome:
                events.append(
                    {
                        "type": "job_start",
                        "time": now,
                        "job": job,
                        "nodeid": nodeid,
                        "devices": devices,
                        "attempt": number,
                        "log": "/logs/w.log",
                    }
                )
            if not outcome:
                continue  # still running
            now += 0.5
            bad = outcome in GATING
            events.append(
                {
                    "type": "job_end",
                    "time": now,
                    "job": job,
                    "nodeid": nodeid,
                    "test": nodeid,
                    "outcome": outcome,
                    "retried": retried,
                    "gating": bad and not retried and kind != "quarantined",
                    "devices": devices,
                    "worker_pid": None if kind == "infra" else 7,
                    "start": now - 0.5,
                    "end": now,
                    "run_time": 0.5,
                    "attempt": number,
                    "log": f"/logs/{index}.{number}.log" if bad or outcome == "flaky" else "",
                    "detail": f"detail of {kind}",
                    "tail": [f"tail of {kind}"],
                    "counted": counted,
                    "quarantined": "known, until 2099-01-01" if kind == "quarantined" else None,
                    **({"category": counted[0]} if counted[0].startswith("x") else {}),
                }
            )
    if ending != "sigkill":
        bad = any(KINDS[k][-1][0] in GATING and k != "quarantined" for k in kinds)
        status = 2 if ending != "finished" else int(bad)
        events.append({"type": "session_end", "time": now + 0.1, "exitstatus": status})
    return events, ending, cut, before


def model(
    kinds: list[str], ids: list[str], ending: str, cut: int, before: int
) -> dict[str, list[str]]:
    """What pytest's closing line counts, and which tests, for the tests that ended; then the
    test running at the signal and those never started."""
    tests: dict[str, list[str]] = {}
    for index, (nodeid, kind) in enumerate(zip(ids, kinds, strict=True)):
        if index > cut or (index == cut and ending == "finished"):
            break
        for _, counted, _ in KINDS[kind][:before] if index == cut else KINDS[kind]:
            for category in counted:
                tests.setdefault(category, []).append(nodeid)
    if ending != "finished":
        tests[INTERRUPTED] = [ids[cut]]
        if ids[cut + 1 :]:
            tests[NOT_RUN] = ids[cut + 1 :]
    return tests


# ---- reading each form back ------------------------------------------------------------------

COUNT = re.compile(r"(\d[\d,]*) ([a-z][a-z ]*[a-z])")


def text_form(text: str) -> tuple[dict[str, int], dict[str, set[str]]]:
    lines = text.splitlines()
    counts = {name: int(n) for n, name in COUNT.findall(lines[2])}
    named: dict[str, set[str]] = {}
    heading = None
    for line in lines[3:]:
        found = re.fullmatch(r"([a-z ]+) \((\d+)\):", line)
        if found:
            heading = found.group(1)
            named[heading] = set()
        elif heading and line.startswith("  "):
            named[heading].add(line.strip())
        else:
            heading = None
    return counts, named


def markdown_form(md: str) -> tuple[dict[str, int], dict[str, set[str]]]:
    counts = {name: int(n) for name, n in re.findall(r"^\| ([a-z ]+) \| (\d+) \|$", md, re.M)}
    named: dict[str, set[str]] = {}
    for heading, block in re.findall(r"^### ([a-z ]+) \(\d+\)\n\n((?:- .*\n)*)", md, re.M):
        named[heading] = {html.unescape(i) for i in re.findall(r"^- `(.*)`$", block, re.M)}
    return counts, named


def html_form(page: str) -> tuple[dict[str, int], dict[str, set[str]]]:
    chips = re.findall(r'data-outcome="([a-z ]+)">([\d,]+) ', page)
    counts = {name: int(n.replace(",", "")) for name, n in chips}
    named: dict[str, set[str]] = {}
    rows = re.findall(
        r'<tr class="(trouble|flaky|quarantined) [^"]*" data-nodeid="([^"]*)">.*?'
        r'<span class="count [^"]*">([^<]*)</span>',
        page,
    )
    for css, nodeid, label in rows:
        for category in [css] if css != "trouble" else label.split("+"):
            named.setdefault(category, set()).add(html.unescape(nodeid))
    for css, name in (("interrupted", INTERRUPTED), ("not-run", NOT_RUN)):
        section = re.search(rf'<section class="{css}">(.*?)</section>', page, re.S)
        if section:
            named[name] = {
                html.unescape(i) for i in re.findall(r'data-nodeid="([^"]*)"', section[1])
            }
    return counts, named


def terminal_form(lines: list[str]) -> dict[str, set[str]]:
    named: dict[str, set[str]] = {}
    for line in lines:
        found = re.match(r"(QUARANTINED|FLAKY|INTERRUPTED|NOT RUN|[A-Z+]+)\s+(\S+)(  |$| —)", line)
        if not found or line.startswith("==="):
            continue
        word, nodeid = found.group(1), found.group(2)
        if word == "FAILED" and " — " in line:  # the quarantined block's line
            word = "QUARANTINED"
        for category in word.lower().split("+"):
            named.setdefault(category, set()).add(nodeid)
    return named


def github_form(lines: list[str]) -> dict[str, set[str]]:
    named: dict[str, set[str]] = {}
    for line in lines:
        title = re.search(r"title=([A-Z+]+) (\S+?)(?: on |::)", line)
        assert title, line
        for category in title.group(1).lower().split("+"):
            nodeid = title.group(2).replace("%3A", ":")
            named.setdefault(category, set()).add(nodeid)
    return named


def page_counts(page: str) -> dict[str, int]:
    done = re.search(r"done \((.*?)\), ", page)
    assert done, page
    return {
        name: int(n)
        for n, name in re.findall(r'<span class="[a-z]*">(\d+) ([a-z ]+)</span>', done[1])
    }


# ---- the property ----------------------------------------------------------------------------


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(runs())
def test_every_form_counts_and_names_as_the_model_says(
    tmp_path_factory: Any, generated: tuple[list[dict[str, Any]], str, int, int]
) -> None:
    events, ending, cut, before = generated
    start = events[0]
    ids = list(start["planned"])
    kinds = [nodeid.split("_", 2)[2] for nodeid in ids]
    expected = model(kinds, ids, ending, cut, before)
    expected_counts = {name: len(tests) for name, tests in expected.items()}
    named = {name: set(tests) for name, tests in expected.items() if name in NAMED}

    path = tmp_path_factory.mktemp("run") / "record.jsonl"
    path.write_text("".join(json.dumps({"v": 1, **e}) + "\n" for e in events))
    record = read_record(path)
    summary = summarize(record)
    assert dict(summary.counts()) == expected_counts

    text_counts, text_named = text_form(render_text(record))
    assert text_counts == expected_counts
    assert text_named == named

    md_counts, md_named = markdown_form(render_markdown(record))
    assert md_counts == expected_counts
    assert md_named == named

    data = json.loads(render_json(record))
    assert data["totals"] == expected_counts
    assert {k: sorted(v) for k, v in data["tests"].items()} == {
        k: sorted(v) for k, v in expected.items()
    }
    assert data["not_run"] == expected.get(NOT_RUN, [])

    page_counts_, page_named = html_form(render_html(record))
    assert page_counts_ == expected_counts
    assert page_named == named

    terminal = Terminal()
    print_summary(terminal, summary, Path("/"))
    assert terminal_form(terminal.lines) == named

    github = GitHubLog("sim", {})
    gating = {k: v for k, v in named.items() if k in GATING}
    assert github_form(github.annotations(summary)) == gating

    host = views.summarise("p", record, live=False).to_json()
    assert host["counts"] == expected_counts
    assert host["done"] == len(ids) - len(expected.get(INTERRUPTED, [])) - len(
        expected.get(NOT_RUN, [])
    )
    assert page_counts(pages.run_page(host)) == expected_counts
    assert Counter(f["test"] for f in host["failures"]) == Counter(
        {nodeid: 1 for tests in gating.values() for nodeid in tests}
    )
