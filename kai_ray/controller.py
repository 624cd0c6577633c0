"""The kopf operator: starts the scheduling loop, reports object validity.

This is the only module that imports kopf. `main` (what `kai-ray operator` and
the image's entrypoint run) starts kopf with the options given; kopf's startup
handler starts the scheduling loop (`kai_ray.effects.scheduling_loop`: watches,
cache, cycles, binder), the health endpoints and the metrics endpoint; its
cleanup handler stops them and gives the leader Lease up. Besides, kopf reports
a `Valid` condition on every Queue, PodGroup and Topology. See
docs/architecture.md.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kopf

from kai_ray.effects.certificates import ensure_certificate
from kai_ray.effects.health import serve_health
from kai_ray.effects.kube import connect
from kai_ray.effects.reporting import (
    merge_condition,
    queue_validity_condition,
    validity_condition,
)
from kai_ray.effects.scheduling_loop import LoopOptions, SchedulingLoop
from kai_ray.values.api import GROUP, VERSION
from kai_ray.values.clock import WallClock, rfc3339
from kai_ray.values.config import SchedulerConfig
from kai_ray.values.names import SCHEDULER_NAME
from kai_ray.values.validation import parse_model
from kai_ray.workloads.membership import admission_changes, holds_with_suspend

#: Kinds whose `Valid` condition kopf reports as they are created or changed. PodGroups
#: are not among them: there may be thousands, and the scheduling loop writes their
#: whole status (`Valid` included) once per change anyway.
PLURALS = {"Queue": "queues", "Topology": "topologies"}
LOG = logging.getLogger("kai_ray.controller")


@dataclass
class OperatorOptions:
    """What `kai-ray operator` was told on its command line."""

    config_file: Path | None = None
    kubeconfig: str | None = None
    metrics_port: int = 8080
    health_port: int = 8081
    bind_address: str = "0.0.0.0"
    leader_elect: bool = True
    lease_namespace: str = "kube-system"
    lease_name: str = "kai-ray"
    identity: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    #: The admission webhook: where the API server reaches it (None: no webhook).
    webhook_host: str | None = "127.0.0.1"
    webhook_port: int = 9443
    webhook_cert_dir: Path = Path("/tmp/kai-ray-webhook")
    #: In a cluster: NAMESPACE/NAME of the Service the API server calls the webhook by.
    webhook_service: str | None = None
    webhook_service_port: int = 443
    #: The webhook configuration kopf keeps up to date (one per installation).
    webhook_config_name: str = "kai-ray.io"


#: Set by `main` before kopf starts (kopf handlers take no arguments of ours).
OPTIONS = OperatorOptions()
_RUNNING: dict[str, Any] = {}


def read_config(path: Path | None) -> SchedulerConfig:
    """The SchedulerConfig file (a YAML document), or the defaults."""
    if path is None:
        return SchedulerConfig()
    import yaml

    return parse_model(SchedulerConfig, yaml.safe_load(path.read_text()) or {})


def main(options: OperatorOptions) -> None:
    """Run the operator until it is stopped (SIGINT/SIGTERM)."""
    global OPTIONS
    OPTIONS = options
    read_config(options.config_file)  # a bad file stops here, before anything starts
    if options.webhook_host is not None:
        register_webhooks()
    kopf.configure(verbose=False)
    kopf.run(standalone=True, clusterwide=True)


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    # Status is written by us; kopf's own progress goes to an annotation-free store
    # so that users' objects keep only what they and kai-ray's status put there.
    settings.persistence.progress_storage = kopf.StatusProgressStorage(field="status.kopf")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="kai-ray.io", key="last-handled-configuration"
    )
    settings.posting.level = logging.WARNING  # warnings and errors become Kubernetes events
    settings.peering.standalone = True  # one scheduler leads through its own Lease
    if OPTIONS.webhook_host is not None:
        service = OPTIONS.webhook_service
        named = _service_dns_name(service) if service else OPTIONS.webhook_host
        files = ensure_certificate(OPTIONS.webhook_cert_dir, named)
        server = ServiceWebhookServer if service else kopf.WebhookServer
        settings.admission.server = server(
            addr=OPTIONS.webhook_host,
            port=OPTIONS.webhook_port,
            host=OPTIONS.webhook_host,
            certfile=str(files.cert_file),
            pkeyfile=str(files.key_file),
            cafile=str(files.ca_file),
        )
        settings.admission.managed = OPTIONS.webhook_config_name
    _start(OPTIONS)


def _service_dns_name(service: str) -> str:
    """The name the API server checks the serving certificate for: NAME.NAMESPACE.svc."""
    namespace, _, name = service.partition("/")
    return f"{name}.{namespace}.svc"


class ServiceWebhookServer(kopf.WebhookServer):
    """kopf's webhook server, registered by a Service reference (`--webhook-service`)
    instead of a URL: in a cluster, the API server reaches pods through a Service."""

    async def __call__(self, fn: kopf.WebhookFn) -> AsyncIterator[kopf.WebhookClientConfig]:
        namespace, _, name = (OPTIONS.webhook_service or "").partition("/")
        service = kopf.WebhookClientConfigService(
            namespace=namespace, name=name, port=OPTIONS.webhook_service_port, path=self.path or ""
        )
        async for config in super().__call__(fn):
            by_service = kopf.WebhookClientConfig(service=service)
            if config.get("caBundle"):
                by_service["caBundle"] = config["caBundle"]
            yield by_service


def _start(options: OperatorOptions) -> None:
    from prometheus_client import start_http_server

    api = connect(options.kubeconfig)
    loop_options = LoopOptions(
        config=read_config(options.config_file),
        leader_elect=options.leader_elect,
        lease_namespace=options.lease_namespace,
        lease_name=options.lease_name,
        identity=options.identity,
    )
    loop = SchedulingLoop(api, loop_options)
    loop.start()
    _RUNNING["loop"] = loop
    _RUNNING["health"] = serve_health(
        options.bind_address, options.health_port, loop.alive, loop.synced
    )
    if options.metrics_port:
        start_http_server(options.metrics_port, addr=options.bind_address)
    LOG.info("kai-ray %s started (leader election: %s)", options.identity, options.leader_elect)


@kopf.on.cleanup()
def stop(**_: Any) -> None:
    loop = _RUNNING.pop("loop", None)
    if isinstance(loop, SchedulingLoop):
        loop.stop()
    health = _RUNNING.pop("health", None)
    if health is not None:
        health.shutdown()


def hold_pod(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
    """New pods of kai-ray: the admission gate, and their gang named
    (docs/architecture.md section 3).

    Failures are ignored by the API server (failurePolicy Ignore): with the
    operator down, pods are still created, only not held back."""
    loop = _RUNNING.get("loop")
    if not isinstance(loop, SchedulingLoop):
        return
    changes = admission_changes(body, loop.scheduler, loop.rayjob_of)
    if "schedulingGates" in changes:
        patch.spec["schedulingGates"] = changes["schedulingGates"]
    if "annotations" in changes:
        patch.metadata["annotations"] = changes["annotations"]
        patch.metadata["labels"] = changes["labels"]


def hold_ray_workload(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
    """New RayClusters and RayJobs of kai-ray queues are created suspended; the
    operator releases them when their whole gang is admitted (docs/architecture.md section 3)."""
    loop = _RUNNING.get("loop")
    scheduler = loop.scheduler if isinstance(loop, SchedulingLoop) else SCHEDULER_NAME
    if holds_with_suspend(body, scheduler) and not body.get("spec", {}).get("suspend"):
        patch.spec["suspend"] = True


def register_webhooks() -> None:
    """The admission webhook's handlers (only when it is served: kopf refuses to
    start with handlers and no server)."""
    mutate = functools.partial(kopf.on.mutate, operation="CREATE", ignore_failures=True)
    mutate("v1", "pods", id="pod-admission")(hold_pod)
    for plural in ("rayclusters", "rayjobs"):
        mutate("ray.io", "v1", plural, id=f"{plural}-admission")(hold_ray_workload)


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    # In a pod: the service account; elsewhere: $KUBECONFIG (or ~/.kube/config).
    info: kopf.ConnectionInfo | None = kopf.login_with_service_account(**kwargs)
    return info or kopf.login_with_kubeconfig(**kwargs)


def _now() -> str:
    return rfc3339(WallClock().now())


def _report(kind: str, body: kopf.Body, patch: kopf.Patch) -> None:
    loop = _RUNNING.get("loop")
    if kind == "Queue" and isinstance(loop, SchedulingLoop):
        # A Queue is judged among all Queues (its parent must exist), as each cycle does.
        condition = queue_validity_condition(body, loop.queue_objects(), _now())
    else:
        condition = validity_condition(kind, body, _now())
    conditions = merge_condition(list(body.get("status", {}).get("conditions") or []), condition)
    patch.status["conditions"] = conditions
    if condition["status"] == "False":
        kopf.warn(body, reason="InvalidSpec", message=condition["message"])


def _register(kind: str) -> None:
    plural = PLURALS[kind]

    @kopf.on.resume(GROUP, VERSION, plural)
    @kopf.on.create(GROUP, VERSION, plural)
    @kopf.on.update(GROUP, VERSION, plural, field="spec")
    def report_validity(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
        _report(kind, body, patch)


for _kind in PLURALS:
    _register(_kind)
