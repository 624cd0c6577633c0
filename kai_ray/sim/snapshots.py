"""The simulator's snapshot builder: `build_snapshot`, reading each object once.

`kai_ray.state.snapshot.build_snapshot` reads every node and pod from its dict
each cycle, as the operator must (its cache changes under it). The simulator
knows exactly when one of its objects changes, so `SnapshotBuilder` keeps what
was read: nodes are read again only after `nodes_changed()`, a pod only after
`pod_changed(key)`. Everything after the reading (GPU devices, used and free,
topology, queue and group trees) is the state layer's `assemble_snapshot`, the
same code `build_snapshot` runs, handed one `SnapshotMemo` from build to build so
that only what changed is worked out again; a test holds the two builders to the
same reports.
Pure: no I/O; it must not decide anything the state layer decides.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kai_ray.state.memo import SnapshotMemo
from kai_ray.state.nodes import NodeReading, read_nodes
from kai_ray.state.pod_states import PodState, read_pod
from kai_ray.state.snapshot import ClusterObjects, Snapshot, _cyclic_gc_paused, assemble_snapshot
from kai_ray.values.errors import Problem
from kai_ray.values.names import SCHEDULER_NAME
from kai_ray.workloads.pods import pod_key


class SnapshotBuilder:
    """Builds each cycle's `Snapshot`, re-reading only the objects said to have changed."""

    def __init__(self, scheduler_name: str = SCHEDULER_NAME) -> None:
        self.scheduler_name = scheduler_name
        self._nodes: NodeReading | None = None
        self._memo = SnapshotMemo()
        self._pods: dict[str, tuple[PodState | None, list[Problem]]] = {}
        #: id of a pod object -> (the object, its key); the object is held so ids stay unique.
        self._keys: dict[int, tuple[Mapping[str, Any], str]] = {}

    def nodes_changed(self) -> None:
        self._nodes = None

    def pod_changed(self, key: str) -> None:
        self._pods.pop(key, None)

    def build(self, objects: ClusterObjects) -> Snapshot:
        with _cyclic_gc_paused():
            nodes = self._node_reading(objects.nodes)
            pods, problems = self._pod_states(objects.pods)
            return self._assemble(objects, nodes, pods, [*nodes.problems, *problems])

    def _node_reading(self, objects: Sequence[Mapping[str, Any]]) -> NodeReading:
        if self._nodes is None:
            self._nodes = read_nodes(objects)
        return self._nodes

    def _pod_states(
        self, objects: Sequence[Mapping[str, Any]]
    ) -> tuple[list[PodState], list[Problem]]:
        states: list[PodState] = []
        problems: list[Problem] = []
        for obj in objects:
            key = self._key(obj)
            cached = self._pods.get(key)
            if cached is None:
                found: list[Problem] = []
                cached = self._pods[key] = (read_pod(obj, found), found)
            if cached[0] is not None:
                states.append(cached[0])
            problems.extend(cached[1])
        if len(self._pods) > 2 * len(objects) + 64:
            live = {self._key(obj) for obj in objects}
            self._pods = {k: v for k, v in self._pods.items() if k in live}
            self._keys = {i: v for i, v in self._keys.items() if v[1] in live}
        return states, problems

    def _key(self, obj: Mapping[str, Any]) -> str:
        """The pod's key, kept by object: a pod's name and namespace never change."""
        kept = self._keys.get(id(obj))
        if kept is not None and kept[0] is obj:
            return kept[1]
        key = pod_key(obj)
        self._keys[id(obj)] = (obj, key)
        return key

    def _assemble(
        self,
        objects: ClusterObjects,
        reading: NodeReading,
        read: list[PodState],
        problems: list[Problem],
    ) -> Snapshot:
        return assemble_snapshot(
            objects, reading.nodes, read, problems, self.scheduler_name, self._memo
        )
