"""A Ray worker's ending, on the controller's host: why it was lost, its actors and
placement group removed, each rank's log fetched back where the code was shipped (its
node's disk is not this one's), and a multi-node worker's ranks gathered into one log."""

from __future__ import annotations

import contextlib

from devpool.backends.ray.actor import STOP_WAIT
from devpool.backends.ray.cluster import import_ray
from devpool.backends.ray.handle import RayWorker
from devpool.report.terminal import read_log
from devpool.worker.stacks import stacks_file


def fetch_logs(worker: RayWorker) -> None:
    """--devpool-ray-ship-code: the nodes' logs come back as text, written here."""
    ray = import_ray()
    for rank in worker.ranks:
        if rank.log is None or not rank.node_id:
            continue
        try:
            text, stacks = ray.get(rank.actor.log_text.remote(), timeout=10)
        except Exception:  # noqa: BLE001 - a log we cannot fetch stays as it was
            continue
        rank.log.write_text(text, encoding="utf-8")
        if stacks:
            stacks_file(rank.log).write_text(stacks, encoding="utf-8")


def gather_logs(worker: RayWorker, fetch: bool) -> None:
    """A multi-node worker's log: every rank's log, labelled, one after the other."""
    if fetch:
        fetch_logs(worker)
    if worker.world == 1:
        return
    parts, stacks = [], []
    for rank in worker.ranks:
        if rank.log is None:
            continue
        head = f"==== rank {rank.rank} on node {rank.address} ({rank.node_id[:12]}) ===="
        parts += [head, read_log(rank.log), f"(rank {rank.rank} log: {rank.log})"]
        rank_stacks = read_log(stacks_file(rank.log))
        if rank_stacks:
            stacks += [head, rank_stacks]
    if parts:
        with contextlib.suppress(OSError):
            worker.log.write_text("\n".join(parts) + "\n", encoding="utf-8")
    if stacks:
        with contextlib.suppress(OSError):
            worker.stacks.write_text("\n".join(stacks) + "\n", encoding="utf-8")


def why_lost(exc: BaseException) -> str:
    text = str(exc)
    if "node" in text.lower() and ("died" in text.lower() or "dead" in text.lower()):
        return "node died"
    return "actor died"


def remove_ray_objects(worker: RayWorker) -> None:
    """Kill a worker's actors and remove its placement group; quiet if they are gone already."""
    ray = import_ray()
    from ray.util.placement_group import remove_placement_group

    for rank in worker.ranks:
        with contextlib.suppress(Exception):
            ray.kill(rank.actor)
    if worker.placement_group is not None:
        with contextlib.suppress(Exception):
            remove_placement_group(worker.placement_group)
        worker.placement_group = None


def end_ranks(worker: RayWorker, fetch: bool) -> None:
    """Stop the ranks' processes and services, then remove the actors and placement group
    (fetch: their logs come back first, --devpool-ray-ship-code)."""
    ray = import_ray()

    stops = []
    for rank in worker.ranks:
        with contextlib.suppress(Exception):
            stops.append(rank.actor.stop.remote())
    if stops and not worker.lost:
        with contextlib.suppress(Exception):
            ray.wait(stops, num_returns=len(stops), timeout=STOP_WAIT * 2)
    if fetch and not worker.lost:
        fetch_logs(worker)
    remove_ray_objects(worker)
