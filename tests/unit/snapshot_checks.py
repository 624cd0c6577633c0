"""Two snapshots are the same in every field the cycle reads, orders included."""

from __future__ import annotations

import numpy as np

from kai_ray.state.snapshot import Snapshot


def assert_same_snapshot(kept: Snapshot, fresh: Snapshot) -> None:
    """`kept` (from the cache) equals `fresh` (from `build_snapshot`), field by field:
    arrays by value, mappings and tuples in their order."""
    assert kept.resource_names == fresh.resource_names
    assert kept.node_names == fresh.node_names
    assert list(kept.node_index.items()) == list(fresh.node_index.items())
    for name in ("capacity", "allocatable", "used", "free", "ready", "unschedulable"):
        np.testing.assert_array_equal(getattr(kept, name), getattr(fresh, name), err_msg=name)
    np.testing.assert_array_equal(kept.gpu_free, fresh.gpu_free, err_msg="gpu_free")
    np.testing.assert_array_equal(kept.gpu_memory_mib, fresh.gpu_memory_mib)
    assert kept.labels == fresh.labels
    assert kept.taints == fresh.taints
    assert [(d.free.tolist(), d.shared.tolist()) for d in kept.gpu_devices] == [
        (d.free.tolist(), d.shared.tolist()) for d in fresh.gpu_devices
    ]
    assert list(kept.pods.items()) == list(fresh.pods.items())
    assert kept.pending_pods == fresh.pending_pods
    assert list(kept.pod_groups) == list(fresh.pod_groups)
    for key, group in kept.pod_groups.items():
        other = fresh.pod_groups[key]
        assert group == other, key
        assert (group.live_requests, group.bound_requests) == (
            other.live_requests,
            other.bound_requests,
        ), key
        assert (group.missing, group.succeeded, group.pod_priority) == (
            other.missing,
            other.succeeded,
            other.pod_priority,
        ), key
    assert kept.waiting_groups == fresh.waiting_groups
    assert [group.key for group in kept.waiting_groups] == [
        group.key for group in fresh.waiting_groups
    ]
    assert kept.queues == fresh.queues
    assert list(kept.problems) == list(fresh.problems)
    assert list(kept.topologies) == list(fresh.topologies)
    for name, tree in kept.topologies.items():
        other = fresh.topologies[name]
        assert list(tree.domains) == list(other.domains), name
        for key, domain in tree.domains.items():
            assert (domain.level, domain.parent) == (
                other.domains[key].level,
                other.domains[key].parent,
            )
            assert domain.node_indices.tolist() == other.domains[key].node_indices.tolist()
