"""The user flow of the operator (issue 10, steps 2-8) on the real control plane.

Queues applied with kubectl, kwok GPU nodes in zones, blocks and racks, the real
KubeRay operator turning RayJobs and RayClusters into pods, the Job controller
making a Job's pods; kai-ray groups, admits and binds them, reports on
PodGroups, Queues and Events, reclaims for an under-served team and releases
what a deleted workload held. The first tests need no kai-ray operator: they
pin what the cluster around it does.

Each test has its own namespace, node pool and queue names (tests/e2e/sandbox.py).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from kai_ray.values.names import (
    ADMITTED_NODES_ANNOTATION,
    GPU_DEVICES_ANNOTATION,
    QUEUE_LABEL,
    SCHEDULER_NAME,
)
from tests.builders import make_pod_group, make_queue

from .nodes import RACK_LABEL, ZONE_LABEL
from .operator_process import OperatorProcess
from .polling import eventually, holds
from .sandbox import Sandbox, bound, headers, kubectl_table, quantity
from .workloads import (
    IMAGE,
    KAI_QUEUE_LABEL,
    QueueTree,
    Workers,
    in_one,
    job,
    pod,
    ray_cluster,
    ray_job,
    topology,
)

pytestmark = pytest.mark.e2e

#: No scheduler runs under this name, and kai-ray leaves it alone.
NO_SCHEDULER = "kai-ray-e2e-unscheduled"
#: Long enough for several cycles (500 ms each in the e2e configuration).
CYCLES_S = 2.5


@pytest.fixture
def teams(sandbox: Sandbox) -> QueueTree:
    return QueueTree(sandbox.name("dept"), sandbox.name("team-a"), sandbox.name("team-b"))


def cluster_label(name: str) -> str:
    return f"ray.io/cluster={name}"


def ray_cluster_of(sandbox: Sandbox, rayjob: str) -> dict[str, Any]:
    """The RayCluster KubeRay made for a RayJob (named `<rayjob>-<suffix>`)."""

    def made() -> dict[str, Any] | None:
        for cluster in sandbox.list("RayCluster"):
            owners = cluster["metadata"].get("ownerReferences") or []
            if any(o["kind"] == "RayJob" and o["name"] == rayjob for o in owners):
                return cluster
        return None

    return eventually(made, 30, f"KubeRay to create the RayCluster of RayJob {rayjob}")


def owner_of(obj: dict[str, Any]) -> tuple[str, str, str]:
    (owner,) = obj["metadata"]["ownerReferences"]
    return owner["kind"], owner["name"], owner["uid"]


def phase(sandbox: Sandbox, group: str, wanted: str) -> dict[str, Any]:
    def reached() -> dict[str, Any] | None:
        body = sandbox.get("PodGroup", group)
        return body if body and (body.get("status") or {}).get("phase") == wanted else None

    return eventually(reached, 30, f"PodGroup {group} to be {wanted}")


def allocated_gpus(sandbox: Sandbox, queue: str) -> Any:
    return quantity(
        ((sandbox.get("Queue", queue) or {}).get("status") or {}).get("allocated", {}).get("gpu")
    )


def scheduled_on(sandbox: Sandbox, pod_name: str) -> list[str]:
    return [e.message or "" for e in sandbox.events(pod_name, "Scheduled")]


# ------------------------------------------------ the cluster around kai-ray


def test_a_queue_tree_applies_and_kubectl_lists_it(sandbox: Sandbox, teams: QueueTree) -> None:
    out = sandbox.kubectl_apply(*teams.manifests())
    for name in (teams.department, teams.team_a, teams.team_b):
        assert f"queue.scheduling.kai-ray.io/{name} created" in out, out
    listed = sandbox.plane.kubectl("get", "queues", teams.department, teams.team_a, teams.team_b)
    assert listed.returncode == 0, listed.stderr
    rows = {row["NAME"]: row for row in kubectl_table(listed.stdout)}
    assert rows[teams.department]["PARENT"] == ""
    assert rows[teams.team_a]["PARENT"] == rows[teams.team_b]["PARENT"] == teams.department
    assert rows[teams.department]["GPU QUOTA"] == "8"
    assert rows[teams.team_a]["GPU QUOTA"] == "4"


def test_kwok_gpu_nodes_carry_zone_block_rack_and_a_topology_names_the_levels(
    sandbox: Sandbox,
) -> None:
    names = sandbox.make_nodes(4, gpus_per_node=4, nodes_per_rack=2, racks_per_block=1)
    labels = [sandbox.core.read_node(n).metadata.labels for n in names]
    assert [lb[RACK_LABEL] for lb in labels] == ["rack-0", "rack-0", "rack-1", "rack-1"]
    assert [lb["kai-ray.io/block"] for lb in labels] == ["block-0", "block-0", "block-1", "block-1"]
    assert {lb[ZONE_LABEL] for lb in labels} == {f"zone-{sandbox.tag}-0"}
    name = sandbox.name("dc")
    sandbox.kubectl_apply(topology(name))
    listed = sandbox.plane.kubectl("get", "topologies", name)
    assert listed.returncode == 0, listed.stderr
    (row,) = kubectl_table(listed.stdout)
    # the printer column of a list field shows its first item only (server-side tables)
    assert row["LEVELS"].split(",")[0] == ZONE_LABEL
    levels = (sandbox.get("Topology", name) or {})["spec"]["levels"]
    assert [level["alias"] for level in levels] == ["zone", "block", "rack", "host"]


def test_kuberay_turns_a_rayjob_into_a_raycluster_and_pods(sandbox: Sandbox) -> None:
    """What kai-ray relies on, with pods no scheduler takes:

    - a RayJob's RayCluster is named `<rayjob>-<suffix>`, owned (controller) by the
      RayJob, and carries the RayJob's labels (the queue label too) and annotations,
      plus `ray.io/originated-from-crd: RayJob` and `ray.io/originated-from-cr-name`;
    - its pods carry `ray.io/cluster`, `ray.io/group` (`headgroup` for the head) and
      `ray.io/node-type`, but not the queue label; they are owned by the RayCluster;
    - once the head runs, the RayJob (K8sJobMode) adds a submitter: a batch Job named
      like the RayJob, owned by it, whose pod is the default scheduler's;
    - a suspended RayJob (which KubeRay allows only with shutdownAfterJobFinishes)
      or RayCluster makes no pods, and makes them once released;
    - suspending a RayJob without shutdownAfterJobFinishes fails its validation.
    """
    if not sandbox.plane.kuberay:
        pytest.skip("the KubeRay operator was not built (see e2e/build.sh output)")
    selector = sandbox.node_selector
    gpu = [Workers("gpu", 2, gpus=1)]
    annotations = {"kai-ray.io/topology": "any"}
    sandbox.create(
        ray_job("rj", "team-a", gpu, selector, annotations=annotations, scheduler=NO_SCHEDULER)
    )
    held = dict(suspend=True, shutdownAfterJobFinishes=True)
    sandbox.create(ray_job("held", "team-a", gpu, selector, scheduler=NO_SCHEDULER, **held))
    sandbox.create(
        ray_job("refused", "team-a", gpu, selector, scheduler=NO_SCHEDULER, suspend=True)
    )
    held_cluster = ray_cluster("held-rc", "team-a", gpu, selector, scheduler=NO_SCHEDULER)
    held_cluster["spec"]["suspend"] = True
    sandbox.create(held_cluster)

    cluster = ray_cluster_of(sandbox, "rj")
    name = cluster["metadata"]["name"]
    assert name.startswith("rj-")
    assert owner_of(cluster)[:2] == ("RayJob", "rj")
    assert cluster["metadata"]["ownerReferences"][0]["controller"] is True
    labels = cluster["metadata"]["labels"]
    assert labels[QUEUE_LABEL] == "team-a"
    assert labels["ray.io/originated-from-crd"] == "RayJob"
    assert labels["ray.io/originated-from-cr-name"] == "rj"
    assert cluster["metadata"]["annotations"]["kai-ray.io/topology"] == "any"

    pods = sandbox.wait_pods(cluster_label(name), 3)
    groups = Counter(p.metadata.labels["ray.io/group"] for p in pods)
    assert groups == {"headgroup": 1, "gpu": 2}
    for p in pods:
        assert QUEUE_LABEL not in p.metadata.labels
        assert p.metadata.labels["ray.io/node-type"] in ("head", "worker")
        assert (p.metadata.owner_references[0].kind, p.metadata.owner_references[0].name) == (
            "RayCluster",
            name,
        )
        assert p.spec.scheduler_name == NO_SCHEDULER
        assert p.spec.node_selector == selector

    def deployment(rayjob: str) -> str:
        return str(
            ((sandbox.get("RayJob", rayjob) or {}).get("status") or {}).get("jobDeploymentStatus")
        )

    eventually(lambda: deployment("held") == "Suspended", 20, "the held RayJob to be Suspended")
    eventually(lambda: deployment("refused") == "ValidationFailed", 20, "ValidationFailed")
    clusters = [c["metadata"]["name"] for c in sandbox.list("RayCluster")]
    assert sorted(clusters) == sorted([name, "held-rc"])
    assert sandbox.pods(cluster_label("held-rc")) == []

    for plural, held_name in (("rayjobs", "held"), ("rayclusters", "held-rc")):
        sandbox.custom.patch_namespaced_custom_object(
            "ray.io", "v1", sandbox.namespace, plural, held_name, {"spec": {"suspend": False}}
        )
    released = ray_cluster_of(sandbox, "held")
    sandbox.wait_pods(cluster_label(released["metadata"]["name"]), 3)
    sandbox.wait_pods(cluster_label("held-rc"), 3)

    (node,) = sandbox.make_nodes(1, gpus_per_node=4)
    for p in pods:  # bound by hand: no scheduler takes these pods
        binding = {"metadata": {"name": p.metadata.name}, "target": {"kind": "Node", "name": node}}
        sandbox.core.create_namespaced_binding(sandbox.namespace, binding, _preload_content=False)
    (submitter,) = sandbox.wait_pods("job-name=rj", 1)
    assert submitter.spec.scheduler_name == "default-scheduler"
    submitter_job = sandbox.batch.read_namespaced_job("rj", sandbox.namespace)
    owner = submitter_job.metadata.owner_references[0]
    assert (owner.kind, owner.name) == ("RayJob", "rj")


# ------------------------------------------------------------ kai-ray at work


def test_rayjobs_of_both_queue_labels_are_bound_as_gangs_one_inside_a_rack(
    operator: OperatorProcess, sandbox: Sandbox, teams: QueueTree
) -> None:
    sandbox.kubectl_apply(*teams.manifests())
    sandbox.make_nodes(4, gpus_per_node=4, nodes_per_rack=2, racks_per_block=1)
    dc = sandbox.name("dc")
    sandbox.kubectl_apply(topology(dc))
    selector = sandbox.node_selector
    racked = ray_job(
        "racked",
        teams.team_a,
        [Workers("gpu", 3, gpus=2)],
        selector,
        annotations=in_one("rack", dc),
    )
    # Its submitter is kai-ray's too: KubeRay labels the submitter Job with nothing of
    # the RayJob's, so the Job is read with its RayJob's queue.
    submitter = {
        "spec": {
            "schedulerName": SCHEDULER_NAME,
            "nodeSelector": dict(selector),
            "restartPolicy": "Never",
            "containers": [{"name": "submit", "image": IMAGE}],
        }
    }
    kai = ray_job(
        "kai",
        teams.team_b,
        [Workers("gpu", 2, gpus=1)],
        selector,
        queue_label=KAI_QUEUE_LABEL,
        submitterPodTemplate=submitter,
    )
    uids = {
        name: sandbox.create(obj)["metadata"]["uid"]
        for name, obj in (("racked", racked), ("kai", kai))
    }

    for name, queue, size in (("racked", teams.team_a, 4), ("kai", teams.team_b, 3)):
        group = sandbox.wait_get("PodGroup", f"rayjob-{name}")
        assert owner_of(group) == ("RayJob", name, uids[name])
        assert group["spec"]["queue"] == queue
        assert group["spec"]["minMember"] == size
        cluster = ray_cluster_of(sandbox, name)["metadata"]["name"]
        pods = sandbox.wait_pods(cluster_label(cluster), size, bound=True)
        for p in pods:
            eventually(lambda p=p: sandbox.pod(p.metadata.name).status.phase == "Running", 30)
            assert any(p.spec.node_name in m for m in scheduled_on(sandbox, p.metadata.name))
        status = phase(sandbox, f"rayjob-{name}", "Running")["status"]
        assert (status["bound"], status["running"]) == (size, size)
        if name == "racked":
            racks = {
                sandbox.core.read_node(p.spec.node_name).metadata.labels[RACK_LABEL] for p in pods
            }
            assert len(racks) == 1, f"a gang required inside one rack spans {racks}"
        deployment = (
            (sandbox.get("RayJob", name) or {}).get("status", {}).get("jobDeploymentStatus")
        )
        assert deployment != "ValidationFailed", sandbox.get("RayJob", name)
    submitter_group = sandbox.wait_get("PodGroup", "job-kai")
    assert submitter_group["spec"]["queue"] == teams.team_b, submitter_group
    sandbox.wait_pods("job-name=kai", 1, bound=True)


def test_a_raycluster_with_two_worker_groups_is_one_gang_with_a_subgroup_per_group(
    operator: OperatorProcess, sandbox: Sandbox, teams: QueueTree
) -> None:
    sandbox.kubectl_apply(*teams.manifests())
    nodes = sandbox.make_nodes(2, gpus_per_node=4)
    workers = [Workers("cpu", 2, min_replicas=1), Workers("gpu", 2, gpus=2)]
    uid = sandbox.create(ray_cluster("mixed", teams.team_a, workers, sandbox.node_selector))[
        "metadata"
    ]["uid"]
    group = sandbox.wait_get("PodGroup", "raycluster-mixed")
    assert owner_of(group) == ("RayCluster", "mixed", uid)
    assert group["spec"]["minMember"] == 1 + 1 + 2
    subgroups = {s["name"]: s["minMember"] for s in group["spec"].get("subGroups") or []}
    assert subgroups == {"headgroup": 1, "cpu": 1, "gpu": 2}
    # the elastic second cpu worker has room too
    sandbox.wait_pods(cluster_label("mixed"), 5, bound=True)
    phase(sandbox, "raycluster-mixed", "Running")
    # created suspended, released with where its gang was placed (room held until its
    # pods exist)
    annotations = (sandbox.get("RayCluster", "mixed") or {})["metadata"].get("annotations") or {}
    admitted = annotations.get(ADMITTED_NODES_ANNOTATION, "").split(",")
    assert len(admitted) == 5 and set(admitted) <= set(nodes), annotations


def test_a_job_with_parallelism_4_is_bound_as_one_gang_and_succeeds(
    operator: OperatorProcess, sandbox: Sandbox, teams: QueueTree
) -> None:
    sandbox.kubectl_apply(*teams.manifests())
    sandbox.make_nodes(2, gpus_per_node=2)
    created = sandbox.create(
        job("train", teams.team_a, sandbox.node_selector, parallelism=4, gpus=1, min_member=4)
    )
    group = sandbox.wait_get("PodGroup", "job-train")
    assert owner_of(group) == ("Job", "train", created["metadata"]["uid"])
    assert group["spec"]["minMember"] == 4
    pods = sandbox.wait_pods("job-name=train", 4, bound=True)
    assert Counter(p.spec.node_name for p in pods) == {n: 2 for n in sandbox.nodes}
    # kwok completes a Job's running pods at once
    eventually(
        lambda: (
            (sandbox.batch.read_namespaced_job("train", sandbox.namespace).status.succeeded or 0)
            == 4
        ),
        30,
    )
    phase(sandbox, "job-train", "Succeeded")


def test_plain_pods_join_the_podgroup_they_name_and_a_bare_pod_is_a_gang_of_one(
    operator: OperatorProcess, sandbox: Sandbox, teams: QueueTree
) -> None:
    sandbox.kubectl_apply(*teams.manifests())
    sandbox.make_nodes(1, gpus_per_node=4)
    selector = sandbox.node_selector
    sandbox.create(make_pod_group("pair").queue(teams.team_a).min_member(2).build())
    sandbox.create(pod("first", None, selector, gpus=1, group="pair"))
    holds(lambda: not sandbox.pod("first").spec.node_name, CYCLES_S, "half a gang stays unbound")
    sandbox.create(pod("second", None, selector, gpus=1, group="pair"))
    sandbox.wait_pods(None, 2, bound=True)
    explicit = sandbox.get("PodGroup", "pair")
    assert explicit is not None
    assert explicit["spec"]["minMember"] == 2, "an explicit PodGroup is never overwritten"
    assert not explicit["metadata"].get("ownerReferences")

    solo = sandbox.create(pod("solo", teams.team_b, selector, gpus=1))
    group = sandbox.wait_get("PodGroup", "pod-solo")
    assert owner_of(group) == ("Pod", "solo", solo["metadata"]["uid"])
    assert group["spec"]["queue"] == teams.team_b
    eventually(lambda: sandbox.pod("solo").spec.node_name, 30, "the bare pod to be bound")


GROVE_GATE = "grove.io/podgang-pending-creation"


def grove_pod(sandbox: Sandbox, gang: str, clique: str, index: int) -> dict[str, Any]:
    """A pod as Grove's PodClique controller makes it: labelled with its PodGang and
    PodClique, held by Grove's gate until every pod of the gang exists."""
    made = pod(f"{clique}-{index}", None, sandbox.node_selector, gpus=1)
    made["metadata"]["labels"] = {"grove.io/podgang": gang, "grove.io/podclique": clique}
    made["spec"]["schedulingGates"] = [{"name": GROVE_GATE}]
    return made


def lift_grove_gate(sandbox: Sandbox, name: str) -> None:
    """What Grove does once its gang is complete: its own gate goes, others stay."""
    gates = sandbox.pod(name).spec.scheduling_gates or []
    kept = [{"name": g.name} for g in gates if g.name != GROVE_GATE]
    # a JSON patch: a strategic merge would merge the list by name and keep the gate
    replace = [{"op": "replace", "path": "/spec/schedulingGates", "value": kept}]
    sandbox.core.patch_namespaced_pod(name, sandbox.namespace, replace)


def test_a_grove_podgang_is_one_gang_bound_whole_once_groves_gate_is_gone(
    operator: OperatorProcess, sandbox: Sandbox, teams: QueueTree
) -> None:
    """Grove makes a PodGang and its pods, gated until all exist; kai-ray reads the
    PodGang as the gang (its queue label, each podgroup's minReplicas) and binds
    nothing of it before every pod of its minimum may be bound."""
    sandbox.kubectl_apply(*teams.manifests())
    sandbox.make_nodes(1, gpus_per_node=4)
    gang, clique = sandbox.name("serve-0"), sandbox.name("serve-0-decode")
    names = [f"{clique}-{i}" for i in range(3)]
    references = [{"namespace": sandbox.namespace, "name": n} for n in names]
    sandbox.create(
        {
            "apiVersion": "scheduler.grove.io/v1alpha1",
            "kind": "PodGang",
            "metadata": {"name": gang, "labels": {QUEUE_LABEL: teams.team_a}},
            "spec": {
                "podgroups": [{"name": clique, "minReplicas": 3, "podReferences": references}]
            },
        }
    )
    for i in range(3):
        sandbox.create(grove_pod(sandbox, gang, clique, i))
    group = sandbox.wait_get("PodGroup", f"podgang-{gang}")
    assert group["spec"]["queue"] == teams.team_a and group["spec"]["minMember"] == 3
    assert [s["name"] for s in group["spec"].get("subGroups") or []] == [clique]
    holds(lambda: not any(p.spec.node_name for p in sandbox.pods()), CYCLES_S, "Grove's gate")
    for name in names[:2]:
        lift_grove_gate(sandbox, name)
    holds(lambda: not any(p.spec.node_name for p in sandbox.pods()), CYCLES_S, "a gang of 3")
    lift_grove_gate(sandbox, names[2])
    sandbox.wait_pods(None, 3, bound=True, timeout=30)
    phase(sandbox, f"podgang-{gang}", "Running")


def test_gpu_fractions_share_one_device_named_on_each_pod(
    operator: OperatorProcess, sandbox: Sandbox, teams: QueueTree
) -> None:
    sandbox.kubectl_apply(*teams.manifests())
    (node,) = sandbox.make_nodes(1, gpus_per_node=2)
    for name in ("half-1", "half-2"):
        sandbox.create(pod(name, teams.team_a, sandbox.node_selector, fraction="0.5"))
    pods = sandbox.wait_pods(None, 2, bound=True)
    assert {p.spec.node_name for p in pods} == {node}
    devices = {(p.metadata.annotations or {}).get(GPU_DEVICES_ANNOTATION) for p in pods}
    assert len(devices) == 1 and None not in devices, devices


def test_kubectl_shows_podgroups_queues_and_events(
    operator: OperatorProcess, sandbox: Sandbox, teams: QueueTree
) -> None:
    sandbox.kubectl_apply(*teams.manifests(dept_quota=16, dept_limit=None))
    sandbox.make_nodes(2, gpus_per_node=4, nodes_per_rack=1)
    dc = sandbox.name("dc")
    sandbox.kubectl_apply(topology(dc))
    selector = sandbox.node_selector
    sandbox.create(ray_cluster("fits", teams.team_a, [Workers("gpu", 1, gpus=2)], selector))
    wide = ray_cluster(
        "too-wide",
        teams.team_b,
        [Workers("gpu", 2, gpus=4)],
        selector,
        annotations=in_one("rack", dc),
    )
    sandbox.create(wide)
    phase(sandbox, "raycluster-fits", "Running")
    eventually(
        lambda: ((sandbox.get("PodGroup", "raycluster-too-wide") or {}).get("status") or {}).get(
            "reason"
        ),
        30,
        "a reason on the gang that cannot fit",
    )

    groups = sandbox.plane.kubectl("get", "podgroups", "-A")
    assert groups.returncode == 0, groups.stderr
    assert headers(groups.stdout) == [
        "NAMESPACE",
        "NAME",
        "QUEUE",
        "PHASE",
        "MIN",
        "BOUND",
        "RUNNING",
        "REASON",
        "AGE",
    ]
    rows = {
        r["NAME"]: r for r in kubectl_table(groups.stdout) if r["NAMESPACE"] == sandbox.namespace
    }
    fits = rows["raycluster-fits"]
    assert (fits["QUEUE"], fits["PHASE"], fits["MIN"], fits["BOUND"], fits["RUNNING"]) == (
        teams.team_a,
        "Running",
        "2",
        "2",
        "2",
    )
    wide_row = rows["raycluster-too-wide"]
    assert (wide_row["PHASE"], wide_row["BOUND"]) == ("Pending", "0")
    assert "rack" in wide_row["REASON"], wide_row

    def queue_rows() -> dict[str, dict[str, str]] | None:
        listed = sandbox.plane.kubectl("get", "queues", teams.team_a, teams.team_b)
        found = {r["NAME"]: r for r in kubectl_table(listed.stdout)}
        ready = found.get(teams.team_a, {}).get("GPU ALLOCATED") == "2"
        return found if ready and found[teams.team_b].get("PENDING") == "1" else None

    queues = eventually(queue_rows, 15, "queue status: team-a allocated 2, team-b pending 1")
    assert queues[teams.team_a]["GPU FAIR SHARE"], queues
    assert queues[teams.team_a]["GPU QUOTA"] == "4"

    worker = next(
        p
        for p in sandbox.pods(cluster_label("fits"))
        if p.metadata.labels["ray.io/node-type"] == "worker"
    )
    described = sandbox.plane.kubectl(
        "describe", "pod", "-n", sandbox.namespace, worker.metadata.name
    ).stdout
    events = described.partition("\nEvents:")[2]  # what `kubectl describe` lists as Events
    assert "Scheduled" in events and worker.spec.node_name in events, described
    described = sandbox.plane.kubectl(
        "describe", "podgroup", "-n", sandbox.namespace, "raycluster-too-wide"
    ).stdout
    events = described.partition("\nEvents:")[2]
    assert "Unschedulable" in events and "rack" in events, described


def test_when_full_a_team_below_its_share_reclaims_a_whole_gang(
    operator: OperatorProcess, sandbox: Sandbox, teams: QueueTree
) -> None:
    """team-a fills the department's 8 GPUs (its quota is 4); team-b's gang of 4 GPUs
    arrives: one of team-a's gangs is evicted whole through the Eviction API, KubeRay
    recreates its pods, they wait, and team-b's gang binds."""
    sandbox.kubectl_apply(*teams.manifests(dept_quota=8, dept_limit=8, team_quota=4))
    sandbox.make_nodes(2, gpus_per_node=4)
    selector = sandbox.node_selector
    gang = [Workers("gpu", 2, gpus=2)]
    for name in ("a1", "a2"):
        sandbox.create(ray_cluster(name, teams.team_a, gang, selector))
    before = {name: sandbox.wait_pods(cluster_label(name), 3, bound=True) for name in ("a1", "a2")}
    eventually(lambda: allocated_gpus(sandbox, teams.team_a) == 8, 15, "team-a to hold 8 GPUs")

    with sandbox.pod_history() as history:
        sandbox.create(ray_cluster("b1", teams.team_b, gang, selector))
        sandbox.wait_pods(cluster_label("b1"), 3, bound=True, timeout=30)

    evicted = {n for n, pods in before.items() if any(_gone(sandbox, p) for p in pods)}
    assert len(evicted) == 1, f"exactly one of team-a's gangs is the victim, not {evicted}"
    (victim,) = evicted
    (spared,) = {"a1", "a2"} - evicted
    assert not any(_gone(sandbox, p) for p in before[spared]), "the other gang is untouched"
    for victim_pod in before[victim]:
        assert _gone(sandbox, victim_pod), "victims are whole gangs"
        reasons = _disruption_reasons(history, victim_pod.metadata.uid)
        assert "EvictionByEvictionAPI" in reasons, (
            f"not evicted through the Eviction API: {reasons}"
        )
        assert any("reclaim" in r.lower() for r in reasons if r != "EvictionByEvictionAPI"), reasons
    messages = [e.message or "" for e in sandbox.events(reason="Evicted")]
    assert any(teams.team_b in m for m in messages), (
        f"no Evicted event names {teams.team_b}: {messages}"
    )

    recreated = sandbox.wait_pods(cluster_label(victim), 3)
    holds(
        lambda: not bound(sandbox.pods(cluster_label(victim))),
        CYCLES_S,
        "the victim's new pods wait",
    )
    assert {p.metadata.uid for p in recreated}.isdisjoint(p.metadata.uid for p in before[victim])
    eventually(lambda: allocated_gpus(sandbox, teams.team_b) == 4, 15, "team-b to hold 4 GPUs")
    assert allocated_gpus(sandbox, teams.team_a) == 4
    assert all(held <= 4 for held in sandbox.node_gpus().values()), sandbox.node_gpus()


def _gone(sandbox: Sandbox, pod_then: client.V1Pod) -> bool:
    try:
        now = sandbox.pod(pod_then.metadata.name)
    except ApiException as err:
        return err.status == 404
    return now.metadata.uid != pod_then.metadata.uid or now.metadata.deletion_timestamp is not None


def _disruption_reasons(history: list[tuple[str, client.V1Pod]], uid: str) -> list[str]:
    """Every DisruptionTarget reason and message a pod showed, in order."""
    seen = []
    for _, p in history:
        if p.metadata.uid != uid:
            continue
        for c in p.status.conditions or []:
            if c.type == "DisruptionTarget" and f"{c.reason} {c.message}" not in seen:
                seen.append(f"{c.reason} {c.message}")
    return [
        s if not s.startswith("EvictionByEvictionAPI") else "EvictionByEvictionAPI" for s in seen
    ]


def test_deleting_a_workload_releases_its_gpus_within_a_cycle(
    operator: OperatorProcess, sandbox: Sandbox, teams: QueueTree
) -> None:
    sandbox.kubectl_apply(*teams.manifests())
    sandbox.make_nodes(1, gpus_per_node=4)
    sandbox.create(
        ray_cluster("done", teams.team_a, [Workers("gpu", 2, gpus=2)], sandbox.node_selector)
    )
    sandbox.wait_pods(cluster_label("done"), 3, bound=True)
    eventually(lambda: allocated_gpus(sandbox, teams.team_a) == 4, 15, "team-a to hold 4 GPUs")

    sandbox.delete("RayCluster", "done")
    sandbox.wait_pods(cluster_label("done"), 0, timeout=60)
    eventually(
        lambda: allocated_gpus(sandbox, teams.team_a) == 0, 2 * 0.5 + 1, "allocation to drop"
    )
    eventually(lambda: sandbox.get("PodGroup", "raycluster-done") is None, 30, "the PodGroup to go")
    assert sandbox.node_gpus() == dict.fromkeys(sandbox.nodes, 0)


def test_over_committed_quotas_warn_on_the_queues_and_a_queue_within_its_quota_keeps_it(
    operator: OperatorProcess, sandbox: Sandbox
) -> None:
    """Two top-level queues whose quotas add up to more than the cluster has (the
    webhook refuses that below the top, where a parent's quota bounds its
    children): each carries a QuotaOverCommitted warning that says so, and each
    quota is still guaranteed: team-a, holding less than its quota, is not reclaimed
    from when team-b asks for 2 GPUs on a full pool; team-b waits."""
    huge = 1_000_000
    team_a, team_b = sandbox.name("over-a"), sandbox.name("over-b")
    sandbox.kubectl_apply(
        *(make_queue(name).gpu(quota=huge, limit=None).build() for name in (team_a, team_b))
    )
    sandbox.make_nodes(1, gpus_per_node=4)
    selector = sandbox.node_selector

    def warned(queue: str) -> dict[str, Any] | None:
        status = (sandbox.get("Queue", queue) or {}).get("status") or {}
        found = [c for c in status.get("conditions") or [] if c["type"] == "QuotaOverCommitted"]
        return found[0] if found and found[0]["status"] == "True" else None

    for queue in (team_a, team_b):
        condition = eventually(lambda q=queue: warned(q), 30, f"{queue}'s QuotaOverCommitted")
        assert "the quotas of the top-level queues add up to" in condition["message"], condition
        assert "the cluster has" in condition["message"], condition

    # bare pods: they run until deleted (kwok completes a Job's pods at once)
    for i in range(4):
        sandbox.create(pod(f"full-{i}", team_a, selector, gpus=1))
    held = sandbox.wait_pods(None, 4, bound=True)
    sandbox.create(pod("wants", team_b, selector, gpus=2))
    sandbox.wait_get("PodGroup", "pod-wants")
    holds(
        lambda: (
            not sandbox.pod("wants").spec.node_name and not any(_gone(sandbox, p) for p in held)
        ),
        2 * CYCLES_S,
        "team-a keeps what is within its quota; team-b waits",
    )
