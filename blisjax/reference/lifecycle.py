"""Instance slots, their lifecycle and the node pools they are placed on (Decision 16).

A run has a fixed number of instance slots (``config.autoscale.max_replicas``). The
``cluster.num_instances`` initial instances take the first slots; each scale-up takes a free
slot: by default the lowest one not holding an instance (a terminated instance's slot is
reused, its caches cold), with ``--blis-quirks`` the lowest never used, since BLIS appends every
new instance to its list (a scale-up finding none is refused and flagged, the run's
``instance_slots`` overflow). Instance order, for event ties and routing, is slot order.

States: UNUSED → SCHEDULING (waiting for a node) → LOADING → WARMING_UP → ACTIVE → DRAINING →
TERMINATED (``config.codes.InstanceState``). A slot holds an instance, paying for it, from its
placement to its termination.
"""

from __future__ import annotations

from typing import NamedTuple

from blisjax.config.codes import HOLDING_STATES, ROUTABLE_STATES, InstanceState
from blisjax.gorand import blis_subsystem_rand
from blisjax.rules import delay_us, held_cost

HOLDING, ROUTABLE = HOLDING_STATES, ROUTABLE_STATES
#: States in which an instance counts toward the replicas a scale-down leaves.
LIVE = HOLDING - {InstanceState.DRAINING}
#: States of an instance still coming up (BLIS's pending replicas).
COMING_UP = frozenset({InstanceState.SCHEDULING, InstanceState.LOADING})

class Streams:
    """BLIS's lifecycle random streams, created when first drawn from (§3.5)."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._rngs: dict[str, object] = {}

    def delay_us(self, spec, stream: str) -> int:
        if spec.stddev_s <= 0:
            return delay_us(spec, None)
        if stream not in self._rngs:
            self._rngs[stream] = blis_subsystem_rand(self.seed, stream)
        return delay_us(spec, self._rngs[stream])


class Node(NamedTuple):
    """A node of a pool: where it sits and when it is ready (µs)."""

    pool: int
    ready_us: int


class Placement:
    """GPUs of the node pools (``semantics-next.md`` §3.2): first fit over the pools in
    order and their nodes in index order, ``tp`` GPUs of one node per instance. By default a
    placement that finds no room provisions a node of the first pool with room to grow (of
    the wanted GPU type), ready after its provisioning delay; with ``--blis-quirks`` none is
    ever provisioned. Without pools every placement succeeds."""

    def __init__(self, pools, tp: int, provision: bool, streams: Streams) -> None:
        self.pools = pools
        self.tp = tp
        self.provision = provision
        self.streams = streams
        self.nodes: list[Node] = []
        self.free_gpus: list[int] = []
        self.count = [0] * len(pools)
        for p, pool in enumerate(pools):
            for _ in range(pool.initial_nodes):
                self._add_node(p, 0)

    def _add_node(self, pool: int, ready_us: int) -> int:
        self.nodes.append(Node(pool, ready_us))
        self.free_gpus.append(self.pools[pool].gpus_per_node)
        self.count[pool] += 1
        return len(self.nodes) - 1

    def place(self, gpu_type: str | None, now_us: int) -> int | None:
        """A node for one instance (its GPUs taken), or None; ``gpu_type`` None = any. Nodes
        are tried in pool order, then index order within a pool."""
        wanted = [p for p, pool in enumerate(self.pools)
                  if gpu_type is None or pool.gpu_type == gpu_type]
        for p in wanted:
            for n, node in enumerate(self.nodes):
                if node.pool == p and self.free_gpus[n] >= self.tp:
                    self.free_gpus[n] -= self.tp
                    return n
        if not self.provision:
            return None
        for p in wanted:
            pool = self.pools[p]
            if self.count[p] < pool.max_nodes and pool.slots_per_node(self.tp) > 0:
                delay = self.streams.delay_us(pool.provisioning_delay, "node-provisioning")
                n = self._add_node(p, now_us + delay)
                self.free_gpus[n] -= self.tp
                return n
        return None

    def release(self, node: int) -> None:
        self.free_gpus[node] += self.tp


class Slot:
    """One instance slot's lifecycle facts."""

    __slots__ = ("state", "placed_us", "node", "cost_per_hour", "variant", "warm_up_left",
                 "replica_us", "cost", "placements")

    def __init__(self) -> None:
        self.state = InstanceState.UNUSED
        self.placed_us = -1
        self.node = -1
        self.cost_per_hour = 0.0
        self.variant = 0
        self.warm_up_left = 0
        self.replica_us = 0  # time held, summed over the instances the slot has held
        self.cost = 0.0
        self.placements = 0

    def settle(self, now_us: int) -> None:
        """Account the time held since placement (at termination, or the run's end)."""
        held = now_us - self.placed_us
        self.replica_us += held
        self.cost += held_cost(held, self.cost_per_hour)
