"""The names devpool gives its rank actors, so that Ray's state API (and so `devpool serve`
and Ray's own dashboard) can say which run, worker and rank each actor is.

A name reads ``devpool:<host>:<run id>:<worker>:<rank>``: the controller's host, the run's
id (its folder under .devpool/runs), the worker's log name in that run (``worker-3``, as
the record's ``job_start`` events name it) and the rank. Names are unique in the cluster's
``devpool`` namespace because a run id is unique on its host.
"""

from __future__ import annotations

from dataclasses import dataclass

NAMESPACE = "devpool"  # the Ray namespace the controller joins; its actors live there
PREFIX = "devpool"
_PARTS = 5


@dataclass(frozen=True)
class ActorName:
    """What an actor's name says: whose rank it is."""

    host: str
    run_id: str
    worker: str
    rank: int

    def __str__(self) -> str:
        return ":".join((PREFIX, self.host, self.run_id, self.worker, str(self.rank)))

    @classmethod
    def parse(cls, name: str | None) -> ActorName | None:
        """The parts of a name devpool gave; None for any other actor's name."""
        parts = (name or "").split(":")
        if len(parts) != _PARTS or parts[0] != PREFIX or not parts[4].isdigit():
            return None
        return cls(parts[1], parts[2], parts[3], int(parts[4]))


def templates_name(host: str, run_id: str, index: int) -> str:
    """The name of a run's NodeTemplates actor on its index-th node: not a rank's (parse()
    gives None), so views of the ranks leave it out; it still says whose run it serves."""
    return ":".join((f"{PREFIX}-templates", host, run_id, str(index)))
