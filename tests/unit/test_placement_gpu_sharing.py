"""GPU sharing: fractions and memory shares pack onto shared devices; whole GPUs avoid them."""

from __future__ import annotations

from tests.builders import make_node, make_pod, make_pod_group
from tests.unit.placement_setup import cluster, extras, place


def share_group(*shares: str, memory: bool = False) -> tuple[list[dict], dict]:  # type: ignore[type-arg]
    pods = []
    for i, share in enumerate(shares):
        pod = make_pod(f"s{i}").group("g").created(i)
        pod.gpu_memory(share) if memory else pod.gpu_fraction(share)
        pods.append(pod.build())
    return pods, make_pod_group("g").queue("q").min_member(1).build()


def test_fractions_pack_onto_a_partly_used_device_before_opening_a_new_one() -> None:
    pods, group = share_group("0.5", "0.25", "0.5", "0.25")
    bound = [make_pod("old").gpu_fraction("0.5").devices("3").on("n2").build()]
    nodes = [make_node("n1").gpus(8).build(), make_node("n2").gpus(8).build()]
    _outcome, tx = place(cluster(nodes, pods + bound, [group]))
    extras(tx)
    binds = {b.pod: b for b in tx.binds()}
    assert binds["default/s0"].node == "n2" and binds["default/s0"].gpu_devices == (3,)
    assert binds["default/s0"].gpu_fraction == 0.5
    assert binds["default/s1"].gpu_devices == (0,) and binds["default/s1"].node == "n2"
    assert {binds["default/s2"].gpu_devices, binds["default/s3"].gpu_devices} == {(0,)}


def test_memory_shares_become_fractions_of_the_node_device() -> None:
    pods, group = share_group("20Gi", "20Gi", memory=True)
    nodes = [make_node("n1").gpus(2, memory_mib=40960).build()]
    _outcome, tx = place(cluster(nodes, pods, [group]))
    extras(tx)
    binds = tx.binds()
    assert [b.gpu_devices for b in binds] == [(0,), (0,)]
    assert [b.gpu_fraction for b in binds] == [0.5, 0.5]


def test_memory_share_needs_a_node_that_publishes_device_memory() -> None:
    pods, group = share_group("20Gi", memory=True)
    outcome, _ = place(cluster([make_node("n1").gpus(2).build()], pods, [group]))
    assert not outcome.admitted
    assert "1 node does not publish nvidia.com/gpu.memory" in outcome.reason


def test_whole_gpu_pods_never_land_on_a_shared_device() -> None:
    bound = [make_pod("old").gpu_fraction("0.1").devices("0").on("n1").build()]
    pods = [make_pod("w").gpus(7).group("g").build()]
    nodes = [make_node("n1").gpus(8).build()]
    outcome, tx = place(cluster(nodes, pods + bound, [make_pod_group("g").queue("q").build()]))
    assert outcome.admitted
    assert tx.binds()[0].gpu_devices == (1, 2, 3, 4, 5, 6, 7)


def test_whole_gpu_pod_waits_when_only_shared_devices_are_left() -> None:
    bound = [
        make_pod(f"old{d}").gpu_fraction("0.1").devices(str(d)).on("n1").build() for d in (0, 1)
    ]
    pods = [make_pod("w").gpus(2).group("g").build()]
    nodes = [make_node("n1").gpus(3).build()]
    outcome, _ = place(cluster(nodes, pods + bound, [make_pod_group("g").queue("q").build()]))
    assert not outcome.admitted
    assert "1 node has fewer than 2 free GPU devices" in outcome.reason
