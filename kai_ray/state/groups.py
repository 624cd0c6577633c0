"""Pod groups: each valid PodGroup with its spec and the pods that joined it.

A pod joins a group through the `kai-ray.io/pod-group` annotation (alias
`pod-group-name`) naming a PodGroup in its own namespace. A group that fails
validation, or names a queue that is missing or not a leaf, is left out and
reported; so is a live pod naming a group that does not exist. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from pydantic import ValidationError

from kai_ray.state.pod_states import PodState, total_requests
from kai_ray.state.problems import object_ref, validation_problems
from kai_ray.state.queues import QueueTree
from kai_ray.values.api import PodGroup, PodGroupSpec, PodGroupStatus
from kai_ray.values.errors import ObjectRef, Problem
from kai_ray.values.names import POD_GROUP_ANNOTATION
from kai_ray.values.resources import Resources
from kai_ray.workloads.pods import annotation_field

POD_GROUP = "PodGroup"


@dataclass(frozen=True)
class PodGroupState:
    key: str
    name: str
    namespace: str
    spec: PodGroupSpec
    status: PodGroupStatus | None
    creation_timestamp: str
    #: Members, terminal ones included (the lifecycle needs them), oldest first.
    pods: tuple[PodState, ...]
    #: The members that are not terminal, in the same order.
    live: tuple[PodState, ...] = field(init=False, repr=False, compare=False)
    #: The live members bound to a node, in the same order.
    bound: tuple[PodState, ...] = field(init=False, repr=False, compare=False)
    #: What the live members ask for, and what the bound ones hold, GPU shares as
    #: parts of a GPU (summed once per state; a kept state keeps its sums).
    live_requests: Resources = field(init=False, repr=False, compare=False)
    bound_requests: Resources = field(init=False, repr=False, compare=False)
    #: The highest priority resolved onto any member (0 without members).
    pod_priority: int = field(init=False, repr=False, compare=False)
    #: The pending pods that would complete the minimum, as placement picks them.
    missing: tuple[PodState, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        live = tuple(pod for pod in self.pods if not pod.terminal)
        bound = tuple(pod for pod in live if pod.node is not None)
        object.__setattr__(self, "live", live)
        object.__setattr__(self, "bound", bound)
        object.__setattr__(self, "live_requests", total_requests(live))
        object.__setattr__(self, "bound_requests", total_requests(bound))
        object.__setattr__(self, "pod_priority", max((p.priority for p in self.pods), default=0))
        pending = [pod for pod in live if pod.node is None]
        short = max(self.spec.minMember - (len(live) - len(pending)), 0)
        object.__setattr__(self, "missing", tuple(pending[:short]))

    @property
    def queue(self) -> str:
        return self.spec.queue

    def ref(self) -> ObjectRef:
        return ObjectRef(POD_GROUP, self.name, self.namespace)

    def live_pods(self) -> tuple[PodState, ...]:
        return self.live

    def pods_of_subgroup(self, subgroup: str | None) -> tuple[PodState, ...]:
        return tuple(pod for pod in self.pods if pod.subgroup == subgroup)


@dataclass
class _Groups:
    valid: dict[str, PodGroup] = field(default_factory=dict)
    #: Every group named by an object, valid or not: a pod of a broken group is not an orphan.
    known: set[str] = field(default_factory=set)
    problems: list[Problem] = field(default_factory=list)


#: Validates one PodGroup object (by key); raises ValidationError.
Validate = Callable[[str, Mapping[str, Any]], PodGroup]


def _validate(key: str, obj: Mapping[str, Any]) -> PodGroup:
    return PodGroup.model_validate(obj)


def build_pod_groups(
    objects: Sequence[Mapping[str, Any]],
    pods: Sequence[PodState],
    queues: QueueTree,
    validate: Validate = _validate,
    kept: dict[str, PodGroupState] | None = None,
) -> tuple[Mapping[str, PodGroupState], list[Problem]]:
    """The valid groups with their members. `validate` may answer from a cache, and
    `kept` holds the states of an earlier build: one whose group and members are
    the same objects is reused (and `kept` is refreshed)."""
    groups = _validated_groups(objects, queues, validate)
    members: dict[str, list[PodState]] = {key: [] for key in groups.valid}
    for pod in pods:
        if pod.pod_group is None:
            continue
        key = f"{pod.namespace}/{pod.pod_group}"
        if key in members:
            members[key].append(pod)
        elif key not in groups.known and not pod.terminal:
            groups.problems.append(_orphan_problem(pod))
    states = {key: _state(group, members[key], kept) for key, group in groups.valid.items()}
    if kept is not None:
        kept.clear()
        kept.update(states)
    return MappingProxyType(states), groups.problems


def _validated_groups(
    objects: Sequence[Mapping[str, Any]], queues: QueueTree, validate: Validate
) -> _Groups:
    groups = _Groups()
    for obj in objects:
        key = _key(obj)
        if key in groups.known:
            ref = object_ref(obj, POD_GROUP)
            groups.problems.append(Problem(ref, "metadata.name", "listed twice; kept the first"))
            continue
        groups.known.add(key)
        try:
            group = validate(key, obj)
        except ValidationError as err:
            groups.problems.extend(validation_problems(object_ref(obj, POD_GROUP), err))
            continue
        queue_problem = _queue_problem(group.spec.queue, queues)
        if queue_problem:
            groups.problems.append(Problem(object_ref(obj, POD_GROUP), "spec.queue", queue_problem))
        else:
            groups.valid[key] = group
    return groups


def _key(obj: Mapping[str, Any]) -> str:
    """`namespace/name`, read as `object_ref` reads them (a bad object is still keyed)."""
    metadata = obj.get("metadata")
    if not isinstance(metadata, Mapping):
        metadata = {}
    return f"{metadata.get('namespace') or 'default'}/{metadata.get('name') or '<unnamed>'}"


def _queue_problem(queue: str, queues: QueueTree) -> str | None:
    if queue not in queues:
        return f"queue {queue!r} does not exist (or was left out of the queue tree)"
    if not queues[queue].is_leaf:
        children = ", ".join(queues[queue].children)
        return (
            f"queue {queue!r} is not a leaf (its children: {children}); "
            "only leaf queues take workloads"
        )
    return None


def _orphan_problem(pod: PodState) -> Problem:
    return Problem(
        pod.ref(),
        annotation_field(POD_GROUP_ANNOTATION),
        f"pod group {pod.pod_group!r} does not exist in namespace {pod.namespace}",
    )


def _state(
    group: PodGroup, pods: list[PodState], kept: dict[str, PodGroupState] | None
) -> PodGroupState:
    pods.sort(key=lambda pod: (pod.creation_timestamp, pod.name))
    key = f"{group.metadata.namespace or 'default'}/{group.metadata.name}"
    before = kept.get(key) if kept is not None else None
    # The same validated model (spec and status objects) and the same members.
    if (
        before is not None
        and before.spec is group.spec
        and before.status is group.status
        and before.pods == tuple(pods)
    ):
        return before
    return PodGroupState(
        key=key,
        name=group.metadata.name,
        namespace=group.metadata.namespace or "default",
        spec=group.spec,
        status=group.status,
        creation_timestamp=group.metadata.creationTimestamp or "",
        pods=tuple(pods),
    )
