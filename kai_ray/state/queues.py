"""The queue tree: every usable Queue with its parent, children and depth.

Queues whose parent is missing, whose parents form a cycle, or whose ancestor
was left out for either reason are removed and reported on `spec.parentQueue`;
the rest of the tree stays usable. Children are ordered by creation time, then
name, so that every consumer walks siblings in the same order. Pure: no I/O.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from pydantic import ValidationError

from kai_ray.state.problems import object_ref, validation_problems
from kai_ray.values.api import Queue, QueueSpec
from kai_ray.values.clock import unix_seconds
from kai_ray.values.errors import ObjectRef, Problem
from kai_ray.values.resources import Resources, canonical_name, parse_amount

QUEUE = "Queue"
PARENT_FIELD = "spec.parentQueue"


@dataclass(frozen=True)
class UsageInterval:
    """From `start_s` to `end_s` a queue held `held`, of a cluster of `capacity`."""

    start_s: float
    end_s: float
    held: Resources
    capacity: Resources

    @property
    def length(self) -> float:
        return self.end_s - self.start_s


@dataclass(frozen=True)
class QueueNode:
    name: str
    parent: str | None
    children: tuple[str, ...]
    spec: QueueSpec
    depth: int
    creation_timestamp: str
    #: Decayed, normalised usage by Kubernetes resource name (time-based fairness).
    usage: Mapping[str, float]
    #: The usage history its status persisted (read once, after a restart).
    usage_history: tuple[UsageInterval, ...] = ()
    #: Per resource: its (quota, limit, over-quota weight), parsed from `spec` when
    #: first asked (`fairness.queue_resource`); a new node starts without any.
    bounds: dict[str, tuple[float, float, float]] = field(
        default_factory=dict, init=False, compare=False, repr=False
    )

    @property
    def is_leaf(self) -> bool:
        return not self.children


@dataclass(frozen=True)
class QueueTree:
    nodes: Mapping[str, QueueNode]
    roots: tuple[str, ...]

    def __contains__(self, name: object) -> bool:
        return name in self.nodes

    def __getitem__(self, name: str) -> QueueNode:
        return self.nodes[name]

    def ancestors(self, name: str) -> tuple[str, ...]:
        """Parent first, root last."""
        chain: list[str] = []
        parent = self.nodes[name].parent
        while parent is not None:
            chain.append(parent)
            parent = self.nodes[parent].parent
        return tuple(chain)

    def top_down(self) -> Iterator[QueueNode]:
        """Every queue, parents before children, siblings in order (depth first)."""
        stack = list(reversed(self.roots))
        while stack:
            node = self.nodes[stack.pop()]
            yield node
            stack.extend(reversed(node.children))

    def leaves(self) -> tuple[str, ...]:
        return tuple(node.name for node in self.top_down() if node.is_leaf)

    def typed_names(self, leaf: str) -> tuple[str, ...]:
        """The per-type resource keys (`label=value`) the leaf or an ancestor names,
        sorted; kept, as the tree never changes."""
        names = self._typed_names.get(leaf)
        if names is None:
            chain = (leaf, *self.ancestors(leaf))
            found = {key for name in chain for key in self.nodes[name].spec.resources}
            names = self._typed_names[leaf] = tuple(sorted(k for k in found if "=" in k))
        return names

    @functools.cached_property
    def _typed_names(self) -> dict[str, tuple[str, ...]]:
        return {}


def build_queue_tree(
    objects: Sequence[Mapping[str, Any]], usage: Mapping[str, Mapping[str, float]]
) -> tuple[QueueTree, list[Problem]]:
    queues, problems = _validated_queues(objects)
    parents = {name: queue.spec.parentQueue for name, queue in queues.items()}
    removed = unreachable_queues(parents, invalid={p.obj.name for p in problems})
    for name, message in removed.items():
        problems.append(Problem(ObjectRef(QUEUE, name), PARENT_FIELD, message))
    kept = {name: queue for name, queue in queues.items() if name not in removed}
    return _tree(kept, usage), problems


def _validated_queues(
    objects: Sequence[Mapping[str, Any]],
) -> tuple[dict[str, Queue], list[Problem]]:
    queues: dict[str, Queue] = {}
    problems: list[Problem] = []
    for obj in objects:
        ref = object_ref(obj, QUEUE)
        try:
            queue = Queue.model_validate(obj)
        except ValidationError as err:
            problems.extend(validation_problems(ref, err))
            continue
        if queue.metadata.name in queues:
            problems.append(Problem(ref, "metadata.name", "listed twice; kept the first"))
            continue
        queues[queue.metadata.name] = queue
    return queues, problems


def unreachable_queues(
    parents: Mapping[str, str | None], invalid: Collection[str] = frozenset()
) -> dict[str, str]:
    """Queues that cannot reach a root, each with the reason it is left out.

    `parents` maps every usable queue to its `spec.parentQueue`; `invalid` names the
    Queues that exist but failed validation. The one judge of a missing parent or a
    cycle: the tree and the operator's `Valid` condition both ask it."""
    removed: dict[str, str] = {}
    reachable: set[str] = set()
    for start in sorted(parents):
        path: list[str] = []
        name: str | None = start
        while name is not None and name not in reachable and name not in removed:
            if name in path:
                _remove_cycle(path[path.index(name) :], removed)
                break
            if name not in parents:
                removed[path[-1]] = _missing_parent(name, invalid)
                break
            path.append(name)
            name = parents[name]
        _settle_path(path, parents, reachable, removed)
    return removed


def _missing_parent(name: str, invalid: Collection[str]) -> str:
    if name in invalid:
        return f"parent queue {name!r} is not valid (see its Valid condition); left out of the tree"
    return f"parent queue {name!r} does not exist; left out of the tree"


def _remove_cycle(cycle: Sequence[str], removed: dict[str, str]) -> None:
    loop = " -> ".join([*cycle, cycle[0]])
    for name in cycle:
        removed[name] = f"parent queues form a cycle ({loop}); left out of the tree"


def _settle_path(
    path: Sequence[str],
    parents: Mapping[str, str | None],
    reachable: set[str],
    removed: dict[str, str],
) -> None:
    """Walking back down the path: a queue is usable exactly when its parent is."""
    for name in reversed(path):
        parent = parents[name]
        if name in removed:
            continue
        if parent is None or parent in reachable:
            reachable.add(name)
        else:
            removed[name] = f"parent queue {parent!r} is left out of the tree, so is this queue"


def _tree(queues: Mapping[str, Queue], usage: Mapping[str, Mapping[str, float]]) -> QueueTree:
    def age(name: str) -> tuple[str, str]:
        return (queues[name].metadata.creationTimestamp or "", name)

    children: dict[str | None, list[str]] = {}
    for name in sorted(queues, key=age):
        children.setdefault(queues[name].spec.parentQueue, []).append(name)
    nodes: dict[str, QueueNode] = {}
    for name, queue in queues.items():
        nodes[name] = QueueNode(
            name=name,
            parent=queue.spec.parentQueue,
            children=tuple(children.get(name, ())),
            spec=queue.spec,
            depth=_depth(name, queues),
            creation_timestamp=queue.metadata.creationTimestamp or "",
            usage=_usage(queue, usage.get(name)),
            usage_history=_usage_history(queue),
        )
    return QueueTree(MappingProxyType(nodes), tuple(children.get(None, ())))


def _depth(name: str, queues: Mapping[str, Queue]) -> int:
    depth = 0
    parent = queues[name].spec.parentQueue
    while parent is not None:
        depth += 1
        parent = queues[parent].spec.parentQueue
    return depth


def _usage_history(queue: Queue) -> tuple[UsageInterval, ...]:
    """The intervals the status persisted, oldest first (unreadable ones left out)."""
    if queue.status is None:
        return ()
    intervals = []
    for i, record in enumerate(queue.status.usageHistory):
        start, end = unix_seconds(record.start), unix_seconds(record.end)
        if start is None or end is None or end <= start:
            continue
        field = f"status.usageHistory[{i}]"
        held = _parsed(record.held, f"{field}.held")
        capacity = _parsed(record.capacity, f"{field}.capacity")
        intervals.append(UsageInterval(start, end, held, capacity))
    return tuple(sorted(intervals, key=lambda i: i.start_s))


def _parsed(amounts: Mapping[str, Any], field: str) -> Resources:
    return Resources(
        {canonical_name(k): parse_amount(v, f"{field}.{k}") for k, v in amounts.items()}
    )


def _usage(queue: Queue, given: Mapping[str, float] | None) -> Mapping[str, float]:
    """The usage handed in this cycle, else what the queue's status last persisted."""
    if given is not None:
        amounts = {canonical_name(k): float(v) for k, v in given.items()}
    elif queue.status is not None:
        amounts = {
            canonical_name(k): parse_amount(v, f"status.usage.{k}")
            for k, v in queue.status.usage.items()
        }
    else:
        amounts = {}
    return MappingProxyType(amounts)
