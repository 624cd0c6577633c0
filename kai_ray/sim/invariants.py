"""Invariants the simulator checks after every cycle that changed something.

A violation is a bug in the scheduler, not bad input: it stops the run with the
cycle, the object and the rule (`kai-ray simulate` exits with status 3 and one
line). Two checkers hold the same rules:

- `BindingLedger`, which the engine uses: it keeps its own count of what every
  bound pod holds on each node and GPU device, from the bindings alone (not from
  the snapshot the cycle saw), and after each cycle checks the nodes and gangs
  that cycle touched: no node or device overcommitted, no gang left partly bound
  by the cycle's binds or evictions, every gang's required topology domain held;
- `check_invariants`, the same rules over a whole `Snapshot`, for tests.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kai_ray.sim.records import JobRecord
from kai_ray.state.nodes import read_nodes
from kai_ray.state.snapshot import Snapshot
from kai_ray.values.api import Topology
from kai_ray.values.resources import GPU, Resources

TOLERANCE = 1e-6
POD_COUNT = "pods"


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


# ------------------------------------------------------------ the engine's ledger


@dataclass
class Holding:
    """What one bound pod holds: its node, its requests, its devices and share."""

    node: str
    requests: Resources
    devices: tuple[int, ...] = ()
    fraction: float = 0.0


@dataclass
class _NodeAccount:
    allocatable: Resources
    labels: Mapping[str, str]
    used: dict[str, float] = field(default_factory=dict)
    devices: list[float] = field(default_factory=list)


class BindingLedger:
    """Per node, what bound pods hold, kept from binds and releases; checked per cycle."""

    def __init__(self, nodes: Sequence[Mapping[str, Any]], topologies: Iterable[Topology]) -> None:
        self._nodes: dict[str, _NodeAccount] = {}
        for facts in read_nodes(nodes).nodes:
            devices = [0.0] * int(np.floor(facts.allocatable[GPU]))
            self._nodes[facts.name] = _NodeAccount(facts.allocatable, facts.labels, {}, devices)
        self._topologies = {t.metadata.name: t for t in topologies}
        self._touched: set[str] = set()

    def add_node_facts(
        self,
        resources: Mapping[str, Resources],
        labels: Mapping[str, Mapping[str, str]],
    ) -> None:
        """What nodes offer and are labelled with beyond their object, as the snapshot
        reads them: their DRA devices of classes counted as queue resources (GPUs: one
        device each), and the NVLink domain those devices name."""
        for name, extra in resources.items():
            if name in self._nodes:
                account = self._nodes[name]
                account.allocatable = account.allocatable + extra
                gpus = int(np.floor(account.allocatable[GPU]))
                account.devices.extend([0.0] * (gpus - len(account.devices)))
        for name, more in labels.items():
            if name in self._nodes:
                account = self._nodes[name]
                account.labels = {**account.labels, **more}

    def hold(self, holding: Holding) -> None:
        self._change(holding, +1.0)

    def release(self, holding: Holding) -> None:
        self._change(holding, -1.0)

    def _change(self, holding: Holding, sign: float) -> None:
        account = self._nodes.get(holding.node)
        if account is None:
            return
        self._touched.add(holding.node)
        for name, amount in [*holding.requests.items(), (POD_COUNT, 1.0)]:
            account.used[name] = account.used.get(name, 0.0) + sign * amount
        per_device = holding.fraction if holding.fraction else 1.0
        for device in holding.devices:
            if device >= len(account.devices):
                account.devices.extend([0.0] * (device + 1 - len(account.devices)))
                account.devices[device] = float("inf")  # no such device: always a violation
            account.devices[device] += sign * per_device

    def fits(self, adding: Sequence[Holding], freeing: Sequence[Holding] = ()) -> bool:
        """Whether the nodes take `adding` on top of what they hold now, less
        `freeing` (the room a pipelined bind waits for: docs/disruption.md)."""
        used: dict[str, dict[str, float]] = {}
        devices: dict[str, list[float]] = {}
        for holding, sign in [*((h, -1.0) for h in freeing), *((h, 1.0) for h in adding)]:
            account = self._nodes.get(holding.node)
            if account is None:
                continue
            node_used = used.setdefault(holding.node, dict(account.used))
            node_devices = devices.setdefault(holding.node, list(account.devices))
            for name, amount in [*holding.requests.items(), (POD_COUNT, 1.0)]:
                node_used[name] = node_used.get(name, 0.0) + sign * amount
            for device in holding.devices:
                if device < len(node_devices):
                    node_devices[device] += sign * (holding.fraction or 1.0)
        for node, node_used in used.items():
            allocatable = self._nodes[node].allocatable
            for resource, amount in node_used.items():
                counted = resource != POD_COUNT or POD_COUNT in allocatable
                if counted and amount > allocatable[resource] + TOLERANCE:
                    return False
            if any(d > 1.0 + TOLERANCE for d in devices[node]):
                return False
        return True

    def check_nodes(self, cycle: int) -> None:
        """No node touched since the last check holds more than it offers."""
        for name in sorted(self._touched):
            account = self._nodes[name]
            for resource, used in account.used.items():
                offered = account.allocatable[resource]
                counted = resource != POD_COUNT or POD_COUNT in account.allocatable
                if counted and used > offered + TOLERANCE:
                    rule = f"{resource} overcommitted ({used:g} bound, {offered:g} allocatable)"
                    raise InvariantViolation(cycle, f"Node {name}", rule)
            if any(d > 1.0 + TOLERANCE for d in account.devices):
                raise InvariantViolation(cycle, f"Node {name}", "a GPU device is overcommitted")
        self._touched.clear()

    def check_gang(
        self, cycle: int, key: str, min_member: int, nodes: Sequence[str], group: Mapping[str, Any]
    ) -> None:
        """A gang the cycle bound or evicted pods of is whole or gone, and in one domain."""
        if 0 < len(nodes) < min_member:
            rule = f"{len(nodes)} of at least {min_member} pods bound: partial gang"
            raise InvariantViolation(cycle, f"PodGroup {key}", rule)
        constraint = (group.get("spec") or {}).get("topologyConstraint") or {}
        label = self._required_label(constraint)
        if label is None or not nodes:
            return
        values = {self._nodes[n].labels.get(label) for n in nodes if n in self._nodes}
        if len(values) > 1 or None in values:
            rule = f"pods straddle {constraint.get('requiredLevel')} domains (required: one)"
            raise InvariantViolation(cycle, f"PodGroup {key}", rule)

    def _required_label(self, constraint: Mapping[str, Any]) -> str | None:
        topology = self._topologies.get(str(constraint.get("topology")))
        level = constraint.get("requiredLevel")
        if topology is None or not level:
            return None
        return topology.spec.resolve(str(level))
