"""Checks across the simulator's input objects: names, parents, queues, topologies.

What the validating webhook will check in a cluster (parent exists, no cycles,
a workload's queue exists, is a leaf and admits its namespace, a named Topology
and its levels exist) is checked here before a run starts. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from kai_ray.values.api import PodGroupSpec, Queue, Topology, TopologyConstraint
from kai_ray.values.errors import InvalidObjectError, ObjectRef, Problem
from kai_ray.values.names import QUEUE_LABEL
from kai_ray.workloads.grouping import pod_group_name

if TYPE_CHECKING:
    from kai_ray.sim.loader import SimInput


def _fail(obj: ObjectRef, field: str, message: str) -> InvalidObjectError:
    return InvalidObjectError([Problem(obj, field, message)])


def _queue_ref(queue: Queue) -> ObjectRef:
    return ObjectRef("Queue", queue.metadata.name)


def _unique(refs: Iterable[ObjectRef]) -> None:
    seen: set[tuple[str, str | None, str]] = set()
    for ref in refs:
        key = (ref.kind, ref.namespace, ref.name)
        if key in seen:
            raise _fail(ref, "metadata.name", f"another {ref.kind} has the same name")
        seen.add(key)


def _check_parents(queues: Mapping[str, Queue]) -> None:
    for name, queue in queues.items():
        parent = queue.spec.parentQueue
        if parent is not None and parent not in queues:
            raise _fail(_queue_ref(queue), "spec.parentQueue", f"no queue named {parent!r}")
        seen = [name]
        while parent is not None:
            if parent in seen:
                cycle = " -> ".join([*seen, parent])
                raise _fail(_queue_ref(queue), "spec.parentQueue", f"parents form a cycle: {cycle}")
            seen.append(parent)
            parent = queues[parent].spec.parentQueue


def check_queue_use(
    queues: Mapping[str, Queue], name: str, namespace: str, obj: ObjectRef, field: str
) -> None:
    """The queue exists, is a leaf, and admits the namespace."""
    queue = queues.get(name)
    if queue is None:
        raise _fail(obj, field, f"no queue named {name!r}")
    children = [q.metadata.name for q in queues.values() if q.spec.parentQueue == name]
    if children:
        raise _fail(obj, field, f"queue {name!r} is not a leaf (children: {', '.join(children)})")
    allowed = queue.spec.namespaces
    if allowed and namespace not in allowed:
        raise _fail(obj, field, f"queue {name!r} does not admit namespace {namespace!r}")


def check_constraint(
    topologies: Mapping[str, Topology],
    constraint: TopologyConstraint | None,
    obj: ObjectRef,
    field: str,
) -> None:
    """A named Topology exists and has the levels the constraint names."""
    if constraint is None or constraint.topology is None:
        if constraint is not None and (constraint.requiredLevel or constraint.preferredLevel):
            raise _fail(obj, f"{field}.topology", "a level is named but no topology")
        return
    topology = topologies.get(constraint.topology)
    if topology is None:
        raise _fail(obj, f"{field}.topology", f"no Topology named {constraint.topology!r}")
    for key in ("requiredLevel", "preferredLevel"):
        level = getattr(constraint, key)
        if level is not None and topology.spec.resolve(level) is None:
            raise _fail(
                obj, f"{field}.{key}", f"Topology {constraint.topology!r} has no level {level!r}"
            )


def _check_group_spec(
    sim: SimInput,
    spec: PodGroupSpec,
    namespace: str,
    obj: ObjectRef,
    queue_field: str,
    prefix: str,
) -> None:
    queues = {q.metadata.name: q for q in sim.queues}
    topologies = {t.metadata.name: t for t in sim.topologies}
    check_queue_use(queues, spec.queue, namespace, obj, queue_field)
    check_constraint(topologies, spec.topologyConstraint, obj, f"{prefix}.topologyConstraint")
    for i, sub in enumerate(spec.subGroups):
        field = f"{prefix}.subGroups[{i}].topologyConstraint"
        check_constraint(topologies, sub.topologyConstraint, obj, field)


def check_references(sim: SimInput) -> None:
    """Raise InvalidObjectError naming the first object whose references are wrong."""
    _unique(ObjectRef("Node", str(n["metadata"]["name"])) for n in sim.nodes)
    _unique(_queue_ref(q) for q in sim.queues)
    _unique(ObjectRef("Topology", t.metadata.name) for t in sim.topologies)
    _unique(w.ref for w in sim.workloads)
    _check_parents({q.metadata.name: q for q in sim.queues})
    for group, _, _ in sim.pod_groups:
        ns = group.metadata.namespace or "default"
        ref = ObjectRef("PodGroup", group.metadata.name, ns)
        _check_group_spec(sim, group.spec, ns, ref, "spec.queue", "spec")
    for workload in sim.workloads:
        for derived in workload.groups:
            ns = derived.pod_group.metadata.namespace or "default"
            field = f"metadata.labels[{QUEUE_LABEL}]"
            _check_group_spec(sim, derived.pod_group.spec, ns, workload.ref, field, "annotations")
    _check_member_pods(sim)


def _check_member_pods(sim: SimInput) -> None:
    names = {(g.metadata.namespace or "default", g.metadata.name) for g, _, _ in sim.pod_groups}
    for doc in sim.member_pods:
        ns = (doc.raw.get("metadata") or {}).get("namespace") or "default"
        group = pod_group_name(doc.raw)
        if (ns, group) not in names:
            field = "metadata.annotations[kai-ray.io/pod-group]"
            raise _fail(doc.ref, field, f"no PodGroup named {group!r} in namespace {ns!r}")
