"""A tree filled again from the previous one, where only some nodes changed, is the
tree filled afresh, to the bit (`fill_topology_tree` with `before`)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kai_ray.state.topology import TopologyTree, fill_topology_tree, topology_layout
from kai_ray.values.api import Topology

BLOCK, RACK, HOST = "example.com/block", "example.com/rack", "kubernetes.io/hostname"


def topology() -> Topology:
    levels = [{"nodeLabel": BLOCK}, {"nodeLabel": RACK}, {"nodeLabel": HOST}]
    return Topology.model_validate({"metadata": {"name": "dc"}, "spec": {"levels": levels}})


def labels(count: int, seed: int) -> list[dict[str, str]]:
    """Nodes in 3 blocks of up to 4 racks; some lack a rack label (outside that level)."""
    rng = np.random.default_rng(seed)
    found = []
    for i in range(count):
        node = {HOST: f"n{i}", BLOCK: f"b{rng.integers(3)}"}
        if rng.random() > 0.1:
            node[RACK] = f"r{rng.integers(4)}"
        found.append(node)
    return found


def same_tree(a: TopologyTree, b: TopologyTree) -> None:
    assert a.domains.keys() == b.domains.keys()
    for level_a, level_b in zip(a.levels, b.levels, strict=True):
        assert level_a.free.tobytes() == level_b.free.tobytes()
        assert [d.id for d in level_a.domains] == [d.id for d in level_b.domains]
        for da, db in zip(level_a.domains, level_b.domains, strict=True):
            assert da.free.tobytes() == db.free.tobytes()
    for key, domain in a.domains.items():
        assert domain.free.tobytes() == b.domains[key].free.tobytes()


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    count=st.integers(1, 40),
    steps=st.integers(1, 6),
)
def test_a_patched_tree_is_the_fresh_tree_to_the_bit(seed: int, count: int, steps: int) -> None:
    rng = np.random.default_rng(seed)
    layout = topology_layout(topology(), labels(count, seed))
    # Fractions that do not add up exactly in floating point, and negative rows (overcommitted).
    free = np.round(rng.uniform(-2.0, 8.0, size=(count, 3)), 1) * 1.1
    available = rng.random(count) > 0.2
    tree = fill_topology_tree(layout, free, available)
    for _ in range(steps):
        new_free, new_available = free.copy(), available.copy()
        for node in rng.choice(count, size=int(rng.integers(0, count + 1)), replace=True):
            new_free[node] -= np.round(rng.uniform(-1.0, 1.0, size=3), 2) * 0.7
            if rng.random() < 0.2:
                new_available[node] = not new_available[node]
        patched = fill_topology_tree(layout, new_free, new_available, tree, (free, available))
        same_tree(patched, fill_topology_tree(layout, new_free, new_available))
        same_tree(patched, fill_topology_tree(layout, new_free, new_available, tree))
        tree, free, available = patched, new_free, new_available


def test_nothing_changed_gives_the_previous_tree_back() -> None:
    layout = topology_layout(topology(), labels(12, 1))
    free, available = np.full((12, 2), 4.0), np.ones(12, dtype=bool)
    tree = fill_topology_tree(layout, free, available)
    again = fill_topology_tree(layout, free.copy(), available.copy(), tree, (free, available))
    assert again is tree


def test_only_the_domains_of_a_changed_node_are_new() -> None:
    layout = topology_layout(topology(), labels(12, 2))
    free, available = np.full((12, 2), 4.0), np.ones(12, dtype=bool)
    tree = fill_topology_tree(layout, free, available)
    moved = free.copy()
    moved[5] -= 1.0
    patched = fill_topology_tree(layout, moved, available, tree, (free, available))
    for level, before in zip(patched.levels, tree.levels, strict=True):
        changed = {int(level.node_domain[5])}
        for i, (now, was) in enumerate(zip(level.domains, before.domains, strict=True)):
            assert (now is was) == (i not in changed), (level.label, now.id)
