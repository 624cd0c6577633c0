"""Security of the operator on a real cluster (issue 15).

- Its endpoints (health, metrics, the admission webhook) change nothing: every
  write method is refused or answered like a read, and the operator goes on.
- The admission webhook is registered with a CA bundle; its certificate holds
  for that CA and the address it is called at, and not for another CA; and the
  API server verifies it: a registration of the same URL with another CA makes
  the API server refuse the pod (x509), so a webhook is never trusted blindly.
- The webhook's private key is readable by its owner only.
- A user without rights cannot move a workload into another team's queue: the
  plain e2e user, allowed to create pods in team b's namespace only, cannot
  create them in team a's, cannot change team a's Queue, and a pod it labels
  for team a's queue is never bound there; kai-ray reports why on its PodGroup.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import socket
import ssl
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.builders import make_queue

from .operator_process import OperatorProcess
from .polling import eventually, holds
from .sandbox import Sandbox
from .workloads import pod

pytestmark = pytest.mark.e2e

WEBHOOK_CONFIG = "kai-ray.io"
WRITES = ("POST", "PUT", "PATCH", "DELETE")
RBAC_GROUP = "rbac.authorization.k8s.io"


def call(url: str, method: str, context: ssl.SSLContext | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=b"{}" if method != "GET" else None, method=method)
    try:
        with urllib.request.urlopen(request, timeout=5, context=context) as answer:
            return int(answer.status), answer.read()
    except urllib.error.HTTPError as err:
        return int(err.code), err.read()


def metrics_port(operator: OperatorProcess) -> int:
    return int(operator.argv[operator.argv.index("--metrics-port") + 1])


def test_health_and_metrics_endpoints_change_nothing(operator: OperatorProcess) -> None:
    base = {
        "health": f"http://127.0.0.1:{operator.health_port}",
        "metrics": f"http://127.0.0.1:{metrics_port(operator)}",
    }
    assert call(f"{base['health']}/healthz", "GET")[0] == 200
    assert call(f"{base['metrics']}/metrics", "GET")[0] == 200
    for name, url in base.items():
        for path in ("/", "/healthz", "/readyz", "/metrics", "/debug"):
            for method in WRITES:
                status, body = call(f"{url}{path}", method)
                if 200 <= status < 300:  # answered as a read, nothing else
                    assert name == "metrics" and body.startswith(b"# HELP"), (name, method, path)
                else:
                    assert status in (400, 404, 405, 501), (name, method, path, status)
    assert operator.running() and operator.probe("/healthz") == 200
    assert operator.probe("/readyz") == 200


def webhook_configuration(admin_api: client.ApiClient) -> Any:
    api = client.AdmissionregistrationV1Api(admin_api)
    return api.read_mutating_webhook_configuration(WEBHOOK_CONFIG)


def ca_context(ca_pem: bytes) -> ssl.SSLContext:
    context = ssl.create_default_context(cadata=ca_pem.decode())
    context.check_hostname = True
    return context


def test_the_webhook_is_registered_with_a_ca_its_certificate_holds_for(
    operator: OperatorProcess, admin_api: client.ApiClient
) -> None:
    config = webhook_configuration(admin_api)
    assert config.webhooks, "the operator registered no webhook"
    for hook in config.webhooks:
        ca_bundle = hook.client_config.ca_bundle
        assert ca_bundle, f"{hook.name} registered without a CA bundle"
        url = urlparse(hook.client_config.url)
        assert url.scheme == "https", hook.client_config.url
        ca_pem = base64.b64decode(ca_bundle)
        with (
            socket.create_connection((url.hostname, url.port), timeout=5) as raw,
            ca_context(ca_pem).wrap_socket(raw, server_hostname=url.hostname) as tls,
        ):
            assert tls.version() in ("TLSv1.2", "TLSv1.3")
        with (
            pytest.raises(ssl.SSLCertVerificationError),
            socket.create_connection((url.hostname, url.port), timeout=5) as raw,
        ):
            ca_context(other_ca()).wrap_socket(raw, server_hostname=url.hostname)
        # Nothing but an AdmissionReview is answered (kopf answers a malformed one
        # with 500, an unhandled KeyError: refused all the same, and nothing written).
        for path, method in (("/no-such-hook", "POST"), ("/", "GET"), ("/", "DELETE")):
            status, _ = call(f"{url.scheme}://{url.netloc}{path}", method, ca_context(ca_pem))
            assert status >= 400, (path, method, status)
    assert operator.running() and operator.probe("/healthz") == 200


def test_a_restarted_operator_is_ready_only_once_its_webhook_listens(
    operator: OperatorProcess,
) -> None:
    """`/readyz` waits for the webhook: a replica a Service sends calls to answers
    them (the API server ignores a webhook it cannot reach, so pods created in
    that gap would go through without their gate)."""
    port = int(operator.argv[operator.argv.index("--webhook-port") + 1])
    operator.kill()
    operator.start()
    eventually(lambda: operator.probe("/readyz") == 200, timeout=120, what="ready", interval=0.005)
    with socket.create_connection(("127.0.0.1", port), timeout=5):
        pass
    assert operator.running() and operator.probe("/readyz") == 200


def test_the_webhook_private_key_is_its_owners_only(operator: OperatorProcess) -> None:
    if "--webhook-cert-dir" in operator.argv:
        folder = Path(operator.argv[operator.argv.index("--webhook-cert-dir") + 1])
    else:
        folder = Path("/tmp/kai-ray-webhook")
    mode = (folder / "tls.key").stat().st_mode & 0o777
    assert mode == 0o600, oct(mode)
    assert not (folder.stat().st_mode & 0o022), f"{folder} is writable by others"


def other_ca() -> bytes:
    """A CA that signed nothing the operator serves."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "not kai-ray's CA")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM)


def test_the_api_server_verifies_the_webhook_certificate(
    operator: OperatorProcess, admin_api: client.ApiClient, sandbox: Sandbox
) -> None:
    """The same URL registered with another CA, failing closed for this namespace:
    the API server refuses the pod because it cannot verify the certificate."""
    url = webhook_configuration(admin_api).webhooks[0].client_config.url
    name = f"untrusted-{uuid.uuid4().hex[:6]}"
    api = client.AdmissionregistrationV1Api(admin_api)
    api.create_mutating_webhook_configuration(
        {
            "metadata": {"name": name},
            "webhooks": [
                {
                    "name": f"{name}.kai-ray.io",
                    "admissionReviewVersions": ["v1"],
                    "sideEffects": "None",
                    "failurePolicy": "Fail",
                    "timeoutSeconds": 5,
                    "clientConfig": {
                        "url": url,
                        "caBundle": base64.b64encode(other_ca()).decode(),
                    },
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": sandbox.namespace}
                    },
                    "rules": [
                        {
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE"],
                            "resources": ["pods"],
                        }
                    ],
                }
            ],
        }
    )
    try:

        def refused() -> str | None:
            try:
                sandbox.create(pod(f"p-{uuid.uuid4().hex[:5]}", None, sandbox.node_selector))
            except ApiException as err:
                return str(err.body)
            return None

        message = eventually(refused, 20, "the API server to refuse the pod")
        assert "x509" in message or "certificate" in message, message
    finally:
        api.delete_mutating_webhook_configuration(name)


# --------------------------------------------------- another team's queue


def grant_pods(admin_api: client.ApiClient, namespace: str) -> None:
    """e2e-user may create, read and delete pods in `namespace`, and nothing else."""
    rbac = client.RbacAuthorizationV1Api(admin_api)
    rule = {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "list", "delete"]}
    rbac.create_namespaced_role(namespace, {"metadata": {"name": "pods"}, "rules": [rule]})
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "e2e-user-pods"},
            "roleRef": {"apiGroup": RBAC_GROUP, "kind": "Role", "name": "pods"},
            "subjects": [{"apiGroup": RBAC_GROUP, "kind": "User", "name": "e2e-user"}],
        },
    )


def test_a_plain_user_cannot_move_a_workload_into_another_teams_queue(
    operator: OperatorProcess,
    sandbox: Sandbox,
    admin_api: client.ApiClient,
    user_api: client.ApiClient,
    core: client.CoreV1Api,
) -> None:
    team_a_ns = f"{sandbox.namespace}-a"
    core.create_namespace({"metadata": {"name": team_a_ns}})
    try:
        dept, team_a, team_b = (sandbox.name(n) for n in ("dept", "team-a", "team-b"))
        sandbox.kubectl_apply(
            make_queue(dept).gpu(quota=8).build(),
            make_queue(team_a).parent(dept).gpu(quota=4).namespaces(team_a_ns).build(),
            make_queue(team_b).parent(dept).gpu(quota=4).namespaces(sandbox.namespace).build(),
        )
        sandbox.make_nodes(1, gpus_per_node=8)
        grant_pods(admin_api, sandbox.namespace)
        user = client.CoreV1Api(user_api)
        user_custom = client.CustomObjectsApi(user_api)
        eventually(lambda: user.list_namespaced_pod(sandbox.namespace) is not None, 10, "RBAC")

        body = pod("sneaky", team_a, sandbox.node_selector, gpus=1)
        body["metadata"].pop("namespace", None)
        with pytest.raises(ApiException) as denied:
            user.create_namespaced_pod(team_a_ns, {**body, "metadata": {"name": "sneaky"}})
        assert denied.value.status == 403
        with pytest.raises(ApiException) as denied:
            user_custom.patch_cluster_custom_object(
                "scheduling.kai-ray.io", "v1alpha1", "queues", team_a,
                {"spec": {"namespaces": [team_a_ns, sandbox.namespace]}},
            )  # fmt: skip
        assert denied.value.status == 403

        # Allowed into its own namespace, the pod names team a's queue: kai-ray's
        # validating webhook refuses it at the door, or (served without the webhook)
        # it is never bound and its PodGroup says why.
        try:
            user.create_namespaced_pod(sandbox.namespace, body)
        except ApiException as refused:
            assert refused.status == 400, refused
            said = str(refused.body)
        else:
            said = ""
        honest = pod("honest", team_b, sandbox.node_selector, gpus=1)
        honest["metadata"].pop("namespace", None)
        user.create_namespaced_pod(sandbox.namespace, honest)
        eventually(lambda: sandbox.pod("honest").spec.node_name, 30, "team b's own pod bound")
        if not said:
            holds(lambda: not sandbox.pod("sneaky").spec.node_name, 3, "the sneaky pod unbound")
            group = eventually(lambda: sandbox.get("PodGroup", "pod-sneaky"), 30, "its PodGroup")
            said = json.dumps(group.get("status") or {})
        assert sandbox.namespace in said and team_a in said, said
    finally:
        core.delete_namespace(team_a_ns)
