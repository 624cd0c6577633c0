"""The cluster snapshot: node arrays, GPU devices, pod groups, and every kind of problem."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from kai_ray.state.nodes import Taint
from kai_ray.state.snapshot import ClusterObjects, Snapshot, build_snapshot
from kai_ray.values.resources import Resources
from tests.builders import make_node, make_pod, make_pod_group, make_queue, timestamp

GI = 2.0**30


def snapshot_of(
    nodes: Sequence[Any] = (),
    pods: Sequence[Any] = (),
    queues: Sequence[Any] = (),
    pod_groups: Sequence[Any] = (),
) -> Snapshot:
    """Builders or dicts in, snapshot out."""

    def built(objects: Sequence[Any]) -> list[dict[str, Any]]:
        return [o if isinstance(o, dict) else o.build() for o in objects]

    return build_snapshot(
        ClusterObjects(
            nodes=built(nodes), pods=built(pods), queues=built(queues), pod_groups=built(pod_groups)
        )
    )


def row(snapshot: Snapshot, matrix: np.ndarray, node: str) -> Resources:
    values = matrix[snapshot.node_index[node]]
    return Resources(dict(zip(snapshot.resource_names, values.tolist(), strict=True)))


# ------------------------------------------------------------------ nodes


def test_resource_columns_put_the_core_three_first_then_the_rest_sorted() -> None:
    snapshot = snapshot_of(
        nodes=[make_node("n1").resource("example.com/zz", 1)],
        pods=[make_pod("p").request("example.com/aa", 1)],
    )
    assert snapshot.resource_names == (
        "cpu",
        "memory",
        "nvidia.com/gpu",
        "example.com/aa",
        "example.com/zz",
        "pods",
    )
    assert snapshot.column("gpu") == snapshot.column("nvidia.com/gpu") == 2
    assert list(snapshot.vector({"gpu": 2, "cpu": 1})[:3]) == [1, 0, 2]
    with pytest.raises(KeyError):
        snapshot.vector({"example.com/none": 1})


def test_allocatable_falls_back_to_capacity_resource_by_resource() -> None:
    snapshot = snapshot_of(nodes=[make_node("n1").gpus(8).cpu("64").allocatable(cpu="62")])
    assert row(snapshot, snapshot.capacity, "n1")["cpu"] == 64
    assert row(snapshot, snapshot.allocatable, "n1")["cpu"] == 62
    assert row(snapshot, snapshot.allocatable, "n1")["nvidia.com/gpu"] == 8
    assert row(snapshot, snapshot.allocatable, "n1")["memory"] == 512 * GI


@dataclass
class UsedCase:
    pods: list[Any]
    used: Resources
    nodes: list[Any] = field(default_factory=lambda: [make_node("n1").gpus(8)])


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(
            UsedCase([make_pod("a").cpu("2").gpus(1).on("n1")], Resources.of(cpu=2, gpu=1)),
            id="a bound kai-ray pod uses its requests",
        ),
        pytest.param(
            UsedCase(
                [make_pod("a").cpu("2").on("n1").scheduler("default-scheduler")],
                Resources.of(cpu=2),
            ),
            id="pods of other schedulers count too",
        ),
        pytest.param(
            UsedCase([make_pod("a").cpu("2").on("n1").phase("Succeeded")], Resources()),
            id="finished pods hold nothing",
        ),
        pytest.param(
            UsedCase([make_pod("a").cpu("2").on("n1").phase("Pending")], Resources.of(cpu=2)),
            id="a bound pod still starting holds its requests",
        ),
        pytest.param(
            UsedCase([make_pod("a").cpu("2")], Resources()), id="waiting pods hold nothing"
        ),
        pytest.param(
            UsedCase([make_pod("a").cpu("1").on("gone")], Resources()),
            id="a pod on an unknown node is counted nowhere",
        ),
        pytest.param(
            UsedCase([make_pod("a").gpu_fraction(0.5).on("n1")], Resources.of(gpu=0.5)),
            id="a GPU share counts as that part of a GPU",
        ),
    ],
)
def test_used(case: UsedCase) -> None:
    snapshot = snapshot_of(nodes=case.nodes, pods=case.pods)
    used = row(snapshot, snapshot.used, "n1")
    assert used - {"pods": used["pods"]} == case.used
    assert used["pods"] == sum(
        1
        for p in case.pods
        if p.build()["spec"].get("nodeName") == "n1"
        and p.build()["status"].get("phase") != "Succeeded"
    )
    free = snapshot.allocatable - snapshot.used
    assert np.array_equal(snapshot.free, free)


def test_node_facts() -> None:
    snapshot = snapshot_of(
        nodes=[
            make_node("plain"),
            make_node("down").unready(),
            make_node("kwok").without_conditions(),
            make_node("cordoned").cordoned(),
            make_node("tainted").taint("gpu", "true", "NoSchedule").label("zone", "z1"),
        ]
    )
    assert snapshot.node_names == ("plain", "down", "kwok", "cordoned", "tainted")
    assert snapshot.ready.tolist() == [True, False, True, True, True]
    assert snapshot.unschedulable.tolist() == [False, False, False, True, False]
    assert snapshot.schedulable.tolist() == [True, False, True, False, True]
    assert snapshot.taints[4] == (Taint("gpu", "true", "NoSchedule"),)
    assert snapshot.labels[4]["zone"] == "z1"


def test_every_array_is_read_only() -> None:
    snapshot = snapshot_of(nodes=[make_node("n1").gpus(2)], pods=[make_pod("p").gpus(1).on("n1")])
    arrays = [
        snapshot.capacity,
        snapshot.allocatable,
        snapshot.used,
        snapshot.free,
        snapshot.ready,
        snapshot.unschedulable,
        snapshot.gpu_memory_mib,
        snapshot.gpu_devices[0].free,
        snapshot.gpu_devices[0].shared,
    ]
    for array in arrays:
        assert not array.flags.writeable
    with pytest.raises(TypeError):
        snapshot.labels[0]["x"] = "y"  # type: ignore[index]


# ------------------------------------------------------------------ GPU devices


@dataclass
class DeviceCase:
    pods: list[Any]
    free: list[float]
    shared: list[bool]
    devices: dict[str, tuple[int, ...]]


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(
            DeviceCase(
                [make_pod("a").gpus(2).on("n1").devices("1,3")],
                [1, 0, 1, 0],
                [False] * 4,
                {"a": (1, 3)},
            ),
            id="devices recorded by the binder are taken as recorded",
        ),
        pytest.param(
            DeviceCase(
                [
                    make_pod("rec").gpus(1).on("n1").devices("0"),
                    make_pod("other").gpus(2).on("n1").scheduler("default-scheduler"),
                ],
                [0, 0, 0, 1],
                [False] * 4,
                {"rec": (0,), "other": (1, 2)},
            ),
            id="a pod without a record takes the lowest free whole devices",
        ),
        pytest.param(
            DeviceCase(
                [
                    make_pod("a").gpu_fraction(0.5).on("n1").devices("2"),
                    make_pod("b").gpu_fraction(0.25).on("n1").devices("3"),
                    make_pod("c").gpu_fraction(0.25).on("n1").created(5),
                ],
                [1, 1, 0.25, 0.75],
                [False, False, True, True],
                {"c": (2,)},
            ),
            id="a share packs onto the fullest shared device it fits on",
        ),
        pytest.param(
            DeviceCase(
                [
                    make_pod("a").gpu_fraction(0.75).on("n1").devices("1"),
                    make_pod("b").gpu_fraction(0.5).on("n1"),
                ],
                [0.5, 0.25, 1, 1],
                [True, True, False, False],
                {"b": (0,)},
            ),
            id="a share that fits no shared device opens the lowest free one",
        ),
        pytest.param(
            DeviceCase(
                [make_pod("m").gpu_memory("20Gi").on("n1")],
                [0.75, 1, 1, 1],
                [True, False, False, False],
                {"m": (0,)},
            ),
            id="a memory share becomes a fraction of the node's device memory",
        ),
        pytest.param(
            DeviceCase(
                [
                    make_pod("old").gpus(1).on("n1").created(1),
                    make_pod("new").gpus(1).on("n1").created(2),
                ],
                [0, 0, 1, 1],
                [False] * 4,
                {"old": (0,), "new": (1,)},
            ),
            id="pods without a record are assigned oldest first",
        ),
    ],
)
def test_gpu_devices(case: DeviceCase) -> None:
    node = make_node("n1").gpus(4, memory_mib=81920)
    snapshot = snapshot_of(nodes=[node], pods=case.pods)
    devices = snapshot.gpu_devices[0]
    assert devices.free.tolist() == case.free
    assert devices.shared.tolist() == case.shared
    for name, expected in case.devices.items():
        assert snapshot.pods[f"default/{name}"].devices == expected
    assert devices.whole_free == case.free.count(1)
    assert snapshot.gpu_memory_mib.tolist() == [81920]


# ------------------------------------------------------------------ pods and groups


def test_pending_pods_are_this_schedulers_unbound_live_pods_oldest_first() -> None:
    snapshot = snapshot_of(
        pods=[
            make_pod("young").created(9),
            make_pod("old").created(1),
            make_pod("theirs").scheduler("default-scheduler"),
            make_pod("bound").on("n1"),
            make_pod("failed").phase("Failed"),
        ]
    )
    assert [p.name for p in snapshot.pending_pods] == ["old", "young"]


def test_a_pod_group_collects_its_pods_with_their_state() -> None:
    snapshot = snapshot_of(
        nodes=[make_node("n1").gpus(8)],
        queues=[make_queue("team-a")],
        pod_groups=[make_pod_group("train", "ml").queue("team-a").min_member(2)],
        pods=[
            make_pod("w1", "ml").group("train").subgroup("workers").gpus(2).on("n1").created(2),
            make_pod("w0", "ml").annotate("pod-group-name", "train").gpu_fraction(0.5).created(1),
            make_pod("elsewhere", "other").group("train").build(),
        ],
    )
    group = snapshot.pod_groups["ml/train"]
    assert (group.name, group.namespace, group.queue, group.spec.minMember) == (
        "train",
        "ml",
        "team-a",
        2,
    )
    assert [p.name for p in group.pods] == ["w0", "w1"]
    waiting, bound = group.pods
    assert (waiting.node, waiting.phase, waiting.gpu_fraction, waiting.devices) == (
        None,
        "Pending",
        0.5,
        (),
    )
    assert waiting.gpu_share is not None and waiting.requests == Resources()
    assert (bound.key, bound.node, bound.phase, bound.subgroup) == (
        "ml/w1",
        "n1",
        "Running",
        "workers",
    )
    assert bound.requests == Resources.of(gpu=2) and bound.devices == (0, 1)
    assert bound.creation_timestamp == timestamp(2)
    assert group.pods_of_subgroup("workers") == (bound,)
    # The pod in another namespace names a group that does not exist there.
    assert [p.obj.name for p in snapshot.problems] == ["elsewhere"]


# ------------------------------------------------------------------ problems


@dataclass
class ProblemCase:
    kind: str
    name: str
    path: str
    says: str
    nodes: list[Any] = field(default_factory=list)
    pods: list[Any] = field(default_factory=list)
    queues: list[Any] = field(default_factory=list)
    pod_groups: list[Any] = field(default_factory=list)


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(
            ProblemCase(
                "Queue", "orphan", "spec.parentQueue", "does not exist",
                queues=[make_queue("orphan").parent("missing")],
            ),
            id="a queue whose parent is missing",
        ),
        pytest.param(
            ProblemCase(
                "Queue", "a", "spec.parentQueue", "cycle",
                queues=[make_queue("a").parent("b"), make_queue("b").parent("a")],
            ),
            id="queues whose parents form a cycle",
        ),
        pytest.param(
            ProblemCase(
                "Pod", "p", "spec.containers[0].resources.requests.cpu", "will not be scheduled",
                pods=[make_pod("p").cpu("-1")],
            ),
            id="a waiting pod asking for a negative amount is not scheduled",
        ),
        pytest.param(
            ProblemCase(
                "Pod", "p", "spec.containers[0].resources.requests.cpu", "cannot be counted",
                nodes=[make_node("n1")], pods=[make_pod("p").cpu("-1").on("n1")],
            ),
            id="a bound pod asking for a negative amount cannot be counted",
        ),
        pytest.param(
            ProblemCase(
                "Node", "n1", "status.capacity.cpu", "not a Kubernetes quantity",
                nodes=[make_node("n1").cpu("many")],
            ),
            id="a node with an unparsable capacity",
        ),
        pytest.param(
            ProblemCase(
                "Node", "n1", "spec.taints[0].effect", "unknown taint effect",
                nodes=[make_node("n1").taint("k", effect="Sometimes")],
            ),
            id="a node with a taint of unknown effect",
        ),
        pytest.param(
            ProblemCase(
                "Node", "n1", "metadata.labels[nvidia.com/gpu.memory]", "MiB",
                nodes=[make_node("n1").label("nvidia.com/gpu.memory", "80G")],
            ),
            id="a node whose GPU memory label is not a number of MiB",
        ),
        pytest.param(
            ProblemCase(
                "PodGroup", "pg", "spec.subGroups[0].minMember", "greater than or equal to 0",
                queues=[make_queue("q")],
                pod_groups=[make_pod_group("pg").queue("q").subgroup("w", min_member=-1)],
            ),
            id="a pod group failing validation names the nested field",
        ),
        pytest.param(
            ProblemCase(
                "PodGroup", "pg", "spec.queue", "Field required",
                pod_groups=[make_pod_group("pg").set("spec", {"minMember": 1})],
            ),
            id="a pod group without a queue",
        ),
        pytest.param(
            ProblemCase(
                "Pod", "p", "metadata.annotations[kai-ray.io/pod-group]", "does not exist",
                pods=[make_pod("p").group("nope")],
            ),
            id="a pod naming a pod group that does not exist",
        ),
        pytest.param(
            ProblemCase(
                "PodGroup", "pg", "spec.queue", "does not exist",
                pod_groups=[make_pod_group("pg").queue("ghost")],
            ),
            id="a pod group naming a queue that does not exist",
        ),
        pytest.param(
            ProblemCase(
                "PodGroup", "pg", "spec.queue", "not a leaf",
                queues=[make_queue("root"), make_queue("leaf").parent("root")],
                pod_groups=[make_pod_group("pg").queue("root")],
            ),
            id="a pod group naming a queue that is not a leaf",
        ),
        pytest.param(
            ProblemCase(
                "Pod", "p", "metadata.annotations[kai-ray.io/gpu-fraction]", "(0, 1]",
                pods=[make_pod("p").gpu_fraction(2)],
            ),
            id="a pod with a GPU fraction above 1",
        ),
        pytest.param(
            ProblemCase(
                "Pod", "p", "metadata.annotations[kai-ray.io/gpu-fraction]", "must not also",
                pods=[make_pod("p").gpu_fraction(0.5).gpus(1)],
            ),
            id="a pod asking for a GPU share and whole GPUs at once",
        ),
        pytest.param(
            ProblemCase(
                "Pod", "b", "metadata.annotations[kai-ray.io/gpu-devices]", "already taken",
                nodes=[make_node("n1").gpus(2)],
                pods=[make_pod("a").gpus(1).on("n1").devices("0"),
                      make_pod("b").gpus(1).on("n1").devices("0")],
            ),
            id="two pods recording the same device",
        ),
        pytest.param(
            ProblemCase(
                "Pod", "p", "metadata.annotations[kai-ray.io/gpu-devices]", "does not exist",
                nodes=[make_node("n1").gpus(2)], pods=[make_pod("p").gpus(1).on("n1").devices("5")],
            ),
            id="a pod recording a device the node does not have",
        ),
        pytest.param(
            ProblemCase(
                "Pod", "b", "spec.nodeName", "overcommitted",
                nodes=[make_node("n1").gpus(1)],
                pods=[make_pod("a").gpus(1).on("n1"), make_pod("b").gpus(1).on("n1").created(9)],
            ),
            id="more GPU pods on a node than it has devices",
        ),
        pytest.param(
            ProblemCase(
                "Pod", "p", "metadata.annotations[kai-ray.io/gpu-memory]", "does not publish",
                nodes=[make_node("n1").gpus(1)], pods=[make_pod("p").gpu_memory("1Gi").on("n1")],
            ),
            id="a memory share on a node that does not publish its GPU memory",
        ),
        pytest.param(
            ProblemCase(
                "Node", "n1", "metadata.name", "listed twice",
                nodes=[make_node("n1"), make_node("n1")],
            ),
            id="a node listed twice",
        ),
    ],
)  # fmt: skip
def test_bad_input_becomes_a_problem_naming_object_and_field(case: ProblemCase) -> None:
    snapshot = snapshot_of(case.nodes, case.pods, case.queues, case.pod_groups)
    matches = [
        p
        for p in snapshot.problems
        if (p.obj.kind, p.obj.name, p.field) == (case.kind, case.name, case.path)
    ]
    assert matches, f"no problem for {case.kind} {case.name} {case.path} in {snapshot.problems}"
    assert case.says in matches[0].message


def test_excluded_objects_stay_out_of_what_is_scheduled() -> None:
    snapshot = snapshot_of(
        nodes=[make_node("bad").cpu("many"), make_node("good")],
        pods=[make_pod("negative").cpu("-1"), make_pod("counted").cpu("-1").on("good")],
        pod_groups=[make_pod_group("pg").queue("ghost")],
    )
    assert snapshot.pending_pods == ()
    assert "default/negative" not in snapshot.pods
    assert row(snapshot, snapshot.used, "good") == Resources()
    assert row(snapshot, snapshot.allocatable, "bad") == Resources()
    assert snapshot.pod_groups == {}


def test_an_overcommitted_gpu_pod_is_still_counted_on_its_node() -> None:
    snapshot = snapshot_of(
        nodes=[make_node("n1").gpus(1)],
        pods=[make_pod("a").gpus(1).on("n1"), make_pod("b").gpus(1).on("n1").created(9)],
    )
    assert row(snapshot, snapshot.free, "n1")["nvidia.com/gpu"] == -1
    assert snapshot.pods["default/b"].devices == ()


def test_garbage_objects_never_crash_the_build() -> None:
    snapshot = build_snapshot(
        ClusterObjects(
            nodes=[{"metadata": None}, {"metadata": {"name": "x"}, "status": {"capacity": 5}}],
            pods=[{}, {"metadata": {"name": "p"}, "spec": {"containers": [{"resources": None}]}}],
            queues=[{"metadata": {}}],
            pod_groups=[{"kind": "PodGroup"}],
            topologies=[{"spec": {"levels": []}}],
        )
    )
    kinds = sorted({p.obj.kind for p in snapshot.problems})
    assert kinds == ["Node", "PodGroup", "Queue", "Topology"]
