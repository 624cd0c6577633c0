"""Where candidate domains are evaluated: in-process (numpy) or on Ray workers.

A `PlacementBackend` answers one question for the topology search: for a pod
shape on a set of allowed nodes, how many such pods each domain of each
candidate level can still take. The local backend computes it with numpy on
the transaction's state; the Ray backend (`ray_backend.py`) splits the nodes
into shards of whole topology domains, each held by a Ray actor that is loaded
once per transaction and then sent only the rows that changed. Both call the
same `fit.room` and sum integers, so they return identical answers and the plan
does not depend on the backend.
`backend_choice.backend_for` picks one per transaction from
`SchedulerConfig.rayBackend`. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from kai_ray.decisions.placement.fit import room_on
from kai_ray.decisions.placement.shapes import PodShape
from kai_ray.decisions.transaction import LevelKey, Transaction

Counts = npt.NDArray[np.int64]
Indices = npt.NDArray[np.intp]


@dataclass(frozen=True)
class RoomQuery:
    """How many pods of `shape` fit, on `nodes` only, per domain of each of `levels`."""

    shape: PodShape
    nodes: Indices
    levels: tuple[LevelKey, ...]


class PlacementBackend(Protocol):
    @property
    def name(self) -> str:
        """ "local" or "ray": which backend answers the queries now."""
        ...

    def domain_room(self, tx: Transaction, query: RoomQuery) -> list[Counts]:
        """Per level of `query.levels`, the room of every domain of that level."""
        ...


class LocalBackend:
    """Evaluates every node in this process with numpy."""

    name = "local"

    def domain_room(self, tx: Transaction, query: RoomQuery) -> list[Counts]:
        counts = room_on(tx, query.shape, query.nodes)
        return [
            per_domain(node_domains(tx, level), query.nodes, counts, domain_count(tx, level))
            for level in query.levels
        ]


def node_domains(tx: Transaction, level: LevelKey) -> npt.NDArray[np.int64]:
    topology, index = level
    return tx.snapshot.topologies[topology].levels[index].node_domain


def domain_count(tx: Transaction, level: LevelKey) -> int:
    topology, index = level
    return len(tx.snapshot.topologies[topology].levels[index].domains)


def per_domain(
    node_domain: npt.NDArray[np.int64], nodes: Indices, counts: Counts, domains: int
) -> Counts:
    """Sum of `counts` (one per node of `nodes`) by the domain each node is in."""
    owner = node_domain[nodes]
    inside = owner >= 0
    sums = np.zeros(domains, dtype=np.int64)
    np.add.at(sums, owner[inside], counts[inside])
    return sums
