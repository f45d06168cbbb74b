"""How a multi-rank test's ranks lie: ranks per node, devices per rank, each rank's torchrun
environment. One place for `ranks(n)` on a host (run/pool.py, backends/ranks.py) and for
multi-rank tests on Ray (ray/backend.py).

`nodes(m)` alone: one rank per node, each with `device_count` devices. `ranks(n)` (with
`nodes(m)`, n a multiple of m): n ranks, n/m on each node, each with `devices_per_rank`
devices, and torchrun's environment per rank: LOCAL_RANK and LOCAL_WORLD_SIZE per node,
GROUP_RANK the node's index. Every rank sees its node's devices of the test in rank order,
so `cuda:LOCAL_RANK` is its own, as under torchrun.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from devpool.plan.markers import Request


@dataclass(frozen=True)
class Layout:
    """A worker's ranks on the cluster."""

    world: int  # rank actors
    nodes: int  # placement bundles, one per node
    per_node: int  # ranks on each node
    per_rank: int  # devices each rank's actor holds
    torchrun: bool  # ranks(n): torchrun's variables for each rank

    @classmethod
    def of(cls, request: Request) -> Layout:
        nodes = max(1, request.nodes)
        if request.ranks:
            per_node = request.ranks // nodes
            return cls(request.ranks, nodes, per_node, request.devices_per_rank, True)
        return cls(nodes, nodes, 1, request.device_count, False)

    def node_of(self, rank: int) -> int:
        return rank // self.per_node

    def env(self, rank: int, master_addr: str, own: Sequence[int]) -> dict[str, str]:
        """torchrun's variables for one rank (MASTER_PORT comes with the leased port)."""
        if not self.torchrun:
            return {}
        return {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank % self.per_node),
            "WORLD_SIZE": str(self.world),
            "LOCAL_WORLD_SIZE": str(self.per_node),
            "GROUP_RANK": str(self.node_of(rank)),
            "ROLE_RANK": str(rank),
            "ROLE_WORLD_SIZE": str(self.world),
            "MASTER_ADDR": master_addr,
            "DEVPOOL_RANK_DEVICES": ",".join(str(d) for d in own),
        }

    def own(self, rank: int, devices: Sequence[int]) -> tuple[int, ...]:
        """A rank's own devices among its node's, which are in rank order."""
        local = rank % self.per_node
        return tuple(devices[local * self.per_rank : (local + 1) * self.per_rank])

    def visible(self, rank: int, claimed: Sequence[Sequence[int]]) -> tuple[int, ...]:
        """The devices a rank sees: its node's ranks' devices, in rank order."""
        if not self.torchrun:
            return tuple(claimed[rank])
        first = self.node_of(rank) * self.per_node
        return tuple(d for r in range(first, first + self.per_node) for d in claimed[r])
