"""What the snapshot keeper works with: the changes the cache records, what it
reads from the cache, and a dict kept in its keys' order that a published
snapshot shares until the next change copies it. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol

from kai_ray.state.pod_states import PodState
from kai_ray.state.snapshot import Changed
from kai_ray.values.errors import Problem

Obj = Mapping[str, Any]


class SnapshotSource(Protocol):
    """What the keeper reads from the cache, by key."""

    def pod_keys(self) -> Iterable[str]:
        """Every pod key the snapshot reads, in their order."""

    def pod_reading(self, key: str) -> tuple[PodState | None, list[Problem]] | None:
        """The pod read (None when it is unreadable or leaving) with what reading it
        found; None when there is no such pod."""

    def pod_order(self, key: str) -> int:
        """The pod's place: larger for a pod listed later."""

    def group_objects(self) -> Iterable[tuple[str, Obj]]:
        """Every PodGroup object by key, in their order."""

    def group_object(self, key: str) -> Obj | None: ...

    def group_order(self, key: str) -> int: ...

    def queue_objects(self) -> Sequence[Obj]: ...

    def topology_objects(self) -> Sequence[Obj]: ...

    def current_usage(self) -> Mapping[str, Mapping[str, float]]: ...


@dataclass
class Changes:
    """What changed since the last snapshot, as the cache recorded it."""

    pods: set[str] = field(default_factory=set)
    groups: set[str] = field(default_factory=set)
    queues: bool = False
    topologies: bool = False
    #: Nodes, placeholder pods, or anything else only a rebuild follows.
    everything: bool = True

    def clear(self) -> None:
        self.pods, self.groups = set(), set()
        self.queues = self.topologies = self.everything = False


class Rebuild(Exception):
    """A patch met a change only a rebuild follows (a new resource column)."""


class Ordered:
    """A dict kept in the order of its keys' places, copied before a change once a
    snapshot shares it (so a published snapshot never changes). Publishing with no
    change since gives the same mapping again; otherwise `changed` says which keys
    differ from the mapping published before (`snapshot.Changed`)."""

    def __init__(self, place: Callable[[str], int]) -> None:
        self.items: dict[str, Any] = {}
        self._place = place
        self._last = -1
        self._shared = False
        self._unordered = False
        self._published: MappingProxyType[str, Any] | None = None
        #: Keys set or popped since the last publishing.
        self._since: set[str] = set()
        self.changed: Changed | None = None

    def set(self, key: str, value: Any) -> None:
        self._own()
        if key not in self.items:
            place = self._place(key)
            self._unordered = self._unordered or place < self._last
            self._last = max(self._last, place)
        self.items[key] = value
        self._since.add(key)

    def pop(self, key: str) -> None:
        if key in self.items:
            self._own()
            del self.items[key]
            self._since.add(key)

    def published(self) -> MappingProxyType[str, Any]:
        before = self._published
        if before is not None and not self._since and not self._unordered:
            self.changed = Changed(before, before, ())
            return before
        if self._unordered:
            self.items = {k: self.items[k] for k in sorted(self.items, key=self._place)}
            self._unordered = False
        self._shared = True
        now = MappingProxyType(self.items)
        keys = tuple(sorted(self._since, key=self._place))
        self.changed = None if before is None else Changed(before, now, keys)
        self._published, self._since = now, set()
        return now

    def _own(self) -> None:
        if self._shared:
            self.items = dict(self.items)
            self._shared = False
