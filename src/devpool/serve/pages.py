"""The host page's HTML, rendered on the server from the views' data.

Every string that comes from outside (test ids, user names, run ids, log lines, details)
goes through ``escape`` (report/htmltext.py), the one rule of the HTML report. The page's
script only swaps in fresh server-rendered HTML when ``/events`` says something changed.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote

from devpool.devices.sizes import format_size
from devpool.report.htmltext import breakable, escape, link
from devpool.serve.queue_page import queue_section
from devpool.serve.ray_page import ray_section
from devpool.wording import ago, duration

# Held is the normal state of a busy host: a calm blue, not an alarm red (red is for failures).
STATE_COLORS = {"free": "#2e7d32", "held": "#1565c0", "shared": "#6a1b9a"}

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;background:#fafafa;color:#212121}
header{background:#263238;color:#fff;padding:8px 16px;display:flex;gap:16px;align-items:center}
header h1{font-size:18px;margin:0}header .meta{opacity:.8;font-size:12px}
main{padding:8px 16px}section{margin:12px 0}h2{font-size:16px;margin:8px 0}
table{border-collapse:collapse;background:#fff;min-width:50%}
td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#eceff1}.num{text-align:right}
.devices{display:grid;grid-template-columns:repeat(auto-fill,minmax(150px,1fr));gap:6px;align-items:start}
.device{border-radius:4px;padding:4px 8px;color:#fff;font-size:12px;min-width:0}
.device b{font-size:13px}.device a{color:#fff}
.device .holder{border-top:1px solid rgba(255,255,255,.4);margin-top:2px}
.device .leak{border-top:1px dashed rgba(255,255,255,.7);margin-top:2px;font-style:italic}
.state-free{background:#2e7d32}.state-held{background:#1565c0}.state-shared{background:#6a1b9a}
#live td,#recent td,#waiting td{white-space:nowrap}#live td.wrap,#recent td.wrap{white-space:normal}
#live td.wrap{min-width:14em}
#live,#recent,#waiting{overflow-x:auto}
.test{font-family:ui-monospace,monospace;overflow-wrap:anywhere;white-space:normal}
.logs{display:flex;flex-wrap:wrap;gap:2px 8px;max-width:360px}
.bad{color:#c62828;font-weight:600}.good{color:#2e7d32}.muted{color:#757575}
.bar{display:inline-block;height:10px;background:#cfd8dc;width:100px;vertical-align:middle}
.bar span{display:block;height:10px;background:#2e7d32}
pre{background:#263238;color:#eceff1;padding:6px;overflow:auto;max-height:300px}
a{color:#1565c0}
"""

_SCRIPT = """
(function(){
  var main=document.getElementById('main');
  function refresh(){
    fetch(location.pathname+location.search,{headers:{'X-Devpool-Partial':'1'},
      credentials:'same-origin'}).then(function(r){return r.ok?r.text():null})
      .then(function(t){if(t!==null){main.innerHTML=t;
        document.body.setAttribute('data-refreshed',String(Date.now()));}});
  }
  var state=document.getElementById('live-state');
  function say(text,color){if(state){state.textContent=text;state.style.color=color;}}
  if(window.EventSource){
    var es=new EventSource('/events');
    es.onopen=function(){say('\u25cf live','#81c784');refresh();};
    es.onerror=function(){say('\u25cb reconnecting','#ffb74d');};
    es.onmessage=function(){refresh();};
  }else{setInterval(refresh,2000);}
})();
"""


def _when(moment: float | None) -> str:
    if not moment:
        return ""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(moment))


def _run_link(run: Mapping[str, Any] | None, run_id: str | None) -> str:
    if run is not None:
        return link(run["page"], str(run["run"]))
    return escape(run_id or "unknown run")


def document(title: str, body: str, *, live: bool = True) -> str:
    """A whole page around server-rendered content; the script refreshes ``<main>``."""
    script = f"<script>{_SCRIPT}</script>" if live else ""
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)}</title><style>{_CSS}</style></head><body>"
        f'<header><h1>{escape(title)}</h1><span id="live-state" class="meta"></span>'
        f'<span class="meta">read only · '
        f'<a style="color:#fff" href="/">host</a> · <a style="color:#fff" '
        f'href="/api/v1/overview">JSON</a></span></header>'
        f'<main id="main">{body}</main>{script}</body></html>\n'
    )


def overview(data: Mapping[str, Any], now: float | None = None) -> str:
    """The host page's content: devices, waiting, live runs, Ray, queue, recent, tests."""
    now = now or time.time()
    runs = {r["run"]: r for r in [*data["live"]["runs"], *data["recent"]["runs"]]}
    return "".join(
        [
            devices_section(data["devices"], runs, now),
            waiting_section(data["waiting"], runs, now),
            live_section(data["live"], now, {w["run"]: w for w in data["waiting"]["waiting"]}),
            ray_section(data["ray"], now),
            queue_section(data.get("queue"), now),
            recent_section(data["recent"]),
            tests_section(data["tests"]),
        ]
    )


def devices_section(
    view: Mapping[str, Any], runs: Mapping[str, Mapping[str, Any]], now: float
) -> str:
    devices = view["devices"]
    counts = {state: sum(d["state"] == state for d in devices) for state in STATE_COLORS}
    summary = ", ".join(f"{n} {state}" for state, n in counts.items() if n)
    parts = [
        '<section id="devices"><h2>Devices</h2>',
        f'<p class="muted">lock folder {escape(view["lock_dir"])}: '
        f"{len(devices)} devices{': ' + escape(summary) if summary else ''}</p>",
    ]
    if not devices:
        parts.append("<p>No device lock files yet: no devpool run has used this folder.</p>")
    parts.append('<div class="devices">')
    for device in devices:
        state = device["state"]
        parts.append(
            f'<div class="device state-{state}" data-device="{escape(device["name"])}" '
            f'data-state="{state}"><b>{escape(device["name"])}</b> {state}'
        )
        if device["memory_free"] is not None:
            parts.append(
                f' · <span class="free-memory">{format_size(device["memory_free"])} free of '
                f"{format_size(device['memory_total'])}</span>"
            )
        for holder in device["holders"]:
            run = runs.get(holder["run"] or "")
            share = f" · {format_size(holder['memory'])}" if holder["memory"] else ""
            test = holder["test"] or "idle"
            parts.append(
                '<div class="holder">'
                f'<div class="test" data-test="{escape(test)}">{breakable(test)}</div>'
                f"run {_run_link(run, holder['run'])} · user {escape(holder['user'] or '?')}"
                f" · pid {escape(holder['pid'] or '?')} · {ago(holder['since'], now)}{share}"
                "</div>"
            )
        if device.get("last_leak"):
            parts.append(_last_leak(device["last_leak"], runs, now))
        parts.append("</div>")
    parts.append("</div></section>")
    return "".join(parts)


def _last_leak(leak: Mapping[str, Any], runs: Mapping[str, Mapping[str, Any]], now: float) -> str:
    """A device's last leak: the test that left it, the process, how it ended, when."""
    pid = leak["pid"] if leak["pid"] is not None else "?"
    command = f" <code>{breakable(leak['command'])}</code>" if leak["command"] else ""
    return (
        f'<div class="leak" data-test="{escape(leak["test"])}">last leak '
        f"{ago(leak['time'], now)} ago: "
        f'<span class="test">{breakable(leak["test"])}</span> left {escape(leak["kind"])} '
        f"pid {escape(pid)}{command}, {escape(leak['ended'])} · run "
        f"{_run_link(runs.get(leak['run']), leak['run'])}</div>"
    )


def waiting_section(
    view: Mapping[str, Any], runs: Mapping[str, Mapping[str, Any]], now: float
) -> str:
    waiting = view["waiting"]
    parts = ['<section id="waiting"><h2>Waiting</h2>']
    if not waiting:
        parts.append("<p>No run is waiting for devices.</p></section>")
        return "".join(parts)
    parts.append(
        "<table><tr><th>run</th><th>pid</th><th>waits for</th><th>held by others</th>"
        "<th>fair share</th><th>waiting</th></tr>"
    )
    for waiter in waiting:
        share = "no limit" if waiter["fair_share"] is None else f"{waiter['fair_share']} devices"
        wants = f"{waiter['wants']} {waiter['platform']} device(s)"
        parts.append(
            f'<tr class="waiter" data-run="{escape(waiter["run"])}">'
            f"<td>{_run_link(runs.get(waiter['run']), waiter['run'])}</td>"
            f"<td class=num>{escape(waiter['pid'])}</td>"
            f'<td class="wants">{escape(wants)} of {escape(waiter["pool"])}</td>'
            f"<td style='white-space:normal'>{escape(', '.join(waiter['busy']) or 'none')}</td>"
            f"<td>{escape(share)}</td><td>{ago(waiter['since'], now)}</td></tr>"
        )
    parts.append("</table></section>")
    return "".join(parts)


def _progress(run: Mapping[str, Any]) -> str:
    total = max(1, int(run["tests"]))
    width = min(100.0, 100.0 * int(run["done"]) / total)
    return f'<span class="bar"><span style="width:{width:.0f}%"></span></span>'


def _counts(counts: Mapping[str, int]) -> str:
    """The run's counts in the order its summary gives them (report.summary): no sorting here."""
    out = []
    for name in counts:
        css = "bad" if name in ("failed", "error", "timeout", "crashed", "infra") else ""
        out.append(f'<span class="{css}">{counts[name]} {escape(name)}</span>')
    return ", ".join(out) or '<span class="muted">none yet</span>'


def live_section(
    view: Mapping[str, Any], now: float, waiting: Mapping[str, Mapping[str, Any]] | None = None
) -> str:
    parts = ['<section id="live"><h2>Live runs</h2>']
    if not view["runs"]:
        parts.append("<p>No run is in progress.</p></section>")
        return "".join(parts)
    parts.append(
        "<table><tr><th>run</th><th>user</th><th>progress</th><th>done</th><th>running</th>"
        "<th>queued</th><th>failures</th><th>for</th></tr>"
    )
    for run in view["runs"]:
        endings = Counter(str(failure["outcome"]) for failure in run["failures"])
        failures = (
            f'<a class="bad" href="{escape(run["page"])}#failures">'
            f"{escape(', '.join(f'{n} {outcome}' for outcome, n in endings.items()))}</a>"
            if endings
            else '<span class="good">0</span>'
        )
        running = "".join(
            f'<div class="test">{breakable(t["test"])}</div>' for t in run["running_tests"][:8]
        )
        waits = (waiting or {}).get(run["run"])
        if waits is not None:
            running += (
                f'<div class="bad"><a href="#waiting">waiting for {escape(waits["wants"])} '
                f"{escape(waits['platform'])} device(s)</a></div>"
            )
        parts.append(
            f'<tr class="live-run" data-run="{escape(run["run"])}">'
            f"<td>{link(run['page'], run['run'])}<br><span class=muted>"
            f"{escape(run['project'])}</span></td><td>{escape(run['user'])}</td>"
            f"<td>{_progress(run)}</td><td class=num>{run['done']} of {run['tests']}</td>"
            f"<td class=wrap>{run['running']}{running}</td><td class=num>{run['queued']}</td>"
            f"<td>{failures}</td><td>{duration(run['duration'])}</td></tr>"
        )
    parts.append("</table></section>")
    return "".join(parts)


def recent_section(view: Mapping[str, Any]) -> str:
    parts = ['<section id="recent"><h2>Recent runs</h2>']
    if not view["runs"]:
        parts.append("<p>No finished run in the projects' .devpool/runs folders.</p></section>")
        return "".join(parts)
    parts.append(
        "<table><tr><th>run</th><th>started</th><th>outcomes</th><th>duration</th>"
        "<th>ending</th><th>report</th></tr>"
    )
    for run in view["runs"]:
        css = "good" if run["exitstatus"] == 0 else "bad"
        shown = _first_logs(run)
        logs = "".join(
            link(href, href.rsplit("/", 1)[-1].removesuffix(".log"), breaks=True) for href in shown
        )
        if len(run["logs"]) > len(shown):
            logs += link(f"{run['page']}#logs", f"+{len(run['logs']) - len(shown)} more")
        parts.append(
            f'<tr class="recent-run" data-run="{escape(run["run"])}">'
            f"<td>{link(run['page'], run['run'])}<br><span class=muted>"
            f"{escape(run['project'])} · {escape(run['user'])}</span></td>"
            f"<td>{_when(run['start'])}</td><td class=wrap>{_counts(run['counts'])}</td>"
            f"<td>{duration(run['duration'])}</td>"
            f'<td class="{css} wrap">{escape(run["ending"])}</td>'
            f"<td class=wrap>{link(run['report'], 'HTML report')}"
            f"{'<div class=logs>logs: ' + logs + '</div>' if logs else ''}</td></tr>"
        )
    parts.append("</table></section>")
    return "".join(parts)


SHOWN_LOGS = 6  # log links in a recent run's row; its page lists them all


def _first_logs(run: Mapping[str, Any]) -> list[str]:
    """The logs a recent run's row links: its failures' own logs first, then the rest."""
    failing = {str(f["log"]).rsplit("/", 1)[-1] for f in run["failures"] if f.get("log")}
    first = [href for href in run["logs"] if href.rsplit("/", 1)[-1] in failing]
    rest = [href for href in run["logs"] if href not in first]
    return [*first, *rest][: max(SHOWN_LOGS, len(first))]


def tests_section(view: Mapping[str, Any]) -> str:
    parts = ['<section id="tests"><h2>Tests</h2>']
    for project in view["projects"]:
        parts.append(f"<h3>{escape(project['project'])}</h3>")
        if project["problem"]:
            parts.append(f'<p class="bad">{escape(project["problem"])}</p>')
        parts.append(_flaky_table(project["flaky"]))
        parts.append(_quarantine_table(project["quarantine"]))
        parts.append(_capacity_table(project["capacity"]))
    parts.append("</section>")
    return "".join(parts)


def _table(title: str, headers: Sequence[str], rows: Sequence[str]) -> str:
    """A titled table of server-rendered rows (each ``<tr>`` already escaped)."""
    head = "".join(f"<th>{name}</th>" for name in headers)
    return f"<h4>{title}</h4><table><tr>{head}</tr>{''.join(rows)}</table>"


def _flaky_table(rows: Sequence[Mapping[str, Any]]) -> str:
    if not rows:
        return "<p>Flakiest tests: none in the history.</p>"
    return _table(
        "Flakiest tests",
        ("test", "runs", "passed", "failed", "flaky", "flips", "leaked", "last"),
        [
            f'<tr class="flaky"><td class="test">{breakable(row["test"])}</td>'
            + "".join(f"<td class=num>{row[k]}</td>" for k in ("runs", "passed", "failed"))
            + "".join(f"<td class=num>{row[k]}</td>" for k in ("flaky", "flips", "leaked"))
            + f"<td>{escape(row['last'])}</td></tr>"
            for row in rows
        ],
    )


def _until(row: Mapping[str, Any]) -> str:
    if row["until"] is None:
        return "no expiry"
    if row["expired"]:
        return f'<span class="bad">{escape(row["until"])} (expired)</span>'
    return f"{escape(row['until'])} ({row['days_left']} days left)"


def _quarantine_table(rows: Sequence[Mapping[str, Any]]) -> str:
    if not rows:
        return "<p>Quarantine: no entries in [tool.devpool.quarantine] or its file.</p>"
    return _table(
        "Quarantine",
        ("test", "reason", "owner", "until"),
        [
            f'<tr class="quarantine"><td class="test">{breakable(row["test"])}</td>'
            f"<td>{escape(row['reason'])}</td><td>{escape(row['owner'])}</td>"
            f"<td>{_until(row)}</td></tr>"
            for row in rows
        ],
    )


def _capacity_table(rows: Sequence[Mapping[str, Any]]) -> str:
    if not rows:
        return ""
    return _table(
        "Capacity by device count (from the history)",
        ("platform", "devices", "tests", "test time", "device time"),
        [
            f'<tr class="capacity"><td>{escape(row["platform"])}</td>'
            f"<td class=num>{escape(row['devices'])}</td><td class=num>{row['tests']}</td>"
            f"<td class=num>{duration(row['test_seconds'])}</td>"
            f"<td class=num>{duration(row['device_seconds'])}</td></tr>"
            for row in rows
        ],
    )


def run_page(run: Mapping[str, Any]) -> str:
    """One run: its progress or ending, what runs now, its failures with their log tails."""
    parts = [
        f'<section id="run" data-run="{escape(run["run"])}"><h2>Run {escape(run["run"])}</h2>',
        f"<p>{escape(run['project'])} · user {escape(run['user'])} · {escape(run['platform'])}"
        f" · started {_when(run['start'])} · {duration(run['duration'])} · "
        f"<b>{escape(run['ending'])}</b></p>",
        f"<p>{run['done']} of {run['tests']} done ({_counts(run['counts'])}), "
        f"{run['running']} {'running' if run['live'] else 'started, never ended'}, "
        f"{run['queued']} {'queued' if run['live'] else 'never started'} · "
        f"{link(run['report'], 'HTML report')}</p>",
    ]
    if run["damage"]:
        parts.append(f'<p class="bad">{escape(run["damage"])}</p>')
    if run["running_tests"]:
        parts.append(f"<h3>{'Running' if run['live'] else 'Started, never ended'}</h3><ul>")
        for test in run["running_tests"]:
            devices = ",".join(str(d) for d in test["devices"])
            parts.append(f'<li class="test">{breakable(test["test"])} on [{escape(devices)}]</li>')
        parts.append("</ul>")
    parts.append('<h3 id="failures">Failures</h3>')
    if not run["failures"]:
        parts.append("<p>None so far.</p>")
    for failure in run["failures"]:
        tail = "\n".join(str(line) for line in failure["tail"])
        log = failure["log"].rsplit("/", 1)[-1] if failure["log"] else ""
        log_link = (
            " · " + link(f"/runs/{run['project']}/{run['run']}/files/logs/{quote(log)}", "log")
            if log
            else ""
        )
        parts.append(
            f'<div class="failure"><div class="test">{breakable(failure["test"])}</div>'
            f'<span class="bad">{escape(failure["outcome"])}</span> '
            f"{escape(failure['detail'])}{log_link}"
            f"{'<pre>' + escape(tail) + '</pre>' if tail else ''}</div>"
        )
    if run.get("leaks"):
        parts.append(f'<h3 id="leaks">Leaks ({len(run["leaks"])})</h3><ul>')
        parts.extend(
            f'<li class="leak"><span class="test">{breakable(leak["test"])}</span>: '
            f"{escape(leak['what'])}</li>"
            for leak in run["leaks"]
        )
        parts.append("</ul>")
    if run["logs"]:
        parts.append('<h3 id="logs">Logs</h3><ul>')
        parts.extend(f"<li>{link(h, h.rsplit('/', 1)[-1])}</li>" for h in run["logs"])
        parts.append("</ul>")
    parts.append("</section>")
    return "".join(parts)
