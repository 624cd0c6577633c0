"""Pod groups: each valid PodGroup with its spec and the pods that joined it.

A pod joins a group through the `kai-ray.io/pod-group` annotation (alias
`pod-group-name`) naming a PodGroup in its own namespace. A group that fails
validation, or names a queue that is missing or not a leaf, is left out and
reported; so is a live pod naming a group that does not exist. When the caller
passes the snapshot's node names, a live pod bound to a node not among them (the
node's watch event not seen yet, or the node gone) is reported too, and its
group does not count it as bound: nothing can be known of where it runs, so it
is neither placed, nor evicted, nor an anchor for its gang. Pure: no I/O.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Mapping, Sequence
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
from kai_ray.values.resources import Resources, interned
from kai_ray.values.validation import NO_NAME
from kai_ray.workloads.pod_fields import annotation_field

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
    #: Live members bound to a node the snapshot does not know (by key): neither
    #: bound nor pending for the cycle.
    unseen: frozenset[str] = frozenset()
    #: The members that are not terminal, in the same order.
    live: tuple[PodState, ...] = field(init=False, repr=False, compare=False)
    #: The live members bound to a node the snapshot knows, in the same order.
    bound: tuple[PodState, ...] = field(init=False, repr=False, compare=False)
    #: The live members waiting for a node, in the same order; a pod held by
    #: another's scheduling gate (Grove's, until its gang's pods all exist) is not
    #: one yet: it cannot be bound, so it cannot make up a minimum.
    pending: tuple[PodState, ...] = field(init=False, repr=False, compare=False)
    #: What the live members ask for, and what the bound ones hold, GPU shares as
    #: parts of a GPU (summed once per state; a kept state keeps its sums).
    live_requests: Resources = field(init=False, repr=False, compare=False)
    bound_requests: Resources = field(init=False, repr=False, compare=False)
    #: The highest priority resolved onto any member (0 without members).
    pod_priority: int = field(init=False, repr=False, compare=False)
    #: The members that ran to completion: they did their part, and count towards
    #: the minimum as bound members do (a gang whose first pods finished before the
    #: rest were bound is not short of them).
    succeeded: tuple[PodState, ...] = field(init=False, repr=False, compare=False)
    #: The pending pods that would complete the minimum, as placement picks them.
    missing: tuple[PodState, ...] = field(init=False, repr=False, compare=False)
    #: The leaf queue it names (`spec.queue`), read by every step that judges it.
    queue: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        live = tuple(pod for pod in self.pods if not pod.terminal)
        bound = tuple(p for p in live if p.node is not None and p.key not in self.unseen)
        pending = tuple(pod for pod in live if pod.node is None and not pod.held)
        object.__setattr__(self, "live", live)
        object.__setattr__(self, "bound", bound)
        object.__setattr__(self, "pending", pending)
        object.__setattr__(self, "live_requests", total_requests(live))
        object.__setattr__(self, "bound_requests", total_requests(bound))
        object.__setattr__(self, "pod_priority", max((p.priority for p in self.pods), default=0))
        succeeded = tuple(pod for pod in self.pods if pod.phase == "Succeeded")
        object.__setattr__(self, "succeeded", succeeded)
        short = max(self.spec.minMember - len(bound) - len(succeeded), 0)
        object.__setattr__(self, "missing", pending[:short])
        object.__setattr__(self, "queue", self.spec.queue)

    @functools.cached_property
    def missing_requests(self) -> Resources:
        """What the missing minimum asks for (`missing`'s requests added up), summed
        once per state: a waiting gang is asked it by every action of every cycle
        while it waits unchanged. Interned: gangs asking alike ask the same object."""
        return interned(total_requests(self.missing))

    def ref(self) -> ObjectRef:
        return ObjectRef(POD_GROUP, self.name, self.namespace)

    def live_pods(self) -> tuple[PodState, ...]:
        return self.live

    @property
    def waiting(self) -> bool:
        """A waiting gang: its minimum does not hold yet, and pending pods can add to it."""
        return bool(self.missing)

    @property
    def seen_whole(self) -> bool:
        """Every live member is pending or on a node the snapshot knows."""
        return not self.unseen

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
    *,
    node_names: Collection[str] | None = None,
    scheduler: str | None = None,
) -> tuple[Mapping[str, PodGroupState], list[Problem]]:
    """The valid groups with their members. `validate` may answer from a cache, and
    `kept` holds the states of an earlier build: one whose group and members are
    the same objects is reused (and `kept` is refreshed). `node_names` are the
    nodes the snapshot knows (None: every node a pod names is taken as known);
    `scheduler` whose pods are members (None: every pod; see `member_of`)."""
    groups = _validated_groups(objects, queues, validate)
    members: dict[str, list[PodState]] = {key: [] for key in groups.valid}
    unseen: set[str] = set()
    for pod in pods:
        if is_unseen(pod, node_names):
            unseen.add(pod.key)
        groups.problems.extend(member_problems(pod, node_names, groups.known, scheduler))
        key = member_of(pod, scheduler)
        if key in members:
            members[key].append(pod)
    states = {
        key: group_state(group, members[key], kept, unseen) for key, group in groups.valid.items()
    }
    if kept is not None:
        kept.clear()
        kept.update(states)
    return MappingProxyType(states), groups.problems


def _validated_groups(
    objects: Sequence[Mapping[str, Any]], queues: QueueTree, validate: Validate
) -> _Groups:
    groups = _Groups()
    for obj in objects:
        key = group_key(obj)
        if key in groups.known:
            groups.problems.append(listed_twice(obj))
            continue
        groups.known.add(key)
        group, problems = validate_group(obj, queues, validate)
        groups.problems.extend(problems)
        if group is not None:
            groups.valid[key] = group
    return groups


def validate_group(
    obj: Mapping[str, Any], queues: QueueTree, validate: Validate = _validate
) -> tuple[PodGroup | None, list[Problem]]:
    """One PodGroup object: its model when it is valid and names a leaf queue of
    `queues`, else None and why."""
    try:
        group = validate(group_key(obj), obj)
    except ValidationError as err:
        return None, validation_problems(object_ref(obj, POD_GROUP), err)
    problem = queue_problem(group.spec.queue, queues)
    if problem:
        return None, [Problem(object_ref(obj, POD_GROUP), "spec.queue", problem)]
    return group, []


def listed_twice(obj: Mapping[str, Any]) -> Problem:
    return Problem(object_ref(obj, POD_GROUP), "metadata.name", "listed twice; kept the first")


def group_of(pod: PodState) -> str | None:
    """The key of the group the pod names, if it names one."""
    return None if pod.pod_group is None else f"{pod.namespace}/{pod.pod_group}"


#: The scheduler of a pod that names none. Such a pod joins the group it names,
#: as it always has (the simulator's input seldom names a scheduler).
UNNAMED_SCHEDULER = "default-scheduler"


def member_of(pod: PodState, scheduler: str | None) -> str | None:
    """The key of the group the pod is a member of: the one it names, unless the
    pod is another scheduler's (named, not `scheduler`; None: any pod is a
    member). Another scheduler's pod counts on its node only: naming a group does
    not make it this scheduler's to place (two kai-ray schedulers in one cluster
    reading the same annotation would both bind it)."""
    if _foreign(pod, scheduler):
        return None
    return group_of(pod)


def _foreign(pod: PodState, scheduler: str | None) -> bool:
    return scheduler is not None and pod.scheduler not in (scheduler, UNNAMED_SCHEDULER)


def is_unseen(pod: PodState, node_names: Collection[str] | None) -> bool:
    """Live and bound to a node the snapshot does not know (None: all are known)."""
    return node_names is not None and _on_unseen_node(pod, node_names)


def member_problems(
    pod: PodState,
    node_names: Collection[str] | None,
    known: Collection[str],
    scheduler: str | None = None,
) -> list[Problem]:
    """What the groups' build reports about one of `scheduler`'s pods (None: any
    pod): bound to a node not seen, or naming a group that no object (valid or
    not) is keyed by. Nothing about another scheduler's pods, nor about a missing
    group of a pod on its way out (its group often goes first: a namespace being
    deleted, an owner's garbage collection)."""
    if _foreign(pod, scheduler):
        return []
    found = [_unseen_node_problem(pod)] if is_unseen(pod, node_names) else []
    key = group_of(pod)
    if key is not None and key not in known and not pod.terminal and not pod.releasing:
        found.append(_orphan_problem(pod))
    return found


def group_key(obj: Mapping[str, Any]) -> str:
    """`namespace/name`, read as `object_ref` reads them (a bad object is still keyed)."""
    metadata = obj.get("metadata")
    if not isinstance(metadata, Mapping):
        metadata = {}
    return f"{metadata.get('namespace') or 'default'}/{metadata.get('name') or NO_NAME}"


def queue_problem(queue: str, queues: QueueTree) -> str | None:
    """Why a workload may not use `queue` (missing from the tree, or not a leaf);
    the tree and the validating webhook both ask it."""
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


def _on_unseen_node(pod: PodState, node_names: Collection[str]) -> bool:
    return pod.node is not None and not pod.terminal and pod.node not in node_names


def _unseen_node_problem(pod: PodState) -> Problem:
    return Problem(
        pod.ref(),
        "spec.nodeName",
        f"bound to node {pod.node!r}, which the snapshot does not know; "
        "its group does not count it until the node is seen",
    )


def group_state(
    group: PodGroup,
    pods: list[PodState],
    kept: Mapping[str, PodGroupState] | None,
    unseen: Collection[str],
) -> PodGroupState:
    """The group's state with `pods` (sorted here, oldest first; ties keep their
    order); the state in `kept` is returned when nothing it holds changed."""
    pods.sort(key=lambda pod: (pod.creation_timestamp, pod.name))
    key = f"{group.metadata.namespace or 'default'}/{group.metadata.name}"
    before = kept.get(key) if kept is not None else None
    members_unseen = frozenset(pod.key for pod in pods if pod.key in unseen)
    # The same validated model (spec and status objects), the same members, seen alike.
    if (
        before is not None
        and before.spec is group.spec
        and before.status is group.status
        and before.pods == tuple(pods)
        and before.unseen == members_unseen
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
        unseen=members_unseen,
    )
