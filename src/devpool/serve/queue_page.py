"""The host page's queue section, rendered from the queue view (queue_view.py)'s data."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from devpool.outcomes import GATING
from devpool.report.htmltext import breakable, escape
from devpool.wording import counted, duration

_BAD = {outcome.value for outcome in GATING}
_STATE_CSS = {"alive": "good", "lost": "bad", "left": "muted"}
_STATE_WORDS = {"alive": "alive", "lost": "lost its lease", "left": "left"}


def queue_section(view: Mapping[str, Any] | None, now: float) -> str:
    """The shared queue's runs: tests by state and outcome, jobs, what is still queued."""
    if view is None or view["database"] is None:
        return ""
    which = f"run {escape(view['run'])}" if view["run"] else "its newest runs"
    answered = f" · answered {duration(max(0.0, now - view['answered']))} ago"
    parts = [
        '<section id="queue"><h2>Queue</h2>',
        f'<p class="muted">PostgreSQL at {escape(view["database"])} · {which}'
        f"{answered if view['answered'] else ''}</p>",
    ]
    if view["problem"]:
        parts.append(f'<p class="bad queue-problem">{escape(view["problem"])}</p>')
    elif view["answered"] is None:
        parts.append("<p class=muted>asking PostgreSQL…</p>")
    elif not view["runs"]:
        parts.append("<p>No run has reached the queue yet.</p>")
    parts.extend(_run(run, now) for run in view["runs"])
    parts.append("</section>")
    return "".join(parts)


def _run(run: Mapping[str, Any], now: float) -> str:
    states = run["states"]
    outcomes = ", ".join(
        f'<span class="{"bad" if name in _BAD else ""}">{n} {escape(name)}</span>'
        for name, n in run["outcomes"].items()
    )
    published = (
        f" · published {duration(max(0.0, now - run['published']))} ago"
        if run.get("published")
        else ""
    )
    ending = "finished" if run["finished"] else "running"
    parts = [
        f'<div class="queue-run" data-run="{escape(run["run"])}" data-ending="{ending}">'
        f"<h3>run {escape(run['run'])}</h3>",
        f'<p class="queue-counts">{run["tests"]} tests: {states["done"]} done'
        f"{' (' + outcomes + ')' if outcomes else ''}, {states['claimed']} claimed, "
        f"{states['queued']} queued"
        f"{', ' + str(states['deselected']) + ' deselected' if states.get('deselected') else ''}"
        f"{published}</p>",
    ]
    if run["jobs"]:
        parts.append(
            "<table><tr><th>job</th><th>host</th><th>devices</th><th>pid</th><th>state</th>"
            "<th>claimed</th><th>done</th></tr>"
        )
        for job in run["jobs"]:
            state = job["state"]
            parts.append(
                f'<tr class="queue-job" data-job="{job["job"]}" data-state="{escape(state)}">'
                f"<td class=num>{job['job']}</td><td>{escape(job['host'])}</td>"
                f"<td class=num>{job['devices']} {escape(job['platform'])}</td>"
                f"<td class=num>{job['pid']}</td>"
                f'<td class="{_STATE_CSS.get(state, "")}">{escape(_STATE_WORDS.get(state, state))}'
                f"</td><td class=num>{job['claimed']}</td><td class=num>{job['done']}</td></tr>"
            )
        parts.append("</table>")
    else:
        parts.append("<p>No job has joined.</p>")
    parts.append(_classes(run))
    if run["queued"]:
        parts.append(_queued(run))
    parts.append("</div>")
    return "".join(parts)


def _queued(run: Mapping[str, Any]) -> str:
    stuck = ""
    if run["unholdable"]:
        largest = run["largest_live_job"]
        why = (
            "no job is alive"
            if largest is None
            else f"the largest has {counted(largest, 'device')}"
        )
        stuck = f', <span class="bad">{run["unholdable"]} that no live job can hold ({why})</span>'
    parts = [f"<h4>Queued ({run['states']['queued']}){stuck}</h4><ul>"]
    for test in run["queued"]:
        css = "queued-test" if test["holdable"] else "queued-test unholdable"
        mark = "" if test["holdable"] else ' <span class="bad">no live job can hold it</span>'
        parts.append(
            f'<li class="{css}"><span class="test">{breakable(test["test"])}</span> '
            f"({escape(test['request'])}){mark}</li>"
        )
    more = run["states"]["queued"] - len(run["queued"])
    if more > 0:
        parts.append(f"<li class=muted>… and {more} more</li>")
    parts.append("</ul>")
    return "".join(parts)


def _classes(run: Mapping[str, Any]) -> str:
    """Per platform class: its jobs, the tests they ran, device-hours and the wall; then the
    tests of a class no live job of it can take (or that the run left out)."""
    parts = []
    if run.get("classes"):
        parts.append(
            '<table class="queue-classes"><tr><th>class</th><th>jobs</th><th>tests</th>'
            "<th>device-hours</th><th>wall</th></tr>"
        )
        for row in run["classes"]:
            parts.append(
                f'<tr class="queue-class" data-class="{escape(row["platform"])}">'
                f"<td>{escape(row['platform'])}</td><td class=num>{row['jobs']}</td>"
                f"<td class=num>{row['tests']}</td><td class=num>{row['device_hours']:.2f}</td>"
                f"<td class=num>{duration(row['wall'])}</td></tr>"
            )
        parts.append("</table>")
    for gap in run.get("class_gaps") or ():
        css = "muted" if gap["deselected"] else "bad"
        parts.append(f'<p class="queue-gap {css}">{escape(gap["sentence"])}</p>')
    return "".join(parts)
