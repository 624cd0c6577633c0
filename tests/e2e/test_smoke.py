"""Smoke tests of the e2e control plane: each part answers for real."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from .conftest import REPO, ControlPlane
from .nodes import BLOCK_LABEL, GPU, GPU_PRODUCT_LABEL, RACK_LABEL, ZONE_LABEL
from .polling import eventually

pytestmark = pytest.mark.e2e

CHARTS = Path(__file__).parent / "charts"
# no scheduler runs under this name: pods that carry it stay unbound until a
# test binds them itself
NO_SCHEDULER = "kai-ray-e2e-unscheduled"

RBAC_GROUP = "rbac.authorization.k8s.io"


def bind(core: client.CoreV1Api, namespace: str, pod: str, node: str) -> None:
    """Bind a pod to a node through the pods/binding subresource, as a scheduler does."""
    body = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": pod},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }
    # the generated client cannot deserialize the (status) answer of this call
    resp = core.create_namespaced_binding(namespace, body, _preload_content=False)
    assert resp.status == 201, resp.data


def pod_phase(core: client.CoreV1Api, namespace: str, name: str) -> str:
    return str(core.read_namespaced_pod(name, namespace).status.phase)


def test_version_is_stamped(admin_api: client.ApiClient) -> None:
    info = client.VersionApi(admin_api).get_code()
    assert info.git_version.startswith("v1.36."), info
    assert (info.major, info.minor) == ("1", "36")
    assert info.git_tree_state == "clean"


def test_fake_gpu_nodes_have_capacity_and_topology(
    core: client.CoreV1Api, gpu_nodes: Callable[..., list[str]]
) -> None:
    names = gpu_nodes(9, gpus_per_node=4, gpu_product="NVIDIA-A100-SXM4-80GB")
    nodes = [core.read_node(n) for n in names]
    for node in nodes:
        assert node.status.allocatable[GPU] == "4"
        assert node.status.capacity[GPU] == "4"
        assert node.metadata.labels[GPU_PRODUCT_LABEL] == "NVIDIA-A100-SXM4-80GB"
        ready = [c for c in node.status.conditions if c.type == "Ready"]
        assert ready and ready[0].status == "True", node.status.conditions
        # no not-ready taint: nothing keeps fake nodes from being schedulable
        assert not node.spec.taints, node.spec.taints
    racks = [n.metadata.labels[RACK_LABEL] for n in nodes]
    assert racks == ["rack-0"] * 4 + ["rack-1"] * 4 + ["rack-2"]
    blocks = [n.metadata.labels[BLOCK_LABEL] for n in nodes]
    assert blocks == ["block-0"] * 8 + ["block-1"]
    assert {n.metadata.labels[ZONE_LABEL] for n in nodes} == {"zone-0"}
    assert [n.metadata.labels["kubernetes.io/hostname"] for n in nodes] == names


def test_bound_pod_runs_on_fake_gpu_node(
    core: client.CoreV1Api, namespace: str, gpu_nodes: Callable[..., list[str]]
) -> None:
    (node,) = gpu_nodes(1)
    core.create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": "trainer"},
            "spec": {
                "schedulerName": NO_SCHEDULER,
                "containers": [
                    {
                        "name": "main",
                        "image": "example.invalid/trainer:1",
                        "resources": {"limits": {GPU: "2"}, "requests": {GPU: "2"}},
                    }
                ],
            },
        },
    )
    time.sleep(1)
    assert pod_phase(core, namespace, "trainer") == "Pending", "nothing may bind it but us"
    bind(core, namespace, "trainer", node)
    pod = eventually(
        lambda: (
            (p := core.read_namespaced_pod("trainer", namespace)).status.phase == "Running" and p
        ),
        what="the bound pod to turn Running",
    )
    assert pod.spec.node_name == node
    assert pod.status.pod_ip
    assert {c.type: c.status for c in pod.status.conditions}["Ready"] == "True"
    assert pod.status.container_statuses[0].ready


def test_job_pod_completes_and_job_succeeds(
    admin_api: client.ApiClient,
    core: client.CoreV1Api,
    namespace: str,
    gpu_nodes: Callable[..., list[str]],
) -> None:
    """The controller-manager's job controller makes the pod; kwok completes it."""
    (node,) = gpu_nodes(1)
    batch = client.BatchV1Api(admin_api)
    batch.create_namespaced_job(
        namespace,
        {
            "metadata": {"name": "once"},
            "spec": {
                "backoffLimit": 0,
                "template": {
                    "spec": {
                        "schedulerName": NO_SCHEDULER,
                        "restartPolicy": "Never",
                        "containers": [{"name": "main", "image": "example.invalid/job:1"}],
                    }
                },
            },
        },
    )
    pods = eventually(
        lambda: core.list_namespaced_pod(namespace, label_selector="job-name=once").items,
        what="the job controller to create the pod",
    )
    bind(core, namespace, pods[0].metadata.name, node)
    eventually(
        lambda: pod_phase(core, namespace, pods[0].metadata.name) == "Succeeded",
        what="kwok to complete the Job's pod",
    )
    job = eventually(
        lambda: (j := batch.read_namespaced_job("once", namespace)).status.succeeded == 1 and j,
        what="the Job to count its success",
    )
    assert any(c.type == "Complete" and c.status == "True" for c in job.status.conditions)


def _queue_crd() -> dict[str, Any]:
    for path in sorted((REPO / "crds").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if (
                doc
                and doc.get("kind") == "CustomResourceDefinition"
                and doc["spec"]["names"]["kind"] == "Queue"
            ):
                return doc
    raise AssertionError("crds/ holds no Queue CRD: run `make crds`")


def test_kai_ray_crds_install_and_cel_rejects_invalid_queue(
    control_plane: ControlPlane,
) -> None:
    crd = _queue_crd()
    applied = control_plane.kubectl("apply", "--server-side", "-f", str(REPO / "crds"))
    assert applied.returncode == 0, applied.stderr
    names = [
        f"crd/{d['metadata']['name']}"
        for p in sorted((REPO / "crds").glob("*.yaml"))
        for d in yaml.safe_load_all(p.read_text())
        if d and d.get("kind") == "CustomResourceDefinition"
    ]
    assert {"crd/queues.scheduling.kai-ray.io", "crd/podgroups.scheduling.kai-ray.io"} <= set(names)
    established = control_plane.kubectl(
        "wait", "--for=condition=Established", "--timeout=60s", *names
    )
    assert established.returncode == 0, established.stderr

    group = crd["spec"]["group"]
    version = next(v["name"] for v in crd["spec"]["versions"] if v.get("storage"))
    suffix = os.urandom(3).hex()

    def queue(name: str, quota: Any, limit: Any) -> str:
        return yaml.safe_dump(
            {
                "apiVersion": f"{group}/{version}",
                "kind": "Queue",
                "metadata": {"name": name},
                "spec": {"resources": {"gpu": {"quota": quota, "limit": limit}}},
            }
        )

    good = f"e2e-good-{suffix}"
    ok = control_plane.kubectl("apply", "-f", "-", input=queue(good, 4, 8))
    assert ok.returncode == 0, ok.stderr
    bad = f"e2e-bad-{suffix}"
    refused = control_plane.kubectl("apply", "-f", "-", input=queue(bad, 16, 8))
    assert refused.returncode != 0, refused.stdout
    assert "spec.resources[gpu]" in refused.stderr, refused.stderr
    assert "quota must not be above limit" in refused.stderr, refused.stderr
    # the CEL rule compares quantities, not strings
    units = control_plane.kubectl("apply", "-f", "-", input=queue(bad, "500m", "1"))
    assert units.returncode == 0, units.stderr
    assert control_plane.kubectl("get", "queue", bad).returncode == 0
    control_plane.kubectl("delete", "queue", good, bad, "--wait=false")


def test_raycluster_makes_kuberay_create_pods(
    admin_api: client.ApiClient,
    core: client.CoreV1Api,
    control_plane: ControlPlane,
    namespace: str,
    gpu_nodes: Callable[..., list[str]],
) -> None:
    if not control_plane.kuberay:
        pytest.skip("the KubeRay operator was not built (see e2e/build.sh output)")
    custom = client.CustomObjectsApi(admin_api)
    container = {"name": "ray", "image": "example.invalid/ray:2.40.0"}
    custom.create_namespaced_custom_object(
        "ray.io",
        "v1",
        namespace,
        "rayclusters",
        {
            "apiVersion": "ray.io/v1",
            "kind": "RayCluster",
            "metadata": {"name": "rc"},
            "spec": {
                "rayVersion": "2.40.0",
                "headGroupSpec": {
                    "rayStartParams": {},
                    "template": {"spec": {"containers": [dict(container)]}},
                },
                "workerGroupSpecs": [
                    {
                        "groupName": "gpu",
                        "replicas": 2,
                        "minReplicas": 0,
                        "maxReplicas": 4,
                        "rayStartParams": {},
                        "template": {
                            "spec": {
                                "containers": [{**container, "resources": {"limits": {GPU: "1"}}}]
                            }
                        },
                    }
                ],
            },
        },
    )

    def ray_pods() -> list[client.V1Pod]:
        pods = core.list_namespaced_pod(namespace, label_selector="ray.io/cluster=rc").items
        return pods if len(pods) == 3 else []

    pods = eventually(ray_pods, what="KubeRay to create 1 head and 2 worker pods")
    kinds = sorted(p.metadata.labels["ray.io/node-type"] for p in pods)
    assert kinds == ["head", "worker", "worker"]
    for p in pods:
        owner = p.metadata.owner_references[0]
        assert (owner.kind, owner.name) == ("RayCluster", "rc")
    workers = [p for p in pods if p.metadata.labels["ray.io/node-type"] == "worker"]
    assert all(p.spec.containers[0].resources.limits[GPU] == "1" for p in workers)
    assert core.read_namespaced_service("rc-head-svc", namespace).spec.ports

    # bound by hand (no scheduler runs), the pods turn Running under kwok
    nodes = gpu_nodes(3)
    for p, n in zip(pods, nodes, strict=True):
        bind(core, namespace, p.metadata.name, n)
    for p in pods:
        eventually(
            lambda name=p.metadata.name: pod_phase(core, namespace, name) == "Running",
            what=f"{p.metadata.name} to run",
        )


def test_plain_user_is_refused_by_rbac(
    admin_api: client.ApiClient, user_api: client.ApiClient, namespace: str
) -> None:
    user_core = client.CoreV1Api(user_api)
    with pytest.raises(ApiException) as denied:
        user_core.list_namespaced_pod(namespace)
    assert denied.value.status == 403
    message = json.loads(denied.value.body)["message"]
    assert 'User "e2e-user" cannot list resource "pods"' in message, message

    rbac = client.RbacAuthorizationV1Api(admin_api)
    rbac.create_namespaced_role(
        namespace,
        {
            "metadata": {"name": "pod-reader"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}],
        },
    )
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "e2e-user-reads-pods"},
            "roleRef": {"apiGroup": RBAC_GROUP, "kind": "Role", "name": "pod-reader"},
            "subjects": [{"apiGroup": RBAC_GROUP, "kind": "User", "name": "e2e-user"}],
        },
    )

    # RBAC changes reach the authorizer through its informer: until then the
    # user is still refused, which is the one error this wait tolerates
    def may_list() -> bool:
        try:
            return user_core.list_namespaced_pod(namespace).items == []
        except ApiException as refused:
            if refused.status != 403:
                raise
            return False

    eventually(may_list, timeout=30, what="the RoleBinding to take effect")
    with pytest.raises(ApiException) as still_denied:
        user_core.create_namespaced_pod(
            namespace,
            {"metadata": {"name": "x"}, "spec": {"containers": [{"name": "c", "image": "i"}]}},
        )
    assert still_denied.value.status == 403
    with pytest.raises(ApiException) as cluster_wide:
        user_core.list_node()
    assert cluster_wide.value.status == 403


def test_helm_renders_and_installs_local_chart(
    control_plane: ControlPlane, core: client.CoreV1Api, namespace: str, tmp_path: Path
) -> None:
    if control_plane.helm is None:
        pytest.skip("helm was not built (see e2e/build.sh output)")
    env = {
        **os.environ,
        "KUBECONFIG": str(control_plane.kubeconfig),
        "HELM_CACHE_HOME": str(tmp_path / "cache"),
        "HELM_CONFIG_HOME": str(tmp_path / "config"),
        "HELM_DATA_HOME": str(tmp_path / "data"),
    }
    chart = str(CHARTS / "smoke")

    def helm(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(control_plane.helm), *args], env=env, capture_output=True, text=True, timeout=120
        )

    rendered = helm("template", "demo", chart, "--namespace", namespace, "--set", "greeting=hi")
    assert rendered.returncode == 0, rendered.stderr
    docs = [d for d in yaml.safe_load_all(rendered.stdout) if d]
    assert [(d["kind"], d["metadata"]["name"]) for d in docs] == [("ConfigMap", "demo-smoke")]
    assert docs[0]["data"]["greeting"] == "hi"

    installed = helm(
        "install", "demo", chart, "--namespace", namespace, "--set", "greeting=hello", "--wait"
    )
    assert installed.returncode == 0, installed.stderr
    cm = core.read_namespaced_config_map("demo-smoke", namespace)
    assert cm.data["greeting"] == "hello"
    # the chart's kubeVersion constraint was checked against the stamped server version
    assert cm.data["kubeVersion"].startswith("v1.36.")
    status = helm("status", "demo", "--namespace", namespace, "-o", "json")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["info"]["status"] == "deployed"
    uninstalled = helm("uninstall", "demo", "--namespace", namespace, "--wait")
    assert uninstalled.returncode == 0, uninstalled.stderr
    with pytest.raises(ApiException) as gone:
        core.read_namespaced_config_map("demo-smoke", namespace)
    assert gone.value.status == 404
