"""The one module that talks to the Kubernetes API.

- `connect`: an API client from the in-cluster service account or `$KUBECONFIG`;
- `Informer`: list, then watch, one kind of object, handing plain dicts to a
  callback (no client models: decoding 20,000 pods into them costs seconds);
  a watch that expires (`410 Gone`) or breaks is followed by a fresh list that
  replaces the kind whole, so deletions missed meanwhile are not kept;
- `KubeWriter`: the binder's writer protocol on the API (Binding, Eviction,
  gate lifts, ResourceClaim allocations and releases, PodGroup status, Events),
  mapping API errors to retry or not;
- `LeaseElector`: leader election on a `coordination.k8s.io` Lease;
- small reads and writes the operator needs (PodGroups, statuses, suspend);
- `read_cluster` and `object_events`: one read of every watched kind, and the
  Events of one object, for the commands that only look (`explain`, `snapshot`).

Everything else in kai-ray is handed plain objects and never imports the client.
"""

from __future__ import annotations

import collections
import datetime as dt
import enum
import functools
import itertools
import logging
import math
import os
import queue
import random
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import orjson
import urllib3
from kubernetes import client, config

from kai_ray.decisions.plan import Bind, Evict, GroupStatus
from kai_ray.decisions.stale import stale_condition
from kai_ray.effects.binder import DONE, Outcome, WriteResult
from kai_ray.effects.reporting import merge_condition
from kai_ray.state.cache import CLAIM_TEMPLATE, DEVICE_CLASS, RESOURCE_CLAIM, RESOURCE_SLICE
from kai_ray.state.dra_allocate import ClaimAllocation
from kai_ray.state.dra_status import ClaimWrite, Consumer, allocation_write, release_write
from kai_ray.values.api import GROUP, VERSION
from kai_ray.values.dra import DRA_API_VERSION, ResourceClaim
from kai_ray.values.errors import ObjectRef, UnavailableError
from kai_ray.values.names import ADMITTED_NODES_ANNOTATION
from kai_ray.values.validation import parse_model

LOG = logging.getLogger("kai_ray.kube")
Obj = dict[str, Any]
#: Who writes Events and conditions.
COMPONENT = "kai-ray"
DISRUPTION_TARGET = "DisruptionTarget"
MERGE_PATCH = "application/merge-patch+json"
CRD_BASE = f"/apis/{GROUP}/{VERSION}"


class ApiError(Exception):
    """A request the API server refused; `status` is its HTTP status."""

    def __init__(self, status: int, reason: str, body: str = "") -> None:
        super().__init__(f"{status} {reason}: {body[:300]}")
        self.status, self.reason, self.body = status, reason, body


class Unreachable(ApiError):
    """The API server could not be reached (refused, reset, timed out): a 503 to
    every writer, which tries again later, never an exception out of a cycle."""

    def __init__(self, err: Exception) -> None:
        super().__init__(503, "Unreachable", _first_line(err))


def connect(kubeconfig: str | None = None, pool_size: int = 64) -> Rest:
    """A client: the pod's service account in a cluster, else the kubeconfig.

    One pool serves the operator's long-lived watches (one per kind), its 32
    binders, four bookkeeping writers and the loop's own reads: 64 connections
    leave none of them waiting."""
    configuration = client.Configuration()
    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    else:
        # $KUBECONFIG read now: the client reads it once, when it is imported
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=kubeconfig or os.environ.get("KUBECONFIG"),
            client_configuration=configuration,
        )
    configuration.connection_pool_maxsize = pool_size
    return Rest(client.ApiClient(configuration))


class Rest:
    """Plain JSON requests on the client's connection pool and credentials.

    kai-ray reads and writes plain objects; the client's generated models would
    decode every pod into Python objects (seconds at 20,000 pods) and refuse
    some replies outright (a Binding's), so they are not used. Nor is the
    client's request path: it serialises every body through its models' code
    and reads the credentials again on each request, which in a burst of binds
    costs more than the request. The credentials (a bearer token, which a
    service account's file or an exec plugin renews) are read again every
    `AUTH_REFRESH_S` seconds, and at once after a 401."""

    AUTH_REFRESH_S = 30.0

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self._pool = api.rest_client.pool_manager
        self._host = str(api.configuration.host).rstrip("/")
        self._auth: dict[str, str] = {}
        self._auth_read = -math.inf
        self._auth_lock = threading.Lock()

    def _credentials(self, again: bool = False) -> dict[str, str]:
        now = time.monotonic()
        if again or now - self._auth_read > self.AUTH_REFRESH_S:
            with self._auth_lock:
                settings = self.api.configuration.auth_settings().values()
                self._auth = {
                    str(s["key"]): str(s["value"])
                    for s in settings
                    if s.get("in") == "header" and s.get("value")
                }
                self._auth_read = now
        return self._auth

    def raw(
        self,
        method: str,
        path: str,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float = 30.0,
    ) -> urllib3.BaseHTTPResponse:
        """The response, unread (for watches); raises ApiError for a refusal."""
        params = {k: v for k, v in (query or {}).items() if v is not None}
        url = self._host + path + (f"?{urllib.parse.urlencode(params)}" if params else "")
        data = None if body is None else orjson.dumps(body)
        for attempt in (1, 2):
            headers = {
                "Accept": "application/json",
                "Content-Type": content_type,
                **self._credentials(again=attempt == 2),
            }
            try:
                response = self._pool.request(
                    method,
                    url,
                    body=data,
                    headers=headers,
                    preload_content=False,
                    timeout=urllib3.Timeout(total=timeout),
                )
            except (urllib3.exceptions.HTTPError, OSError) as err:
                raise Unreachable(err) from err
            if 200 <= response.status < 300:
                return response
            text = response.read().decode(errors="replace")
            response.release_conn()
            if response.status != 401 or attempt == 2:
                raise ApiError(response.status, str(response.reason), text)
        raise AssertionError("unreachable")

    def call(
        self,
        method: str,
        path: str,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> Any:
        """The decoded JSON reply; raises ApiError for a refusal."""
        response = self.raw(method, path, query, body, content_type)
        try:
            data = response.read()
        except (urllib3.exceptions.HTTPError, OSError) as err:
            raise Unreachable(err) from err
        finally:
            response.release_conn()
        return orjson.loads(data) if data else {}


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# ------------------------------------------------------------------ reading


@dataclass(frozen=True)
class Kind:
    """A kind the operator watches: its name, and where to list it cluster-wide."""

    kind: str
    api_version: str
    plural: str

    def path(self) -> str:
        base = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        return f"{base}/{self.plural}"


WATCHED = (
    Kind("Node", "v1", "nodes"),
    Kind("Pod", "v1", "pods"),
    Kind("Queue", f"{GROUP}/{VERSION}", "queues"),
    Kind("PodGroup", f"{GROUP}/{VERSION}", "podgroups"),
    Kind("Topology", f"{GROUP}/{VERSION}", "topologies"),
    Kind("Job", "batch/v1", "jobs"),
    Kind("RayCluster", "ray.io/v1", "rayclusters"),
    Kind("RayJob", "ray.io/v1", "rayjobs"),
    # NVIDIA Grove's gangs (its PodCliqueSets are Grove's to turn into PodGangs)
    Kind("PodGang", "scheduler.grove.io/v1alpha1", "podgangs"),
    # Dynamic Resource Allocation (docs/dra.md); an API server without it answers 404
    Kind(DEVICE_CLASS, DRA_API_VERSION, "deviceclasses"),
    Kind(RESOURCE_SLICE, DRA_API_VERSION, "resourceslices"),
    Kind(RESOURCE_CLAIM, DRA_API_VERSION, "resourceclaims"),
    Kind(CLAIM_TEMPLATE, DRA_API_VERSION, "resourceclaimtemplates"),
)

#: (kind, objects) after a full list; (kind, event type, object) for each change.
OnList = Callable[[str, list[Obj]], None]
OnEvent = Callable[[str, str, Obj], None]


class Informer(threading.Thread):
    """Lists one kind, then watches it from that version, until `stop`."""

    def __init__(
        self,
        rest: Rest,
        kind: Kind,
        on_list: OnList,
        on_event: OnEvent,
        stop: threading.Event,
        page_size: int = 1000,
    ) -> None:
        super().__init__(name=f"informer-{kind.plural}", daemon=True)
        self.rest, self.kind, self.stop = rest, kind, stop
        self.on_list, self.on_event = on_list, on_event
        self.page_size = page_size
        #: Set after the first complete list (readiness).
        self.synced = threading.Event()
        #: Why the kind cannot be listed now (a missing CRD, no permission), if so.
        self.problem: str | None = None

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                version = self._list()
                self.problem = None
                self._watch(version)
            except ApiError as err:
                if isinstance(err, Unreachable):
                    LOG.warning("watch of %s broke: %s; listing again", self.kind.plural, err)
                    self.stop.wait(1.0)
                    continue
                problem = f"{self.kind.plural}: {err.status} {err.reason}"
                if problem != self.problem and err.status == 404:  # said once
                    # an optional kind not served here: a CRD not installed (KubeRay,
                    # Grove), or resource.k8s.io not enabled
                    LOG.info("%s not served here; looking again every 30 s", self.kind.plural)
                elif problem != self.problem:
                    LOG.warning("listing %s failed: %s", self.kind.plural, problem)
                self.problem = problem
                absent = err.status in (403, 404)
                if absent:
                    self.synced.set()  # not installed or not allowed: nothing to wait for
                self.stop.wait(30.0 if absent else 5.0)
            except Exception:  # a broken connection: list again after a pause
                LOG.warning("watch of %s broke; listing again", self.kind.plural, exc_info=True)
                self.stop.wait(1.0)

    def _list(self) -> str:
        items: list[Obj] = []
        token: str | None = None
        while True:
            query = {"limit": self.page_size, "continue": token}
            page = self.rest.call("GET", self.kind.path(), query)
            items.extend(self._typed(item) for item in page.get("items") or [])
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                break
        self.on_list(self.kind.kind, items)
        self.synced.set()
        return str((page.get("metadata") or {}).get("resourceVersion") or "")

    def _typed(self, obj: Obj) -> Obj:
        obj.setdefault("kind", self.kind.kind)
        obj.setdefault("apiVersion", self.kind.api_version)
        return obj

    def _watch(self, version: str) -> None:
        while not self.stop.is_set():
            query = {
                "watch": "true",
                "resourceVersion": version,
                "allowWatchBookmarks": "true",
                "timeoutSeconds": 60,
            }
            response = self.rest.raw("GET", self.kind.path(), query, timeout=90)
            for event in _events(response):
                kind, obj = event.get("type", ""), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        return  # expired: list again
                    raise RuntimeError(f"watch error: {obj.get('message')}")
                version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                if kind != "BOOKMARK":
                    self.on_event(self.kind.kind, kind, self._typed(obj))
                if self.stop.is_set():
                    return


def _events(response: urllib3.BaseHTTPResponse) -> Iterator[dict[str, Any]]:
    """A watch's events as they arrive, one JSON object per line."""
    rest = b""
    try:
        for chunk in response.stream(amt=None, decode_content=False):
            *lines, rest = (rest + chunk).split(b"\n")
            for line in lines:
                if line.strip():
                    yield orjson.loads(line)
        if rest.strip():
            yield orjson.loads(rest)
    finally:
        response.release_conn()


# ------------------------------------------------------------ one-off reads


class ClusterReadError(UnavailableError):
    """The cluster cannot be read: no kubeconfig, unreachable, or a refusal; one line."""


def read_cluster(kubeconfig: str | None, kinds: tuple[Kind, ...] = WATCHED) -> dict[str, list[Obj]]:
    """Every object of `kinds`, listed once, by kind. A kind whose API is not
    installed (KubeRay absent) is empty; anything else that stops a list raises
    ClusterReadError."""
    rest = _reader(kubeconfig)
    return {kind.kind: _list_all(rest, kind) for kind in kinds}


def object_events(kubeconfig: str | None, namespace: str, kind: str, name: str) -> list[Obj]:
    """The Events about one object, oldest first."""
    rest = _reader(kubeconfig)
    selector = f"involvedObject.kind={kind},involvedObject.name={name}"
    path = f"/api/v1/namespaces/{namespace}/events"
    events = _guarded(rest, functools.partial(rest.call, "GET", path, {"fieldSelector": selector}))
    items: list[Obj] = list(events.get("items") or [])
    return sorted(items, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))


def _reader(kubeconfig: str | None) -> Rest:
    try:
        return connect(kubeconfig, pool_size=2)
    except Exception as err:  # the client raises several kinds for a bad or missing file
        where = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
        raise ClusterReadError(f"cannot load the kubeconfig {where}: {err}") from None


def _list_all(rest: Rest, kind: Kind) -> list[Obj]:
    items: list[Obj] = []
    token: str | None = None
    while True:
        query = {"limit": 1000, "continue": token}
        try:
            page = _guarded(rest, functools.partial(rest.call, "GET", kind.path(), query))
        except ClusterReadError as err:
            if isinstance(err.__cause__, ApiError) and err.__cause__.status == 404:
                return []  # the kind's API is not installed here
            raise
        for item in page.get("items") or []:
            item.setdefault("kind", kind.kind)
            item.setdefault("apiVersion", kind.api_version)
            items.append(item)
        token = (page.get("metadata") or {}).get("continue")
        if not token:
            return items


def _guarded(rest: Rest, request: Callable[[], Any]) -> Any:
    """The request's answer; a refusal or an unreachable server as ClusterReadError."""
    host = rest.api.configuration.host
    try:
        return request()
    except Unreachable as err:
        raise ClusterReadError(f"cannot reach the API server {host}: {err.body}") from err
    except ApiError as err:
        raise ClusterReadError(f"{host} refused: {err.status} {err.reason}") from err
    except Exception as err:  # urllib3 and socket errors: the server cannot be reached
        raise ClusterReadError(f"cannot reach the API server {host}: {_first_line(err)}") from err


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__


# ------------------------------------------------------------------ writing


def _outcome(err: ApiError) -> Outcome:
    if err.status in (400, 403, 404, 410, 422):
        return Outcome.PERMANENT
    return Outcome.RETRY


def _split(key: str) -> tuple[str, str]:
    namespace, _, name = key.partition("/")
    return namespace, name


def _pod_path(key: str, sub: str = "") -> str:
    namespace, name = _split(key)
    return f"/api/v1/namespaces/{namespace}/pods/{name}{sub}"


PLURALS = {"PodGroup": "podgroups", "Queue": "queues", "Topology": "topologies"}


def crd_path(kind: str, key: str) -> str:
    """The path of one kai-ray object."""
    if kind == "PodGroup":
        namespace, name = _split(key)
        return f"{CRD_BASE}/namespaces/{namespace}/podgroups/{name}"
    return f"{CRD_BASE}/{PLURALS[kind]}/{key}"


class KubeWriter:
    """The binder's writer on the API server. `current` reads an object the cache
    holds (kind, key), so that status patches merge into what is there."""

    def __init__(
        self,
        rest: Rest,
        current: Callable[[str, str], Mapping[str, Any] | None],
        backlog: WriteBacklog | None = None,
    ) -> None:
        self.rest = rest
        self.current = current
        #: Events go out in the back when there is one.
        self.backlog = backlog

    def evict(self, evict: Evict, message: str) -> WriteResult:
        namespace, name = _split(evict.pod)
        reason = "".join(word.title() for word in evict.reason.split("-"))
        condition = {
            "type": DISRUPTION_TARGET,
            "status": "True",
            "reason": f"KaiRay{reason}",
            "message": message,
            "lastTransitionTime": _now(),
        }
        try:
            pod = self.current("Pod", evict.pod) or {}
            conditions = merge_condition((pod.get("status") or {}).get("conditions"), condition)
            patch = {"status": {"conditions": conditions}}
            self.rest.call(
                "PATCH", _pod_path(evict.pod, "/status"), body=patch, content_type=MERGE_PATCH
            )
            body = {
                "apiVersion": "policy/v1",
                "kind": "Eviction",
                "metadata": {"name": name, "namespace": namespace},
            }
            self.rest.call("POST", _pod_path(evict.pod, "/eviction"), body=body)
        except ApiError as err:
            if err.status == 404:
                return DONE  # already gone
            return WriteResult(_outcome(err), f"evicting {evict.pod}: {err.status} {err.reason}")
        return DONE

    def lift_gate(self, pod: str, gate: str) -> WriteResult:
        try:
            live = self.rest.call("GET", _pod_path(pod))
            gates = (live.get("spec") or {}).get("schedulingGates") or []
            kept = [g for g in gates if g.get("name") != gate]
            if len(kept) != len(gates):
                patch = {"spec": {"schedulingGates": kept}}
                self.rest.call("PATCH", _pod_path(pod), body=patch, content_type=MERGE_PATCH)
        except ApiError as err:
            return WriteResult(_outcome(err), f"lifting {gate} of {pod}: {err.status} {err.reason}")
        return DONE

    def bind(self, bind: Bind, annotations: Mapping[str, str]) -> WriteResult:
        namespace, name = _split(bind.pod)
        try:
            # The API server copies a Binding's annotations onto the pod: one request.
            body = {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {
                    "name": name,
                    "namespace": namespace,
                    "annotations": dict(annotations),
                },
                "target": {"apiVersion": "v1", "kind": "Node", "name": bind.node},
            }
            self.rest.call("POST", _pod_path(bind.pod, "/binding"), body=body)
        except ApiError as err:
            if err.status == 409 and self._bound_to(bind) == bind.node:
                return DONE  # applied before (the same plan twice)
            return WriteResult(_outcome(err), f"binding {bind.pod}: {err.status} {err.reason}")
        return DONE

    def _bound_to(self, bind: Bind) -> str | None:
        try:
            live = self.rest.call("GET", _pod_path(bind.pod))
        except ApiError:
            return None
        return (live.get("spec") or {}).get("nodeName")

    def write_group_status(self, status: GroupStatus, now: float) -> WriteResult:
        body: dict[str, Any] = {}
        if status.staleness is not None:
            group = self.current("PodGroup", status.group) or {}
            conditions = (group.get("status") or {}).get("conditions")
            body["conditions"] = merge_condition(conditions, stale_condition(status.staleness, now))
        if status.nominated is not None:  # an empty list clears them (null in a merge patch)
            body["nominatedNodes"] = list(status.nominated) or None
        if not body:
            return DONE
        return self.patch_status("PodGroup", status.group, body)

    def patch_status(self, kind: str, key: str, status: Mapping[str, Any]) -> WriteResult:
        try:
            self.rest.call(
                "PATCH",
                crd_path(kind, key) + "/status",
                body={"status": status},
                content_type=MERGE_PATCH,
            )
        except ApiError as err:
            return WriteResult(_outcome(err), f"status of {kind} {key}: {err.status} {err.reason}")
        return DONE

    def record_event(self, ref: ObjectRef, warning: bool, reason: str, message: str) -> None:
        if self.backlog is not None:
            self.backlog.later(lambda: self._post_event(ref, warning, reason, message))
        else:
            self._post_event(ref, warning, reason, message)

    def _post_event(self, ref: ObjectRef, warning: bool, reason: str, message: str) -> None:
        namespace = ref.namespace or "default"
        now = _now()
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{ref.name}.", "namespace": namespace},
            "involvedObject": self._involved(ref),
            "reason": reason,
            "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": COMPONENT},
            "firstTimestamp": now.split(".")[0] + "Z",
            "lastTimestamp": now.split(".")[0] + "Z",
            "count": 1,
        }
        try:
            self.rest.call("POST", f"/api/v1/namespaces/{namespace}/events", body=body)
        except ApiError as err:
            LOG.debug("event %s on %s not written: %s", reason, ref, err)

    def _involved(self, ref: ObjectRef) -> dict[str, str]:
        """The Event's `involvedObject`, with the uid and apiVersion of the object as
        the cache holds it: `kubectl describe` lists only the Events whose uid is
        the object's."""
        key = ref.name if ref.namespace is None else f"{ref.namespace}/{ref.name}"
        obj = self.current(ref.kind, key) or {}
        involved = {
            "kind": ref.kind,
            "name": ref.name,
            "namespace": ref.namespace or "",
            "apiVersion": str(
                obj.get("apiVersion") or ("v1" if ref.kind == "Pod" else f"{GROUP}/{VERSION}")
            ),
        }
        uid = (obj.get("metadata") or {}).get("uid")
        if uid:
            involved["uid"] = str(uid)
        return involved

    def create_pod_group(self, body: Mapping[str, Any]) -> WriteResult:
        namespace = body["metadata"]["namespace"]
        try:
            self.rest.call("POST", f"{CRD_BASE}/namespaces/{namespace}/podgroups", body=body)
        except ApiError as err:
            if err.status == 409:
                return DONE  # there already: an explicit PodGroup is never overwritten
            return WriteResult(_outcome(err), f"creating PodGroup: {err.status} {err.body}")
        return DONE

    def resume_workload(self, kind: str, key: str, nodes: Sequence[str]) -> WriteResult:
        """Released from suspend, with where its gang was placed (`ADMITTED_NODES_ANNOTATION`)."""
        return self.set_suspend(kind, key, False, {ADMITTED_NODES_ANNOTATION: ",".join(nodes)})

    def set_suspend(
        self, kind: str, key: str, suspend: bool, annotations: Mapping[str, str] | None = None
    ) -> WriteResult:
        namespace, name = _split(key)
        plural = {"RayCluster": "rayclusters", "RayJob": "rayjobs"}[kind]
        path = f"/apis/ray.io/v1/namespaces/{namespace}/{plural}/{name}"
        body: dict[str, Any] = {"spec": {"suspend": suspend}}
        if annotations:
            body["metadata"] = {"annotations": dict(annotations)}
        try:
            self.rest.call("PATCH", path, body=body, content_type=MERGE_PATCH)
        except ApiError as err:
            return WriteResult(_outcome(err), f"suspend of {kind} {key}: {err.status}")
        return DONE

    def write_claim(
        self, namespace: str, name: str, allocation: ClaimAllocation, consumer: Consumer
    ) -> WriteResult:
        """The claim allocated as planned (unless it already is) and reserved for the pod."""

        def write(claim: ResourceClaim) -> ClaimWrite | WriteResult:
            if (claim.metadata.model_extra or {}).get("deletionTimestamp"):
                what = f"ResourceClaim {namespace}/{name}"
                return WriteResult(Outcome.PERMANENT, f"{what} is being deleted")
            planned = _reconciled(claim, allocation)
            if isinstance(planned, WriteResult):
                return planned
            return allocation_write(claim, planned, consumer)

        return self._write_claim(namespace, name, "allocating", write, gone_is_done=False)

    def release_claim(self, namespace: str, name: str, pod_uid: str) -> WriteResult:
        """The pod out of the claim's `reservedFor`; the claim deallocated when nobody
        else holds it. A claim that is gone has nothing to release."""
        return self._write_claim(
            namespace,
            name,
            "releasing",
            lambda claim: release_write(claim, pod_uid),
            gone_is_done=True,
        )

    def _write_claim(
        self,
        namespace: str,
        name: str,
        doing: str,
        write_for: Callable[[ResourceClaim], ClaimWrite | WriteResult],
        gone_is_done: bool,
    ) -> WriteResult:
        """Read the claim, work out the write, send it; a conflict (the pods of a gang
        sharing the claim are bound in parallel) reads the claim again."""
        what = f"{doing} ResourceClaim {namespace}/{name}"
        for attempt in range(1, CLAIM_WRITE_ATTEMPTS + 1):
            try:
                claim = parse_model(
                    ResourceClaim, self.rest.call("GET", _claim_path(namespace, name))
                )
                write = write_for(claim)
                if isinstance(write, WriteResult):
                    return write
                self._send_claim_write(write)
            except ApiError as err:
                if err.status == 404 and gone_is_done:
                    return DONE
                if err.status == 409 and attempt < CLAIM_WRITE_ATTEMPTS:
                    time.sleep(random.uniform(0, CLAIM_CONFLICT_PAUSE_S * attempt))
                    continue
                return WriteResult(_outcome(err), f"{what}: {err.status} {err.reason}")
            except ValueError as err:  # a claim the models refuse, or reserved for too many
                return WriteResult(Outcome.PERMANENT, f"{what}: {err}")
            return DONE
        raise AssertionError("unreachable")

    def _send_claim_write(self, write: ClaimWrite) -> None:
        """The patches in order, each after the first with the version the last one gave."""
        version: str | None = None
        for subresource, body in write.patches():
            if version:
                body = {
                    **body,
                    "metadata": {**body.get("metadata", {}), "resourceVersion": version},
                }
            answer = self.rest.call(
                "PATCH",
                _claim_path(write.namespace, write.name, subresource),
                body=body,
                content_type=MERGE_PATCH,
            )
            version = str((answer.get("metadata") or {}).get("resourceVersion") or "")


#: Reads and writes of one claim before a conflict is left to the next cycle: each
#: conflict means another writer got through, so a gang of 8 sharing a claim fits.
CLAIM_WRITE_ATTEMPTS = 8
#: At most this many seconds, times the attempt, between a conflict and the next read.
CLAIM_CONFLICT_PAUSE_S = 0.02


def _claim_path(namespace: str, name: str, subresource: str = "") -> str:
    sub = f"/{subresource}" if subresource else ""
    return f"/apis/{DRA_API_VERSION}/namespaces/{namespace}/resourceclaims/{name}{sub}"


def _reconciled(claim: ResourceClaim, planned: ClaimAllocation) -> ClaimAllocation | WriteResult:
    """The planned allocation against the claim as it is now. Allocated meanwhile to
    the same devices (another pod of the gang was first, or the same plan twice): only
    reserved. Not allocated (yet, or any longer): allocated with the planned devices,
    as kube-scheduler writes the allocation its own cache holds. Allocated to other
    devices: not overwritten; the next cycle plans with what is there."""
    current = claim.status.allocation
    if current is None:
        return replace(planned, new=True)
    held = {(r.request, r.driver, r.pool, r.device) for r in current.devices.results}
    wanted = {(d.request, d.ref.driver, d.ref.pool, d.ref.device) for d in planned.devices}
    if held == wanted:
        return replace(planned, new=False)
    claim_key = f"{planned.namespace}/{planned.name}"
    return WriteResult(
        Outcome.RETRY, f"ResourceClaim {claim_key} was allocated meanwhile to other devices"
    )


# ------------------------------------------------------------- leader election


class LeaseElector(threading.Thread):
    """Holds a Lease while it can; `leading` says whether this replica schedules.

    The holder renews every `renew_s`; another replica takes the Lease once it
    has not been renewed for `duration_s`. Writes carry the Lease's
    resourceVersion, so two replicas never both win. The holder counts itself
    the leader (`holds`) only while its last renewal is younger than two thirds
    of `duration_s`: a renewal that hangs or fails ends its writes well before
    another replica may take the Lease."""

    def __init__(
        self,
        rest: Rest,
        namespace: str,
        name: str,
        identity: str,
        stop: threading.Event,
        duration_s: int = 10,
        renew_s: float = 2.0,
    ) -> None:
        super().__init__(name="leader-election", daemon=True)
        self.rest = rest
        self.path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        self.namespace, self.lease_name, self.identity = namespace, name, identity
        self.stop, self.duration_s, self.renew_s = stop, duration_s, renew_s
        self.leading = threading.Event()
        #: When the Lease was last won or renewed (monotonic seconds).
        self.renewed_at = -float("inf")
        #: The Lease's uid, once read (Events on the Lease name it).
        self.uid: str | None = None
        self.monotonic: Callable[[], float] = time.monotonic

    def run(self) -> None:
        while not self.stop.is_set():
            self.renew_once()
            self.stop.wait(self.renew_s)

    def renew_once(self) -> None:
        """Take or renew the Lease if this replica may; `leading` says the outcome."""
        started = self.monotonic()
        try:
            won = self._try()
        except Exception as err:
            LOG.warning("lease %s: %s", self.lease_name, err)
            won = False
        if won:
            self.renewed_at = started  # the Lease's renewTime is no earlier
        self._set(won)

    def holds(self) -> bool:
        """Whether this replica leads and may write: it won the Lease and renewed it
        within two thirds of its duration (the rest is the margin before another
        replica may take it)."""
        fresh = self.monotonic() - self.renewed_at < self.duration_s * 2 / 3
        return self.leading.is_set() and fresh

    def _set(self, won: bool) -> None:
        if won != self.leading.is_set():
            LOG.info("%s the lease %s", "took" if won else "lost", self.lease_name)
            (self.leading.set if won else self.leading.clear)()

    def _try(self) -> bool:
        now = dt.datetime.now(dt.UTC)
        try:
            lease = self.rest.call("GET", f"{self.path}/{self.lease_name}")
        except ApiError as err:
            if err.status != 404:
                raise
            body = {"metadata": {"name": self.lease_name}, "spec": self._spec(now, now, 0)}
            try:
                self.rest.call("POST", self.path, body=body)
            except ApiError as race:
                if race.status == 409:
                    return False
                raise
            return True
        self.uid = (lease.get("metadata") or {}).get("uid") or self.uid
        spec = lease.get("spec") or {}
        renewed = _time(spec.get("renewTime") or spec.get("acquireTime")) or now
        expired = (now - renewed).total_seconds() > float(spec.get("leaseDurationSeconds") or 0)
        holder = spec.get("holderIdentity")
        mine = holder == self.identity
        if not mine and not expired and holder:
            return False
        transitions = int(spec.get("leaseTransitions") or 0) + (0 if mine else 1)
        acquired = _time(spec.get("acquireTime")) if mine else None
        lease["spec"] = self._spec(acquired or now, now, transitions)
        try:
            self.rest.call("PUT", f"{self.path}/{self.lease_name}", body=lease)
        except ApiError as err:
            if err.status == 409:
                return False  # another replica wrote first
            raise
        return True

    def _spec(self, acquired: dt.datetime, renewed: dt.datetime, transitions: int) -> Obj:
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": self.duration_s,
            "acquireTime": _micro(acquired),
            "renewTime": _micro(renewed),
            "leaseTransitions": transitions,
        }

    def release(self) -> None:
        """Give the Lease up on a clean stop, so another replica need not wait it out."""
        if not self.leading.is_set():
            return
        self.leading.clear()
        try:
            lease = self.rest.call("GET", f"{self.path}/{self.lease_name}")
            spec = lease.get("spec") or {}
            if spec.get("holderIdentity") == self.identity:
                spec["holderIdentity"] = None
                self.rest.call("PUT", f"{self.path}/{self.lease_name}", body=lease)
        except ApiError as err:
            LOG.debug("lease %s not released: %s", self.lease_name, err)


def _micro(moment: dt.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _time(text: str | None) -> dt.datetime | None:
    if not text:
        return None
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


# ------------------------------------------------------------- writes in the back


class Urgency(enum.IntEnum):
    """Which background write goes first when several wait: binds, then the
    PodGroups a status or a bind's gang needs, then statuses, then Events."""

    BIND = 0
    CREATE = 1
    STATUS = 2
    EVENT = 3


class WriteBacklog:
    """Writes made by worker threads in the back: binds by `workers` threads of their
    own, first come first served; the rest (PodGroup creations, statuses, Events:
    what need not hold a cycle up) by `bookkeepers` threads, most urgent first
    (`Urgency`). Bookkeeping thus never takes a writer from a bind; and while
    binds wait or go out, only the first bookkeeper works (the others wait for the
    binds to be done), so that in a burst the binds have the API server, and the
    operator's interpreter, nearly to themselves, and bookkeeping still moves. A
    status queued for an object replaces one queued before it and not yet written:
    only the latest is sent. A status settles before it is queued at all: it
    waits until it has not changed for `status_settle_s`, and at most
    `SETTLE_AT_MOST` times that since it first waited (what changes meanwhile is
    written once). In a burst a gang's status goes Admitted, then bound, then
    Running within a few seconds, and the API server was sent all three."""

    def __init__(
        self,
        workers: int,
        stop: threading.Event,
        bookkeepers: int = 4,
        status_settle_s: float = 0.0,
    ) -> None:
        self._stop = stop
        self._binds: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._queue: queue.PriorityQueue[_Queued] = queue.PriorityQueue()
        self._order = itertools.count()
        self._statuses: dict[tuple[str, str], Callable[[], None]] = {}
        self._settle_s = status_settle_s
        #: Statuses settling, (when due as first put, object), in about the order
        #: they are due; and when each is due now (put off by each change).
        self._settling: collections.deque[tuple[float, tuple[str, str]]] = collections.deque()
        self._due: dict[tuple[str, str], tuple[float, float]] = {}
        self._lock = threading.Lock()
        #: Binds queued or going out.
        self._binding = 0
        self._threads = [
            threading.Thread(target=self._bind, name=f"binder-{i}", daemon=True)
            for i in range(workers)
        ] + [
            threading.Thread(
                target=self._keep_books, args=(i == 0,), name=f"writer-{i}", daemon=True
            )
            for i in range(bookkeepers)
        ]
        for thread in self._threads:
            thread.start()

    def status(self, kind: str, key: str, write: Callable[[], None], settle: bool = True) -> None:
        """Queue the write of an object's status (replacing one not yet sent), once
        it has settled unless `settle` is False."""
        target = (kind, key)
        with self._lock:
            queued = target in self._statuses
            self._statuses[target] = write
            now = time.monotonic()
            if target in self._due:  # settling: put off again, up to the most
                first, _ = self._due[target]
                latest = first + SETTLE_AT_MOST * self._settle_s
                self._due[target] = (first, min(now + self._settle_s, latest))
                return
            if not queued and settle and self._settle_s > 0:
                self._due[target] = (now, now + self._settle_s)
                self._settling.append((now + self._settle_s, target))
                return
        if not queued:
            self._put(Urgency.STATUS, target)

    def later(self, write: Callable[[], None], urgency: Urgency = Urgency.EVENT) -> None:
        if urgency is Urgency.BIND:
            with self._lock:
                self._binding += 1
            self._binds.put(write)
        else:
            self._put(urgency, write)

    def pending(self) -> int:
        return self._binds.qsize() + self._queue.qsize() + len(self._settling)

    @property
    def binding(self) -> int:
        """Binds queued or going out."""
        return self._binding

    def _put(self, urgency: Urgency, item: tuple[str, str] | Callable[[], None]) -> None:
        self._queue.put(_Queued(urgency, next(self._order), item))

    def _bind(self) -> None:
        while not self._stop.is_set():
            try:
                write = self._binds.get(timeout=0.5)
            except queue.Empty:
                continue
            try:
                _run(write)
            finally:
                with self._lock:
                    self._binding -= 1

    def _settled(self) -> float:
        """Queue the statuses due by now; how long until the next is (at most 0.5 s)."""
        with self._lock:
            now = time.monotonic()
            while self._settling and self._settling[0][0] <= now:
                target = self._settling.popleft()[1]
                due = self._due[target][1]
                if due > now:
                    self._settling.append((due, target))  # changed since: later
                    continue
                del self._due[target]
                self._put(Urgency.STATUS, target)
            return min(self._settling[0][0] - now, 0.5) if self._settling else 0.5

    def _keep_books(self, always: bool) -> None:
        while not self._stop.is_set():
            if not always and self._binding:
                self._stop.wait(BOOKS_PAUSE_S)
                continue
            try:
                queued = self._queue.get(timeout=self._settled())
            except queue.Empty:
                continue
            if not always and self._binding:
                self._queue.put(queued)  # binds came while it waited: back, in its place
                continue
            item = queued.item
            if isinstance(item, tuple):
                with self._lock:
                    write = self._statuses.pop(item, None)
                if write is None:
                    continue
            else:
                write = item
            _run(write)


#: A settling status waits at most this many settle periods since it first waited.
SETTLE_AT_MOST = 5
#: How often a waiting bookkeeper looks whether the binds are done.
BOOKS_PAUSE_S = 0.05


def _run(write: Callable[[], None]) -> None:
    try:
        write()
    except Exception:
        LOG.warning("a background write failed", exc_info=True)


@dataclass(order=True, frozen=True)
class _Queued:
    urgency: Urgency
    #: First come, first served within one urgency.
    order: int
    item: tuple[str, str] | Callable[[], None] = field(compare=False)
