"""The Helm chart on the real control plane: install, least-privilege RBAC, the
operator scheduling as the chart's ServiceAccount, upgrade and uninstall.

The e2e API server reaches no pod and no Service (there is no pod network), so
the chart's Deployment never runs here: its pods stay Pending. The operator
runs from the checkout instead, as the chart's ServiceAccount (a token from the
TokenRequest API), with the chart's SchedulerConfig, Lease and webhook
configuration; only its webhook is reached by URL on 127.0.0.1 rather than
through the chart's Service. Each release schedules under its own scheduler
name and has its own queues, so it never touches another test's pods.
"""

from __future__ import annotations

import base64
import datetime as dt
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from kubernetes import client
from kubernetes.client.rest import ApiException

from kai_ray.effects.certificates import ensure_certificate

from .chart import (
    CHART,
    Helm,
    OperatorProcess,
    Release,
    forbidden_lines,
    free_port,
    new_release,
    operator_args,
    running,
    scheduler_config,
    service_account_kubeconfig,
)
from .conftest import REPO, ControlPlane

pytestmark = pytest.mark.e2e

GROUP, VERSION = "scheduling.kai-ray.io", "v1alpha1"
KAI_RAY = str(Path(sys.executable).with_name("kai-ray"))

#: Every request the operator makes, as RBAC sees it: (API group, resource, verb,
#: resource name or "" for any) -> where it is made. The chart must grant exactly
#: these; a change to kai_ray/effects/kube.py or to kopf's needs shows up here.
CLUSTER_CALLS: dict[tuple[str, str, str, str], str] = {
    ("", "nodes", "list", ""): "Informer",
    ("", "nodes", "watch", ""): "Informer",
    ("", "pods", "list", ""): "Informer",
    ("", "pods", "watch", ""): "Informer",
    ("", "pods", "get", ""): "KubeWriter.lift_gate, KubeWriter._bound_to",
    ("", "pods", "patch", ""): "KubeWriter.lift_gate, KubeWriter.bind (GPU devices)",
    ("", "pods/binding", "create", ""): "KubeWriter.bind",
    ("", "pods/eviction", "create", ""): "KubeWriter.evict",
    ("", "pods/status", "patch", ""): "KubeWriter.evict (DisruptionTarget)",
    ("", "events", "create", ""): "KubeWriter.record_event; kopf's warnings",
    (GROUP, "queues", "list", ""): "Informer; kopf",
    (GROUP, "queues", "watch", ""): "Informer; kopf",
    (GROUP, "queues", "patch", ""): "kopf (its last-handled annotation)",
    (GROUP, "queues/status", "patch", ""): "KubeWriter.patch_status; kopf (Valid)",
    (GROUP, "podgroups", "list", ""): "Informer; kopf",
    (GROUP, "podgroups", "watch", ""): "Informer; kopf",
    (GROUP, "podgroups", "create", ""): "KubeWriter.create_pod_group",
    (GROUP, "podgroups", "patch", ""): "kopf (its last-handled annotation)",
    (GROUP, "podgroups/status", "patch", ""): "KubeWriter.patch_status; kopf (Valid)",
    (GROUP, "topologies", "list", ""): "Informer; kopf",
    (GROUP, "topologies", "watch", ""): "Informer; kopf",
    (GROUP, "topologies", "patch", ""): "kopf (its last-handled annotation)",
    (GROUP, "topologies/status", "patch", ""): "kopf (Valid)",
    ("batch", "jobs", "list", ""): "Informer",
    ("batch", "jobs", "watch", ""): "Informer",
    ("ray.io", "rayclusters", "list", ""): "Informer",
    ("ray.io", "rayclusters", "watch", ""): "Informer",
    ("ray.io", "rayclusters", "patch", ""): "KubeWriter.set_suspend",
    ("ray.io", "rayjobs", "list", ""): "Informer",
    ("ray.io", "rayjobs", "watch", ""): "Informer",
    ("ray.io", "rayjobs", "patch", ""): "KubeWriter.set_suspend",
    ("scheduler.grove.io", "podgangs", "list", ""): "Informer",
    ("scheduler.grove.io", "podgangs", "watch", ""): "Informer",
    ("resource.k8s.io", "deviceclasses", "list", ""): "Informer",
    ("resource.k8s.io", "deviceclasses", "watch", ""): "Informer",
    ("resource.k8s.io", "resourceslices", "list", ""): "Informer",
    ("resource.k8s.io", "resourceslices", "watch", ""): "Informer",
    ("resource.k8s.io", "resourceclaimtemplates", "list", ""): "Informer",
    ("resource.k8s.io", "resourceclaimtemplates", "watch", ""): "Informer",
    ("resource.k8s.io", "resourceclaims", "list", ""): "Informer",
    ("resource.k8s.io", "resourceclaims", "watch", ""): "Informer",
    ("resource.k8s.io", "resourceclaims", "get", ""): "KubeWriter._write_claim",
    ("resource.k8s.io", "resourceclaims", "patch", ""): "KubeWriter.write_claim (finalizer)",
    ("resource.k8s.io", "resourceclaims/status", "patch", ""): "KubeWriter.write_claim, "
    "release_claim (allocation, reservedFor)",
    ("apiextensions.k8s.io", "customresourcedefinitions", "list", ""): "kopf's resource scan",
    ("apiextensions.k8s.io", "customresourcedefinitions", "watch", ""): "kopf's resource scan",
}


def webhook_calls(release: Release) -> dict[tuple[str, str, str, str], str]:
    """kopf keeps a validating and a mutating webhook configuration (both, whatever
    its handlers: kopf/_core/reactor/running.py): create (it finds the chart's
    there) and patch (only those, by name)."""
    calls = {}
    for kind in ("validating", "mutating"):
        resource = f"{kind}webhookconfigurations"
        calls[("admissionregistration.k8s.io", resource, "create", "")] = "kopf"
        calls[("admissionregistration.k8s.io", resource, "patch", release.webhook_config)] = "kopf"
    return calls


def lease_calls(release: Release) -> dict[tuple[str, str, str, str], str]:
    """Leader election, in the release's namespace (LeaseElector)."""
    lease = ("coordination.k8s.io", "leases")
    return {
        (*lease, "create", ""): "LeaseElector._try",
        (*lease, "get", release.fullname): "LeaseElector._try, release",
        (*lease, "update", release.fullname): "LeaseElector._try, release",
    }


def granted(rules: list[dict[str, Any]]) -> set[tuple[str, str, str, str]]:
    """Every (group, resource, verb, name) a list of RBAC rules grants."""
    triples = set()
    for rule in rules:
        for group in rule.get("apiGroups") or [""]:
            for resource in rule.get("resources") or []:
                for verb in rule.get("verbs") or []:
                    for name in rule.get("resourceNames") or [""]:
                        triples.add((group, resource, verb, name))
    return triples


# ------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def helm(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Helm:
    if control_plane.helm is None:
        pytest.skip("helm was not built (see e2e/build.sh output)")
    return Helm(control_plane.helm, control_plane.kubeconfig, tmp_path_factory.mktemp("helm"))


@pytest.fixture(scope="module")
def release(helm: Helm, core: client.CoreV1Api) -> Iterator[Release]:
    """The chart installed once for the module, in a namespace of its own."""
    rel = new_release("chart")
    core.create_namespace(
        {"metadata": {"name": rel.namespace, "labels": {"kai-ray.io/e2e": "true"}}}
    )
    rel.install(helm)
    yield rel
    helm.run("uninstall", rel.name, "--namespace", rel.namespace, check=False)
    custom = client.CustomObjectsApi(core.api_client)
    for queue in reversed(rel.queues):
        try:
            custom.delete_cluster_custom_object(GROUP, VERSION, "queues", queue)
        except ApiException as err:
            if err.status != 404:
                raise
    core.delete_namespace(rel.namespace)


@pytest.fixture(scope="module")
def sa_kubeconfig(
    control_plane: ControlPlane,
    core: client.CoreV1Api,
    release: Release,
    tmp_path_factory: pytest.TempPathFactory,
) -> Path:
    path = tmp_path_factory.mktemp("sa") / "kubeconfig"
    return service_account_kubeconfig(
        control_plane, core, release.namespace, release.fullname, path
    )


@pytest.fixture(scope="module")
def operator(
    release: Release,
    sa_kubeconfig: Path,
    core: client.CoreV1Api,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[OperatorProcess]:
    """`kai-ray operator` from the checkout, as the chart's ServiceAccount."""
    folder = tmp_path_factory.mktemp("operator")
    config = scheduler_config(core, release, folder / "scheduler-config.yaml")
    health, metrics, webhook = free_port(), free_port(), free_port()
    args = operator_args(release, str(config), str(sa_kubeconfig), health, metrics, webhook)
    args.append(f"--webhook-cert-dir={folder / 'webhook'}")
    env = {**os.environ, "KUBECONFIG": str(sa_kubeconfig)}
    process = OperatorProcess([KAI_RAY, *args], folder / "operator.log", env, health, metrics)
    with running(process) as started:
        yield started


# ------------------------------------------------------------ the chart itself


def test_chart_versions_match_the_package_and_the_image_tag() -> None:
    import tomllib

    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert chart["appVersion"] == version, "the image tag `make image` gives"
    assert values["image"]["tag"] == "", "the tag defaults to appVersion"
    semver = version.replace(".dev", "-dev")
    assert chart["version"] == semver


def test_lint_and_template_are_clean(helm: Helm) -> None:
    linted = helm.run("lint", str(CHART), "--strict")
    assert "0 chart(s) failed" in linted.stdout, linted.stdout
    docs = helm.template("lint", "kai-ray-system")
    kinds = sorted({doc["kind"] for doc in docs})
    assert kinds == [
        "ClusterRole",
        "ClusterRoleBinding",
        "ConfigMap",
        "Deployment",
        "MutatingWebhookConfiguration",
        "Queue",
        "Role",
        "RoleBinding",
        "Secret",
        "Service",
        "ServiceAccount",
        "ValidatingWebhookConfiguration",
    ]
    deployment = next(doc for doc in docs if doc["kind"] == "Deployment")
    assert deployment["spec"]["replicas"] == 2
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert (
        container["image"]
        == f"kai-ray:{yaml.safe_load((CHART / 'Chart.yaml').read_text())['appVersion']}"
    )
    assert "--config=/etc/kai-ray/config/scheduler-config.yaml" in container["args"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"


BAD_VALUES = [
    pytest.param("replicas=two", "/replicas", id="replicas that is not a number"),
    pytest.param("image.pullPolicy=Sometimes", "/image/pullPolicy", id="an unknown pull policy"),
    pytest.param(
        "schedulerConfig.cyclePeriod=1d", "/schedulerConfig/cyclePeriod", id="a bad duration"
    ),
    pytest.param(
        "schedulerConfig.actions[0]=allocat", "/schedulerConfig/actions/0", id="an unknown action"
    ),
    pytest.param("schedulerConfig.cyclePerod=1s", "cyclePerod", id="a misspelt config field"),
    pytest.param(
        "schedulerConfig.dra.nvlinkDomainAttribute=cliqueId",
        "/schedulerConfig/dra/nvlinkDomainAttribute",
        id="an NVLink domain attribute without its domain",
    ),
    pytest.param("webhook.certificate.renewBeforeDays=7", "renewBeforeDays", id="renewal too late"),
    pytest.param("imag.tag=x", "imag", id="a misspelt top-level value"),
]


@pytest.mark.parametrize(("value", "named"), BAD_VALUES)
def test_a_wrong_value_fails_install_naming_it(helm: Helm, value: str, named: str) -> None:
    done = helm.run("install", "bad", str(CHART), "--dry-run=client", "--set", value, check=False)
    assert done.returncode != 0
    assert named in done.stderr, done.stderr


def test_schema_knows_every_scheduler_config_field() -> None:
    import json

    from kai_ray.values.config import DEFAULT_ACTIONS, SchedulerConfigSpec

    schema = json.loads((CHART / "values.schema.json").read_text())
    config = schema["properties"]["schedulerConfig"]["properties"]
    assert sorted(config) == sorted(SchedulerConfigSpec.model_fields)
    assert config["actions"]["items"]["enum"] == list(DEFAULT_ACTIONS)


def test_default_queues_can_be_turned_off(helm: Helm) -> None:
    on = helm.template("q", "ns")
    off = helm.template("q", "ns", "defaultQueues.enabled=false")
    assert [d["metadata"]["name"] for d in on if d["kind"] == "Queue"] == [
        "default",
        "default-team",
    ]
    assert not [d for d in off if d["kind"] == "Queue"]


# ------------------------------------------------------------ RBAC


def test_the_roles_grant_exactly_what_the_operator_uses(helm: Helm) -> None:
    rel = new_release("rbac")
    docs = helm.template(rel.name, rel.namespace)
    cluster_role = next(d for d in docs if d["kind"] == "ClusterRole")
    role = next(d for d in docs if d["kind"] == "Role")
    everything = [*cluster_role["rules"], *role["rules"]]
    text = yaml.safe_dump(everything)
    assert "'*'" not in text and '"*"' not in text, "no wildcard"
    assert "secrets" not in text, "the certificate is mounted, never read through the API"
    node_writes = {t for t in granted(cluster_role["rules"]) if t[1].startswith("nodes")}
    assert all(verb in ("get", "list", "watch") for _, _, verb, _ in node_writes)
    expected_cluster = {**CLUSTER_CALLS, **webhook_calls(rel)}
    extra = granted(cluster_role["rules"]) - set(expected_cluster)
    missing = set(expected_cluster) - granted(cluster_role["rules"])
    assert not extra, f"the ClusterRole grants more than the operator uses: {sorted(extra)}"
    assert not missing, f"the ClusterRole lacks what the operator uses: {sorted(missing)}"
    assert granted(role["rules"]) == set(lease_calls(rel)), "the Role: leader election only"


def _allowed(
    authz: client.AuthorizationV1Api, user: str, call: tuple[str, str, str, str], namespace: str
) -> bool:
    group, resource, verb, name = call
    plural, _, sub = resource.partition("/")
    attributes = {
        "group": group,
        "resource": plural,
        "subresource": sub or None,
        "verb": verb,
        "name": name or None,
        "namespace": namespace or None,
    }
    review = {"spec": {"user": user, "resourceAttributes": attributes}}
    answer = authz.create_subject_access_review(review)
    return bool(answer.status.allowed)


def test_the_service_account_may_make_every_call_the_operator_makes(
    release: Release, admin_api: client.ApiClient
) -> None:
    authz = client.AuthorizationV1Api(admin_api)
    user = f"system:serviceaccount:{release.namespace}:{release.fullname}"
    refused = [
        (call, why)
        for call, why in {**CLUSTER_CALLS, **webhook_calls(release)}.items()
        if not _allowed(authz, user, call, "some-team")
    ]
    refused += [
        (call, why)
        for call, why in lease_calls(release).items()
        if not _allowed(authz, user, call, release.namespace)
    ]
    assert not refused, f"the chart's ServiceAccount may not: {refused}"
    # and nothing beyond: a sample of what it must not do
    for call in [
        ("", "secrets", "get", ""),
        ("", "nodes", "patch", ""),
        ("", "pods", "delete", ""),
        ("coordination.k8s.io", "leases", "update", "someone-elses"),
        ("admissionregistration.k8s.io", "mutatingwebhookconfigurations", "patch", "other"),
    ]:
        assert not _allowed(authz, user, call, release.namespace), call


# ------------------------------------------------------------ install


def test_install_creates_the_release_objects(
    release: Release, core: client.CoreV1Api, admin_api: client.ApiClient
) -> None:
    apps = client.AppsV1Api(admin_api)
    deployment = apps.read_namespaced_deployment(release.fullname, release.namespace)
    assert deployment.spec.replicas == 2
    assert core.read_namespaced_service(f"{release.fullname}-metrics", release.namespace)
    service = core.read_namespaced_service(release.webhook_service, release.namespace)
    assert service.spec.ports[0].port == 443
    registration = client.AdmissionregistrationV1Api(admin_api)
    assert registration.read_mutating_webhook_configuration(release.webhook_config)
    assert registration.read_validating_webhook_configuration(release.webhook_config)
    custom = client.CustomObjectsApi(admin_api)
    team = custom.get_cluster_custom_object(GROUP, VERSION, "queues", release.queues[1])
    assert team["spec"]["parentQueue"] == release.queues[0]


def test_the_chart_certificate_is_one_the_operator_keeps(
    release: Release, core: client.CoreV1Api, tmp_path: Path
) -> None:
    secret = core.read_namespaced_secret(f"{release.fullname}-webhook-cert", release.namespace)
    for key in ("ca.crt", "tls.crt", "tls.key"):
        (tmp_path / key).write_bytes(base64.b64decode(secret.data[key]))
    before = {key: (tmp_path / key).read_bytes() for key in ("ca.crt", "tls.crt", "tls.key")}
    dns = f"{release.webhook_service}.{release.namespace}.svc"
    ensure_certificate(tmp_path, dns)
    after = {key: (tmp_path / key).read_bytes() for key in before}
    assert after == before, "the operator would have made its own certificate"
    cert = x509.load_pem_x509_certificate(before["tls.crt"])
    ca = x509.load_pem_x509_certificate(before["ca.crt"])
    cert.verify_directly_issued_by(ca)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert dns in names.get_values_for_type(x509.DNSName)
    expires = dt.datetime.fromisoformat(
        secret.metadata.annotations["kai-ray.io/certificate-expires"]
    )
    assert abs((expires - cert.not_valid_after_utc).total_seconds()) < 120


# ------------------------------------------------------------ the operator as the ServiceAccount


def _gang(namespace: str, release: Release, size: int) -> list[dict[str, Any]]:
    group = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "PodGroup",
        "metadata": {"name": "gang", "namespace": namespace},
        "spec": {"queue": release.queues[1], "minMember": size},
    }
    pods = [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"gang-{i}",
                "namespace": namespace,
                "annotations": {"kai-ray.io/pod-group": "gang"},
                "labels": {"kai-ray.io/queue": release.queues[1]},
            },
            "spec": {
                "schedulerName": release.scheduler,
                "containers": [
                    {
                        "name": "main",
                        "image": "busybox",
                        "resources": {
                            "requests": {"nvidia.com/gpu": "1", "cpu": "1"},
                            "limits": {"nvidia.com/gpu": "1"},
                        },
                    }
                ],
            },
        }
        for i in range(size)
    ]
    return [group, *pods]


def wait_for(probe: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def schedule_a_gang(
    plane: ControlPlane, core: client.CoreV1Api, release: Release, namespace: str, size: int
) -> dict[str, str]:
    """Apply a gang of `size` one-GPU pods; return pod -> node once all are bound."""
    applied = plane.kubectl(
        "apply", "-f", "-", input=yaml.safe_dump_all(_gang(namespace, release, size))
    )
    assert applied.returncode == 0, applied.stderr

    def bound() -> dict[str, str] | None:
        pods = core.list_namespaced_pod(namespace).items
        nodes = {pod.metadata.name: pod.spec.node_name for pod in pods}
        return nodes if len(nodes) == size and all(nodes.values()) else None

    return dict(wait_for(bound, 60, f"a gang of {size} bound in {namespace}"))


def test_the_operator_schedules_a_gang_as_the_service_account(
    control_plane: ControlPlane,
    core: client.CoreV1Api,
    admin_api: client.ApiClient,
    release: Release,
    operator: OperatorProcess,
    namespace: str,
    gpu_nodes: Callable[..., list[str]],
) -> None:
    nodes = gpu_nodes(2, gpus_per_node=2)
    placed = schedule_a_gang(control_plane, core, release, namespace, 3)
    assert set(placed.values()) <= set(nodes)
    # the webhook held them first (kopf filled the chart's configuration by URL)
    registration = client.AdmissionregistrationV1Api(admin_api)
    webhooks = registration.read_mutating_webhook_configuration(release.webhook_config).webhooks
    assert webhooks and all(w.failure_policy == "Ignore" for w in webhooks)
    # the Lease in the release's namespace names this replica
    lease = client.CoordinationV1Api(admin_api).read_namespaced_lease(
        release.fullname, release.namespace
    )
    assert lease.spec.holder_identity
    # its metrics say the same as the cluster: 3 GPUs held by the team, 3 binds, leading
    team = (("queue", release.queues[1]), ("resource", "nvidia.com/gpu"), ("unit", "gpu"))
    wanted = {
        ("kai_ray_queue_allocated", team): 3.0,
        ("kai_ray_leader", ()): 1.0,
        ("kai_ray_binds_total", ()): 3.0,
    }
    seen: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}

    def agrees() -> bool:
        seen.clear()
        seen.update(_scrape(operator))
        return seen.items() >= wanted.items()

    try:
        wait_for(agrees, 30, f"metrics {wanted}")
    except AssertionError as err:
        got = {key: seen.get(key) for key in wanted}
        who = {key: value for key, value in seen.items() if key[0].startswith("process_")}
        cycles = seen.get(("kai_ray_cycles_total", ()))
        pid = operator.process.pid if operator.process else None
        raise AssertionError(
            f"{err}; last scrape: {got}, cycles {cycles}, {who} (operator pid {pid}, "
            f"metrics port {operator.metrics_port})\n{operator.output()[-6000:]}"
        ) from None
    refused = forbidden_lines(operator.output())
    assert not refused, "requests refused by RBAC:\n" + "\n".join(refused[:20])


def _scrape(operator: OperatorProcess) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    status, text = operator.get(operator.metrics_port, "/metrics")
    assert status == 200, text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


# ------------------------------------------------------------ upgrade and uninstall


def _release_objects(plane: ControlPlane, rel: Release) -> list[str]:
    """What of the release is still in the cluster, as kubectl names it."""
    namespaced = [
        ("deployment", rel.fullname),
        ("serviceaccount", rel.fullname),
        ("configmap", f"{rel.fullname}-config"),
        ("secret", f"{rel.fullname}-webhook-cert"),
        ("service", rel.webhook_service),
        ("service", f"{rel.fullname}-metrics"),
        ("role", rel.fullname),
        ("rolebinding", rel.fullname),
    ]
    cluster = [
        ("clusterrole", rel.cluster_name),
        ("clusterrolebinding", rel.cluster_name),
        ("mutatingwebhookconfiguration", rel.webhook_config),
        ("validatingwebhookconfiguration", rel.webhook_config),
    ]
    left = []
    for kind, name, namespace in [
        *((k, n, rel.namespace) for k, n in namespaced),
        *((k, n, "") for k, n in cluster),
    ]:
        scope = ["-n", namespace] if namespace else []
        found = plane.kubectl("get", kind, name, *scope, "--ignore-not-found", "-o", "name")
        assert found.returncode == 0, found.stderr
        left += found.stdout.split()
    return left


def _queues(admin_api: client.ApiClient, rel: Release) -> list[str]:
    custom = client.CustomObjectsApi(admin_api)
    names = [
        q["metadata"]["name"]
        for q in custom.list_cluster_custom_object(GROUP, VERSION, "queues")["items"]
    ]
    return [name for name in rel.queues if name in names]


def test_upgrade_with_a_changed_value_then_uninstall_leaves_the_cluster_clean(
    control_plane: ControlPlane, helm: Helm, core: client.CoreV1Api, admin_api: client.ApiClient
) -> None:
    rel = new_release("life")
    core.create_namespace({"metadata": {"name": rel.namespace}})
    apps = client.AppsV1Api(admin_api)
    try:
        rel.install(helm)
        before = apps.read_namespaced_deployment(rel.fullname, rel.namespace)
        secret = core.read_namespaced_secret(f"{rel.fullname}-webhook-cert", rel.namespace)
        helm.run(
            "upgrade", rel.name, str(CHART), "--namespace", rel.namespace, "--reuse-values",
            "--set", "schedulerConfig.cyclePeriod=2s", "--set", "replicas=3",
        )  # fmt: skip
        config = core.read_namespaced_config_map(f"{rel.fullname}-config", rel.namespace)
        assert "cyclePeriod: 2s" in config.data["scheduler-config.yaml"]
        after = apps.read_namespaced_deployment(rel.fullname, rel.namespace)
        assert after.spec.replicas == 3
        checksum = "checksum/config"
        assert (
            after.spec.template.metadata.annotations[checksum]
            != before.spec.template.metadata.annotations[checksum]
        ), "a changed SchedulerConfig rolls the pods"
        kept = core.read_namespaced_secret(f"{rel.fullname}-webhook-cert", rel.namespace)
        assert kept.data == secret.data, "the certificate is kept while it is far from expiry"
        helm.run("uninstall", rel.name, "--namespace", rel.namespace, "--wait")
        assert _release_objects(control_plane, rel) == []
        assert _queues(admin_api, rel) == list(rel.queues), "Queues are kept by default"
        # asked to: installed with keepOnUninstall=false, uninstall takes the Queues too
        rel.install(helm, "defaultQueues.keepOnUninstall=false")
        helm.run("uninstall", rel.name, "--namespace", rel.namespace, "--wait")
        assert _release_objects(control_plane, rel) == []
        assert _queues(admin_api, rel) == []
    finally:
        helm.run("uninstall", rel.name, "--namespace", rel.namespace, check=False)
        custom = client.CustomObjectsApi(admin_api)
        for queue in reversed(rel.queues):
            try:
                custom.delete_cluster_custom_object(GROUP, VERSION, "queues", queue)
            except ApiException as err:
                if err.status != 404:
                    raise
        core.delete_namespace(rel.namespace)


def test_the_rbac_table_in_the_docs_is_the_charts(helm: Helm) -> None:
    from helm import rbac_table

    roles = [d for d in helm.template("kai-ray", "kai-ray-system") if d["kind"].endswith("Role")]
    docs = rbac_table.DOCS.read_text()
    assert rbac_table.with_table(docs, rbac_table.table(roles)) == docs, (
        "docs/operations.md's RBAC table differs from the chart: run `make rbac-docs`"
    )
