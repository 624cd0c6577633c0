"""Applying a `ClusterEvent` to a running simulation (the model is in `events`).

NodeDown and NodeUp flip the nodes' Ready condition (a NotReady node takes no new
pods) and, going down, fail every pod bound there with the reason `node-down`;
PodFailure fails pods with the reason `failed`; QueueUpdate replaces a queue with
its patched self. Failed pods are created again, pending, as their controllers
would. No I/O; it must not decide anything the cycle decides.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from kai_ray.sim.events import (
    NODE_DOWN_REASON,
    POD_FAILED_REASON,
    ClusterEvent,
    patched_queue,
    selected_nodes,
)

if TYPE_CHECKING:
    from kai_ray.sim.engine import Simulation


def apply_cluster_event(sim: Simulation, event: ClusterEvent, now: float) -> None:
    spec = event.spec
    if spec.action in ("NodeDown", "NodeUp"):
        _set_nodes_ready(sim, selected_nodes(spec, sim.nodes), spec.action == "NodeUp")
    elif spec.action == "PodFailure":
        for key in _failing_pods(sim, event):
            sim.fail_pod(key, POD_FAILED_REASON)
    elif spec.queue is not None:
        sim.set_queue(patched_queue(sim.queues[spec.queue], spec.patch, None))


def _set_nodes_ready(sim: Simulation, names: list[str], ready: bool) -> None:
    chosen = set(names)
    for index, node in enumerate(sim.nodes):
        if (node.get("metadata") or {}).get("name") in chosen:
            sim.set_node(index, with_ready(node, ready))
    if not ready:
        bound = [key for key, b in sim.bindings.items() if b.node in chosen]
        for key in bound:
            sim.fail_pod(key, NODE_DOWN_REASON)


def with_ready(node: dict[str, Any], ready: bool) -> dict[str, Any]:
    """A copy of the node with its Ready condition set."""
    changed = copy.deepcopy(node)
    status = changed.setdefault("status", {})
    others = [c for c in status.get("conditions") or [] if c.get("type") != "Ready"]
    reason = "KubeletReady" if ready else "NodeStatusUnknown"
    ready_condition = {"type": "Ready", "status": str(ready), "reason": reason}
    status["conditions"] = [*others, ready_condition]
    return changed


def _failing_pods(sim: Simulation, event: ClusterEvent) -> list[str]:
    spec = event.spec
    if spec.pod is not None:
        return [spec.pod] if spec.pod in sim.bindings else []
    return [key for key, b in sim.bindings.items() if b.job == spec.job]
