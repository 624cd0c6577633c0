"""`kai-ray snapshot --kubeconfig`: a live cluster as the simulator's input.

The cluster is read once (`effects.live_view`: the cache the operator would hold)
and written as one multi-document YAML that `kai-ray simulate` loads:

1. Nodes (name, labels, annotations, taints, cordon, capacity, allocatable,
   the Ready condition), then the pods the simulator does not play but that
   hold room on them (another scheduler's, room held for a released workload,
   kai-ray's without a valid PodGroup), as held pods (`sim.kai-ray.io/held`:
   bound there for the whole run).
2. Topologies, Queues (spec, and the decayed usage of their status) and the
   SchedulerConfig the operator runs with (`--config`, else the defaults).
3. Every valid PodGroup, as the API holds it or as the operator would create it
   for a workload that has none yet, followed by its live member pods (bound
   ones with their node, a suspended workload's gang as the pods its controller
   will make). Workloads are not written: their gangs and pods are. Each group
   is submitted a microsecond after the one created before it
   (`sim.kai-ray.io/submit-at`), so the simulator's first cycle, at one cycle
   period, sees them all in the cluster's order.

What is left out (invalid objects, finished pods, pending pods of no gang, pods
bound to a node that is not there) is counted in `LiveSnapshot.left_out`.
`live_snapshot` is pure; `write_live_snapshot` reads the cluster once and
writes the one file.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kai_ray.effects.live_view import LiveCluster, read_live_cluster
from kai_ray.sim.loader import HELD_ANNOTATION, Document, load_documents
from kai_ray.state.cache import NODE, POD, POD_GROUP, QUEUE, TOPOLOGY
from kai_ray.state.snapshot import Snapshot
from kai_ray.values.config import SchedulerConfig
from kai_ray.values.errors import InvalidObjectError, ObjectRef
from kai_ray.values.names import POD_GROUP_ANNOTATION, SIM_SUBMIT_AT
from kai_ray.workloads.pod_fields import pod_node

Obj = Mapping[str, Any]
#: Pod fields the simulator reads; the rest of a live pod is noise to it.
POD_META = ("name", "namespace", "labels", "annotations")
NODE_ANNOTATIONS_SKIPPED = ("kubectl.kubernetes.io/last-applied-configuration",)


@dataclass
class LiveSnapshot:
    """The documents to write, and how many objects of each kind were left out."""

    documents: list[dict[str, Any]]
    left_out: dict[str, int] = field(default_factory=dict)

    def yaml(self, origin: str) -> str:
        header = f"# kai-ray snapshot of the live cluster {origin}: the simulator's input.\n"
        return header + yaml.safe_dump_all(self.documents, sort_keys=False)


def live_snapshot(view: LiveCluster, config: SchedulerConfig) -> LiveSnapshot:
    """The simulator's input for the cluster `view` holds."""
    snapshot = view.cache.snapshot()
    left_out: dict[str, int] = {}
    groups = _valid_groups(view, snapshot, left_out)
    members, held = _sort_pods(view, snapshot, set(groups), left_out)
    documents = [
        _node(node) for name, node in view.cache.items(NODE) if name in snapshot.node_index
    ]
    _count(
        left_out, "invalid Node(s)", len(list(view.cache.items(NODE))) - len(snapshot.node_names)
    )
    documents += [_held_pod(pod) for pod in held]
    documents += [
        _plain(obj) for name, obj in view.cache.items(TOPOLOGY) if name in snapshot.topologies
    ]
    documents += [_queue(obj) for name, obj in view.cache.items(QUEUE) if name in snapshot.queues]
    _count(
        left_out,
        "invalid Topology(ies)",
        len(list(view.cache.items(TOPOLOGY))) - len(snapshot.topologies),
    )
    _count(
        left_out,
        "invalid Queue(s)",
        len(list(view.cache.items(QUEUE))) - len(snapshot.queues.nodes),
    )
    documents.append(config.model_dump(mode="json", exclude_none=True))
    for rank, (key, group) in enumerate(groups.items()):
        documents.append(_pod_group(group, rank))
        documents += [_pod(pod) for pod in members.get(key, [])]
    return _loadable(LiveSnapshot(documents, left_out))


def _loadable(taken: LiveSnapshot) -> LiveSnapshot:
    """The snapshot less what the simulator's loader refuses and the operator takes:
    a PodGroup naming a Topology or level that does not exist, or a queue that does
    not admit its namespace (the operator keeps it waiting), with its pods; a Node,
    Queue, Topology or pod it finds wrong. Each is counted; a refused SchedulerConfig
    is raised as it is."""
    while True:
        try:
            load_documents([Document(doc, "snapshot") for doc in taken.documents])
            return taken
        except InvalidObjectError as err:
            refused = next((p.obj for p in err.problems if p.obj.kind in REFUSABLE), None)
            if refused is None:
                raise
            taken.documents = [d for d in taken.documents if not _refused(d, refused)]
            _count(taken.left_out, f"{refused.kind}(s) the simulator refuses", 1)


#: Kinds of object the snapshot leaves out when the simulator refuses one.
REFUSABLE = (NODE, POD, POD_GROUP, QUEUE, TOPOLOGY)


def _refused(doc: Obj, obj: ObjectRef) -> bool:
    """`doc` is the refused object, or a pod of a refused PodGroup."""
    meta = doc.get("metadata") or {}
    if obj.namespace is not None and (meta.get("namespace") or "default") != obj.namespace:
        return False
    if doc.get("kind") == obj.kind:
        return bool(meta.get("name") == obj.name)
    named = (meta.get("annotations") or {}).get(POD_GROUP_ANNOTATION)
    return obj.kind == POD_GROUP and doc.get("kind") == POD and named == obj.name


def _valid_groups(
    view: LiveCluster, snapshot: Snapshot, left_out: dict[str, int]
) -> dict[str, Obj]:
    """The PodGroups the operator schedules, oldest first (its order inside a queue)."""
    valid = {key: obj for key, obj in view.cache.items(POD_GROUP) if key in snapshot.pod_groups}
    _count(left_out, "invalid PodGroup(s)", len(list(view.cache.items(POD_GROUP))) - len(valid))
    created = {key: snapshot.pod_groups[key].creation_timestamp for key in valid}
    return dict(sorted(valid.items(), key=lambda item: (created[item[0]], item[0])))


def _sort_pods(
    view: LiveCluster, snapshot: Snapshot, groups: set[str], left_out: dict[str, int]
) -> tuple[dict[str, list[Obj]], list[Obj]]:
    """Live pods as members of their group, or as room held on their node."""
    members: dict[str, list[Obj]] = {}
    held: list[Obj] = []
    nodes = snapshot.node_index
    for pod in view.cache.objects().pods:
        node = pod_node(pod)
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            _count(left_out, "finished pod(s)", 1)
            continue
        if node is not None and node not in nodes:
            # The operator neither places nor counts it either (a node deleted, or
            # not seen yet): nothing is known of where it runs.
            _count(left_out, "pod(s) bound to a node that is not there", 1)
            continue
        group = _group_of(pod, view.scheduler)
        if group in groups:
            members.setdefault(group, []).append(pod)
        elif node is not None:
            held.append(pod)
        else:
            _count(left_out, "pending pod(s) of no gang", 1)
    return members, held


def _group_of(pod: Obj, scheduler: str) -> str | None:
    if (pod.get("spec") or {}).get("schedulerName") != scheduler:
        return None
    name = ((pod.get("metadata") or {}).get("annotations") or {}).get(POD_GROUP_ANNOTATION)
    return f"{(pod.get('metadata') or {}).get('namespace') or 'default'}/{name}" if name else None


def _node(node: Obj) -> dict[str, Any]:
    meta = node.get("metadata") or {}
    status = node.get("status") or {}
    annotations = {
        k: v
        for k, v in (meta.get("annotations") or {}).items()
        if k not in NODE_ANNOTATIONS_SKIPPED
    }
    spec = node.get("spec") or {}
    ready = [c for c in status.get("conditions") or () if c.get("type") == "Ready"]
    return {
        "apiVersion": "v1",
        "kind": NODE,
        "metadata": _some(
            {"name": meta.get("name"), "labels": meta.get("labels"), "annotations": annotations}
        ),
        "spec": _some({"taints": spec.get("taints"), "unschedulable": spec.get("unschedulable")}),
        "status": _some(
            {
                "capacity": status.get("capacity"),
                "allocatable": status.get("allocatable"),
                "conditions": [{"type": "Ready", "status": c.get("status")} for c in ready],
            }
        ),
    }


def _held_pod(pod: Obj) -> dict[str, Any]:
    held = _pod(pod)
    annotations = dict(held["metadata"].get("annotations") or {})
    annotations[HELD_ANNOTATION] = "true"
    held["metadata"]["annotations"] = annotations
    return held


def _queue(obj: Obj) -> dict[str, Any]:
    queue = _plain(obj, keep_created=True)
    usage = (obj.get("status") or {}).get("usage")
    if usage:  # decayed usage only: its history is on the cluster's clock, not the simulator's
        queue["status"] = {"usage": usage}
    return queue


def _pod_group(obj: Obj, rank: int) -> dict[str, Any]:
    group = _plain(obj)
    annotations = dict(group["metadata"].get("annotations") or {})
    annotations[SIM_SUBMIT_AT] = f"{(rank + 1) / 1000:.3f}ms"
    group["metadata"]["annotations"] = annotations
    status = obj.get("status")
    if status:
        group["status"] = dict(status)
    return group


def _pod(pod: Obj) -> dict[str, Any]:
    meta = pod.get("metadata") or {}
    phase = (pod.get("status") or {}).get("phase")
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": POD,
        "metadata": _some({key: meta.get(key) for key in POD_META}),
        "spec": dict(pod.get("spec") or {}),
    }
    if phase:
        body["status"] = {"phase": phase}
    return body


def _plain(obj: Obj, keep_created: bool = False) -> dict[str, Any]:
    """apiVersion, kind, the metadata a user writes, and the spec."""
    meta = obj.get("metadata") or {}
    keys = [*POD_META, *(("creationTimestamp",) if keep_created else ())]
    return {
        "apiVersion": obj.get("apiVersion"),
        "kind": obj.get("kind"),
        "metadata": _some({key: meta.get(key) for key in keys}),
        "spec": dict(obj.get("spec") or {}),
    }


def _some(values: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v not in (None, {}, [])}


def _count(left_out: dict[str, int], what: str, count: int) -> None:
    if count > 0:
        left_out[what] = left_out.get(what, 0) + count


def write_live_snapshot(kubeconfig: str | None, config: Path | None, output: Path) -> int:
    """Read the cluster, check the input as `kai-ray simulate` would, write it."""
    from kai_ray.controller import read_config

    settings = read_config(config)
    view = read_live_cluster(kubeconfig, settings.spec.schedulerName, settings.spec.dra)
    taken = live_snapshot(view, settings)  # checked as the simulator will load it
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(taken.yaml(kubeconfig or os.environ.get("KUBECONFIG") or "in-cluster"))
    if taken.left_out:
        parts = ", ".join(f"{count} {what}" for what, count in sorted(taken.left_out.items()))
        print(f"kai-ray snapshot: left out {parts}", file=sys.stderr)
    print(output)
    return 0
