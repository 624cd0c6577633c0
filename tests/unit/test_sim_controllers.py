"""The simulator's workload controllers: the pods KubeRay, Job and Grove would create."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest

from kai_ray.workloads.expected_pods import pods_for_workload
from kai_ray.workloads.grouping import derive_group, derive_groups, pod_group_name, subgroup_name
from tests.builders import patched
from tests.unit.workload_builders import clique, fixture, job, pod, podcliqueset

SUFFIX = "[bcdfghjklmnpqrstvwxz2456789]{5}"
FIXTURES = [
    "raycluster-two-groups.yaml",
    "rayjob.yaml",
    "job.yaml",
    "podcliqueset.yaml",
    "pod.yaml",
]


def all_pods(obj: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for group in derive_groups(obj) for p in pods_for_workload(obj, group)]


def labels(pod_obj: dict[str, Any]) -> dict[str, str]:
    found: dict[str, str] = pod_obj["metadata"]["labels"]
    return found


def names(pods: list[dict[str, Any]]) -> list[str]:
    return [p["metadata"]["name"] for p in pods]


@pytest.mark.parametrize("name", [pytest.param(n, id=n) for n in FIXTURES])
def test_every_pod_joins_its_group_and_subgroup(name: str) -> None:
    obj = fixture(name)
    for group in derive_groups(obj):
        pods = pods_for_workload(obj, group)
        assert len(pods) == group.max_members
        for made in pods:
            assert pod_group_name(made) == group.name
            assert made["metadata"]["annotations"]["kai-ray.io/pod-group"] == group.name
            assert labels(made)["kai-ray.io/queue"] == group.pod_group.spec.queue
            assert made["status"] == {"phase": "Pending"}
            if group.subgroup_max:
                assert subgroup_name(made) in group.subgroup_max


@pytest.mark.parametrize(
    "name", [pytest.param(n, id=n) for n in FIXTURES if n not in ("rayjob.yaml", "pod.yaml")]
)
def test_controller_labels_alone_lead_back_to_the_same_group(name: str) -> None:
    """What the operator sees on real pods, without the simulator's annotation."""
    obj = fixture(name)
    for group in derive_groups(obj):
        for made in pods_for_workload(obj, group):
            bare = copy.deepcopy(made)
            del bare["metadata"]["annotations"]["kai-ray.io/pod-group"]
            bare["metadata"]["labels"].pop("kai-ray.io/subgroup", None)
            assert pod_group_name(bare) == group.name
            assert subgroup_name(bare) == labels(made).get("kai-ray.io/subgroup")


@pytest.mark.parametrize("name", [pytest.param(n, id=n) for n in FIXTURES])
def test_same_input_gives_the_same_pods_with_unique_names(name: str) -> None:
    first, second = all_pods(fixture(name)), all_pods(fixture(name))
    assert first == second
    assert len(set(names(first))) == len(first)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        pytest.param(
            "raycluster-two-groups.yaml",
            ["head", "a", "a", "a", "a", "b", "b", "b", "a", "a"],
            id="RayCluster: head, then every group's minimum, then the elastic replicas",
        ),
        pytest.param(
            "podcliqueset.yaml",
            ["serve-0-frontend"]
            + ["serve-0-decode-0-leader"]
            + ["serve-0-decode-0-worker"] * 3
            + ["serve-0-decode-1-leader"]
            + ["serve-0-decode-1-worker"] * 3
            + ["serve-0-frontend"],
            id="PodCliqueSet: each clique's minAvailable, then the rest",
        ),
    ],
)
def test_minimum_members_come_first(name: str, expected: list[str]) -> None:
    obj = fixture(name)
    pods = pods_for_workload(obj, derive_groups(obj)[0])
    order = [labels(p).get("ray.io/group", labels(p).get("grove.io/podclique")) for p in pods]
    assert [o.replace("headgroup", "head") if o else o for o in order] == expected


def ray_pods() -> list[dict[str, Any]]:
    return all_pods(fixture("raycluster-two-groups.yaml"))


def test_kuberay_names_head_and_workers_as_kuberay_does() -> None:
    pods = ray_pods()
    assert re.fullmatch(f"train-head-{SUFFIX}", names(pods)[0])
    assert all(re.fullmatch(f"train-(a|b)-worker-{SUFFIX}", n) for n in names(pods)[1:])


def test_kuberay_labels_identify_cluster_node_type_and_group() -> None:
    head, worker = ray_pods()[0], ray_pods()[1]
    assert (
        labels(head).items()
        >= {
            "ray.io/cluster": "train",
            "ray.io/node-type": "head",
            "ray.io/group": "headgroup",
            "ray.io/is-ray-node": "yes",
            "ray.io/identifier": "train-head",
            "app.kubernetes.io/created-by": "kuberay-operator",
            "kai-ray.io/subgroup": "headgroup",
        }.items()
    )
    assert (
        labels(worker).items()
        >= {
            "ray.io/node-type": "worker",
            "ray.io/group": "a",
            "ray.io/identifier": "train-worker",
            "kai-ray.io/subgroup": "a",
        }.items()
    )


def test_template_labels_cannot_override_kuberay_identity_labels() -> None:
    obj = fixture("raycluster-two-groups.yaml")
    head_template = obj["spec"]["headGroupSpec"]["template"]
    head_template["metadata"] = {"labels": {"ray.io/group": "mine", "team": "vision"}}
    head = all_pods(obj)[0]
    assert (labels(head)["ray.io/group"], labels(head)["team"]) == ("headgroup", "vision")


def test_kuberay_multi_host_replicas_carry_replica_and_host_labels() -> None:
    group_a = [labels(p) for p in ray_pods() if labels(p)["ray.io/group"] == "a"]
    indices = [
        (lab["ray.io/worker-group-replica-index"], lab["ray.io/replica-host-index"])
        for lab in group_a
    ]
    assert indices == [("0", "0"), ("0", "1"), ("1", "0"), ("1", "1"), ("2", "0"), ("2", "1")]
    replica_names = {lab["ray.io/worker-group-replica-name"] for lab in group_a}
    assert len(replica_names) == 3 and all(re.fullmatch(f"a-{SUFFIX}", n) for n in replica_names)


def test_kuberay_single_host_replicas_have_an_index_but_no_host_labels() -> None:
    group_b = [labels(p) for p in ray_pods() if labels(p)["ray.io/group"] == "b"]
    assert [lab["ray.io/worker-group-replica-index"] for lab in group_b] == ["0", "1", "2"]
    assert not any("ray.io/replica-host-index" in lab for lab in group_b)


def test_template_placement_fields_and_annotations_are_copied() -> None:
    worker = ray_pods()[1]
    assert worker["metadata"]["annotations"]["kai-ray.io/gpu-fraction"] == "0.5"
    assert worker["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "H100"}
    assert worker["spec"]["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert worker["spec"]["schedulerName"] == "kai-ray"


def test_requests_default_to_limits_as_the_api_server_does() -> None:
    resources = ray_pods()[1]["spec"]["containers"][0]["resources"]
    assert resources == {
        "requests": {"cpu": "4", "nvidia.com/gpu": 1},
        "limits": {"nvidia.com/gpu": 1},
    }


def test_ray_pods_are_owned_by_their_raycluster() -> None:
    owner = ray_pods()[0]["metadata"]["ownerReferences"][0]
    assert (owner["apiVersion"], owner["kind"], owner["name"], owner["controller"]) == (
        "ray.io/v1",
        "RayCluster",
        "train",
        True,
    )


def test_rayjob_pods_belong_to_a_cluster_named_after_the_rayjob() -> None:
    pods = all_pods(fixture("rayjob.yaml"))
    assert re.fullmatch(f"sweep-raycluster-head-{SUFFIX}", names(pods)[0])
    assert {labels(p)["ray.io/cluster"] for p in pods} == {"sweep-raycluster"}
    assert pods[0]["metadata"]["ownerReferences"][0]["name"] == "sweep-raycluster"
    assert pods[0]["spec"]["priorityClassName"] == "batch-low"


def test_a_template_scheduler_name_is_kept() -> None:
    obj = patched(job(), "spec.template.spec.schedulerName", "default-scheduler")
    assert all_pods(obj)[0]["spec"]["schedulerName"] == "default-scheduler"


def test_job_pods_carry_the_job_controller_labels() -> None:
    obj = patched(job(parallelism=2), "metadata.uid", "uid-1")
    pods = all_pods(obj)
    assert all(re.fullmatch(f"bench-{SUFFIX}", n) for n in names(pods))
    assert {
        k: labels(pods[0])[k]
        for k in (
            "job-name",
            "batch.kubernetes.io/job-name",
            "controller-uid",
            "batch.kubernetes.io/controller-uid",
        )
    } == {
        "job-name": "bench",
        "batch.kubernetes.io/job-name": "bench",
        "controller-uid": "uid-1",
        "batch.kubernetes.io/controller-uid": "uid-1",
    }
    owner = pods[0]["metadata"]["ownerReferences"][0]
    assert (owner["apiVersion"], owner["kind"], owner["uid"]) == ("batch/v1", "Job", "uid-1")


def test_indexed_job_pods_carry_their_completion_index() -> None:
    pods = all_pods(fixture("job.yaml"))
    assert [labels(p)["batch.kubernetes.io/job-completion-index"] for p in pods] == ["0", "1", "2"]
    assert all(re.fullmatch(f"bench-{i}-{SUFFIX}", n) for i, n in enumerate(names(pods)))
    assert pods[0]["spec"]["priorityClassName"] == "inference"


def test_job_without_a_uid_gets_a_stable_derived_one() -> None:
    uid = labels(all_pods(job())[0])["controller-uid"]
    assert uid == labels(all_pods(job())[0])["controller-uid"]
    assert re.fullmatch("[0-9a-f-]{36}", uid)


def test_grove_pods_carry_podclique_podgang_and_index_labels() -> None:
    obj = fixture("podcliqueset.yaml")
    base = pods_for_workload(obj, derive_groups(obj)[0])
    frontend = [labels(p) for p in base if labels(p)["grove.io/podclique"] == "serve-0-frontend"]
    assert [
        (
            lab["grove.io/podgang"],
            lab["grove.io/podcliqueset-replica-index"],
            lab["grove.io/podclique-pod-index"],
        )
        for lab in frontend
    ] == [("serve-0", "0", "0"), ("serve-0", "0", "1")]
    assert re.fullmatch(f"serve-0-frontend-{SUFFIX}", names(base)[0])
    assert base[0]["spec"]["priorityClassName"] == "serving"


def test_grove_scaling_group_pods_name_their_group_and_scaled_gangs_their_base() -> None:
    obj = fixture("podcliqueset.yaml")
    scaled = pods_for_workload(obj, derive_groups(obj)[1])
    leader = labels(scaled[0])
    assert (
        leader["grove.io/podgang"],
        leader["grove.io/base-podgang"],
        leader["grove.io/podcliquescalinggroup"],
        leader["grove.io/podcliquescalinggroup-replica-index"],
        leader["role"],
    ) == ("serve-0-decode-0", "serve-0", "serve-0-decode", "2", "leader")


def test_grove_pods_are_owned_by_their_podclique() -> None:
    obj = podcliqueset(clique("a"))
    owner = all_pods(obj)[0]["metadata"]["ownerReferences"][0]
    assert (owner["apiVersion"], owner["kind"], owner["name"]) == (
        "grove.io/v1alpha1",
        "PodClique",
        "pcs-0-a",
    )


def test_podgang_creates_no_pods_of_its_own() -> None:
    obj = fixture("podgang.yaml")
    assert pods_for_workload(obj, derive_group(obj)) == []


def test_bare_pod_is_itself_pending_in_the_kai_ray_scheduler() -> None:
    obj = pod()
    made = all_pods(obj)
    assert names(made) == ["solo"]
    assert made[0]["spec"]["schedulerName"] == "kai-ray"
    assert made[0]["spec"]["containers"] == obj["spec"]["containers"]
    assert "schedulerName" not in obj["spec"], "the input is not changed"
