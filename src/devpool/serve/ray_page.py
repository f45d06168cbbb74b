"""The host page's Ray section, rendered from the cluster view (cluster.py)'s data: each
cluster devpool runs on, its nodes and their devices, devpool's actors, the runs waiting."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from devpool.devices.sizes import format_size
from devpool.report.htmltext import breakable, escape, link
from devpool.wording import ago


def _amount(value: float) -> str:
    return f"{value:g}"


def _resources(node: Mapping[str, Any]) -> str:
    lines = []
    for name, amount in node["resources"].items():
        held = f" · devpool holds {_amount(amount['devpool'])}" if amount["devpool"] else ""
        lines.append(f"<div>{escape(name)} {_amount(amount['total'])}{held}</div>")
    if node["memory"]:
        lines.append(f'<div class="muted">memory {format_size(int(node["memory"]))}</div>')
    return "".join(lines)


def _ray_actor(actor: Mapping[str, Any], css: str) -> str:
    if actor["run"] is None:
        whose = f"actor {escape(actor['name'] or actor['actor_id'][:12])}"
    else:
        run = link(actor["page"], actor["run"]) if actor["page"] else escape(actor["run"])
        whose = f"run {run} · {escape(actor['worker'])} · rank {actor['rank']}"
    wants = ", ".join(f"{escape(k)} {_amount(v)}" for k, v in actor["resources"].items())
    test = actor["test"] or ""
    return (
        f'<div class="{css}" data-actor="{escape(actor["actor_id"])}" data-test="{escape(test)}">'
        f"{whose} · pid {escape(actor['pid'] or '?')} · {escape(actor['state'])}"
        f"{' · ' + wants if wants else ''}"
        f"{'<div class=test>' + breakable(test) + '</div>' if test else ''}</div>"
    )


def _ray_waiting(waiter: Mapping[str, Any], now: float) -> str:
    """A run waiting on the cluster for its fair share (backends/ray/waiting.py)."""
    return (
        f'<div class="ray-waiting" data-run="{escape(waiter["session"])}">'
        f"run {escape(waiter['session'])} · pid {escape(waiter['pid'])} on "
        f"{escape(waiter['host'])} · its next job needs {escape(waiter['wants'])} "
        f"{escape(waiter['platform'])} · waiting for {ago(waiter['since'], now)}</div>"
    )


def ray_section(view: Mapping[str, Any], now: float) -> str:
    """Each Ray cluster devpool runs on: its nodes, their devices, devpool's actors."""
    if not view["clusters"]:
        return ""
    parts = ['<section id="ray"><h2>Ray clusters</h2>']
    for found in view["clusters"]:
        parts.append(
            f'<div class="cluster" data-address="{escape(found["address"])}">'
            f"<h3>{escape(found['address'])}</h3><p class=muted>shown for "
            f"{escape('; '.join(found['why']))}"
            f"{' · answered ' + ago(found['answered'], now) + ' ago' if found['answered'] else ''}"
            "</p>"
        )
        if found["problem"]:
            parts.append(f'<p class="bad ray-problem">{escape(found["problem"])}</p>')
        elif found["answered"] is None:
            parts.append("<p class=muted>asking Ray's state API…</p>")
        if found["nodes"]:
            parts.append(
                "<table><tr><th>node</th><th>state</th><th>resources</th>"
                "<th>devpool's actors</th></tr>"
            )
        for node in found["nodes"]:
            head = " · head" if node["head"] else ""
            state_css = "good" if node["state"] == "ALIVE" else "bad"
            actors = "".join(_ray_actor(a, "ray-actor") for a in node["actors"])
            parts.append(
                f'<tr class="ray-node" data-node="{escape(node["node_id"])}" '
                f'data-state="{escape(node["state"])}">'
                f"<td>{escape(node['address'])}<br><span class=muted>"
                f"{escape(node['node_id'][:12])}{head}</span></td>"
                f'<td class="{state_css}">{escape(node["state"])}</td>'
                f"<td>{_resources(node)}</td>"
                f"<td class=wrap>{actors or '<span class=muted>none</span>'}</td></tr>"
            )
        if found["nodes"]:
            parts.append("</table>")
        if found["pending"]:
            parts.append("<h4>Waiting for a placement</h4>")
            parts.extend(_ray_actor(a, "ray-pending") for a in found["pending"])
        if found["waiting"]:
            parts.append("<h4>Runs waiting for a fair share</h4>")
            parts.extend(_ray_waiting(w, now) for w in found["waiting"])
        parts.append("</div>")
    parts.append("</section>")
    return "".join(parts)
