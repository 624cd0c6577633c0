"""A gang that found no room, remembered while the room it found stays as short.

`equivalence.py` answers a gang equivalent to one that failed at the very same
transaction version. With a deep backlog on a full cluster the same kinds of
gang fail again at every version and every cycle, though what decided their
failure did not move: each node they may use still cannot take one of their
pods, for the same reason. This keeps such a failure across versions and
cycles, with what it was decided on, and answers from it while that holds.

A failure is kept only for a gang whose signature is its plain one (no inter-pod
terms in play, no device claims) and whose live pods are alike, so they share
one shape and one set of nodes the static filters let them on; and only of one
of two families, whose reasons are made of what the nodes' rooms say alone:
- no such node can take even one of its pods (`fit.rejection_stages` gives -1
  on none). Then no placement path places anything and the first pod finds no
  node; the attempt read each node's room for the shape (all none) and the
  first reason each fails ("no node fits pod X: 512 nodes lack free
  nvidia.com/gpu"). It holds while every node the gang may use fails for the
  same first reason;
- the gang has a required topology level and no domain of any level it may use
  has room on its nodes for its whole minimum. Then placement tries no domain
  and says how much room the best domain of the required level has ("the best
  rack has room for 3"). It holds while that is still so and that best room is
  the same, whichever nodes' rooms moved.

Node versions (`node_kept.NodeVersions`, which move whenever a node's free row
or devices may have changed, in a transaction or from one to the next) tell the
nodes to look at again: those whose version moved since the failure was last
found to hold. The failures are kept with the nodes' static facts
(`node_kept.node_static`), and dropped when the nodes' allocatable or a
topology's layout changes. A property test (`tests/unit/test_carried.py`) holds
the answers to fresh attempts after random events. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kai_ray.decisions.placement.backend import per_domain
from kai_ray.decisions.placement.domains import Scope, resolve
from kai_ray.decisions.placement.equivalence import KNOWN_FAILURE, KnownFailure, plain_signature
from kai_ray.decisions.placement.filters import static_mask
from kai_ray.decisions.placement.fit import rejection_stages, room_on
from kai_ray.decisions.placement.node_kept import (
    ACROSS_CYCLES,
    KeptAcrossCycles,
    Versions,
    node_static,
    same_values,
)
from kai_ray.decisions.placement.shapes import shape_of
from kai_ray.decisions.transaction import MemoKey, Transaction
from kai_ray.state.groups import PodGroupState

Flags = npt.NDArray[np.bool_]
Stages = npt.NDArray[np.int64]
Counts = npt.NDArray[np.int64]
Indices = npt.NDArray[np.intp]


@dataclass
class _Kept:
    known: KnownFailure
    #: The nodes the static filters let the gang's pods on.
    allowed: Flags
    #: The node versions at which the failure was last found to hold.
    versions: Versions
    #: Per node: its room for one pod (`fit.room_on`) and the first reason it fails
    #: (`fit.rejection_stages`), on allowed nodes.
    rooms: Counts
    stages: Stages
    #: For a failure no domain held (some node had room): the room of the best domain
    #: of the required level, the one number the reason gives; None for a failure no
    #: node had room for (the reason gives each node's first failing stage instead).
    best: int | None = None


class CarriedFailures:
    """The kept failures by gang signature, the most recently used last; for one set of
    the nodes' static facts, allocatable and topology layouts (`follow`)."""

    #: Values of a node kept per failure: a few bytes each (versions and stages).
    NODE_VALUES = 1 << 22

    def __init__(self) -> None:
        self._by_key: dict[Hashable, _Kept] = {}
        self._facts: tuple[object, ...] = ()
        self._at_most = 0

    def follow(self, tx: Transaction) -> CarriedFailures:
        """Start afresh when the nodes' allocatable or a topology's layout is not the one
        the failures were found on."""
        snapshot = tx.snapshot
        layouts = tuple(
            (name, tuple((level.label, level.alias, level.node_domain) for level in tree.levels))
            for name, tree in sorted(snapshot.topologies.items())
        )
        facts = (snapshot.allocatable, layouts)
        if not same_values(facts, self._facts):
            self._by_key.clear()
        self._facts = facts
        self._at_most = max(16, self.NODE_VALUES // max(len(tx.free), 1))
        return self

    def find(self, key: Hashable) -> _Kept | None:
        found = self._by_key.pop(key, None)
        if found is not None:
            self._by_key[key] = found
        return found

    def keep(self, key: Hashable, kept: _Kept) -> None:
        self._by_key.pop(key, None)
        self._by_key[key] = kept
        while len(self._by_key) > self._at_most:
            del self._by_key[next(iter(self._by_key))]

    def drop(self, key: Hashable) -> None:
        self._by_key.pop(key, None)


#: The transaction's store, kept with the nodes' static facts.
CARRIED = MemoKey[CarriedFailures]("failures carried across states")
#: The store followed once per transaction.
FOLLOWED = MemoKey[CarriedFailures]("failures carried, followed")


def carried_failure(tx: Transaction, key: Hashable, group: PodGroupState) -> KnownFailure | None:
    """The failure kept for gangs of signature `key`, when every node they may use
    still fails for the reason it failed for then; also kept as the known failure at
    the transaction's version (`equivalence.known_failure`)."""
    store = _store(tx)
    found = store.find(key)
    if found is None:
        return None
    versions = _versions(tx)
    if versions.shape != found.versions.shape:
        store.drop(key)
        return None
    changed = np.flatnonzero(versions != found.versions)
    moved = changed[found.allowed[changed]]
    if moved.size and not _still_holds(tx, group, found, moved):
        store.drop(key)
        return None
    if changed.size:
        found.versions = versions.copy()
    tx.memo.keep(KNOWN_FAILURE, (tx.version, key), found.known)
    return found.known


def _still_holds(tx: Transaction, group: PodGroupState, found: _Kept, moved: Indices) -> bool:
    """Whether the kept failure is the one an attempt would find now, the nodes `moved`
    (allowed ones whose versions moved) read again. For a failure no node had room
    for: each of them with the same room (none) and first failing stage. For one no
    domain held: the same rooms, or still no domain holding the gang and the best
    one of the required level with the same room (its reason reads the rooms alone,
    `domains.no_room_reason`, never the stages); `found` then keeps the rooms read."""
    shape = shape_of(tx, group.live_pods()[0])
    rooms = room_on(tx, shape, moved)
    same = np.array_equal(rooms, found.rooms[moved])
    if found.best is None:
        return same and np.array_equal(rejection_stages(tx, shape, moved)[1], found.stages[moved])
    if same:
        return True
    now = found.rooms.copy()
    now[moved] = rooms
    nodes = np.flatnonzero(found.allowed).astype(np.intp)
    if not now[nodes].any() or _best_room_when_none_holds(tx, group, nodes, now[nodes]) != (
        found.best
    ):
        return False
    found.rooms = now
    return True


def carry_failure(
    tx: Transaction, key: Hashable, group: PodGroupState, known: KnownFailure
) -> None:
    """Keep `known`, the failure just found for `group` at the transaction as it is,
    when it is one no node the gang may use could take a pod of (see the module)."""
    plain = plain_signature(group, tx)
    if plain is None or plain.claims or key != plain:
        return  # inter-pod terms or claims: the attempt read more than the nodes' room
    pods = plain.parts[-1]
    live = group.live_pods()
    if not live or not isinstance(pods, tuple) or any(pod != pods[0] for pod in pods):
        return
    allowed = static_mask(tx, live[0])
    nodes = np.flatnonzero(allowed).astype(np.intp)
    shape = shape_of(tx, live[0])
    rooms = room_on(tx, shape, nodes)
    best = None
    if rooms.any():
        best = _best_room_when_none_holds(tx, group, nodes, rooms)
        if best is None:
            return  # a pod was placed, or might have been: the attempt read more than the room
    rooms_of = np.zeros(len(allowed), dtype=np.int64)
    rooms_of[nodes] = rooms
    stages = np.full(len(allowed), -1, dtype=np.int64)
    stages[nodes] = rejection_stages(tx, shape, nodes)[1]
    _store(tx).keep(key, _Kept(known, allowed, _versions(tx).copy(), rooms_of, stages, best))


def _best_room_when_none_holds(
    tx: Transaction, group: PodGroupState, nodes: Indices, rooms: Counts
) -> int | None:
    """When the gang has a required topology level (no fallback to every node) and no
    domain of any level it may be placed in has room on its allowed nodes for the
    whole minimum, the room of the best domain of the required level (placement then
    tries no domain, `domains.candidates` asking a domain for that room before
    anything else, and says why from the rooms alone); else None."""
    constraint = group.spec.topologyConstraint
    scope = resolve(tx, constraint, constraint.topology if constraint else None)
    if not isinstance(scope, Scope) or scope.fallback_to_all:
        return None
    count = len(group.missing)
    best = 0
    for level in scope.levels:
        entry = scope.tree.levels[level]
        per = per_domain(entry.node_domain, nodes, rooms, len(entry.domains))
        if (per >= count).any():
            return None
        best = int(per.max()) if per.size else 0
    return best


def _store(tx: Transaction) -> CarriedFailures:
    return tx.memo.get(
        FOLLOWED, None, lambda: node_static(tx, CARRIED, None, CarriedFailures).follow(tx)
    )


def _versions(tx: Transaction) -> Versions:
    return tx.memo.get(ACROSS_CYCLES, None, KeptAcrossCycles).versions.of(tx)
