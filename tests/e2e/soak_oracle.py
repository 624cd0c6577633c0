"""What the soak's checker judges a cluster by, from the objects alone.

An independent reading of a cluster's pods, nodes, PodGroups and Queues (plain
dicts, as the API returns them), written without kai-ray's decision code so
that a bug there cannot hide itself here:

- `holdings`: what every node holds (whole GPUs, GPU devices and their shares,
  pods) and what every queue holds;
- `overcommitted`: nodes or devices holding more than they have;
- `partial_gangs`: gangs with some, but fewer than their minimum, members
  bound and alive (and none finished: a finishing gang is not stale);
- `fit_pending`: gangs with pods pending although they fit now: their queue
  and its parents have room under their limits, and a first-fit placement
  (whole GPUs on untouched devices, shares on one device, one domain of the
  required topology level) finds a node for every pending pod. First fit may
  miss a fit that exists; it never claims one that does not, so the count
  errs towards zero, never towards a false alarm. For the same reason an
  elastic extra (its gang at its minimum) of a queue holding its quota or more
  is not judged while another queue has pods waiting: whether it may grow past
  its quota then is the fair share's call (reclaim may be taking from it).
  Nodes where room is held for an admitted workload whose controller has not
  made all its pods yet (`admitted_room`) are left out of the first fit.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kai_ray.values.names import (
    ADMISSION_GATE,
    ADMITTED_NODES_ANNOTATION,
    GPU_DEVICES_ANNOTATION,
    GPU_FRACTION_ANNOTATION,
    POD_GROUP_ANNOTATION,
)

from .nodes import GPU

Obj = Mapping[str, Any]
RAY_CLUSTER_LABEL = "ray.io/cluster"
DERIVED_ANNOTATION = "kai-ray.io/pod-group-derived"
EPSILON = 1e-6
#: How long the operator holds an admitted workload's room for pods not made yet.
ADMITTED_HOLD_S = 60.0
FINISHED = ("Succeeded", "Failed")


@dataclass(frozen=True)
class PodView:
    key: str
    namespace: str
    gang: str
    gpus: int
    fraction: float
    node: str | None
    phase: str
    deleting: bool
    #: Held back by a gate other than kai-ray's own (which the binder lifts).
    held: bool
    devices: tuple[int, ...]
    owned: bool

    @property
    def holds(self) -> bool:
        """It holds room on its node: bound and not finished (terminating included)."""
        return self.node is not None and self.phase not in FINISHED

    @property
    def pending(self) -> bool:
        return self.node is None and not self.deleting and self.phase not in FINISHED

    @property
    def gpu_amount(self) -> float:
        return self.gpus + self.fraction


@dataclass(frozen=True)
class NodeView:
    name: str
    gpus: int
    pods: int
    labels: Mapping[str, str]
    schedulable: bool


@dataclass(frozen=True)
class GangView:
    key: str
    queue: str
    min_member: int
    #: The node label all its pods must share a value of, if any.
    required_label: str | None


@dataclass(frozen=True)
class QueueView:
    name: str
    parent: str | None
    quota: float
    limit: float | None


@dataclass
class NodeUsage:
    gpus: int = 0
    pods: int = 0
    #: Share of each device in use (a whole GPU is 1.0).
    devices: dict[int, float] = field(default_factory=dict)
    #: Whole GPUs held by pods that name no devices.
    unnamed: int = 0

    def untouched(self, total: int) -> int:
        return total - len([d for d, used in self.devices.items() if used > EPSILON]) - self.unnamed


# ------------------------------------------------------------------ reading


def gang_of(pod: Obj, rayjob_of: Mapping[tuple[str, str], str]) -> str:
    """`namespace/name` of the gang a pod belongs to, named as kai-ray names it."""
    meta = pod.get("metadata") or {}
    namespace = str(meta.get("namespace") or "default")
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    cluster = labels.get(RAY_CLUSTER_LABEL)
    if cluster:
        owner = rayjob_of.get((namespace, cluster))
        return f"{namespace}/rayjob-{owner}" if owner else f"{namespace}/raycluster-{cluster}"
    for owner in meta.get("ownerReferences") or ():
        if owner.get("kind") == "Job":
            return f"{namespace}/job-{owner.get('name')}"
    explicit = annotations.get(POD_GROUP_ANNOTATION)
    if explicit and not annotations.get(DERIVED_ANNOTATION):
        return f"{namespace}/{explicit}"
    return f"{namespace}/pod-{meta.get('name')}"


def read_pod(pod: Obj, rayjob_of: Mapping[tuple[str, str], str]) -> PodView:
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    annotations = meta.get("annotations") or {}
    gates = [g.get("name") for g in spec.get("schedulingGates") or ()]
    devices = annotations.get(GPU_DEVICES_ANNOTATION)
    return PodView(
        key=f"{meta.get('namespace')}/{meta.get('name')}",
        namespace=str(meta.get("namespace")),
        gang=gang_of(pod, rayjob_of),
        gpus=whole_gpus(spec),
        fraction=float(annotations.get(GPU_FRACTION_ANNOTATION) or 0),
        node=spec.get("nodeName") or None,
        phase=str((pod.get("status") or {}).get("phase") or "Pending"),
        deleting=bool(meta.get("deletionTimestamp")),
        held=any(g != ADMISSION_GATE for g in gates),
        devices=tuple(int(d) for d in devices.split(",")) if devices else (),
        owned=bool(meta.get("ownerReferences")),
    )


def whole_gpus(spec: Obj) -> int:
    total = 0
    for container in spec.get("containers") or ():
        resources = container.get("resources") or {}
        amount = (resources.get("requests") or {}).get(GPU) or (resources.get("limits") or {}).get(
            GPU
        )
        total += int(amount or 0)
    return total


def read_node(node: Obj) -> NodeView:
    meta = node.get("metadata") or {}
    status = node.get("status") or {}
    allocatable = status.get("allocatable") or status.get("capacity") or {}
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or ()
    )
    tainted = any(
        t.get("effect") in ("NoSchedule", "NoExecute")
        for t in (node.get("spec") or {}).get("taints") or ()
    )
    cordoned = bool((node.get("spec") or {}).get("unschedulable"))
    return NodeView(
        name=str(meta.get("name")),
        gpus=int(allocatable.get(GPU) or 0),
        pods=int(allocatable.get("pods") or 110),
        labels=dict(meta.get("labels") or {}),
        schedulable=ready and not tainted and not cordoned,
    )


def read_gang(group: Obj, levels: Mapping[str, str]) -> GangView:
    meta = group.get("metadata") or {}
    spec = group.get("spec") or {}
    level = (spec.get("topologyConstraint") or {}).get("requiredLevel")
    return GangView(
        key=f"{meta.get('namespace')}/{meta.get('name')}",
        queue=str(spec.get("queue") or ""),
        min_member=int(spec.get("minMember") or 1),
        required_label=levels.get(level, level) if level else None,
    )


# ----------------------------------------------------------------- holdings


def node_usage(nodes: Iterable[NodeView], pods: Iterable[PodView]) -> dict[str, NodeUsage]:
    usage = {node.name: NodeUsage() for node in nodes}
    for pod in pods:
        if not pod.holds:
            continue
        used = usage.setdefault(str(pod.node), NodeUsage())
        used.gpus += pod.gpus
        used.pods += 1
        if pod.devices:
            share = pod.fraction if pod.fraction else 1.0
            for device in pod.devices:
                used.devices[device] = used.devices.get(device, 0.0) + share
        else:
            used.unnamed += pod.gpus
    return usage


def queue_allocations(
    pods: Iterable[PodView], queue_of: Mapping[str, str], queues: Mapping[str, QueueView]
) -> dict[str, float]:
    """GPUs each queue holds (its children's included), counting held pods."""
    held: dict[str, float] = dict.fromkeys(queues, 0.0)
    for pod in pods:
        if pod.holds:
            for queue in path(queue_of.get(pod.gang, ""), queues):
                held[queue] += pod.gpu_amount
    return held


def path(queue: str, queues: Mapping[str, QueueView]) -> list[str]:
    """The queue and its parents, leaf first."""
    chain: list[str] = []
    while queue in queues and queue not in chain:
        chain.append(queue)
        queue = queues[queue].parent or ""
    return chain


def overcommitted(nodes: Iterable[NodeView], usage: Mapping[str, NodeUsage]) -> list[str]:
    """One line per node (or device) that holds more than it has."""
    found = []
    for node in nodes:
        used = usage.get(node.name, NodeUsage())
        if used.gpus > node.gpus:
            found.append(f"node {node.name}: {used.gpus} GPUs held of {node.gpus}")
        elif used.untouched(node.gpus) < 0:
            found.append(f"node {node.name}: more GPU devices in use than its {node.gpus}")
        if used.pods > node.pods:
            found.append(f"node {node.name}: {used.pods} pods of {node.pods}")
        for device, share in sorted(used.devices.items()):
            if share > 1 + EPSILON:
                found.append(f"node {node.name} device {device}: {share:g} of one GPU held")
            if device >= node.gpus:
                found.append(f"node {node.name}: device {device} does not exist")
    return found


# -------------------------------------------------------------------- gangs


def by_gang(pods: Iterable[PodView]) -> dict[str, list[PodView]]:
    gangs: dict[str, list[PodView]] = {}
    for pod in pods:
        gangs.setdefault(pod.gang, []).append(pod)
    return gangs


def alive_bound(pods: Iterable[PodView], nodes: Mapping[str, NodeView]) -> int:
    """Members bound to a node that exists, not finished and not on their way out."""
    return sum(
        1 for p in pods if p.holds and not p.deleting and p.node in nodes and p.phase != "Failed"
    )


def partial_gangs(
    gangs: Mapping[str, list[PodView]],
    groups: Mapping[str, GangView],
    nodes: Mapping[str, NodeView],
) -> dict[str, str]:
    """Gangs with some but too few live members bound, and why they are counted."""
    partial = {}
    for key, members in gangs.items():
        group = groups.get(key)
        if group is None or any(p.phase == "Succeeded" for p in members):
            continue
        alive = alive_bound(members, nodes)
        if 0 < alive < group.min_member:
            partial[key] = f"{alive} of minimum {group.min_member} bound and alive"
    return partial


@dataclass
class Room:
    """Free room per schedulable node, taken as a placement goes."""

    nodes: dict[str, NodeView]
    usage: dict[str, NodeUsage]
    #: Nodes whose room is held for pods not made yet: no pod is placed there.
    held: frozenset[str] = frozenset()

    def fits(self, pod: PodView, node: NodeView) -> bool:
        used = self.usage.setdefault(node.name, NodeUsage())
        if used.pods + 1 > node.pods:
            return False
        if pod.fraction:
            return (
                bool(self._partly_used(used, node, pod.fraction)) or used.untouched(node.gpus) > 0
            )
        return used.untouched(node.gpus) >= pod.gpus

    def take(self, pod: PodView, node: NodeView) -> None:
        used = self.usage[node.name]
        used.pods += 1
        used.gpus += pod.gpus
        if not pod.fraction:
            used.unnamed += pod.gpus
            return
        partly = self._partly_used(used, node, pod.fraction)
        device = (
            partly[0]
            if partly
            else min(
                d
                for d in range(node.gpus + len(used.devices) + 1)
                if used.devices.get(d, 0.0) <= EPSILON
            )
        )
        used.devices[device] = used.devices.get(device, 0.0) + pod.fraction

    @staticmethod
    def _partly_used(used: NodeUsage, node: NodeView, share: float) -> list[int]:
        return [
            d
            for d, held in sorted(used.devices.items())
            if held > EPSILON and held + share <= 1 + EPSILON and d < node.gpus
        ]


def first_fit(pods: list[PodView], candidates: list[NodeView], room: Room) -> bool:
    """Whether every pod gets a node, fullest node first, largest pod first."""
    trial = Room(room.nodes, {n: _copy(u) for n, u in room.usage.items()}, room.held)
    for pod in sorted(pods, key=lambda p: (-p.gpus, -p.fraction)):
        order = sorted(
            candidates, key=lambda n: trial.usage.get(n.name, NodeUsage()).untouched(n.gpus)
        )
        chosen = next((n for n in order if trial.fits(pod, n)), None)
        if chosen is None:
            return False
        trial.take(pod, chosen)
    return True


def _copy(usage: NodeUsage) -> NodeUsage:
    return NodeUsage(usage.gpus, usage.pods, dict(usage.devices), usage.unnamed)


def fits_somewhere(
    pods: list[PodView], group: GangView, room: Room, anchors: Iterable[str] = ()
) -> bool:
    """The pods fit together, inside one domain of the required level if there is one.

    `anchors` are the nodes of members already bound: a required domain must
    hold them too, so only their domain counts (the rest of a partly bound gang
    joins its bound members; if they cannot, the stale-gang grace frees them)."""
    schedulable = [n for n in room.nodes.values() if n.schedulable and n.name not in room.held]
    if group.required_label is None:
        return first_fit(pods, schedulable, room)
    label = group.required_label
    held = {room.nodes[n].labels.get(label) for n in anchors if n in room.nodes}
    domains: dict[str, list[NodeView]] = {}
    for node in schedulable:
        value = node.labels.get(label)
        if value is not None and (not held or value in held):
            domains.setdefault(value, []).append(node)
    if len(held) > 1:
        return False  # bound members already span domains: nothing more joins them
    return any(first_fit(pods, members, room) for members in domains.values())


def fit_pending(
    gangs: Mapping[str, list[PodView]],
    groups: Mapping[str, GangView],
    nodes: Mapping[str, NodeView],
    usage: Mapping[str, NodeUsage],
    queues: Mapping[str, QueueView],
    allocated: Mapping[str, float],
    held: Iterable[str] = (),
) -> dict[str, str]:
    """Gangs with pending pods that fit now, each with what fits.

    A gang short of its minimum (members bound alive or finished count towards
    it) must have pods enough pending to reach it, and fit all of them at once
    (its minimum is among them); a gang at its minimum, any one pending pod.
    No pod is placed on the `held` nodes (`admitted_room`)."""
    room = Room(dict(nodes), dict(usage), frozenset(held))
    found = {}
    waiting = _queues_waiting(gangs, groups)
    for key, members in gangs.items():
        group = groups.get(key)
        pending = [p for p in members if p.pending and not p.held]
        if group is None or not pending:
            continue
        held = alive_bound(members, nodes) + sum(1 for p in members if p.phase == "Succeeded")
        whole = held < group.min_member
        if whole and held + len(pending) < group.min_member:
            continue  # its minimum cannot hold whatever the room: pods are missing
        if not whole and _over_quota(group.queue, queues, allocated) and waiting - {group.queue}:
            continue  # an extra beyond its quota, while another queue waits: fairness's call
        tries = [pending] if whole else [[p] for p in pending]
        anchors = [p.node for p in members if p.node and p.holds and not p.deleting]
        for pods in tries:
            asked = sum(p.gpu_amount for p in pods)
            if not over_limit(group.queue, asked, queues, allocated) and fits_somewhere(
                pods, group, room, anchors
            ):
                what = "all its pending pods" if whole else f"pod {pods[0].key}"
                found[key] = f"{what} ({asked:g} GPUs) fit now"
                break
    return found


def admitted_nodes(workload: Obj) -> tuple[str, ...]:
    """The nodes a released workload's gang was placed on when admitted (none if
    it is suspended or was never held)."""
    meta = workload.get("metadata") or {}
    if (workload.get("spec") or {}).get("suspend"):
        return ()
    written = (meta.get("annotations") or {}).get(ADMITTED_NODES_ANNOTATION) or ""
    return tuple(n for n in written.split(",") if n)


def workload_gang(workload: Obj, kind: str) -> str:
    """The gang of a RayCluster or RayJob (`kind`), named as kai-ray names it."""
    meta = workload.get("metadata") or {}
    prefix = "rayjob" if kind == "RayJob" else "raycluster"
    return f"{meta.get('namespace') or 'default'}/{prefix}-{meta.get('name')}"


def admitted_room(
    admitted: Mapping[str, tuple[float, tuple[str, ...]]],
    gangs: Mapping[str, list[PodView]],
    now: float,
    ended: set[tuple[str, float]] | None = None,
    holders: dict[str, str] | None = None,
) -> set[str]:
    """Nodes where the operator holds room for admitted workloads: gang -> (when
    its release was first seen, its admitted nodes); held while the gang has
    fewer pods than nodes, for `ADMITTED_HOLD_S` at most. As the operator's, a
    hold ends once for good: a release whose pods all existed once is put in
    `ended` (when given) and not held again if some of its pods go. `holders`,
    when given, gets each held node's gang and how many of its pods exist."""
    held: set[str] = set()
    for gang, (seen, nodes) in admitted.items():
        if ended is not None and (gang, seen) in ended:
            continue
        if len(gangs.get(gang, ())) >= len(nodes):
            if ended is not None:
                ended.add((gang, seen))
        elif now - seen < ADMITTED_HOLD_S:
            held.update(nodes)
            if holders is not None:
                made = len(gangs.get(gang, ()))
                for node in nodes:
                    holders[node] = f"{gang} ({made} of {len(nodes)} pods, {now - seen:.0f}s)"
    return held


def _queues_waiting(gangs: Mapping[str, list[PodView]], groups: Mapping[str, GangView]) -> set[str]:
    """Queues with a pending pod (not held by another gate) of a known gang."""
    return {
        groups[key].queue
        for key, members in gangs.items()
        if key in groups and any(p.pending and not p.held for p in members)
    }


def _over_quota(
    queue: str, queues: Mapping[str, QueueView], allocated: Mapping[str, float]
) -> bool:
    view = queues.get(queue)
    return view is not None and allocated.get(queue, 0.0) >= view.quota - EPSILON


def over_limit(
    queue: str, asked: float, queues: Mapping[str, QueueView], allocated: Mapping[str, float]
) -> bool:
    """Whether `asked` more GPUs would pass the limit of the queue or of a parent."""
    for name in path(queue, queues):
        limit = queues[name].limit
        if limit is not None and allocated.get(name, 0.0) + asked > limit + EPSILON:
            return True
    return False
