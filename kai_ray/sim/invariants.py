"""Invariants the simulator checks after every cycle that changed something.

A violation is a bug in the scheduler, not bad input: it stops the run with the
cycle, the object and the rule. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from kai_ray.sim.records import JobRecord
from kai_ray.state.snapshot import Snapshot

TOLERANCE = 1e-6


class InvariantViolation(AssertionError):
    def __init__(self, cycle: int, obj: str, rule: str) -> None:
        super().__init__(f"cycle {cycle}: {obj}: {rule}")
        self.cycle, self.obj, self.rule = cycle, obj, rule


def check_invariants(snapshot: Snapshot, cycle: int, jobs: Mapping[str, JobRecord]) -> None:
    _no_node_overcommitted(snapshot, cycle)
    _no_device_overcommitted(snapshot, cycle)
    _no_partial_gang(snapshot, cycle, jobs)
    _required_topology_held(snapshot, cycle)


def _no_node_overcommitted(snapshot: Snapshot, cycle: int) -> None:
    over = np.argwhere(snapshot.free < -TOLERANCE)
    if len(over):
        node, column = (int(x) for x in over[0])
        resource = snapshot.resource_names[column]
        obj = f"Node {snapshot.node_names[node]}"
        raise InvariantViolation(cycle, obj, f"{resource} overcommitted")


def _no_device_overcommitted(snapshot: Snapshot, cycle: int) -> None:
    for node, devices in zip(snapshot.node_names, snapshot.gpu_devices, strict=True):
        if len(devices.free) and float(np.min(devices.free)) < -TOLERANCE:
            raise InvariantViolation(cycle, f"Node {node}", "a GPU device is overcommitted")


def _no_partial_gang(snapshot: Snapshot, cycle: int, jobs: Mapping[str, JobRecord]) -> None:
    for key, group in snapshot.pod_groups.items():
        bound = sum(1 for pod in group.pods if pod.node is not None)
        record = jobs.get(key)
        if bound and record is not None and bound < record.min_member:
            rule = f"{bound} of at least {record.min_member} pods bound: partial gang"
            raise InvariantViolation(cycle, f"PodGroup {key}", rule)


def _required_domains(
    snapshot: Snapshot, topology: str | None, level: str | None, nodes: list[int]
) -> set[int] | None:
    """The domains of `level` the nodes fall in (-1 for outside), or None if unconstrained."""
    if topology is None or level is None or topology not in snapshot.topologies:
        return None
    found = snapshot.topologies[topology].level(level)
    if found is None:
        return None
    return {int(found.node_domain[node]) for node in nodes}


def _required_topology_held(snapshot: Snapshot, cycle: int) -> None:
    for key, group in snapshot.pod_groups.items():
        constraint = group.spec.topologyConstraint
        if constraint is None or constraint.requiredLevel is None:
            continue
        nodes = [snapshot.node_index[p.node] for p in group.live_pods() if p.node is not None]
        domains = _required_domains(snapshot, constraint.topology, constraint.requiredLevel, nodes)
        if domains is not None and (len(domains) > 1 or -1 in domains):
            rule = f"pods straddle {constraint.requiredLevel} domains (required: one)"
            raise InvariantViolation(cycle, f"PodGroup {key}", rule)
