"""Topology trees: for each Topology object, its levels and their domains.

A domain is the set of nodes sharing one value of a level's label under the
same wider domain; its id is the path of values from the widest level
("block-1/rack-1"), so "rack-1" under two blocks stays two domains. A node
without a level's label is outside every domain of that level and of all
narrower levels. Pure: no I/O; the tree is read-only once built.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kai_ray.values.api import Topology
from kai_ray.values.arrays import add_rows

#: Separates the values of nested levels in a domain id; label values cannot hold it.
PATH_SEPARATOR = "/"
OUTSIDE = -1


@dataclass(frozen=True)
class TopologyDomain:
    id: str
    #: The label value that names this domain within its parent.
    value: str
    level: int
    parent: str | None
    node_indices: npt.NDArray[np.int64]
    #: Free resources of the domain's ready, schedulable nodes (negative free counts as 0).
    free: npt.NDArray[np.float64]


@dataclass(frozen=True)
class TopologyLevel:
    label: str
    alias: str | None
    domains: tuple[TopologyDomain, ...]
    #: For each snapshot node, the index of its domain in `domains`, or -1 when outside.
    node_domain: npt.NDArray[np.int64]
    #: Row i: free resources of `domains[i]` (equal to each domain's `free`).
    free: npt.NDArray[np.float64]


@dataclass(frozen=True)
class TopologyTree:
    name: str
    levels: tuple[TopologyLevel, ...]
    domains: Mapping[str, TopologyDomain]

    def level_index(self, name: str) -> int | None:
        """The level named by its node label or its alias, widest first from 0."""
        for index, level in enumerate(self.levels):
            if name in (level.label, level.alias):
                return index
        return None

    def level(self, name: str) -> TopologyLevel | None:
        index = self.level_index(name)
        return None if index is None else self.levels[index]

    def children(self, domain_id: str) -> tuple[TopologyDomain, ...]:
        domain = self.domains[domain_id]
        if domain.level + 1 >= len(self.levels):
            return ()
        return tuple(d for d in self.levels[domain.level + 1].domains if d.parent == domain_id)


@dataclass(frozen=True)
class LevelLayout:
    """Which nodes make up each domain of one level: labels only, no resources."""

    label: str
    alias: str | None
    ids: tuple[str, ...]
    parents: tuple[str | None, ...]
    node_domain: npt.NDArray[np.int64]
    members: tuple[npt.NDArray[np.int64], ...]


@dataclass(frozen=True)
class TopologyLayout:
    """A Topology laid over the nodes' labels; the nodes' free resources fill it in
    each cycle (`fill_topology_tree`), so a build may keep it while labels stay."""

    name: str
    levels: tuple[LevelLayout, ...]
    #: Each domain id's (level, index), level by level (a later level's wins an id).
    places: Mapping[str, tuple[int, int]]


class DomainsById(Mapping[str, TopologyDomain]):
    """Every domain of a tree by id, read from the tree's levels at the places the
    layout gives: trees filled again from one layout share the places and copy
    nothing (a mapping of every domain made again each cycle cost as much as the
    domains it held)."""

    def __init__(self, places: Mapping[str, tuple[int, int]], levels: Sequence[TopologyLevel]):
        self._places = places
        self._levels = levels

    def __getitem__(self, key: str) -> TopologyDomain:
        level, index = self._places[key]
        return self._levels[level].domains[index]

    def __iter__(self) -> Iterator[str]:
        return iter(self._places)

    def __len__(self) -> int:
        return len(self._places)


def topology_layout(topology: Topology, labels: Sequence[Mapping[str, str]]) -> TopologyLayout:
    parent_paths: list[str | None] = [""] * len(labels)
    levels: list[LevelLayout] = []
    for spec in topology.spec.levels:
        paths = _domain_paths(spec.nodeLabel, labels, parent_paths)
        levels.append(_level_layout(spec.nodeLabel, spec.alias, paths, parent_paths))
        parent_paths = paths
    places = {id_: (level, i) for level, lay in enumerate(levels) for i, id_ in enumerate(lay.ids)}
    return TopologyLayout(topology.metadata.name, tuple(levels), places)


def fill_topology_tree(
    layout: TopologyLayout,
    free: npt.NDArray[np.float64],
    available: npt.NDArray[np.bool_],
    previous: TopologyTree | None = None,
    before: tuple[npt.NDArray[np.float64], npt.NDArray[np.bool_]] | None = None,
) -> TopologyTree:
    """The tree of `layout` with the nodes' free resources summed into its domains.

    `previous`, a tree of the same layout, lends the domains whose free is unchanged
    (values are immutable, so sharing them is safe). With `before`, the free and
    availability `previous` was filled from, only the domains holding a node whose
    row changed are summed again, each over its nodes in node order, as the full sum
    adds them: the sums are the same to the bit, and a cycle that moved a few pods
    costs what it moved, not what the cluster has.
    """
    countable_free = np.where(available[:, None], np.maximum(free, 0.0), 0.0)
    changed = _changed_nodes(free, available, previous, before)
    earlier = previous.levels if previous is not None else (None,) * len(layout.levels)
    levels = tuple(
        _level(index, level, countable_free, was, changed)
        for index, (level, was) in enumerate(zip(layout.levels, earlier, strict=True))
    )
    if previous is not None and all(a is b for a, b in zip(levels, previous.levels, strict=True)):
        return previous
    return TopologyTree(layout.name, levels, DomainsById(layout.places, levels))


def _touched(node_domain: npt.NDArray[np.int64], changed: npt.NDArray[np.intp]) -> list[int]:
    """The domains of a level holding one of the `changed` nodes."""
    touched = np.unique(node_domain[changed])
    return [int(i) for i in touched[touched != OUTSIDE]]


def _changed_nodes(
    free: npt.NDArray[np.float64],
    available: npt.NDArray[np.bool_],
    previous: TopologyTree | None,
    before: tuple[npt.NDArray[np.float64], npt.NDArray[np.bool_]] | None,
) -> npt.NDArray[np.intp] | None:
    """The nodes whose free row or availability differs from `before`; None when
    there is nothing to compare with (every domain is summed)."""
    if previous is None or before is None:
        return None
    was_free, was_available = before
    if was_free.shape != free.shape or was_available.shape != available.shape:
        return None
    differs = np.any(was_free != free, axis=1) | (was_available != available)
    return np.flatnonzero(differs)


def _level(
    index: int,
    layout: LevelLayout,
    countable_free: npt.NDArray[np.float64],
    previous: TopologyLevel | None,
    changed: npt.NDArray[np.intp] | None = None,
) -> TopologyLevel:
    width = countable_free.shape[1]
    if previous is not None and changed is not None and previous.free.shape[1] == width:
        return _level_patched(index, layout, countable_free, previous, changed)
    free = np.zeros((len(layout.ids), width), dtype=np.float64)
    inside = layout.node_domain != OUTSIDE
    add_rows(free, layout.node_domain[inside], countable_free[inside])
    free.setflags(write=False)
    if previous is not None and previous.free.shape == free.shape:
        same = (~np.any(previous.free != free, axis=1)).tolist()
        kept = previous.domains
    else:
        same, kept = [False] * len(layout.ids), ()
    domains = tuple(
        kept[i] if same[i] else _domain(layout, i, index, free[i]) for i in range(len(same))
    )
    return TopologyLevel(layout.label, layout.alias, domains, layout.node_domain, free)


def _level_patched(
    index: int,
    layout: LevelLayout,
    countable_free: npt.NDArray[np.float64],
    previous: TopologyLevel,
    changed: npt.NDArray[np.intp],
) -> TopologyLevel:
    """`_level` from the previous level, when only the nodes `changed` may differ: the
    domains holding one are summed again over all their nodes, in node order (as
    `np.add.at` over every node adds them), the others kept."""
    touched = np.array(_touched(layout.node_domain, changed), dtype=np.int64)
    if not touched.size:
        return previous
    if len(touched) == 1:
        nodes = layout.members[int(touched[0])]  # in node order
    else:
        nodes = np.sort(np.concatenate([layout.members[int(i)] for i in touched]))
    slot = np.searchsorted(touched, layout.node_domain[nodes])
    sums = np.zeros((len(touched), countable_free.shape[1]), dtype=np.float64)
    add_rows(sums, slot, countable_free[nodes])
    moved = np.any(previous.free[touched] != sums, axis=1)
    if not moved.any():
        return previous
    free = previous.free.copy()
    free[touched] = sums
    free.setflags(write=False)
    domains = list(previous.domains)
    for i in touched[moved].tolist():
        # A row of its own: a view would keep this level's whole array alive for as
        # long as the domain is kept, patch after patch (a leak over a long run).
        row = free[i].copy()
        row.setflags(write=False)
        domains[i] = _domain(layout, i, index, row)
    return TopologyLevel(layout.label, layout.alias, tuple(domains), layout.node_domain, free)


def _domain_paths(
    label: str, labels: Sequence[Mapping[str, str]], parent_paths: Sequence[str | None]
) -> list[str | None]:
    """Each node's domain id at this level, None when it (or a wider level) lacks a label."""
    paths: list[str | None] = []
    for node_labels, parent in zip(labels, parent_paths, strict=True):
        value = node_labels.get(label)
        if parent is None or value is None:
            paths.append(None)
        else:
            paths.append(f"{parent}{PATH_SEPARATOR}{value}" if parent else value)
    return paths


def _level_layout(
    label: str, alias: str | None, paths: Sequence[str | None], parent_paths: Sequence[str | None]
) -> LevelLayout:
    ids = sorted({path for path in paths if path is not None})
    position = {domain_id: i for i, domain_id in enumerate(ids)}
    node_domain = np.array([OUTSIDE if p is None else position[p] for p in paths], dtype=np.int64)
    node_domain.setflags(write=False)
    parents = _parents(paths, parent_paths)
    members = _members_by_domain(node_domain, len(ids))
    for indices in members:
        indices.setflags(write=False)
    return LevelLayout(
        label, alias, tuple(ids), tuple(parents[i] for i in ids), node_domain, tuple(members)
    )


def _parents(
    paths: Sequence[str | None], parent_paths: Sequence[str | None]
) -> dict[str, str | None]:
    return {
        path: parent or None
        for path, parent in zip(paths, parent_paths, strict=True)
        if path is not None
    }


def _members_by_domain(
    node_domain: npt.NDArray[np.int64], count: int
) -> list[npt.NDArray[np.int64]]:
    """Node indices of each domain, in one sort rather than one scan per domain."""
    order = np.argsort(node_domain, kind="stable")
    bounds = np.searchsorted(node_domain[order], np.arange(count + 1))
    return [order[bounds[i] : bounds[i + 1]].astype(np.int64) for i in range(count)]


def _domain(
    layout: LevelLayout, i: int, level: int, free: npt.NDArray[np.float64]
) -> TopologyDomain:
    domain_id = layout.ids[i]
    value = domain_id.rsplit(PATH_SEPARATOR, 1)[-1]
    return TopologyDomain(domain_id, value, level, layout.parents[i], layout.members[i], free)
