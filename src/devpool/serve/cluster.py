"""The Ray view of `devpool serve`: each node of the clusters devpool runs on, its devices,
and devpool's rank actors on it with the run, worker and test each serves.

Which clusters: those named with ``--ray-address``, those of projects whose [tool.devpool]
says ``backend = "ray"``, and those live ray-backed runs joined (their record's
``ray_address``). Each is read through Ray's state API (``ray.util.state``), which the
cluster's dashboard serves: a head started from ``ray[default]`` has it. The server never
joins a cluster as a driver; it only asks.

A cluster that does not answer holds Ray's client until its GCS timeout (about 40 s), so
each question runs in a thread of its own and the page shows the last answer, or that none
came yet. A cluster is asked at most every ASK_SECONDS, and only RETRY_SECONDS after a
failure.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devpool.backends.ray.names import ActorName
from devpool.errors import DevpoolError

SCHEMA = 1
ASK_SECONDS = 2.0
RETRY_SECONDS = 10.0
STATE_TIMEOUT = 5  # seconds one call of Ray's state API may take
DASHBOARD_WAIT = 30  # seconds a cluster still starting may take to register its dashboard
CONNECT_TIMEOUT = 2.0  # seconds to reach the cluster's GCS port before asking Ray
LIMIT = 10_000  # nodes or actors listed per call (Ray's default is 100)
RANK_CLASS = "RankProcess"  # backends/ray/actor.py: the class of every devpool rank actor
_INTERNAL = ("node:", "accelerator_type:")  # Ray's own per-node markers, not capacity
_SIZES = {"memory", "object_store_memory"}  # bytes, shown apart from device counts
_GROUP = "_group_"  # in a placement group's own resource names (NPU_group_0_<id>)

Asker = Callable[[str], tuple[list[dict[str, Any]], list[dict[str, Any]]]]
WaitAsker = Callable[[str], list[dict[str, Any]]]


@dataclass(frozen=True)
class Answer:
    """What one question to a cluster brought back (or the one sentence why nothing did)."""

    at: float  # time.monotonic() of the answer: when the next question is due
    time: float  # time.time() of the answer, for the page
    nodes: list[dict[str, Any]]
    actors: list[dict[str, Any]]
    problem: str | None = None
    waiting: tuple[dict[str, Any], ...] = ()  # runs waiting there for a fair share

    def signature(self) -> tuple[Any, ...]:
        """What a reader would see change: nodes and their states, actors and theirs, the
        runs that wait."""
        nodes = tuple((n.get("node_id"), n.get("state")) for n in self.nodes)
        actors = tuple((a.get("actor_id"), a.get("state"), a.get("node_id")) for a in self.actors)
        waiting = tuple((w["session"], w["wants"]) for w in self.waiting)
        return (self.problem, nodes, actors, waiting)


def ask_state_api(address: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every node of the cluster, and devpool's actors that are not dead, as plain dicts.
    A dashboard URL (http://head:8265) is asked over HTTP without loading Ray's client
    (about 57 MB of the server's memory); a GCS address through ``ray.util.state``."""
    if address.startswith(("http://", "https://")):
        return _ask_dashboard(address.rstrip("/"))
    _reachable(address)
    # Ray's C++ client logs each failed connection attempt to stderr: the view says it once.
    os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "error")
    try:
        from ray.util import state
        from ray.util.state.exception import ServerUnavailable
    except ImportError:
        raise DevpoolError(
            "the Ray view needs Ray in devpool serve's environment: "
            "pip install '/path/to/devpool[ray]'"
        ) from None
    deadline = time.monotonic() + DASHBOARD_WAIT
    while True:
        try:
            nodes = state.list_nodes(
                address=address, limit=LIMIT, timeout=STATE_TIMEOUT, raise_on_missing_output=False
            )
            actors = state.list_actors(
                address=address,
                filters=[("class_name", "=", RANK_CLASS), ("state", "!=", "DEAD")],
                limit=LIMIT,
                detail=True,  # required_resources is a detail
                timeout=STATE_TIMEOUT,
                raise_on_missing_output=False,
            )
        except ConnectionError as exc:  # the head's dashboard not registered in the GCS yet
            if time.monotonic() > deadline:
                raise DevpoolError(f"Ray at {address} answers no state query: {exc}") from None
            time.sleep(0.5)
            continue
        except ServerUnavailable:  # registered, or Ray's default port guessed: none answers
            raise DevpoolError(
                f"Ray at {address} answers no state query: its dashboard, which serves them, "
                "is not up (a cluster started with --include-dashboard=False has none)"
            ) from None
        return [dataclasses.asdict(n) for n in nodes], [dataclasses.asdict(a) for a in actors]


def ask_waiting(address: str) -> list[dict[str, Any]]:
    """The runs waiting on a cluster for a fair share (backends/ray/waiting.py), read from
    its key-value store through its GCS address; a dashboard URL has no such face."""
    if address.startswith(("http://", "https://")):
        return []
    from devpool.backends.ray.waiting import waiting_at

    return [dataclasses.asdict(waiter) for waiter in waiting_at(address, STATE_TIMEOUT)]


def _ask_dashboard(url: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The same two lists from the dashboard's REST face of the state API (/api/v0/...)."""
    common = {"limit": LIMIT, "timeout": STATE_TIMEOUT}
    nodes = _rest(url, "nodes", {**common, "detail": 0}, [])
    wanted = [("class_name", "=", RANK_CLASS), ("state", "!=", "DEAD")]
    actors = _rest(url, "actors", {**common, "detail": 1}, wanted)
    return nodes, actors


def _rest(
    url: str, kind: str, params: Mapping[str, Any], filters: Sequence[tuple[str, str, str]]
) -> list[dict[str, Any]]:
    query = [*params.items()]
    for key, predicate, value in filters:
        query += [("filter_keys", key), ("filter_predicates", predicate), ("filter_values", value)]
    where = f"{url}/api/v0/{kind}?{urllib.parse.urlencode(query)}"
    try:
        with urllib.request.urlopen(where, timeout=STATE_TIMEOUT + CONNECT_TIMEOUT) as answer:
            body = json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        raise DevpoolError(f"Ray's state API at {url} did not answer: HTTP {exc.code}") from None
    except (OSError, ValueError) as exc:
        why = getattr(exc, "reason", None) or exc
        raise DevpoolError(f"Ray's state API at {url} did not answer: {why}") from None
    try:
        if not body["result"]:
            raise DevpoolError(f"Ray's state API at {url} did not answer: {body.get('msg')}")
        rows = body["data"]["result"]["result"]
    except (KeyError, TypeError):
        raise DevpoolError(f"{url} is not a Ray dashboard (no state API answer)") from None
    return [dict(row) for row in rows]


def _reachable(address: str) -> None:
    """A GCS address nobody listens at fails here at once, not after Ray's 40 s timeout."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return  # "auto", or a form Ray resolves itself
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT).close()
    except OSError as exc:
        raise DevpoolError(
            f"Ray's state API at {address} did not answer: nothing listens there "
            f"({exc.strerror or type(exc).__name__})"
        ) from None


def _problem(address: str, exc: BaseException) -> str:
    if isinstance(exc, DevpoolError):
        return str(exc)
    text = str(exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    if "dashboard" in text.lower():
        first += " (Ray's state API is served by its dashboard: start the head with ray[default])"
    return f"Ray's state API at {address} did not answer: {first}"


class RayWatch:
    """The last answer of each cluster, asked again in the background when due."""

    def __init__(self, ask: Asker = ask_state_api, waiting: WaitAsker = ask_waiting) -> None:
        self._ask = ask
        self._waiting = waiting
        self._answers: dict[str, Answer] = {}
        self._asking: set[str] = set()
        self._lock = threading.Lock()

    def answers(self, addresses: Iterable[str]) -> dict[str, Answer | None]:
        """Each cluster's last answer (None before the first); questions go out where due.
        Never waits for Ray."""
        now = time.monotonic()
        out: dict[str, Answer | None] = {}
        with self._lock:
            for address in addresses:
                answer = self._answers.get(address)
                wait = RETRY_SECONDS if answer is not None and answer.problem else ASK_SECONDS
                if (answer is None or now - answer.at >= wait) and address not in self._asking:
                    self._asking.add(address)
                    threading.Thread(
                        target=self._question,
                        args=(address,),
                        name=f"devpool-serve-ray-{address}",
                        daemon=True,
                    ).start()
                out[address] = answer
        return out

    def signature(self, addresses: Iterable[str]) -> tuple[Any, ...]:
        found = self.answers(addresses)
        return tuple((a, None if v is None else v.signature()) for a, v in sorted(found.items()))

    def _question(self, address: str) -> None:
        try:
            nodes, actors = self._ask(address)
            waiting: tuple[dict[str, Any], ...] = ()
            with contextlib.suppress(Exception):  # a store we cannot read: no one shown waiting
                waiting = tuple(self._waiting(address))
            answer = Answer(time.monotonic(), time.time(), nodes, actors, None, waiting)
        except Exception as exc:  # noqa: BLE001 - any failure of Ray's client is one sentence
            answer = Answer(time.monotonic(), time.time(), [], [], _problem(address, exc))
        with self._lock:
            self._answers[address] = answer
            self._asking.discard(address)


def configured_address(root: Path) -> str | None:
    """The cluster a project's [tool.devpool] runs on (backend = "ray"); None otherwise."""
    from devpool.backends.ray.cluster import cluster_address
    from devpool.project import project_settings

    try:
        settings = project_settings(root, (), {})
    except DevpoolError:
        return None  # the tests view says what is wrong with the project's table
    return cluster_address(settings.ray_address) if settings.backend == "ray" else None


def wanted(
    explicit: Sequence[str],
    configured: Sequence[tuple[str, str]],
    live: Sequence[Mapping[str, Any]],
) -> list[tuple[str, list[str]]]:
    """The clusters to show, each with why: --ray-address, a project's table, a live run."""
    reasons: dict[str, list[str]] = {}
    for address in explicit:
        reasons.setdefault(address, []).append("--ray-address")
    for project, address in configured:
        reasons.setdefault(address, []).append(f"project {project}: backend = ray")
    for run in live:
        if run.get("ray_address"):
            reasons.setdefault(run["ray_address"], []).append(f"live run {run['run']}")
    return list(reasons.items())


def ray_view(
    clusters: Sequence[tuple[str, list[str]]],
    answers: Mapping[str, Answer | None],
    runs: Sequence[Mapping[str, Any]],
) -> dict[str, Any]:
    """Per cluster: its nodes, each with its resources (and how much devpool's actors hold)
    and devpool's actors on it; actors not placed yet apart, as waiting for placement."""
    by_run = {run["run"]: run for run in runs}
    out = []
    for address, why in clusters:
        answer = answers.get(address)
        entry: dict[str, Any] = {
            "address": address,
            "why": why,
            "answered": answer.time if answer is not None else None,
            "problem": answer.problem if answer is not None else None,
            "nodes": [],
            "pending": [],
            "waiting": [],
        }
        if answer is not None:
            actors = [_actor(a, by_run) for a in answer.actors if _is_devpool(a)]
            known = {n.get("node_id") for n in answer.nodes}
            entry["nodes"] = [_node(n, actors) for n in _ordered(answer.nodes)]
            placed = [a for a in actors if a["state"] == "ALIVE" and a["node"] in known]
            entry["pending"] = [a for a in actors if a not in placed]
            entry["waiting"] = [dict(w) for w in answer.waiting]
        out.append(entry)
    return {"schema": SCHEMA, "clusters": out}


def _is_devpool(actor: Mapping[str, Any]) -> bool:
    return actor.get("class_name") == RANK_CLASS or ActorName.parse(actor.get("name")) is not None


def _ordered(nodes: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The head first, then alive nodes by address, then dead ones."""
    return sorted(
        nodes,
        key=lambda n: (
            not n.get("is_head_node"),
            n.get("state") != "ALIVE",
            str(n.get("node_ip", "")),
            str(n.get("node_id", "")),
        ),
    )


def _node(node: Mapping[str, Any], actors: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    node_id = str(node.get("node_id", ""))
    here = [a for a in actors if a["node"] == node_id and a["state"] == "ALIVE"]
    held: Counter[str] = Counter()
    for actor in here:
        held.update({k: float(v) for k, v in actor["resources"].items()})
    total = node.get("resources_total") or {}
    resources = {
        name: {"total": float(value), "devpool": held.get(name, 0.0)}
        for name, value in sorted(total.items())
        if not name.startswith(_INTERNAL) and name not in _SIZES and _GROUP not in name
    }
    return {
        "node_id": node_id,
        "address": str(node.get("node_ip", "")),
        "name": str(node.get("node_name") or ""),
        "head": bool(node.get("is_head_node")),
        "state": str(node.get("state", "")),
        "message": node.get("state_message"),
        "resources": resources,
        "memory": total.get("memory"),
        "actors": here,
    }


def _base_resources(required: Mapping[str, float]) -> dict[str, float]:
    """An actor's resources by their own names. Inside a placement group Ray asks for the
    same amount twice, as ``NPU_group_0_<id>`` (its bundle) and ``NPU_group_<id>`` (any
    bundle), plus ``bundle_group_...``: that is so much of the node's NPU, once."""
    out: dict[str, float] = {}
    for name, amount in required.items():
        base = name.split(_GROUP, 1)[0]
        if base != "bundle":
            out[base] = max(out.get(base, 0.0), float(amount))
    return dict(sorted(out.items()))


def _actor(actor: Mapping[str, Any], runs: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    name = ActorName.parse(actor.get("name"))
    run = runs.get(name.run_id) if name is not None else None
    test = None
    if run is not None and name is not None:
        test = next((t["test"] for t in run["running_tests"] if t["worker"] == name.worker), None)
    return {
        "actor_id": str(actor.get("actor_id", "")),
        "name": actor.get("name") or "",
        "state": str(actor.get("state", "")),
        "node": str(actor.get("node_id") or ""),
        "pid": actor.get("pid"),
        "resources": _base_resources(actor.get("required_resources") or {}),
        "host": name.host if name else None,
        "run": name.run_id if name else None,
        "worker": name.worker if name else None,
        "rank": name.rank if name else None,
        "test": test,
        "page": run["page"] if run is not None else None,
    }


def locks_lines(address: str | None) -> list[str]:
    """`devpool locks --ray-address`: devpool's workers on each node of the cluster, by run,
    and the runs waiting there for a fair share. Joins the cluster as a driver to read them."""
    from devpool.backends.ray.cluster import connect, import_ray
    from devpool.backends.ray.waiting import ClusterWaitingRoom

    target = connect(address)
    ray = import_ray()
    gcs = ray.get_runtime_context().gcs_address
    nodes, actors = ask_state_api(gcs)
    where = {
        n["node_id"]: n.get("node_ip") or n.get("node_name") or n["node_id"][:8] for n in nodes
    }
    held: dict[str, dict[str, int]] = {}  # run → node → ranks
    for actor in actors:
        name = ActorName.parse(actor.get("name"))
        if name is None:
            continue
        node = where.get(actor.get("node_id") or "", "not placed yet")
        run = f"{name.run_id} (host {name.host})"
        held.setdefault(run, {})
        held[run][node] = held[run].get(node, 0) + 1
    lines = [f"devpool workers on the Ray cluster at {target}:"]
    if not held:
        lines.append("  none")
    for run, per_node in sorted(held.items()):
        spread = ", ".join(f"{count} on {node}" for node, count in sorted(per_node.items()))
        lines.append(f"  run {run}: {spread}")
    waiting = ClusterWaitingRoom("devpool-locks").others_all()
    if waiting:
        lines.append("runs waiting for a fair share:")
        for waiter in waiting:
            since = time.strftime("%H:%M:%S", time.localtime(waiter.since))
            lines.append(
                f"  run {waiter.session} (pid {waiter.pid} on {waiter.host}, {waiter.platform}):"
                f" its next job needs {waiter.wants}, waiting since {since}"
            )
    return lines
