"""Fair share between runs on one Ray cluster: the cluster's waiting room.

On a host, a run that waits for devices other runs hold says so with a file in the lock
folder's `waiting/` (devices/waiting_room.py), and every run holds at most a fair share while
others wait. On a cluster the runs' drivers may sit on different hosts and share no
folder; they share the cluster's key-value store (Ray's GCS). A waiting run keeps a key
there, `waiting/<session>` in devpool's namespace, with the same fields as the file and
the time it last said so; it says so again every few seconds while it waits. A key not
renewed for STALE seconds belongs to a run that died (SIGKILL leaves no goodbye) and is
removed by whoever reads it. The rule on top is the host's (waiting_room.fair_limit).
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import asdict
from typing import Any

from devpool.backends.ray.cluster import import_ray
from devpool.backends.ray.names import NAMESPACE
from devpool.devices.waiting_room import Waiter

PREFIX = "waiting/"
STALE = 15.0  # seconds: a waiting run renews its key every RENEW
RENEW = 3.0


class ClusterWaitingRoom:
    """The waiting room of a Ray cluster, in its key-value store."""

    def __init__(self, session: str) -> None:
        self.session = session
        self._mine: Waiter | None = None
        self._said = 0.0  # time.time() this run last wrote its key

    def _kv(self) -> Any:
        import_ray()
        from ray.experimental import internal_kv

        return internal_kv

    def wait(self, waiter: Waiter | None) -> None:
        """Say that this run waits (or, with None, that it no longer does)."""
        now = time.time()
        if waiter == self._mine and (waiter is None or now - self._said < RENEW):
            return
        kv = self._kv()
        key = PREFIX + self.session
        with contextlib.suppress(Exception):  # the cluster went away: the run says so itself
            if waiter is None:
                kv._internal_kv_del(key, namespace=NAMESPACE)  # noqa: SLF001
            else:
                value = json.dumps({**asdict(waiter), "seen": now})
                kv._internal_kv_put(key, value, overwrite=True, namespace=NAMESPACE)  # noqa: SLF001
        self._mine, self._said = waiter, now

    def others(self, platform: str) -> list[Waiter]:
        """Live runs other than this one that wait for devices of this platform."""
        return [waiter for waiter in self.others_all() if waiter.platform == platform]

    def others_all(self) -> list[Waiter]:
        """Live runs other than this one that wait, for devices of any platform."""
        kv = self._kv()
        found = []
        now = time.time()
        try:
            keys = kv._internal_kv_list(PREFIX, namespace=NAMESPACE)  # noqa: SLF001
        except Exception:  # noqa: BLE001 - the cluster went away: no one to share with
            return []
        for key in keys:
            name = key.decode() if isinstance(key, bytes) else str(key)
            if name == PREFIX + self.session:
                continue
            try:
                waiter, seen = _parse(kv._internal_kv_get(name, namespace=NAMESPACE))  # noqa: SLF001
            except Exception:  # noqa: BLE001 - gone meanwhile, or not ours
                continue
            if now - seen > STALE:
                with contextlib.suppress(Exception):  # a run that died while waiting
                    kv._internal_kv_del(name, namespace=NAMESPACE)  # noqa: SLF001
                continue
            found.append(waiter)
        return found


def _parse(value: bytes | str) -> tuple[Waiter, float]:
    """A waiting key's value: the waiter, and the time.time() it last said so."""
    fields = json.loads(value)
    seen = float(fields.pop("seen"))
    return Waiter(**fields), seen


def waiting_at(gcs_address: str, timeout: float = 5.0) -> list[Waiter]:
    """The runs waiting on a cluster, read without joining it as a driver (for the host
    page, which only asks): through Ray's own GCS client. Keys past STALE are left to the
    runs to remove."""
    from ray._raylet import GcsClient  # type: ignore[attr-defined,unused-ignore]  # what Ray reads it with

    client = GcsClient(address=gcs_address)
    namespace = NAMESPACE.encode()
    found = []
    now = time.time()
    for key in client.internal_kv_keys(PREFIX.encode(), namespace, timeout=timeout):
        try:
            waiter, seen = _parse(client.internal_kv_get(key, namespace, timeout=timeout))
        except Exception:  # noqa: BLE001 - gone meanwhile, or not ours
            continue
        if now - seen <= STALE:
            found.append(waiter)
    return sorted(found, key=lambda waiter: waiter.since)
