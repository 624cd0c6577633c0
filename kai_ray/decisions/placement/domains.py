"""Topology-aware candidates: which node sets a gang (or subgroup) may be placed in.

A constraint names a Topology and levels by label or alias. `requiredLevel`
is the widest domain all members must share (nodes without its label are
out); `preferredLevel` is a narrower one to aim for. Candidate levels run from
the preferred level (else the narrowest level of the tree) out to the
required one, or, with no
required level, to the whole allowed node set as the last fallback. At each
level the domains that can hold every member (per pod kind, by the backend's
room count, and by the domain's free total) are tried fullest first, so large
free domains stay whole; ties go to the domain listed first. When none can,
`no_room_reason` says so for a person, with the best domain's room. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kai_ray.decisions.placement.backend import PlacementBackend, RoomQuery
from kai_ray.decisions.placement.shapes import NodeSet, PodShape
from kai_ray.decisions.transaction import LevelKey, Transaction
from kai_ray.state.topology import TopologyTree
from kai_ray.values.api import TopologyConstraint
from kai_ray.values.resources import EPSILON, GPU

Indices = npt.NDArray[np.intp]
#: Domains tried per level before giving up (each try is a full attempt).
MAX_TRIES_PER_LEVEL = 8


@dataclass(frozen=True)
class Scope:
    """A resolved constraint: the tree and the candidate levels, narrowest first."""

    tree: TopologyTree
    levels: tuple[int, ...]
    #: With no required level, the whole allowed set is the last candidate.
    fallback_to_all: bool

    def level_name(self, level: int) -> str:
        entry = self.tree.levels[level]
        return entry.alias or entry.label


@dataclass(frozen=True)
class Kind:
    """Members of one shape and filter signature: `count` pods allowed on `nodes`."""

    shape: PodShape
    nodes: Indices
    count: int


def resolve(
    tx: Transaction, constraint: TopologyConstraint | None, topology: str | None
) -> Scope | str | None:
    """The constraint's scope; None without a constraint; a message when it names nothing."""
    if constraint is None or not (constraint.requiredLevel or constraint.preferredLevel):
        return None
    name = constraint.topology or topology
    tree = tx.snapshot.topologies.get(name or "")
    if tree is None:
        return f"topology {name!r} does not exist"
    required = _level(tree, constraint.requiredLevel)
    preferred = _level(tree, constraint.preferredLevel)
    if isinstance(required, str) or isinstance(preferred, str):
        return (
            f"topology {name!r} has no level {required if isinstance(required, str) else preferred}"
        )
    return _scope(tree, required, preferred)


def _level(tree: TopologyTree, name: str | None) -> int | str | None:
    if name is None:
        return None
    index = tree.level_index(name)
    return repr(name) if index is None else index


def _scope(tree: TopologyTree, required: int | None, preferred: int | None) -> Scope:
    """Required alone: every level from the narrowest out to it; preferred: from there."""
    widest = 0 if required is None else required
    narrowest = len(tree.levels) - 1
    if preferred is not None:
        narrowest = max(preferred, widest)
    levels = tuple(range(narrowest, widest - 1, -1))
    return Scope(tree, levels, required is None)


def anchored(scope: Scope, allowed: NodeSet, anchors: list[int]) -> NodeSet:
    """`allowed` inside the required domain that already holds members (if any do)."""
    if scope.fallback_to_all or not anchors:
        return allowed
    level = scope.levels[-1]
    domain = int(scope.tree.levels[level].node_domain[anchors[0]])
    return _domain_nodes(scope, level, domain, allowed)


def candidates(
    tx: Transaction, backend: PlacementBackend, scope: Scope, kinds: list[Kind], allowed: NodeSet
) -> list[NodeSet]:
    """Node sets to try, in order: narrowest level first, fullest fitting domain first."""
    rooms = _rooms(tx, backend, scope, kinds)
    sets: list[NodeSet] = []
    for position, level in enumerate(scope.levels):
        fitting = _fitting(tx, scope, level, kinds, [r[position] for r in rooms])
        for domain in fitting[:MAX_TRIES_PER_LEVEL]:
            sets.append(_domain_nodes(scope, level, int(domain), allowed))
    if scope.fallback_to_all:
        sets.append(allowed)
    return sets


def _rooms(
    tx: Transaction, backend: PlacementBackend, scope: Scope, kinds: list[Kind]
) -> list[list[npt.NDArray[np.int64]]]:
    levels: tuple[LevelKey, ...] = tuple((scope.tree.name, level) for level in scope.levels)
    return [backend.domain_room(tx, RoomQuery(kind.shape, kind.nodes, levels)) for kind in kinds]


def _fitting(
    tx: Transaction, scope: Scope, level: int, kinds: list[Kind], rooms: list[npt.NDArray[np.int64]]
) -> Indices:
    """Domains that hold every kind, fullest first (least free of the key resource)."""
    domain_free = tx.domain_free(scope.tree.name, level)
    total = sum((kind.shape.need * kind.count for kind in kinds), np.zeros(domain_free.shape[1]))
    ok = np.all(domain_free + EPSILON >= total, axis=1)
    for kind, domain_room in zip(kinds, rooms, strict=True):
        ok &= domain_room >= kind.count
    fitting = np.flatnonzero(ok)
    key = domain_free[fitting, _key_column(tx, kinds)]
    return fitting[np.argsort(key, kind="stable")].astype(np.intp)


def _key_column(tx: Transaction, kinds: list[Kind]) -> int:
    uses_gpu = any(k.shape.whole_gpus or k.shape.shares_gpu for k in kinds)
    return tx.snapshot.column(GPU if uses_gpu else "cpu")


def _domain_nodes(scope: Scope, level: int, domain: int, allowed: NodeSet) -> NodeSet:
    node_domain = scope.tree.levels[level].node_domain
    inside = allowed.nodes[node_domain[allowed.nodes] == domain]
    domain_id = scope.tree.levels[level].domains[domain].id
    return NodeSet(inside, f"{scope.level_name(level)} {domain_id}")


def no_room_reason(
    tx: Transaction, backend: PlacementBackend, scope: Scope, kinds: list[Kind], who: str
) -> str:
    """ "needs 8 pods with 8 GPUs each inside one rack; the best rack has room for 5"."""
    level = scope.levels[-1]
    rooms = [r[-1] for r in _rooms(tx, backend, scope, kinds)]
    ratios = np.min([room / kind.count for room, kind in zip(rooms, kinds, strict=True)], axis=0)
    name = scope.level_name(level)
    needs = "; ".join(_pods(kind.count, kind.shape) for kind in kinds)
    if not ratios.size:
        return f"{who}needs {needs} inside one {name}; no node is in any {name}"
    best = int(np.argmax(ratios))
    limiting = int(
        np.argmin([room[best] / kind.count for room, kind in zip(rooms, kinds, strict=True)])
    )
    room = int(rooms[limiting][best])
    return f"{who}needs {needs} inside one {name}; the best {name} has room for {room}"


def _pods(count: int, shape: PodShape) -> str:
    each = " each" if count != 1 else ""
    return f"{count} pod{'s' if count != 1 else ''} with {shape.describe()}{each}"
