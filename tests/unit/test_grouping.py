"""Workload grouping: which gang each workload kind is, and which gang a pod joins."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from kai_ray.values.api import TopologyConstraint
from kai_ray.values.errors import InvalidObjectError
from kai_ray.values.resources import GPU
from kai_ray.workloads.grouping import (
    WORKLOAD_KIND_LABEL,
    derive_group,
    derive_groups,
    pod_group_name,
    subgroup_name,
)
from tests.builders import DELETE, patched
from tests.unit.workload_builders import (
    QUEUE,
    clique,
    cluster_spec,
    fixture,
    job,
    pod,
    podcliqueset,
    podgang,
    podgroup,
    raycluster,
    rayjob,
    template,
    worker,
)


@dataclass(frozen=True)
class Expected:
    name: str
    min_member: int
    max_members: int
    subgroups: dict[str, tuple[int, int]] = field(default_factory=dict)
    queue: str = "team-a"
    priority: str | None = None
    topology: TopologyConstraint | None = None
    suspendable: bool = False


def summary(obj: dict[str, Any]) -> Expected:
    group = derive_group(obj)
    spec = group.pod_group.spec
    return Expected(
        name=group.name,
        min_member=spec.minMember,
        max_members=group.max_members,
        subgroups={s.name: (s.minMember, group.subgroup_max[s.name]) for s in spec.subGroups},
        queue=spec.queue,
        priority=spec.priorityClassName,
        topology=spec.topologyConstraint,
        suspendable=group.suspendable,
    )


RAY_HEAD = {"headgroup": (1, 1)}


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        pytest.param(
            fixture("raycluster-two-groups.yaml"),
            Expected(
                "raycluster-train",
                8,
                10,
                {**RAY_HEAD, "a": (4, 6), "b": (3, 3)},
                queue="team-a",
                priority="high",
                suspendable=True,
                topology=TopologyConstraint(
                    topology="dc", requiredLevel="block", preferredLevel="rack"
                ),
            ),
            id="RayCluster head + A (min 2 x 2 hosts) + B (replicas 3) gangs 8 in three subgroups",
        ),
        pytest.param(
            raycluster(worker("w", minReplicas=1, replicas=3)),
            Expected("raycluster-rc", 2, 4, {**RAY_HEAD, "w": (1, 3)}, suspendable=True),
            id="RayCluster replicas above minReplicas are elastic",
        ),
        pytest.param(
            raycluster(worker("w", replicas=5, maxReplicas=2)),
            Expected("raycluster-rc", 3, 3, {**RAY_HEAD, "w": (2, 2)}, suspendable=True),
            id="RayCluster replicas are capped at maxReplicas",
        ),
        pytest.param(
            raycluster(worker("w", minReplicas=2, replicas=1)),
            Expected("raycluster-rc", 3, 3, {**RAY_HEAD, "w": (2, 2)}, suspendable=True),
            id="RayCluster replicas below minReplicas still gang the minimum",
        ),
        pytest.param(
            raycluster(worker("tpu", minReplicas=1, replicas=2, numOfHosts=4)),
            Expected("raycluster-rc", 5, 9, {**RAY_HEAD, "tpu": (4, 8)}, suspendable=True),
            id="RayCluster multi-host replicas are numOfHosts pods each",
        ),
        pytest.param(
            raycluster(),
            Expected("raycluster-rc", 1, 1, RAY_HEAD, suspendable=True),
            id="RayCluster with only a head is a gang of one",
        ),
        pytest.param(
            raycluster(worker("idle")),
            Expected("raycluster-rc", 1, 1, {**RAY_HEAD, "idle": (0, 0)}, suspendable=True),
            id="RayCluster worker group with no replicas is an empty subgroup",
        ),
        pytest.param(
            raycluster(labels={"kai.scheduler/queue": "legacy"}),
            Expected("raycluster-rc", 1, 1, RAY_HEAD, queue="legacy", suspendable=True),
            id="RayCluster queue from KAI's kai.scheduler/queue alias",
        ),
        pytest.param(
            raycluster(labels=None, head=template(labels={"kai-ray.io/queue": "from-head"})),
            Expected("raycluster-rc", 1, 1, RAY_HEAD, queue="from-head", suspendable=True),
            id="RayCluster queue from the head template when the cluster has none",
        ),
        pytest.param(
            raycluster(head=template(priorityClassName="from-template")),
            Expected("raycluster-rc", 1, 1, RAY_HEAD, priority="from-template", suspendable=True),
            id="RayCluster priority from the head template's priorityClassName",
        ),
        pytest.param(
            raycluster(
                labels={**QUEUE, "ray.io/priority-class-name": "from-label"},
                head=template(priorityClassName="from-template"),
            ),
            Expected("raycluster-rc", 1, 1, RAY_HEAD, priority="from-label", suspendable=True),
            id="RayCluster priority label ray.io/priority-class-name wins over the template",
        ),
        pytest.param(
            fixture("rayjob.yaml"),
            Expected(
                "rayjob-sweep",
                2,
                3,
                {**RAY_HEAD, "gpu": (1, 2)},
                queue="team-b",
                priority="batch-low",
                suspendable=True,
            ),
            id="RayJob gangs its rayClusterSpec and not its submitter",
        ),
        pytest.param(
            job(parallelism=4),
            Expected("job-bench", 1, 4),
            id="Job without min-member lets each pod start on its own",
        ),
        pytest.param(
            job(annotations={"kai-ray.io/min-member": "4"}, parallelism=4),
            Expected("job-bench", 4, 4),
            id="Job min-member annotation makes all pods one gang",
        ),
        pytest.param(
            fixture("job.yaml"),
            Expected("job-bench", 2, 3, queue="team-c", priority="inference"),
            id="Job parallelism is bounded by completions; queue from the pod template",
        ),
        pytest.param(job(), Expected("job-bench", 1, 1), id="Job defaults to one pod"),
        pytest.param(
            job(parallelism=0), Expected("job-bench", 0, 0), id="Job with parallelism 0 has no pods"
        ),
        pytest.param(
            job(annotations={"kai-ray.io/topology": "dc", "kai-ray.io/topology-required": "rack"}),
            Expected(
                "job-bench", 1, 1, topology=TopologyConstraint(topology="dc", requiredLevel="rack")
            ),
            id="Job topology annotations become the group's constraint",
        ),
        pytest.param(
            fixture("pod.yaml"),
            Expected("pod-notebook", 1, 1, queue="research", priority="interactive"),
            id="bare Pod is a gang of one with its own priority",
        ),
        pytest.param(
            podcliqueset(clique("router", replicas=3)),
            Expected("podgang-pcs-0", 3, 3, {"pcs-0-router": (3, 3)}),
            id="PodCliqueSet clique minAvailable defaults to its replicas",
        ),
        pytest.param(
            podcliqueset(
                clique("router", replicas=2, minAvailable=1),
                clique("worker", replicas=2),
                topologyConstraint={"pack": {"required": "block", "preferred": "rack"}},
                priorityClassName="serving",
            ),
            Expected(
                "podgang-pcs-0",
                3,
                4,
                {"pcs-0-router": (1, 2), "pcs-0-worker": (2, 2)},
                priority="serving",
                topology=TopologyConstraint(requiredLevel="block", preferredLevel="rack"),
            ),
            id="PodCliqueSet cliques are subgroups; Grove's pack constraint is the gang's",
        ),
        pytest.param(
            fixture("podgang.yaml"),
            Expected(
                "podgang-serve-0",
                4,
                5,
                {"serve-0-frontend": (1, 2), "serve-0-decode-0-worker": (3, 3)},
                queue="inference",
                priority="serving",
                topology=TopologyConstraint(requiredLevel="topology.kubernetes.io/zone"),
            ),
            id="PodGang podgroups are subgroups of at least minReplicas pods",
        ),
    ],
)
def test_workload_becomes_one_gang(obj: dict[str, Any], expected: Expected) -> None:
    assert summary(obj) == expected


def test_derived_pod_group_is_labelled_with_queue_and_kind_in_the_workload_namespace() -> None:
    group = derive_group(fixture("raycluster-two-groups.yaml"), "file.yaml")
    meta = group.pod_group.metadata
    assert (meta.namespace, meta.labels) == (
        "team-a",
        {"kai-ray.io/queue": "team-a", WORKLOAD_KIND_LABEL: "RayCluster"},
    )
    assert (group.workload.kind, group.workload.name, group.workload.source) == (
        "RayCluster",
        "train",
        "file.yaml",
    )


def test_workload_without_namespace_lands_in_default() -> None:
    obj = patched(job(), "metadata.namespace", DELETE)
    assert derive_group(obj).pod_group.metadata.namespace == "default"


def test_podcliqueset_makes_a_base_gang_per_replica_and_a_gang_per_scaled_replica() -> None:
    groups = derive_groups(fixture("podcliqueset.yaml"))
    sizes = {g.name: (g.min_member, g.max_members) for g in groups}
    assert sizes == {
        "podgang-serve-0": (9, 10),
        "podgang-serve-0-decode-0": (4, 4),
        "podgang-serve-1": (9, 10),
        "podgang-serve-1-decode-0": (4, 4),
    }
    assert list(groups[1].subgroup_max) == ["serve-0-decode-2-leader", "serve-0-decode-2-worker"]


def test_grove_clique_pack_constraint_becomes_its_subgroup_constraint() -> None:
    groups = derive_groups(fixture("podcliqueset.yaml"))
    constraints = {s.name: s.topologyConstraint for s in groups[0].pod_group.spec.subGroups}
    assert constraints["serve-0-decode-0-worker"] == TopologyConstraint(requiredLevel="rack")
    assert constraints["serve-0-frontend"] is None


def test_derive_group_refuses_a_podcliqueset_with_several_gangs() -> None:
    with pytest.raises(ValueError, match="use derive_groups"):
        derive_group(fixture("podcliqueset.yaml"))


def test_a_pod_that_names_its_pod_group_is_not_derived() -> None:
    with pytest.raises(ValueError, match="joins it"):
        derive_groups(pod(annotations={"kai-ray.io/pod-group": "mine"}))


def test_every_problem_of_an_object_is_reported_at_once() -> None:
    obj = raycluster(worker("w", minReplicas=-1, numOfHosts=0), labels=None)
    with pytest.raises(InvalidObjectError) as caught:
        derive_group(obj, "bad.yaml")
    assert {p.field for p in caught.value.problems} == {
        "spec.workerGroupSpecs[0].minReplicas",
        "spec.workerGroupSpecs[0].numOfHosts",
        "metadata.labels[kai-ray.io/queue]",
    }
    assert str(caught.value.problems[0]).startswith("bad.yaml: RayCluster ns/rc: ")


MIN_MEMBER = "metadata.annotations[kai-ray.io/min-member]"
CLUSTER = raycluster(worker("a", replicas=1), worker("b", replicas=1))


@pytest.mark.parametrize(
    ("obj", "field", "message"),
    [
        pytest.param(
            patched(CLUSTER, "spec.workerGroupSpecs[1].minReplicas", -1),
            "spec.workerGroupSpecs[1].minReplicas",
            "at least 0",
            id="RayCluster negative minReplicas",
        ),
        pytest.param(
            patched(CLUSTER, "spec.workerGroupSpecs[0].numOfHosts", 0),
            "spec.workerGroupSpecs[0].numOfHosts",
            "at least 1",
            id="RayCluster numOfHosts 0",
        ),
        pytest.param(
            patched(CLUSTER, "spec.workerGroupSpecs[1].groupName", DELETE),
            "spec.workerGroupSpecs[1].groupName",
            "missing",
            id="RayCluster worker group without groupName",
        ),
        pytest.param(
            patched(CLUSTER, "spec.workerGroupSpecs[1].groupName", "a"),
            "spec.workerGroupSpecs[1].groupName",
            "used twice",
            id="RayCluster duplicate groupName",
        ),
        pytest.param(
            patched(CLUSTER, "spec.workerGroupSpecs[0].groupName", "headgroup"),
            "spec.workerGroupSpecs[0].groupName",
            "head",
            id="RayCluster worker group named after the head's subgroup",
        ),
        pytest.param(
            raycluster(worker("w", minReplicas=3, maxReplicas=2)),
            "spec.workerGroupSpecs[0].minReplicas",
            "above maxReplicas 2",
            id="RayCluster minReplicas above maxReplicas",
        ),
        pytest.param(
            patched(CLUSTER, "spec.workerGroupSpecs[0].replicas", "3"),
            "spec.workerGroupSpecs[0].replicas",
            "whole number",
            id="RayCluster replicas written as a string",
        ),
        pytest.param(
            raycluster(labels=None),
            "metadata.labels[kai-ray.io/queue]",
            "kai.scheduler/queue",
            id="RayCluster without a queue label",
        ),
        pytest.param(
            patched(CLUSTER, "spec.workerGroupSpecs[0].template.spec.containers", DELETE),
            "spec.workerGroupSpecs[0].template.spec.containers",
            "missing",
            id="RayCluster worker template without containers",
        ),
        pytest.param(
            patched(CLUSTER, "spec.workerGroupSpecs[0].template", DELETE),
            "spec.workerGroupSpecs[0].template",
            "missing",
            id="RayCluster worker group without a template",
        ),
        pytest.param(
            patched(CLUSTER, "spec.headGroupSpec", DELETE),
            "spec.headGroupSpec",
            "missing",
            id="RayCluster without a head",
        ),
        pytest.param(
            patched(
                CLUSTER,
                "spec.headGroupSpec.template.spec.containers[0].resources.requests",
                {"cpu": "lots"},
            ),
            "spec.headGroupSpec.template.spec.containers[0].resources.requests[cpu]",
            "not a Kubernetes quantity",
            id="RayCluster head request that is not a quantity",
        ),
        pytest.param(
            raycluster(labels={**QUEUE, "team": 7}),  # type: ignore[dict-item]
            "metadata.labels[team]",
            "expected a string",
            id="RayCluster label value that is not a string",
        ),
        pytest.param(
            raycluster(annotations={"kai-ray.io/topology-required": "rack"}),
            "metadata.annotations[kai-ray.io/topology]",
            "Topology",
            id="topology-required annotation without a topology name",
        ),
        pytest.param(
            rayjob({"clusterSelector": {"ray.io/cluster": "shared"}}),
            "spec.rayClusterSpec",
            "clusterSelector",
            id="RayJob with clusterSelector and no rayClusterSpec",
        ),
        pytest.param(
            rayjob({"rayClusterSpec": cluster_spec(worker("w", numOfHosts=0))}),
            "spec.rayClusterSpec.workerGroupSpecs[0].numOfHosts",
            "at least 1",
            id="RayJob worker group problems name the rayClusterSpec path",
        ),
        pytest.param(
            job(annotations={"kai-ray.io/min-member": "two"}),
            MIN_MEMBER,
            "whole number",
            id="Job min-member not an integer",
        ),
        pytest.param(
            job(annotations={"kai-ray.io/min-member": "5"}, parallelism=4),
            MIN_MEMBER,
            "more than the 4 pods",
            id="Job min-member above parallelism",
        ),
        pytest.param(
            job(annotations={"kai-ray.io/min-member": "3"}, parallelism=4, completions=2),
            MIN_MEMBER,
            "more than the 2 pods",
            id="Job min-member above completions",
        ),
        pytest.param(
            job(annotations={"kai-ray.io/min-member": "0"}),
            MIN_MEMBER,
            "at least 1",
            id="Job min-member zero",
        ),
        pytest.param(
            job(parallelism=-2),
            "spec.parallelism",
            "at least 0",
            id="Job negative parallelism",
        ),
        pytest.param(
            patched(job(), "spec.template", DELETE),
            "spec.template",
            "missing",
            id="Job without a pod template",
        ),
        pytest.param(
            pod(labels=None),
            "metadata.labels[kai-ray.io/queue]",
            "missing",
            id="Pod without a queue label",
        ),
        pytest.param(
            patched(pod(), "spec.containers", []),
            "spec.containers",
            "at least one",
            id="Pod without containers",
        ),
        pytest.param(
            patched(pod(), "spec.containers[0].name", DELETE),
            "spec.containers[0].name",
            "missing",
            id="Pod container without a name",
        ),
        pytest.param(
            patched(job(), "metadata.name", DELETE),
            "metadata.name",
            "missing",
            id="workload without a name",
        ),
        pytest.param(
            patched(podcliqueset(clique("a")), "spec.template.cliques[0].name", DELETE),
            "spec.template.cliques[0].name",
            "missing",
            id="PodCliqueSet clique without a name",
        ),
        pytest.param(
            podcliqueset(clique("a"), clique("a")),
            "spec.template.cliques[1].name",
            "used twice",
            id="PodCliqueSet duplicate clique name",
        ),
        pytest.param(
            podcliqueset(clique("a", replicas=2, minAvailable=3)),
            "spec.template.cliques[0].spec.minAvailable",
            "above replicas 2",
            id="PodCliqueSet clique minAvailable above replicas",
        ),
        pytest.param(
            patched(podcliqueset(clique("a")), "spec.template.cliques[0].spec.podSpec", DELETE),
            "spec.template.cliques[0].spec.podSpec",
            "missing",
            id="PodCliqueSet clique without a podSpec",
        ),
        pytest.param(
            podcliqueset(clique("a"), scaling_groups=[{"name": "g", "cliqueNames": ["a", "b"]}]),
            "spec.template.podCliqueScalingGroups[0].cliqueNames[1]",
            "no clique named 'b'",
            id="PodCliqueSet scaling group naming an unknown clique",
        ),
        pytest.param(
            podcliqueset(
                clique("a"),
                scaling_groups=[
                    {"name": "g", "cliqueNames": ["a"], "replicas": 1, "minAvailable": 2}
                ],
            ),
            "spec.template.podCliqueScalingGroups[0].minAvailable",
            "above replicas 1",
            id="PodCliqueSet scaling group minAvailable above replicas",
        ),
        pytest.param(
            podcliqueset(
                clique("a"),
                scaling_groups=[
                    {"name": "g", "cliqueNames": ["a"]},
                    {"name": "h", "cliqueNames": ["a"]},
                ],
            ),
            "spec.template.podCliqueScalingGroups[1].cliqueNames[0]",
            "already in group 'g'",
            id="PodCliqueSet clique in two scaling groups",
        ),
        pytest.param(
            podcliqueset(clique("a"), labels=None),
            "metadata.labels[kai-ray.io/queue]",
            "PodCliqueSet",
            id="PodCliqueSet without a queue label",
        ),
        pytest.param(
            podgang(podgroup("p", -1, 1)),
            "spec.podgroups[0].minReplicas",
            "at least 0",
            id="PodGang podgroup with negative minReplicas",
        ),
        pytest.param(
            patched(podgang(podgroup("p", 1, 1)), "spec.podgroups[0].minReplicas", DELETE),
            "spec.podgroups[0].minReplicas",
            "missing",
            id="PodGang podgroup without minReplicas",
        ),
        pytest.param(
            podgang(podgroup("p", 1, 1), podgroup("p", 1, 1)),
            "spec.podgroups[1].name",
            "used twice",
            id="PodGang duplicate podgroup name",
        ),
        pytest.param(
            podgang(),
            "spec.podgroups",
            "at least one",
            id="PodGang without podgroups",
        ),
        pytest.param(
            patched(pod(), "spec.schedulerName", -3),
            "spec.schedulerName",
            "expected a string",
            id="Pod scheduler name not a string",
        ),
        pytest.param(
            patched(job(), "spec.template.spec.restartPolicy", "Sometimes"),
            "spec.template.spec.restartPolicy",
            "one of Always, OnFailure, Never",
            id="Job restart policy not one Kubernetes knows",
        ),
        pytest.param(
            patched(job(), "spec.template.spec.containers[0].image", {}),
            "spec.template.spec.containers[0].image",
            "expected a string",
            id="Job container image not a string",
        ),
        pytest.param(
            patched(
                job(),
                "spec.template.spec.containers[0].resources",
                {"requests": {GPU: 1}, "limits": {GPU: 2}},
            ),
            f"spec.template.spec.containers[0].resources.limits.{GPU}",
            "must equal the request",
            id="Job container GPU limit and request differ",
        ),
        pytest.param(
            patched(CLUSTER, "spec.workerGroupSpecs[1].rayStartParams", "num-cpus=1"),
            "spec.workerGroupSpecs[1].rayStartParams",
            "expected an object",
            id="RayCluster rayStartParams not a map",
        ),
        pytest.param(
            rayjob({"shutdownAfterJobFinishes": "yes", "rayClusterSpec": cluster_spec()}),
            "spec.shutdownAfterJobFinishes",
            "true or false",
            id="RayJob shutdownAfterJobFinishes not a boolean",
        ),
        pytest.param(
            rayjob({"entrypoint": 1.5, "rayClusterSpec": cluster_spec()}),
            "spec.entrypoint",
            "expected a string",
            id="RayJob entrypoint not a string",
        ),
        pytest.param(
            {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"}},
            "kind",
            "not a workload kai-ray groups",
            id="a kind kai-ray does not group",
        ),
    ],
)
def test_malformed_workload_is_refused_naming_the_field(
    obj: dict[str, Any], field: str, message: str
) -> None:
    with pytest.raises(InvalidObjectError) as caught:
        derive_groups(obj)
    matching = [p for p in caught.value.problems if p.field == field]
    assert matching, f"no problem on {field}: {caught.value}"
    assert message in matching[0].message


def labelled(labels: dict[str, str], annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return pod("p-1", labels=labels, annotations=annotations)


@pytest.mark.parametrize(
    ("pod_obj", "group", "subgroup"),
    [
        pytest.param(
            labelled({}, {"kai-ray.io/pod-group": "pg"}),
            "pg",
            None,
            id="explicit kai-ray.io/pod-group annotation",
        ),
        pytest.param(
            labelled({}, {"pod-group-name": "kai"}),
            "kai",
            None,
            id="KAI's pod-group-name annotation is accepted",
        ),
        pytest.param(
            labelled(
                {"ray.io/cluster": "rc", "ray.io/group": "gpu"}, {"kai-ray.io/pod-group": "x"}
            ),
            "x",
            None,
            id="explicit group wins and controller subgroups do not apply to it",
        ),
        pytest.param(
            labelled({"kai-ray.io/subgroup": "s"}, {"kai-ray.io/pod-group": "x"}),
            "x",
            "s",
            id="explicit group member takes kai-ray's subgroup label",
        ),
        pytest.param(
            labelled({"ray.io/cluster": "rc", "ray.io/group": "gpu"}),
            "raycluster-rc",
            "gpu",
            id="KubeRay pod joins its cluster's group and its worker group",
        ),
        pytest.param(
            labelled({"ray.io/cluster": "rc", "ray.io/group": "headgroup"}),
            "raycluster-rc",
            "headgroup",
            id="KubeRay head pod is in the headgroup subgroup",
        ),
        pytest.param(
            labelled({"batch.kubernetes.io/job-name": "bench", "job-name": "bench"}),
            "job-bench",
            None,
            id="Job pod joins its Job's group",
        ),
        pytest.param(
            labelled({"job-name": "old"}),
            "job-old",
            None,
            id="Job pod with only the legacy job-name label",
        ),
        pytest.param(
            labelled({"grove.io/podgang": "serve-0", "grove.io/podclique": "serve-0-frontend"}),
            "podgang-serve-0",
            "serve-0-frontend",
            id="Grove pod joins its PodGang and its PodClique",
        ),
        pytest.param(
            labelled({"kai-ray.io/subgroup": "mine", "ray.io/cluster": "rc", "ray.io/group": "g"}),
            "raycluster-rc",
            "mine",
            id="kai-ray's subgroup label wins over the controller's",
        ),
        pytest.param(labelled({}), "pod-p-1", None, id="bare pod is its own group"),
    ],
)
def test_pod_joins_its_group(pod_obj: dict[str, Any], group: str, subgroup: str | None) -> None:
    assert (pod_group_name(pod_obj), subgroup_name(pod_obj)) == (group, subgroup)


def test_pod_without_a_name_or_group_is_refused() -> None:
    with pytest.raises(InvalidObjectError, match=r"metadata\.name"):
        pod_group_name({"apiVersion": "v1", "kind": "Pod", "metadata": {}})
