"""NodePool expansion: names, even split over domains, label values."""

from __future__ import annotations

from kai_ray.sim.nodepool import NodePool, expand


def pool(count: int, levels: list[tuple[str, int]]) -> NodePool:
    return NodePool.model_validate(
        {
            "metadata": {"name": "p"},
            "spec": {
                "count": count,
                "namePrefix": "gpu",
                "capacity": {"nvidia.com/gpu": 8},
                "labels": {"team": "x"},
                "taints": [{"key": "gpu", "effect": "NoSchedule"}],
                "topology": [{"label": label, "domains": n} for label, n in levels],
            },
        }
    )


def test_nodes_are_named_and_split_evenly_in_order() -> None:
    nodes = expand(pool(8, [("kai-ray.io/block", 2), ("kai-ray.io/rack", 2)]))
    assert [n["metadata"]["name"] for n in nodes] == [f"gpu-{i}" for i in range(8)]
    racks = [n["metadata"]["labels"]["kai-ray.io/rack"] for n in nodes]
    assert (
        racks
        == ["block-0-rack-0"] * 2
        + ["block-0-rack-1"] * 2
        + ["block-1-rack-0"] * 2
        + ["block-1-rack-1"] * 2
    )
    assert nodes[5]["metadata"]["labels"]["kai-ray.io/block"] == "block-1"


def test_hostname_labels_taints_and_capacity() -> None:
    node = expand(pool(2, []))[1]
    assert node["metadata"]["labels"]["kubernetes.io/hostname"] == "gpu-1"
    assert node["metadata"]["labels"]["team"] == "x"
    assert node["spec"]["taints"] == [{"key": "gpu", "effect": "NoSchedule"}]
    assert node["status"]["capacity"] == {"nvidia.com/gpu": "8"}


def test_uneven_counts_still_split_in_order() -> None:
    nodes = expand(pool(5, [("topology.kubernetes.io/zone", 2)]))
    zones = [n["metadata"]["labels"]["topology.kubernetes.io/zone"] for n in nodes]
    assert zones == ["zone-0", "zone-0", "zone-0", "zone-1", "zone-1"]


def test_the_benchmark_layout_has_five_hundred_racks_of_ten() -> None:
    levels = [("topology.kubernetes.io/zone", 2), ("kai-ray.io/block", 10), ("kai-ray.io/rack", 25)]
    nodes = expand(pool(5000, levels))
    racks = {n["metadata"]["labels"]["kai-ray.io/rack"] for n in nodes}
    assert len(racks) == 500
    assert nodes[-1]["metadata"]["labels"]["kai-ray.io/rack"] == "zone-1-block-9-rack-24"
