"""What kai-ray writes in status survives a real API server, and `kubectl get` shows it.

The unit tests hold the status bodies to the generated schemas; here the API
server itself is the judge: each body is merge-patched through the status
subresource and read back whole (nothing pruned), and the printer columns show
the written values.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import yaml
from kubernetes import client

from kai_ray.decisions.cycle import run_cycle
from kai_ray.effects.status import pod_group_status, queue_statuses
from kai_ray.state.snapshot import ClusterObjects, build_snapshot
from kai_ray.values.config import SchedulerConfig
from tests.builders import make_node, make_pod, make_pod_group, make_queue
from tests.unit.status_checks import merge_patch

from .conftest import REPO, ControlPlane
from .polling import eventually

pytestmark = pytest.mark.e2e

GROUP, VERSION = "scheduling.kai-ray.io", "v1alpha1"
NOW = "2026-12-02T10:00:00.000000Z"


@pytest.fixture(scope="module")
def crds(control_plane: ControlPlane) -> ControlPlane:
    applied = control_plane.kubectl(
        "apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds")
    )
    assert applied.returncode == 0, applied.stderr
    names = [line.split()[0] for line in applied.stdout.splitlines() if line.strip()]
    waited = control_plane.kubectl("wait", "--for=condition=Established", "--timeout=60s", *names)
    assert waited.returncode == 0, waited.stderr
    return control_plane


def _apply(plane: ControlPlane, obj: dict[str, Any]) -> None:
    result = plane.kubectl("apply", "-f", "-", input=yaml.safe_dump(obj))
    assert result.returncode == 0, result.stderr


def _statuses(team: str, namespace: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A team's Queue status and its waiting gang's PodGroup status, from one cycle
    of a cluster where the gang (4 pods of 8 GPUs) finds one node of 8 free GPUs."""
    queue = make_queue(team).gpu(quota=8).build()
    group = make_pod_group("train", namespace).queue(team).min_member(4).build()
    pods = [make_pod(f"p{i}", namespace).group("train").gpus(8).build() for i in range(4)]
    nodes = [make_node("n0").gpus(8).build()]
    snapshot = build_snapshot(ClusterObjects(nodes, pods, [group], [queue]))
    result = run_cycle(snapshot, SchedulerConfig(), 1, 1_780_000_000.0)
    key = f"{namespace}/train"
    group_status = pod_group_status(snapshot.pod_groups[key], result.plan.status_of(key), None, NOW)
    queue_status = queue_statuses(snapshot, result, {key: group_status["phase"]})[team]
    return queue_status, group_status


def test_status_bodies_are_kept_whole_and_shown_by_kubectl(
    crds: ControlPlane, namespace: str, admin_api: client.ApiClient
) -> None:
    custom = client.CustomObjectsApi(admin_api)
    team = f"team-{os.urandom(3).hex()}"
    _apply(crds, {**make_queue(team).gpu(quota=8).build()})
    group = make_pod_group("train", namespace).queue(team).min_member(4).build()
    _apply(crds, group)
    queue_status, group_status = _statuses(team, namespace)

    # What the API server answers each patch with is what it stored: a later read
    # could see what the operator of this session wrote since, from its watch.
    stored_queue = custom.patch_cluster_custom_object_status(
        GROUP, VERSION, "queues", team, {"status": queue_status}
    )
    stored_group = custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, "podgroups", "train", {"status": group_status}
    )
    assert stored_queue["status"] == merge_patch({}, queue_status)
    assert stored_group["status"] == merge_patch({}, group_status)

    groups = crds.kubectl("get", "pg", "train", "-n", namespace).stdout.splitlines()
    assert groups[0].split()[:6] == ["NAME", "QUEUE", "PHASE", "MIN", "BOUND", "RUNNING"]
    assert groups[1].split()[:6] == ["train", team, "Pending", "4", "0", "0"]

    def reason_shown() -> bool:
        """The REASON column is the stored reason (ours, or the operator's since)."""
        row = crds.kubectl("get", "pg", "train", "-n", namespace).stdout.splitlines()[1]
        stored = custom.get_namespaced_custom_object(
            GROUP, VERSION, namespace, "podgroups", "train"
        )
        return str(stored["status"]["reason"]) in row

    assert "gang of 4" in str(group_status["reason"])
    eventually(reason_shown, 30, "the stored reason shown by kubectl get pg")
    queues = crds.kubectl("get", "queues", team).stdout.splitlines()
    assert "PENDING" in queues[0]
    # Priority, quota, allocated, fair share, pending (the parent column is empty):
    # ours as patched, or the operator's own once it wrote its status over ours.
    assert str(stored_queue["status"]["fairShare"]["gpu"]) == "8"

    def queue_shown() -> bool:
        row = crds.kubectl("get", "queues", team).stdout.splitlines()[1].split()[-6:-1]
        status = custom.get_cluster_custom_object(GROUP, VERSION, "queues", team)["status"]
        shown = [
            str((status.get("allocated") or {}).get("gpu", "<none>")),
            str((status.get("fairShare") or {}).get("gpu", "<none>")),
            str(status.get("pendingWorkloads", "<none>")),
        ]
        return row[:2] == ["100", "8"] and row[2:] == shown

    eventually(queue_shown, 30, "the stored queue status shown by kubectl get queues")


def test_a_topology_keeps_its_status(crds: ControlPlane, admin_api: client.ApiClient) -> None:
    custom = client.CustomObjectsApi(admin_api)
    name = f"topo-{os.urandom(3).hex()}"
    topology = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Topology",
        "metadata": {"name": name},
        "spec": {"levels": [{"nodeLabel": "kubernetes.io/hostname"}]},
    }
    _apply(crds, topology)
    condition = {
        "type": "Valid",
        "status": "True",
        "reason": "SpecValid",
        "message": "",
        "lastTransitionTime": NOW,
    }
    # What the API server answers the patch with is what it stored (a later read
    # could see the operator's own Valid condition, written from its watch).
    stored = custom.patch_cluster_custom_object_status(
        GROUP, VERSION, "topologies", name, {"status": {"conditions": [condition]}}
    )
    assert stored["status"] == {"conditions": [condition]}
