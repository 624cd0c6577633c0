"""The simulator's side of the binder's writer protocol: the cluster in memory.

Where the operator's writer calls the Kubernetes API, this one changes the
simulation's objects as the API server, kwok and the workload controllers would:
a bind makes the pod run on its node at once; an eviction releases the pod and
its controller creates it again, pending; a gate lift drops the gate; a group
status is kept on the PodGroup; a claim write changes the in-memory ResourceClaim
as its status subresource would (`kai_ray.sim.claims`). Every call succeeds but a
claim write the API server would refuse (the claim is gone, or allocated
already): the simulated cluster has no races. Events are not kept (the report
says what happened). No I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from kai_ray.decisions.plan import Bind, Evict, GroupStatus
from kai_ray.decisions.stale import stale_condition
from kai_ray.effects.binder import DONE, WriteResult
from kai_ray.state.dra_allocate import ClaimAllocation
from kai_ray.state.dra_status import Consumer
from kai_ray.values.errors import ObjectRef

if TYPE_CHECKING:
    from kai_ray.sim.engine import Simulation


class SimWriter:
    def __init__(self, sim: Simulation) -> None:
        self._sim = sim

    def evict(self, evict: Evict, message: str) -> WriteResult:
        self._sim.evict(evict)
        return DONE

    def lift_gate(self, pod: str, gate: str) -> WriteResult:
        obj = self._sim.pods.get(pod)
        if obj is not None:
            spec = obj.setdefault("spec", {})
            gates = [g for g in spec.get("schedulingGates") or () if g.get("name") != gate]
            spec["schedulingGates"] = gates
        return DONE

    def bind(self, bind: Bind, annotations: Mapping[str, str]) -> WriteResult:
        self._sim.bind(bind)
        return DONE

    def write_group_status(self, status: GroupStatus, now: float) -> WriteResult:
        if status.staleness is not None:
            condition = stale_condition(status.staleness, now)
            self._sim.persist_group_status(status.group, condition)
        if status.nominated is not None:
            self._sim.persist_nominations(status.group, status.nominated)
        return DONE

    def resume_workload(self, kind: str, key: str, nodes: Sequence[str]) -> WriteResult:
        return DONE  # the simulator creates its workloads' pods unsuspended

    def write_claim(
        self, namespace: str, name: str, allocation: ClaimAllocation, consumer: Consumer
    ) -> WriteResult:
        return self._sim.claims.write(namespace, name, allocation, consumer)

    def release_claim(self, namespace: str, name: str, pod_uid: str) -> WriteResult:
        return self._sim.claims.release(namespace, name, pod_uid)

    def record_event(self, ref: ObjectRef, warning: bool, reason: str, message: str) -> None:
        return None
