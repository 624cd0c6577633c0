"""The kopf operator: starts the scheduling loop, reports object validity.

This is the only module that imports kopf. `main` (what `kai-ray operator` and
the image's entrypoint run) starts kopf with the options given; kopf's startup
handler starts the scheduling loop (`kai_ray.effects.scheduling_loop`: watches,
cache, cycles, binder), the health endpoints and the metrics endpoint; its
cleanup handler stops them and gives the leader Lease up. Besides, kopf reports
a `Valid` condition on every Queue, PodGroup and Topology, and serves the
admission webhooks: mutating (pods gated, Ray workloads suspended) and validating
(what CEL cannot see; docs/operations.md). See docs/architecture.md.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import threading
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import kopf

from kai_ray.effects.admission_checks import (
    deprecation_warnings,
    queue_refusals,
    queue_warnings,
    refusal_message,
    topology_refusals,
    workload_refusals,
)
from kai_ray.effects.certificates import ensure_certificate
from kai_ray.effects.health import serve_health
from kai_ray.effects.kube import WATCHED, connect
from kai_ray.effects.reporting import (
    merge_condition,
    queue_validity_condition,
    validity_condition,
)
from kai_ray.effects.scheduling_loop import LoopOptions, SchedulingLoop
from kai_ray.values.api import GROUP, VERSION
from kai_ray.values.clock import WallClock, rfc3339
from kai_ray.values.config import SchedulerConfig
from kai_ray.values.errors import Problem
from kai_ray.values.names import SCHEDULER_NAME
from kai_ray.values.validation import parse_model
from kai_ray.workloads.membership import admission_changes, holds_with_suspend

#: Kinds whose `Valid` condition kopf reports as they are created or changed. PodGroups
#: are not among them: there may be thousands, and the scheduling loop writes their
#: whole status (`Valid` included) once per change anyway.
PLURALS = {"Queue": "queues", "Topology": "topologies"}
LOG = logging.getLogger("kai_ray.controller")
#: How long the API server waits for an answer of the webhook (kopf writes 30 s,
#: the most Kubernetes allows); with failurePolicy Ignore, an operator that does
#: not answer costs each write this much, then the object is admitted unchecked.
WEBHOOK_TIMEOUT_S = 5
#: The workloads the validating webhook checks, by (group, version, plural), with
#: the writes checked: pods only when created (the binder's own updates of every
#: pod it gates and binds need no round trip through the webhook).
WORKLOAD_RESOURCES: tuple[tuple[str, str, str, tuple[kopf.Operation, ...]], ...] = (
    ("", "v1", "pods", ("CREATE",)),
    ("batch", "v1", "jobs", ("CREATE", "UPDATE")),
    ("ray.io", "v1", "rayclusters", ("CREATE", "UPDATE")),
    ("ray.io", "v1", "rayjobs", ("CREATE", "UPDATE")),
    (GROUP, VERSION, "podgroups", ("CREATE", "UPDATE")),
)


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
#: Set once the admission webhook listens: `/readyz` waits for it when a webhook is
#: served, so that neither a Service nor a test calls a webhook that is not there yet
#: (the API server ignores a webhook it cannot reach: pods would go through ungated).
WEBHOOK_SERVING = threading.Event()


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
        server = ServiceWebhookServer if service else ServingWebhookServer
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


class ServingWebhookServer(kopf.WebhookServer):
    """kopf's webhook server, which says when it listens: kopf yields the client
    configuration only after its site has started."""

    async def __call__(self, fn: kopf.WebhookFn) -> AsyncIterator[kopf.WebhookClientConfig]:
        async for config in super().__call__(fn):
            WEBHOOK_SERVING.set()
            yield config


class ServiceWebhookServer(ServingWebhookServer):
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
    ready = functools.partial(_ready, loop, options.webhook_host is not None)
    _RUNNING["health"] = serve_health(
        options.bind_address, options.health_port, loop.alive, ready, loop.ray_report.health_line
    )
    if options.metrics_port:
        start_http_server(options.metrics_port, addr=options.bind_address)
    LOG.info("kai-ray %s started (leader election: %s)", options.identity, options.leader_elect)


def _ready(loop: SchedulingLoop, webhook: bool) -> bool:
    """Every watched kind listed, and the admission webhook listening if one is served."""
    return loop.synced() and (not webhook or WEBHOOK_SERVING.is_set())


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
    start with handlers and no server): mutating ones for new workloads, and
    validating ones for what the CRDs' CEL rules cannot see (one object at a time)."""
    mutate = functools.partial(kopf.on.mutate, operation="CREATE", ignore_failures=True)
    mutate("v1", "pods", id="pod-admission")(hold_pod)
    for plural in ("rayclusters", "rayjobs"):
        mutate("ray.io", "v1", plural, id=f"{plural}-admission")(hold_ray_workload)
    validate = functools.partial(kopf.on.validate, ignore_failures=True)
    writes: list[kopf.Operation] = ["CREATE", "UPDATE"]
    validate(GROUP, VERSION, "queues", id="queue-validation", operations=writes)(validate_queue)
    validate(GROUP, VERSION, "topologies", id="topology-validation", operations=writes)(
        validate_topology
    )
    for group, version, plural, operations in WORKLOAD_RESOURCES:
        api = f"{group}/{version}" if group else version
        validate(api, plural, id=f"{plural}-validation", operations=list(operations))(
            validate_workload
        )
    _short_webhook_timeout()


def _short_webhook_timeout() -> None:
    """kopf writes every webhook with a 30 s timeout and offers no setting: its one
    builder of webhook entries is wrapped to write `WEBHOOK_TIMEOUT_S` instead."""
    from kopf._core.engines import admission

    build = admission.build_webhooks
    if getattr(build, "kai_ray_timeout", False):
        return

    def with_timeout(*args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        webhooks = build(*args, **kwargs)
        for webhook in webhooks:
            webhook["timeoutSeconds"] = WEBHOOK_TIMEOUT_S
        return webhooks

    with_timeout.kai_ray_timeout = True  # type: ignore[attr-defined]
    admission.build_webhooks = with_timeout


def _judge(
    kind: str,
    body: kopf.Body,
    old: kopf.Body | None,
    warnings: list[str],
    refusals: Refusals,
) -> None:
    """Refuse (kopf.AdmissionError) when `refusals(body)` finds problems that the
    object's old version, if any, did not have (a write that fixes nothing else
    is not held back by what was already there). An unexpected failure admits:
    the webhook must not stop the cluster; the `Valid` condition still reports."""
    warnings.extend(deprecation_warnings(kind, body))
    try:
        problems = refusals(body)
        if problems and old is not None:
            before = {(p.field, p.message) for p in refusals(old)}
            problems = [p for p in problems if (p.field, p.message) not in before]
    except Exception:
        LOG.exception("validating %s %s failed; admitted unchecked", kind, body.get("metadata"))
        return
    if problems:
        raise kopf.AdmissionError(refusal_message(problems), code=400)


Refusals = Callable[[kopf.Body], list[Problem]]


def _serving_loop() -> SchedulingLoop | None:
    """The loop whose cache the checks read, once it has listed everything
    (before that, objects are admitted unchecked, as with the operator down)."""
    loop = _RUNNING.get("loop")
    return loop if isinstance(loop, SchedulingLoop) and loop.synced() else None


def _fresh_queues(loop: SchedulingLoop) -> dict[str, Any]:
    """Every Queue, listed from the API server now: a refusal is confirmed
    against this, not against a cache a Queue created a moment ago may not be in yet."""
    path = next(kind.path() for kind in WATCHED if kind.kind == "Queue")
    items = loop.rest.call("GET", path).get("items") or []
    return {str(item["metadata"]["name"]): item for item in items}


def _confirmed(
    loop: SchedulingLoop, check: Callable[[kopf.Body, Mapping[str, Any]], list[Problem]]
) -> Refusals:
    """`check(queues)` with the cache's Queues, then, if it refuses, with fresh ones."""

    def refusals(body: kopf.Body) -> list[Problem]:
        problems = check(body, loop.queue_objects())
        return problems and check(body, _fresh_queues(loop))

    return refusals


def validate_queue(body: kopf.Body, warnings: list[str], **kwargs: Any) -> None:
    """No cycle of parents, children's quotas fit their parent's, and its parent
    does not hold workloads (kai_ray.effects.admission_checks); a parent that
    does not exist yet is a warning."""
    loop = _serving_loop()
    if loop is None:
        return
    pod_groups = loop.pod_group_objects()
    check = _confirmed(loop, lambda obj, queues: queue_refusals(obj, queues, pod_groups))
    _judge("Queue", body, kwargs.get("old"), warnings, check)
    if queue_warnings(body, loop.queue_objects()):
        warnings.extend(queue_warnings(body, _fresh_queues(loop)))


def validate_workload(body: kopf.Body, warnings: list[str], **kwargs: Any) -> None:
    """A workload's queue exists, is a leaf and admits its namespace; a PodGroup's
    spec holds together (no subgroup cycle)."""
    loop = _serving_loop()
    if loop is None:
        return
    scheduler = loop.scheduler
    check = _confirmed(loop, lambda obj, queues: workload_refusals(obj, queues, scheduler))
    _judge(str(body.get("kind")), body, kwargs.get("old"), warnings, check)


def validate_topology(body: kopf.Body, warnings: list[str], **kwargs: Any) -> None:
    """A Topology's level names are each used once, as a label or an alias."""
    _judge("Topology", body, kwargs.get("old"), warnings, topology_refusals)


#: How many connections kopf's own requests to the API server may hold at once:
#: its watches (one per kind in `PLURALS`) and its writes of progress and diff
#: base. Its built-in session has no bound: a thousand Queues created at once
#: opened up to 438 TLS connections, each with its own read buffer, kept while
#: idle, and the operator's resident memory varied by a hundred MiB from run to
#: run (docs/reliability.md). Requests past the bound wait for a free connection.
API_CONNECTIONS = 16


@kopf.on.login()
async def login(**kwargs: Any) -> kopf.AiohttpSession | None:
    # In a pod: the service account; elsewhere: $KUBECONFIG (or ~/.kube/config).
    info: kopf.ConnectionInfo | None = kopf.login_with_service_account(**kwargs)
    info = info or kopf.login_with_kubeconfig(**kwargs)
    return None if info is None else bounded_session(info)


def bounded_session(info: kopf.ConnectionInfo) -> kopf.AiohttpSession:
    """kopf's session for `info`, as kopf would make it, with at most
    `API_CONNECTIONS` connections. Made within the operator's event loop."""
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=API_CONNECTIONS, ssl=info.as_ssl_context()),
        headers=info.as_http_headers(),
        proxy=info.proxy_url,
        trust_env=info.trust_env,
    )
    return kopf.AiohttpSession(
        server=info.server,
        default_namespace=info.default_namespace,
        priority=info.priority,
        expiration=info.expiration,
        aiohttp_session=session,
    )


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
