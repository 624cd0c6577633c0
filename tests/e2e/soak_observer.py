"""The soak's eyes: its own watches of the cluster, and a sample of it twice a second.

`Mirror` lists, then watches, one kind with the `kubernetes` client (not with
kai-ray's informer: the checker must not share the code it checks), and lists
again after any break, an API-server restart included. `Observer` holds the
mirrors of the soak's pods, nodes, PodGroups and RayClusters and:

- calls the armed `triggers` on every bind it sees (a fault that must land
  between the binds of one gang waits for one);
- records, for every pod kai-ray marks for eviction (its `DisruptionTarget`
  condition), the reason and what the pod's queue held at that moment;
- samples the cluster every `SAMPLE_S`: whether the scheduler could act (a
  leader holds the Lease and is ready), gangs pending that fit, gangs partly
  bound, overcommitted nodes; each gang's time in one of those states is an
  `Episode`, whose length counts only the time the scheduler could act.

Judging a sample is `soak_oracle`'s business.
"""

from __future__ import annotations

import collections
import contextlib
import re
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client, watch

from . import soak_oracle as oracle

LOG = logging.getLogger("soak.observer")
SAMPLE_S = 0.5
DISRUPTION_TARGET = "DisruptionTarget"
#: (event type, the object before, the object now); before is None when it is new.
OnChange = Callable[[str, dict[str, Any] | None, dict[str, Any]], None]
#: Called on each bind: (pod, node, the gang's members as mirrored now).
Trigger = Callable[[oracle.PodView, str, list[oracle.PodView]], bool]


class Mirror(threading.Thread):
    """One kind, listed then watched into `objects` (by namespace/name)."""

    def __init__(
        self,
        name: str,
        lister: Callable[..., Any],
        keep: Callable[[Mapping[str, Any]], bool],
        stop: threading.Event,
        on_change: OnChange | None = None,
    ) -> None:
        super().__init__(name=f"soak-mirror-{name}", daemon=True)
        self.lister, self.keep, self.stop, self.on_change = lister, keep, stop, on_change
        self.objects: dict[str, dict[str, Any]] = {}
        self.lock = threading.Lock()
        self.synced = threading.Event()
        self.lists = 0

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self._watch(self._list())
            except Exception as err:  # a restart of the API server, an expired version
                LOG.debug("%s: %s; listing again", self.name, err)
                self.stop.wait(0.5)

    def values(self) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.objects.values())

    def _list(self) -> str:
        answer = json.loads(self.lister(_preload_content=False, _request_timeout=30).data)
        items = {_key(o): o for o in answer.get("items") or () if self.keep(o)}
        with self.lock:
            gone = [o for k, o in self.objects.items() if k not in items]
            before = dict(self.objects)
            self.objects = items
        self.lists += 1
        self.synced.set()
        for obj in gone:
            self._changed("DELETED", obj, obj)
        for key, obj in items.items():
            if before.get(key) != obj:
                self._changed("MODIFIED" if key in before else "ADDED", before.get(key), obj)
        return str(answer["metadata"]["resourceVersion"])

    def _watch(self, version: str) -> None:
        while not self.stop.is_set():
            stream = watch.Watch().stream(
                self.lister,
                resource_version=version,
                timeout_seconds=30,
                allow_watch_bookmarks=True,
                _request_timeout=60,
            )
            for event in stream:
                obj = event["raw_object"]
                version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                if event["type"] == "ERROR":
                    raise RuntimeError(f"watch error: {obj}")
                if event["type"] == "BOOKMARK" or not self.keep(obj):
                    continue
                self._apply(event["type"], obj)
                if self.stop.is_set():
                    return

    def _apply(self, kind: str, obj: dict[str, Any]) -> None:
        key = _key(obj)
        with self.lock:
            before = self.objects.get(key)
            if kind == "DELETED":
                self.objects.pop(key, None)
            else:
                self.objects[key] = obj
        self._changed(kind, before, obj)

    def _changed(self, kind: str, before: dict[str, Any] | None, obj: dict[str, Any]) -> None:
        if self.on_change is not None:
            try:
                self.on_change(kind, before, obj)
            except Exception:
                LOG.exception("%s: a change handler failed", self.name)


def _key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace') or ''}/{meta.get('name')}"


@dataclass
class Episode:
    """A gang's stretch in one state (pending that fits, or partly bound)."""

    gang: str
    state: str
    started: float
    last: float
    #: Seconds of it during which the scheduler could act.
    counted_s: float = 0.0
    #: The same in cycles: each stretch divided by the length of a cycle then.
    cycles: float = 0.0
    why: str = ""
    #: The gang's pods and its PodGroup's reason when it first outlasted three cycles.
    detail: str = ""

    @property
    def length_s(self) -> float:
        return self.last - self.started


@dataclass
class Sample:
    at: float
    available: bool
    fit_pending: int
    partial: int
    overcommitted: list[str]
    #: The age of the oldest open episode of each state at this sample.
    oldest_fit_s: float = 0.0
    oldest_partial_s: float = 0.0


@dataclass
class EvictionSeen:
    """A pod kai-ray marked for eviction, and its queue then."""

    pod: str
    queue: str
    reason: str
    at: float
    gpus: float
    owned: bool
    #: What the queue held when the pod was marked, less pods kai-ray had
    #: evicted before (which no longer count for its share).
    queue_held: float
    #: GPUs the queue let go of (finished, deleted by the soak) in the last
    #: moments before: changes the cycle that chose this pod could not have seen.
    recently_released: float
    #: What the queue held counting pods on their way out too (as kai-ray counts).
    queue_held_with_leaving: float = 0.0
    #: kai-ray's own view then: the Queue's status.allocated and fairShare (GPUs).
    status_allocated: str = ""
    status_fair_share: str = ""
    #: Every queue's status then: allocated / requested / fair share (GPUs).
    queues_then: str = ""
    #: When it was marked (wall clock, to meet the audit log's binds).
    wall: float = 0.0
    #: The queue's pods `queue_held` counted: a bind of another of its pods close to
    #: the mark may be one the cycle had made already (`checker.in_flight_binds`).
    counted: frozenset[str] = frozenset()
    #: What the cycle said the queue keeps of its GPUs once its victims are gone
    #: (the condition's message, `Evict.standing`); None when it said nothing.
    cycle_kept: float | None = None


@dataclass
class Observer:
    """Mirrors of the soak's objects, the samples, the episodes; see the module docstring."""

    api: client.ApiClient
    namespaces: frozenset[str]
    pool_label: tuple[str, str]
    queue_of_namespace: Mapping[str, str]
    queues: Mapping[str, oracle.QueueView]
    topology_levels: Mapping[str, str]
    #: Whether the scheduler can act now (a ready leader holds the Lease).
    available: Callable[[], bool]
    #: Seconds a gang may wait with a fit while the scheduler can act (three cycles).
    patience_s: Callable[[], float]
    #: The length of one cycle now (seconds).
    cycle_s: Callable[[], float]
    stop: threading.Event = field(default_factory=threading.Event)
    triggers: list[Trigger] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    episodes: list[Episode] = field(default_factory=list)
    open: dict[tuple[str, str], Episode] = field(default_factory=dict)
    evictions: list[EvictionSeen] = field(default_factory=list)
    overcommits: list[tuple[float, str]] = field(default_factory=list)
    #: Each overcommit line, when first seen and the pods holding its node then.
    overcommit_seen: dict[str, tuple[float, list[str]]] = field(default_factory=dict)
    #: Gangs that fit only on room held for admitted workloads (`oracle.admitted_room`):
    #: when each was first and last seen so, with the nodes held when first seen. How
    #: much that rule spared, and for how long.
    fit_only_on_held: dict[str, tuple[float, float, list[str]]] = field(default_factory=dict)
    #: Releases whose hold ended (`oracle.admitted_room`'s `ended`).
    holds_ended: set[tuple[str, float]] = field(default_factory=set)
    #: Gangs the soak deleted (their pods going is not a fault of the scheduler).
    deleted: set[str] = field(default_factory=set)
    #: The gang of every pod seen, by pod key (the audit log names pods only).
    gang_of_pod: dict[str, str] = field(default_factory=dict)
    #: The GPUs every pod seen asks for, by pod key.
    gpus_of_pod: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        core = client.CoreV1Api(self.api)
        custom = client.CustomObjectsApi(self.api)

        def ours(obj: Mapping[str, Any]) -> bool:
            return (obj.get("metadata") or {}).get("namespace") in self.namespaces

        def pooled(obj: Mapping[str, Any]) -> bool:
            labels = (obj.get("metadata") or {}).get("labels") or {}
            return bool(labels.get(self.pool_label[0]) == self.pool_label[1])

        def listing(plural: str, group: str, version: str) -> Callable[..., Any]:
            def lister(**kwargs: Any) -> Any:
                return custom.list_cluster_custom_object(group, version, plural, **kwargs)

            return lister

        self.pods = Mirror("pods", core.list_pod_for_all_namespaces, ours, self.stop, self._pod)
        self.nodes = Mirror("nodes", core.list_node, pooled, self.stop)
        self.groups = Mirror(
            "podgroups", listing("podgroups", "scheduling.kai-ray.io", "v1alpha1"), ours, self.stop
        )
        self.rays = Mirror("rayclusters", listing("rayclusters", "ray.io", "v1"), ours, self.stop)
        self.rayjobs = Mirror("rayjobs", listing("rayjobs", "ray.io", "v1"), ours, self.stop)

        def mine(obj: Mapping[str, Any]) -> bool:
            return _name(obj) in self.queues

        self.queue_mirror = Mirror(
            "queues", listing("queues", "scheduling.kai-ray.io", "v1alpha1"), mine, self.stop
        )
        self.lock = threading.Lock()
        self._admitted_seen: dict[tuple[str, tuple[str, ...]], float] = {}
        self._released: collections.deque[tuple[float, str, float]] = collections.deque()
        self._sampler = threading.Thread(target=self._sample_loop, name="soak-sampler", daemon=True)

    def start(self) -> None:
        for mirror in self.mirrors():
            mirror.start()
        for mirror in self.mirrors():
            mirror.synced.wait(60)
        self._sampler.start()

    def close(self) -> None:
        self.stop.set()
        self._sampler.join(5)
        for state, episode in list(self.open.items()):
            self.episodes.append(episode)
            del self.open[state]

    def mirrors(self) -> list[Mirror]:
        return [self.pods, self.nodes, self.groups, self.rays, self.rayjobs, self.queue_mirror]

    def admitted(self, now: float) -> dict[str, tuple[float, tuple[str, ...]]]:
        """Released workloads' admitted nodes (`oracle.admitted_nodes`) by gang, each
        with when this release was first seen."""
        found = {}
        for kind, mirror in (("RayCluster", self.rays), ("RayJob", self.rayjobs)):
            for workload in mirror.values():
                nodes = oracle.admitted_nodes(workload)
                if nodes:
                    gang = oracle.workload_gang(workload, kind)
                    seen = self._admitted_seen.setdefault((gang, nodes), now)
                    found[gang] = (seen, nodes)
        return found

    def queue_line(self) -> str:
        """allocated/requested/fair share of GPUs of every queue, from their statuses."""
        said = []
        for name, obj in sorted(self.queue_objects.items()):
            status = obj.get("status") or {}
            amounts = [
                str((status.get(k) or {}).get("gpu", "-"))
                for k in ("allocated", "requested", "fairShare")
            ]
            said.append(f"{name}={'/'.join(amounts)}")
        return " ".join(said)

    @property
    def queue_objects(self) -> dict[str, dict[str, Any]]:
        return {_name(q): q for q in self.queue_mirror.values()}

    # ----------------------------------------------------------------- views

    def rayjob_of(self) -> dict[tuple[str, str], str]:
        owners = {}
        for cluster in self.rays.values():
            meta = cluster.get("metadata") or {}
            for owner in meta.get("ownerReferences") or ():
                if owner.get("kind") == "RayJob":
                    owners[(str(meta.get("namespace")), str(meta.get("name")))] = owner["name"]
        return owners

    def view(self) -> tuple[list[oracle.PodView], dict[str, oracle.NodeView]]:
        owners = self.rayjob_of()
        pods = [oracle.read_pod(p, owners) for p in self.pods.values()]
        nodes = {n.name: n for n in map(oracle.read_node, self.nodes.values())}
        return pods, nodes

    def gangs(self) -> dict[str, oracle.GangView]:
        found = {}
        for group in self.groups.values():
            gang = oracle.read_gang(group, self.topology_levels)
            if not gang.queue:
                namespace = gang.key.partition("/")[0]
                gang = oracle.GangView(
                    gang.key, self.queue_of_namespace.get(namespace, ""), gang.min_member, None
                )
            found[gang.key] = gang
        return found

    def queue_of(
        self, gangs: Mapping[str, oracle.GangView], pods: list[oracle.PodView]
    ) -> dict[str, str]:
        return {
            p.gang: (
                gangs[p.gang].queue if p.gang in gangs else self.queue_of_namespace[p.namespace]
            )
            for p in pods
        }

    # ----------------------------------------------------------- pod changes

    def _pod(self, kind: str, before: dict[str, Any] | None, obj: dict[str, Any]) -> None:
        was = oracle.read_pod(before, {}) if before else None
        now = oracle.read_pod(obj, self.rayjob_of())
        self.gang_of_pod[now.key] = now.gang
        if kind != "DELETED" and now.node and (was is None or not was.node):
            self._bound(now)
        if kind != "DELETED":
            self.gpus_of_pod[now.key] = now.gpu_amount
        reason = _kai_ray_reason(obj)
        if reason and not (before and _kai_ray_reason(before)):
            self._marked(now, reason, _kept_gpus(obj))
        holding_before = was is not None and was.holds and not was.deleting
        holding_now = kind != "DELETED" and now.holds and not now.deleting
        if holding_before and not holding_now and not reason:
            queue = self.queue_of_namespace.get(now.namespace, "")
            with self.lock:
                self._released.append((time.monotonic(), queue, now.gpu_amount))

    def _bound(self, pod: oracle.PodView) -> None:
        pods, _ = self.view()
        members = [p for p in pods if p.gang == pod.gang]
        for trigger in list(self.triggers):
            if trigger(pod, str(pod.node), members):
                with contextlib.suppress(ValueError):
                    self.triggers.remove(trigger)

    def _marked(self, pod: oracle.PodView, reason: str, cycle_kept: float | None) -> None:
        """What the pod's queue held when kai-ray chose it, less earlier victims."""
        queue = self.queue_of_namespace.get(pod.namespace, "")
        now, wall = time.monotonic(), time.time()
        held = with_leaving = 0.0
        counted = set()
        for obj in self.pods.values():
            other = oracle.read_pod(obj, {})
            if other.namespace != pod.namespace or not other.holds:
                continue
            with_leaving += other.gpu_amount
            earlier = _kai_ray_reason(obj) and other.key != pod.key
            if not other.deleting and not earlier:
                held += other.gpu_amount
                counted.add(other.key)
        status = next(
            (q.get("status") or {} for q in self.queue_objects.values() if _name(q) == queue), {}
        )
        with self.lock:
            window = now - 3 * self.patience_s()
            while self._released and self._released[0][0] < window:
                self._released.popleft()
            released = sum(g for _, q, g in self._released if q == queue)
        seen = EvictionSeen(
            pod.key,
            queue,
            reason,
            now,
            pod.gpu_amount,
            pod.owned,
            held,
            released,
            with_leaving,
            str((status.get("allocated") or {}).get("gpu", "")),
            str((status.get("fairShare") or {}).get("gpu", "")),
            self.queue_line(),
            wall,
            frozenset(counted),
            cycle_kept,
        )
        self.evictions.append(seen)

    # -------------------------------------------------------------- sampling

    def _sample_loop(self) -> None:
        last = time.monotonic()
        while not self.stop.wait(SAMPLE_S):
            now = time.monotonic()
            try:
                self.sample(now, now - last)
            except Exception:
                LOG.exception("a sample failed")
            last = now

    def sample(self, now: float, elapsed: float) -> Sample:
        available = self.available()
        pods, nodes = self.view()
        gangs = self.gangs()
        members = {k: v for k, v in oracle.by_gang(pods).items() if k not in self.deleted}
        queue_of = self.queue_of(gangs, pods)
        usage = oracle.node_usage(nodes.values(), pods)
        allocated = oracle.queue_allocations(pods, queue_of, self.queues)
        holders: dict[str, str] = {}
        admitted = self.admitted(now)
        held = oracle.admitted_room(admitted, members, now, self.holds_ended, holders)
        fitting = oracle.fit_pending(members, gangs, nodes, usage, self.queues, allocated, held)
        if held:
            anywhere = oracle.fit_pending(members, gangs, nodes, usage, self.queues, allocated)
            for gang in anywhere.keys() - fitting.keys():
                by = sorted({f"{node} by {holders[node]}" for node in held})
                first, _, held_then = self.fit_only_on_held.get(gang, (now, now, by))
                self.fit_only_on_held[gang] = (first, now, held_then)
        partial = oracle.partial_gangs(members, gangs, nodes)
        over = oracle.overcommitted(nodes.values(), usage)
        self.overcommits.extend((now, line) for line in over)
        for line in over:
            self.overcommit_seen.setdefault(line, (now, _holding(line, pods)))
        sample = Sample(now, available, len(fitting), len(partial), over)
        for state, found in (("fit", fitting), ("partial", partial)):
            oldest = self._track(state, found, now, elapsed if available else 0.0)
            if state == "fit":
                sample.oldest_fit_s = oldest
            else:
                sample.oldest_partial_s = oldest
        self.samples.append(sample)
        return sample

    def _track(self, state: str, found: Mapping[str, str], now: float, counted: float) -> float:
        """Extend, open and close the episodes of one state; the oldest counted age."""
        for (kind, gang), episode in list(self.open.items()):
            if kind == state and gang not in found:
                self.episodes.append(episode)
                del self.open[(kind, gang)]
        oldest = 0.0
        for gang, why in found.items():
            episode = self.open.get((state, gang))
            if episode is None:
                episode = self.open[(state, gang)] = Episode(gang, state, now, now, why=why)
            else:
                episode.last, episode.why = now, why
                episode.counted_s += counted
                episode.cycles += counted / self.cycle_s()
                if not episode.detail and episode.cycles > 3:
                    episode.detail = self.describe(gang)
            oldest = max(oldest, episode.counted_s)
        return oldest

    def describe(self, gang: str) -> str:
        """The gang's pods (phase, node, gates) and what its PodGroup says."""
        pods = [
            f"{_name(p)}:{(p.get('status') or {}).get('phase')}"
            f"@{(p.get('spec') or {}).get('nodeName') or '-'}"
            f"{'+gated' if (p.get('spec') or {}).get('schedulingGates') else ''}"
            f"{'+deleting' if (p.get('metadata') or {}).get('deletionTimestamp') else ''}"
            for p in self.pods.values()
            if oracle.gang_of(p, self.rayjob_of()) == gang
        ]
        group = next((g for g in self.groups.values() if _key(g) == gang), {})
        reason = (group.get("status") or {}).get("reason") or ""
        return f"pods {pods}; PodGroup reason {reason!r}"

    def all_episodes(self) -> Iterator[Episode]:
        yield from self.episodes
        yield from self.open.values()


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name"))


def _kai_ray_reason(pod: Mapping[str, Any]) -> str:
    """kai-ray's eviction reason on the pod's DisruptionTarget condition ("" if none)."""
    for condition in (pod.get("status") or {}).get("conditions") or ():
        reason = str(condition.get("reason") or "")
        if condition.get("type") == DISRUPTION_TARGET and reason.startswith("KaiRay"):
            return reason.removeprefix("KaiRay")
    return ""


#: `Evict.standing` in a reclaimed pod's condition: "... keeps nvidia.com/gpu 160 (quota".
_KEPT = re.compile(r"keeps nvidia\.com/gpu (-?[0-9.e+]+) \(quota")


def _kept_gpus(pod: Mapping[str, Any]) -> float | None:
    """The GPUs kai-ray said the pod's queue keeps, from its DisruptionTarget message."""
    for condition in (pod.get("status") or {}).get("conditions") or ():
        if condition.get("type") == DISRUPTION_TARGET:
            found = _KEPT.search(str(condition.get("message") or ""))
            return float(found.group(1)) if found else None
    return None


def _holding(line: str, pods: list[oracle.PodView]) -> list[str]:
    """The pods holding the node an overcommit line names: GPUs, devices, state."""
    node = line.split()[1].rstrip(":")
    held = []
    for pod in pods:
        if pod.node == node and pod.holds:
            amount = f"{pod.fraction:g} of a GPU" if pod.fraction else f"{pod.gpus} GPUs"
            devices = f" on device {','.join(map(str, pod.devices))}" if pod.devices else ""
            state = " deleting" if pod.deleting else ""
            held.append(f"{pod.key}: {amount}{devices}, {pod.phase}{state}")
    return held
