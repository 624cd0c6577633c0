"""Topology trees: for each Topology object, its levels and their domains.

A domain is the set of nodes sharing one value of a level's label under the
same wider domain; its id is the path of values from the widest level
("block-1/rack-1"), so "rack-1" under two blocks stays two domains. A node
without a level's label is outside every domain of that level and of all
narrower levels.

A tree says which nodes make up each domain, nothing of their resources: it is
built once per layout (a Topology over the nodes' labels) and kept while both
stay, whatever pods come and go. What a domain has free is summed where a
decision reads it, from the free rows it works on (`Transaction.domain_free`),
so a snapshot pays nothing per domain for sums no one reads. Pure: no I/O; the
tree is read-only once built.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kai_ray.values.api import Topology

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


@dataclass(frozen=True)
class TopologyLevel:
    label: str
    alias: str | None
    domains: tuple[TopologyDomain, ...]
    #: For each snapshot node, the index of its domain in `domains`, or -1 when outside.
    node_domain: npt.NDArray[np.int64]


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
    """A Topology laid over the nodes' labels (`topology_tree` makes its tree): a
    build keeps it while the Topology and the labels stay."""

    name: str
    levels: tuple[LevelLayout, ...]
    #: Each domain id's (level, index), level by level (a later level's wins an id).
    places: Mapping[str, tuple[int, int]]


class DomainsById(Mapping[str, TopologyDomain]):
    """Every domain of a tree by id, read from the tree's levels at the places the
    layout gives, without a mapping of its own."""

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


def topology_tree(layout: TopologyLayout) -> TopologyTree:
    """The tree of `layout`: its levels and their domains, by id too."""
    levels = tuple(_level(index, level) for index, level in enumerate(layout.levels))
    return TopologyTree(layout.name, levels, DomainsById(layout.places, levels))


def _level(index: int, layout: LevelLayout) -> TopologyLevel:
    domains = tuple(_domain(layout, i, index) for i in range(len(layout.ids)))
    return TopologyLevel(layout.label, layout.alias, domains, layout.node_domain)


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


def _domain(layout: LevelLayout, i: int, level: int) -> TopologyDomain:
    domain_id = layout.ids[i]
    value = domain_id.rsplit(PATH_SEPARATOR, 1)[-1]
    return TopologyDomain(domain_id, value, level, layout.parents[i], layout.members[i])
