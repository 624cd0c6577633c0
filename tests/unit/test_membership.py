"""Which workloads and pods are kai-ray's, which gang a pod joins, and admission by suspend."""

from __future__ import annotations

from typing import Any

import pytest

from kai_ray.decisions.cycle import run_cycle
from kai_ray.effects.binder import Binder
from kai_ray.state.cache import ClusterCache
from kai_ray.values.config import SchedulerConfig
from kai_ray.values.errors import InvalidObjectError
from kai_ray.values.names import ADMISSION_GATE, POD_GROUP_ANNOTATION, SUBGROUP_LABEL
from kai_ray.workloads.expected_pods import pods_for_workload
from kai_ray.workloads.grouping import derive_group
from kai_ray.workloads.membership import (
    admission_changes,
    as_written,
    holds_with_suspend,
    needs_derived_group,
    with_membership,
    with_owner_queue,
)

from .test_cluster_cache import MemoryWriter, node
from .workload_builders import job, pod, raycluster, rayjob, template, worker


def ours(obj: dict[str, Any]) -> dict[str, Any]:
    """The workload with every pod template (or the pod) scheduled by kai-ray."""
    spec = obj["spec"]
    if obj["kind"] == "Pod":
        spec["schedulerName"] = "kai-ray"
        return obj
    cluster = spec.get("rayClusterSpec", spec)
    templates = [spec.get("template")] if obj["kind"] == "Job" else []
    if "headGroupSpec" in cluster:
        templates += [cluster["headGroupSpec"]["template"]]
        templates += [w["template"] for w in cluster.get("workerGroupSpecs", [])]
    for t in templates:
        t["spec"]["schedulerName"] = "kai-ray"
    return obj


def ray_pod(cluster: str, group: str, owner: str = "RayCluster") -> dict[str, Any]:
    made = pod(
        name=f"{cluster}-{group}-x", labels={"ray.io/cluster": cluster, "ray.io/group": group}
    )
    made["metadata"]["ownerReferences"] = [{"kind": owner, "name": cluster}]
    return ours(made)


@pytest.mark.parametrize(
    ("workload", "expected"),
    [
        pytest.param(ours(job()), True, id="a Job of kai-ray gets a PodGroup"),
        pytest.param(job(), False, id="a Job of the default scheduler does not"),
        pytest.param(
            ours(rayjob({"rayClusterSpec": {"headGroupSpec": {"template": template()}}})),
            True,
            id="a RayJob of kai-ray gets one",
        ),
        pytest.param(ours(pod()), True, id="a bare pod of kai-ray is a gang of one"),
        pytest.param(ray_pod("rc", "headgroup"), False, id="a RayCluster's pod joins its cluster"),
        pytest.param(
            ours(pod(name="leaving"))
            | {
                "metadata": {
                    "name": "leaving",
                    "namespace": "ns",
                    "deletionTimestamp": "2026-01-01T00:00:00Z",
                }
            },
            False,
            id="a bare pod being deleted gets none (its namespace may be going)",
        ),
    ],
)
def test_which_workloads_get_a_derived_pod_group(workload: dict[str, Any], expected: bool) -> None:
    assert needs_derived_group(workload, "kai-ray") is expected


def test_a_raycluster_owned_by_a_rayjob_is_covered_by_the_rayjob() -> None:
    cluster = ours(raycluster(worker("w", replicas=1)))
    cluster["metadata"]["ownerReferences"] = [{"kind": "RayJob", "name": "rj"}]
    assert not needs_derived_group(cluster, "kai-ray")


def test_a_rayjobs_submitter_job_without_a_queue_is_in_its_rayjobs_queue() -> None:
    """KubeRay copies none of the RayJob's labels onto its submitter Job; a Job that
    names its own queue keeps it, and one whose owner names none stays refused."""
    submitter = job(labels=None)
    submitter["metadata"]["ownerReferences"] = [
        {"kind": "RayJob", "name": "rj", "controller": True}
    ]
    owners = {("RayJob", "ns/rj"): rayjob({}, {"kai.scheduler/queue": "team-b"})}

    def lookup(kind: str, key: str) -> dict[str, Any] | None:
        return owners.get((kind, key))

    with pytest.raises(InvalidObjectError, match="label the Job with the queue"):
        derive_group(submitter)
    assert derive_group(with_owner_queue(submitter, lookup)).pod_group.spec.queue == "team-b"
    own = job(labels={"kai-ray.io/queue": "team-c"})
    own["metadata"]["ownerReferences"] = submitter["metadata"]["ownerReferences"]
    assert with_owner_queue(own, lookup) is own
    assert with_owner_queue(submitter, lambda kind, key: None) is submitter
    owners[("RayJob", "ns/rj")] = rayjob({}, None)
    assert with_owner_queue(submitter, lookup) is submitter
    assert with_owner_queue(job(labels=None), lookup)["metadata"].get("labels") is None


def test_a_ray_pod_joins_its_cluster_and_subgroup_or_its_rayjob() -> None:
    member = with_membership(ray_pod("rc", "gpu-workers"), lambda ns, cluster: None)
    assert member["metadata"]["annotations"][POD_GROUP_ANNOTATION] == "raycluster-rc"
    assert member["metadata"]["labels"][SUBGROUP_LABEL] == "gpu-workers"
    of_job = with_membership(ray_pod("rj-abcde", "headgroup"), lambda ns, cluster: "rj")
    assert of_job["metadata"]["annotations"][POD_GROUP_ANNOTATION] == "rayjob-rj"


def test_a_pod_on_its_way_out_is_not_reported_for_the_group_that_went_first() -> None:
    """A namespace being deleted loses its PodGroups before its pods (kwok or a
    kubelet is still stopping them): no Event per pod about its missing group."""

    def bound(name: str, deleting: bool) -> dict[str, Any]:
        made = ours(pod(name=name, annotations={POD_GROUP_ANNOTATION: f"pod-{name}"}))
        made["metadata"]["namespace"] = "ns"
        made["spec"]["nodeName"] = "n1"
        made["status"] = {"phase": "Running"}
        if deleting:
            made["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        return made

    cache = ClusterCache("kai-ray")
    for obj in (node("n1"), bound("leaving", True), bound("staying", False)):
        cache.upsert(obj)
    problems = [(p.obj.name, p.field) for p in cache.snapshot().problems]
    assert problems == [("staying", f"metadata.annotations[{POD_GROUP_ANNOTATION}]")]


def test_a_pod_that_names_its_group_is_left_as_it_is() -> None:
    named = ours(pod(annotations={POD_GROUP_ANNOTATION: "mine"}))
    assert with_membership(named, lambda ns, cluster: None) is named


def test_the_webhook_gates_pods_of_kai_ray_only_and_names_their_gang() -> None:
    changes = admission_changes(ray_pod("rc", "headgroup"), "kai-ray", lambda ns, c: None)
    assert changes["schedulingGates"] == [{"name": ADMISSION_GATE}]
    assert changes["annotations"][POD_GROUP_ANNOTATION] == "raycluster-rc"
    assert admission_changes(pod(), "kai-ray", lambda ns, c: None) == {}


@pytest.mark.parametrize(
    ("workload", "held"),
    [
        pytest.param(ours(raycluster(worker("w", replicas=1))), True, id="a RayCluster of a queue"),
        pytest.param(
            ours(raycluster(worker("w", replicas=1), labels=None)), False, id="one without a queue"
        ),
        pytest.param(
            ours(
                rayjob(
                    {
                        "shutdownAfterJobFinishes": True,
                        "rayClusterSpec": {"headGroupSpec": {"template": template()}},
                    }
                )
            ),
            True,
            id="a RayJob that shuts its cluster down",
        ),
        pytest.param(
            ours(rayjob({"rayClusterSpec": {"headGroupSpec": {"template": template()}}})),
            False,
            id="a RayJob KubeRay would refuse to suspend",
        ),
    ],
)
def test_which_ray_workloads_are_created_suspended(workload: dict[str, Any], held: bool) -> None:
    assert holds_with_suspend(workload, "kai-ray") is held


def test_a_suspended_raycluster_is_admitted_when_its_whole_gang_fits() -> None:
    gpu = template()
    gpu["spec"]["containers"][0]["resources"]["requests"] = {"nvidia.com/gpu": "8"}
    cluster = ours(raycluster(worker("w", replicas=2, minReplicas=2, template=gpu)))
    cluster["spec"]["suspend"] = True
    cluster["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    queue = {"kind": "Queue", "metadata": {"name": "team-a"}, "spec": {}}
    group = derive_group(cluster).pod_group.model_dump(mode="json", exclude_none=True)
    cache = ClusterCache()
    for obj in (node("n1"), node("n2"), queue, {**group, "kind": "PodGroup"}, cluster):
        cache.upsert(obj)
    snapshot = cache.snapshot()
    placeholders = [key for key in snapshot.pods if cache.placeholder_owner(key)]
    assert len(placeholders) == 3  # the head and two workers: nothing exists yet
    plan = run_cycle(snapshot, SchedulerConfig(), 1, 0.0).plan
    assert {b.pod for b in plan.binds} == set(placeholders)
    writer = MemoryWriter()
    binder = Binder(
        writer, placeholder_owner=cache.placeholder_owner, on_resumed=cache.assume_resumed
    )
    report = binder.apply(plan, snapshot, 0.0)
    assert report.resumed == [("RayCluster", "ns/rc")]
    assert [c for c in writer.calls if c[0] == "bind"] == []  # no pod exists to bind
    held = cache.snapshot()
    assert not [key for key in held.pods if cache.placeholder_owner(key)]
    assert held.free[:, held.column("gpu")].sum() == 0  # its room is held for it
    assert not held.pending_pods
    for made in pods_for_workload(cluster, derive_group(cluster)):  # KubeRay makes the pods
        cache.upsert(made)
    after = cache.snapshot()
    assert after.free[:, after.column("gpu")].sum() == 16  # ...and the hold goes
    assert len(after.pending_pods) == 3


def test_a_suspended_raycluster_that_does_not_fit_stays_suspended() -> None:
    gpu = template()
    gpu["spec"]["containers"][0]["resources"]["requests"] = {"nvidia.com/gpu": "8"}
    cluster = ours(raycluster(worker("w", replicas=3, minReplicas=3, template=gpu)))
    cluster["spec"]["suspend"] = True
    queue = {"kind": "Queue", "metadata": {"name": "team-a"}, "spec": {}}
    group = derive_group(cluster).pod_group.model_dump(mode="json", exclude_none=True)
    cache = ClusterCache()
    for obj in (node("n1"), node("n2"), queue, {**group, "kind": "PodGroup"}, cluster):
        cache.upsert(obj)
    plan = run_cycle(cache.snapshot(), SchedulerConfig(), 1, 0.0).plan
    assert plan.binds == []
    report = Binder(MemoryWriter(), placeholder_owner=cache.placeholder_owner).apply(
        plan, cache.snapshot(), 0.0
    )
    assert report.resumed == []


def test_a_bare_pod_keeps_its_own_gang_after_kai_ray_names_it() -> None:
    bare = ours(pod())
    named = with_membership(bare, lambda ns, cluster: None)
    assert named["metadata"]["annotations"][POD_GROUP_ANNOTATION] == "pod-solo"
    assert needs_derived_group(named, "kai-ray")  # the name kai-ray wrote is not a choice
    assert derive_group(as_written(named)).name == "pod-solo"
    chosen = ours(pod(annotations={POD_GROUP_ANNOTATION: "mine"}))
    assert not needs_derived_group(chosen, "kai-ray")


def podgang(labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "scheduler.grove.io/v1alpha1",
        "kind": "PodGang",
        "metadata": {"name": "serve-0", "namespace": "ns", "labels": labels},
        "spec": {"podgroups": [{"name": "serve-0-decode", "minReplicas": 2}]},
    }


def test_a_grove_podgang_is_kai_rays_when_it_names_a_queue_and_its_pods_join_it() -> None:
    """A PodGang names no scheduler: its queue label says whose gang it is, and
    only pods naming kai-ray's scheduler join it."""
    assert needs_derived_group(podgang({"kai-ray.io/queue": "team"}), "kai-ray")
    assert needs_derived_group(podgang({"kai.scheduler/queue": "team"}), "kai-ray")
    assert not needs_derived_group(podgang({}), "kai-ray")
    (group,) = [derive_group(podgang({"kai-ray.io/queue": "team"}))]
    assert (group.pod_group.metadata.name, group.pod_group.spec.queue) == (
        "podgang-serve-0",
        "team",
    )
    member = pod(name="serve-0-decode-0", labels={"grove.io/podgang": "serve-0"})
    assert not needs_derived_group(ours(member), "kai-ray")  # its PodGang's gang covers it
    named = with_membership(ours(member), lambda namespace, cluster: None)
    assert named["metadata"]["annotations"][POD_GROUP_ANNOTATION] == "podgang-serve-0"


def test_a_gang_whose_pods_grove_still_gates_waits_and_is_placed_once_the_gate_goes() -> None:
    """Grove gates a gang's pods until all exist: a pod held by another's gate cannot
    be bound, so it cannot make up the minimum; the PodGroup says which gate holds it."""
    from kai_ray.effects.scheduling_loop import pod_group_body
    from kai_ray.effects.status import pod_group_status, waits_for_its_pods

    cache = ClusterCache("kai-ray", lambda: 0.0, 30)
    cache.upsert(node("n1"))
    cache.upsert(
        {
            "apiVersion": "scheduling.kai-ray.io/v1alpha1",
            "kind": "Queue",
            "metadata": {"name": "team"},
        },
        "Queue",
    )
    gang = podgang({"kai-ray.io/queue": "team"})
    body = pod_group_body(derive_group(gang).pod_group.model_dump(mode="json"), gang)
    cache.upsert({**body, "kind": "PodGroup"}, "PodGroup")
    members = []
    for i in range(2):
        labels = {"grove.io/podgang": "serve-0", "grove.io/podclique": "serve-0-decode"}
        member = ours(pod(name=f"serve-0-decode-{i}", labels=labels))
        member["spec"]["schedulingGates"] = [{"name": "grove.io/podgang-pending-creation"}]
        members.append(with_membership(member, lambda namespace, cluster: None))
    members[1]["spec"]["schedulingGates"] = []  # Grove lifts its gates one pod at a time
    for member in members:
        cache.upsert(member)
    snapshot = cache.snapshot()
    result = run_cycle(snapshot, SchedulerConfig(), 1, 0.0)
    assert result.plan.binds == []
    (group,) = snapshot.pod_groups.values()
    status = pod_group_status(group, result.plan.statuses.get(group.key), None, "t")
    assert status["phase"] == "Pending"
    assert status["conditions"][0]["message"] == (
        "1 of its pods held by scheduling gates grove.io/podgang-pending-creation"
    )
    assert waits_for_its_pods(status["conditions"][0]["message"])  # a Normal Event
    members[0]["spec"]["schedulingGates"] = []
    cache.upsert(members[0])
    result = run_cycle(cache.snapshot(), SchedulerConfig(), 2, 0.0)
    assert sorted(b.pod for b in result.plan.binds) == [
        "ns/serve-0-decode-0",
        "ns/serve-0-decode-1",
    ]
