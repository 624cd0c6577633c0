"""The snapshot memo: a build that keeps a memo equals a fresh build, whatever changed."""

from __future__ import annotations

import datetime as dt
from typing import Any

import numpy as np

from kai_ray.decisions.transaction import Transaction
from kai_ray.state.memo import SnapshotMemo, ValidatedCache
from kai_ray.state.nodes import read_nodes
from kai_ray.state.pod_states import read_pods
from kai_ray.state.snapshot import ClusterObjects, Snapshot, assemble_snapshot, build_snapshot
from tests.builders import make_node, make_pod, make_pod_group, make_queue


def _with_memo(objects: ClusterObjects, memo: SnapshotMemo, nodes: Any) -> Snapshot:
    pods = read_pods(objects.pods)
    return assemble_snapshot(objects, nodes, pods.pods, list(pods.problems), "kai-ray", memo)


def _same(a: Snapshot, b: Snapshot) -> None:
    assert a.resource_names == b.resource_names
    np.testing.assert_array_equal(a.used, b.used)
    np.testing.assert_array_equal(a.gpu_free, b.gpu_free)
    assert [d.free.tolist() for d in a.gpu_devices] == [d.free.tolist() for d in b.gpu_devices]
    assert dict(a.pods) == dict(b.pods)
    assert {k: (g.queue, g.pods) for k, g in a.pod_groups.items()} == {
        k: (g.queue, g.pods) for k, g in b.pod_groups.items()
    }
    assert [p.message for p in a.problems] == [p.message for p in b.problems]
    for name, tree in a.topologies.items():
        fresh = b.topologies[name]
        assert tree.domains.keys() == fresh.domains.keys()
        for key, domain in tree.domains.items():
            assert domain.node_indices.tolist() == fresh.domains[key].node_indices.tolist(), key


def test_a_kept_memo_follows_binds_releases_and_objects_changed_in_place() -> None:
    nodes = [make_node(f"n{i}").gpus(8).build() for i in range(3)]
    for i, node in enumerate(nodes):
        node["metadata"]["labels"]["rack"] = f"r{i // 2}"
    topology = {
        "apiVersion": "scheduling.kai-ray.io/v1alpha1",
        "kind": "Topology",
        "metadata": {"name": "dc"},
        "spec": {"levels": [{"nodeLabel": "rack"}, {"nodeLabel": "kubernetes.io/hostname"}]},
    }
    queues = [make_queue("team").build(), make_queue("other").build()]
    group = make_pod_group("g").queue("team").min_member(2).build()
    pods = [make_pod(f"p{i}").gpus(4).group("g").build() for i in range(2)]
    memo = SnapshotMemo()
    node_facts = read_nodes(nodes).nodes

    def check() -> Snapshot:
        objects = ClusterObjects(
            nodes=nodes, pods=pods, queues=queues, pod_groups=[group], topologies=[topology]
        )
        kept = _with_memo(objects, memo, node_facts)
        _same(kept, build_snapshot(objects))
        return kept

    first = check()
    assert len(first.pending_pods) == 2
    kept_tree = first.topologies["dc"]
    pods[0]["spec"]["nodeName"] = "n0"  # bound: a new reading of that pod
    pods[1]["spec"]["nodeName"] = "n0"
    bound = check()
    assert bound.gpu_devices[0].whole_free == 0
    assert bound.topologies["dc"] is kept_tree  # pods came: the tree is as it was
    assert Transaction(bound).domain_free("dc", 0)[0, bound.column("gpu")] == 8
    group["spec"]["queue"] = "other"  # changed in place: validated again
    assert check().pod_groups["default/g"].queue == "other"
    del pods[1]  # released
    released = check()
    assert released.gpu_devices[0].whole_free == 4
    assert Transaction(released).domain_free("dc", 0)[0, released.column("gpu")] == 12


def test_a_validation_is_kept_until_its_object_changes_json_or_not() -> None:
    """The memo keeps a copy to compare with: through JSON, or deep for what JSON
    would change (a YAML date); an object changed in place is validated again."""
    validated: list[dict[str, Any]] = []

    def validate(obj: Any) -> str:
        validated.append(obj)
        return f"model {len(validated)}"

    cache: ValidatedCache[str] = ValidatedCache()
    dated = {"metadata": {"name": "g", "creationTimestamp": dt.datetime(2026, 1, 1)}}
    plain: dict[str, Any] = {"metadata": {"name": "h"}, "spec": {"minMember": 2}}
    assert cache.get("g", dated, validate) == cache.get("g", dated, validate) == "model 1"
    assert cache.get("h", plain, validate) == cache.get("h", plain, validate) == "model 2"
    plain["spec"]["minMember"] = 3  # changed in place: the kept copy is not
    assert cache.get("h", plain, validate) == "model 3"
    assert len(validated) == 3
