"""Reading Pods into `PodState` values: requests, GPU share, group and standing.

Pods stay plain dicts until here; each is read once per snapshot into a small
frozen value. A pod whose requests cannot be read is left out of placement and
reported; so is one whose node selector, required node affinity or
tolerations or inter-pod affinity cannot be read (parsed here once, used by
every placement). Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kai_ray.state.problems import field_problem, object_ref
from kai_ray.values.errors import InvalidFieldError, ObjectRef, Problem
from kai_ray.values.names import ADMISSION_GATE, PLACEHOLDER_ANNOTATION
from kai_ray.values.resources import GPU, Resources, add_into
from kai_ray.workloads.pod_affinity import PodAffinity, pod_inter_affinity
from kai_ray.workloads.pod_claims import PodClaim, pod_claims
from kai_ray.workloads.pod_fields import (
    GpuShare,
    NodeSelectorTerm,
    Toleration,
    check_gpu_request,
    gpu_share,
    pod_creation_timestamp,
    pod_gpu_devices,
    pod_group_name,
    pod_has_controller,
    pod_is_deleting,
    pod_is_terminal,
    pod_key,
    pod_labels,
    pod_name,
    pod_namespace,
    pod_node,
    pod_node_selector,
    pod_phase,
    pod_priority,
    pod_requests,
    pod_required_node_affinity,
    pod_scheduler,
    pod_scheduling_gates,
    pod_subgroup,
    pod_tolerations,
)

POD = "Pod"


@dataclass(frozen=True, slots=True)
class PodState:
    """One pod as the cycle sees it."""

    key: str
    name: str
    namespace: str
    node: str | None
    phase: str
    scheduler: str
    #: Effective requests (kube-scheduler's rules); whole GPUs only, never a share.
    requests: Resources
    gpu_share: GpuShare | None
    #: Fraction of one device the pod holds (bound) or asks for (pending, when known).
    gpu_fraction: float
    #: GPU device indices on `node`: recorded by the binder or assigned by the snapshot.
    devices: tuple[int, ...]
    creation_timestamp: str
    priority: int
    pod_group: str | None
    subgroup: str | None
    scheduling_gates: tuple[str, ...]
    #: status.startTime: when the pod started running ("" while it has not).
    start_time: str = ""
    #: spec.nodeSelector as sorted (label, value) pairs.
    node_selector: tuple[tuple[str, str], ...] = ()
    #: Required node affinity: any one term holds (each term: all its requirements).
    node_affinity: tuple[NodeSelectorTerm, ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    #: A controller recreates the pod when it is evicted (`pod_has_controller`).
    controlled: bool = False
    #: Bound and being deleted (`pod_is_deleting`): it holds its node until it is
    #: gone, and the cycle places work onto what it releases (`eviction.release_terminating`).
    releasing: bool = False
    #: metadata.labels, as inter-pod affinity terms select pods by them (not hashed).
    labels: Mapping[str, str] = field(default_factory=dict, hash=False)
    #: Inter-pod affinity and anti-affinity; None when the pod has no such terms.
    pod_affinity: PodAffinity | None = None
    uid: str = ""
    #: spec.resourceClaims as read from the pod (`pod_claims`), before the claims are found.
    claim_entries: tuple[PodClaim, ...] = ()
    #: The DRA claims found for it (`namespace/name`), set by the snapshot's `DraView`.
    claims: tuple[str, ...] = ()
    #: Why its claims keep it from being placed ("" when they do not).
    claim_wait: str = ""
    #: A placeholder of a suspended workload (`kai-ray.io/placeholder`): its claims
    #: templates are counted in its requests, not waited for (no claim is made yet).
    stand_in: bool = False

    @property
    def terminal(self) -> bool:
        return self.phase in ("Succeeded", "Failed")

    @property
    def held(self) -> bool:
        """Held back by another's scheduling gate (Grove's, say): it cannot be bound.
        kai-ray's own admission gate does not hold it: the binder lifts that one."""
        return any(gate != ADMISSION_GATE for gate in self.scheduling_gates)

    @property
    def uses_gpu(self) -> bool:
        return self.requests[GPU] > 0 or self.gpu_share is not None

    @property
    def effective_requests(self) -> Resources:
        """Requests with the GPU share counted as part of a GPU (queue accounting)."""
        if self.gpu_fraction == 0:
            return self.requests
        return self.requests + {GPU: self.gpu_fraction}

    def ref(self) -> ObjectRef:
        return ObjectRef(POD, self.name, self.namespace)

    def on_devices(self, devices: tuple[int, ...], gpu_fraction: float) -> PodState:
        """This pod with its devices settled; spelled out because it runs per GPU pod
        and `dataclasses.replace` costs three times as much."""
        return PodState(
            self.key,
            self.name,
            self.namespace,
            self.node,
            self.phase,
            self.scheduler,
            self.requests,
            self.gpu_share,
            gpu_fraction,
            devices,
            self.creation_timestamp,
            self.priority,
            self.pod_group,
            self.subgroup,
            self.scheduling_gates,
            self.start_time,
            self.node_selector,
            self.node_affinity,
            self.tolerations,
            self.controlled,
            self.releasing,
            self.labels,
            self.pod_affinity,
            self.uid,
            self.claim_entries,
            self.claims,
            self.claim_wait,
            self.stand_in,
        )


def total_requests(pods: Sequence[PodState]) -> Resources:
    """The pods' effective requests summed (in pod order) into one vector."""
    amounts: dict[str, float] = {}
    for pod in pods:
        add_into(amounts, pod.effective_requests)
    return Resources.from_canonical(amounts)


@dataclass
class PodReading:
    pods: list[PodState] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)


def read_pods(objects: Sequence[Mapping[str, Any]]) -> PodReading:
    """Every readable pod once; unreadable or duplicate pods become problems."""
    reading = PodReading()
    seen: set[str] = set()
    for obj in objects:
        key = pod_key(obj)
        if key in seen:
            reading.problems.append(
                Problem(object_ref(obj, POD), "metadata.name", "listed twice; kept the first")
            )
            continue
        seen.add(key)
        state = read_pod(obj, reading.problems)
        if state is not None:
            reading.pods.append(state)
    return reading


def read_pod(pod: Mapping[str, Any], problems: list[Problem]) -> PodState | None:
    """The pod's state, or None (with a problem) when its requests cannot be read."""
    try:
        requests = pod_requests(pod)
        share = gpu_share(pod)
        check_gpu_request(requests, share)
        selector = pod_node_selector(pod)
        affinity = pod_required_node_affinity(pod)
        tolerations = pod_tolerations(pod)
        labels = pod_labels(pod)
        pod_affinity = pod_inter_affinity(pod)
        claim_entries = pod_claims(pod)
    except InvalidFieldError as err:
        problems.append(field_problem(object_ref(pod, POD), _excluded(err, pod)))
        return None
    return PodState(
        key=pod_key(pod),
        name=pod_name(pod),
        namespace=pod_namespace(pod),
        node=pod_node(pod),
        phase=pod_phase(pod),
        scheduler=pod_scheduler(pod),
        requests=requests,
        gpu_share=share,
        gpu_fraction=(share.fraction or 0.0) if share else 0.0,
        devices=_recorded_devices(pod, problems),
        creation_timestamp=pod_creation_timestamp(pod),
        start_time=str((pod.get("status") or {}).get("startTime") or ""),
        priority=pod_priority(pod),
        pod_group=pod_group_name(pod),
        subgroup=pod_subgroup(pod),
        scheduling_gates=pod_scheduling_gates(pod),
        node_selector=selector,
        node_affinity=affinity,
        tolerations=tolerations,
        controlled=pod_has_controller(pod),
        releasing=pod_node(pod) is not None and pod_is_deleting(pod),
        labels=labels,
        pod_affinity=pod_affinity,
        uid=str((pod.get("metadata") or {}).get("uid") or ""),
        claim_entries=claim_entries,
        stand_in=PLACEHOLDER_ANNOTATION in ((pod.get("metadata") or {}).get("annotations") or {}),
    )


def _excluded(err: InvalidFieldError, pod: Mapping[str, Any]) -> InvalidFieldError:
    """Say what the pod's exclusion means, which differs for bound and waiting pods."""
    if pod_is_terminal(pod):
        consequence = "pod ignored"
    elif pod_node(pod):
        consequence = f"pod is bound to {pod_node(pod)} but its usage cannot be counted"
    else:
        consequence = "pod will not be scheduled"
    return InvalidFieldError(err.field, f"{err.message} ({consequence})")


def _recorded_devices(pod: Mapping[str, Any], problems: list[Problem]) -> tuple[int, ...]:
    """Devices the binder recorded; a bad record is reported and re-derived later."""
    try:
        return pod_gpu_devices(pod) or ()
    except InvalidFieldError as err:
        problems.append(field_problem(object_ref(pod, POD), err))
        return ()
