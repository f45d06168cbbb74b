"""The heartbeat: a thread with its own connection that renews a job's lease."""

from __future__ import annotations

import threading
import time

from devpool.errors import DevpoolError
from devpool.queue.store import QueueStore


class Heartbeat:
    """Renews the job's lease every third of it; `lost` once the queue took it away (or no
    renewal got through for a whole lease)."""

    def __init__(self, url: str, run_id: str, job_id: int, lease: float) -> None:
        self.url, self.run_id, self.job_id, self.lease = url, run_id, job_id, lease
        self.lost = False
        self.why = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="devpool-queue-heartbeat")
        self._thread.daemon = True

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.lease)

    def _beat(self) -> None:
        store: QueueStore | None = None
        renewed = time.monotonic()
        while not self._stop.wait(self.lease / 3):
            try:
                if store is None:
                    store = QueueStore(self.url, self.run_id)
                if not store.heartbeat(self.job_id):
                    self._lose("the queue ended this job's lease (it was not renewed in time)")
                    break
                renewed = time.monotonic()
            except (DevpoolError, OSError, _driver_errors()) as exc:
                if store is not None:
                    store.close()
                store = None
                if time.monotonic() - renewed > self.lease:
                    self._lose(f"no lease renewal got through for {self.lease:g}s ({exc})")
                    break
        if store is not None:
            store.close()

    def _lose(self, why: str) -> None:
        self.why = why
        self.lost = True


def _driver_errors() -> type[Exception]:
    import psycopg

    return psycopg.Error
