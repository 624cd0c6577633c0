"""The snapshot kept from cycle to cycle: what changed is worked out again, the rest shared.

`ClusterCache` knows every change it is fed (a pod or PodGroup upserted or
deleted, a bind assumed or forgotten or expired, a Queue, Topology or Node
changed, new usage) and hands the keys to `SnapshotKeeper.snapshot`, which
patches the last snapshot instead of assembling a new one from every pod:

- nothing changed: the last `Snapshot` itself (snapshots are immutable);
- some pods changed: their readings, the accounts of the nodes they left or
  joined (devices, used row), their entries in `pods` and `pending_pods`, and
  the states of the groups they left or joined; every other entry is the same
  object as before;
- some PodGroups changed: validated again, their states rebuilt;
- a Queue changed, or usage: the queue tree again, and every group validated
  again when a queue came, went or gained or lost children;
- a Node's reading changed: its row and its pods again, while the nodes keep
  their names, order and resources (`_patch_nodes`);
- a node came or went, a new resource column, or the suspended workloads'
  placeholder pods: everything from the cache's readings (`rebuild`).

Every part is the function `assemble_snapshot` runs (`account_node`, `_used_row`,
`validate_group`, `member_problems`, `group_state`, `build_queue_tree`,
`_topologies`), applied to the changed keys only, with the order of every
mapping and of the problems as a full build lists them (the cache says each
key's place: `SnapshotSource.pod_order`, `group_order`). A property test holds
the result to `build_snapshot` of the cache's objects after random events.
Pure: no I/O; the previous snapshot is never changed in place.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from types import MappingProxyType

import numpy as np

from kai_ray.state.devices import NO_DEVICE, GpuDevices, account_node
from kai_ray.state.groups import (
    PodGroupState,
    group_key,
    group_state,
    is_unseen,
    listed_twice,
    member_of,
    member_problems,
    validate_group,
)
from kai_ray.state.keeping import Changes, Obj, Ordered, Rebuild, SnapshotSource
from kai_ray.state.memo import SnapshotMemo
from kai_ray.state.nodes import NodeFacts, NodeReading
from kai_ray.state.pod_states import PodState
from kai_ray.state.queues import QueueTree, build_queue_tree
from kai_ray.state.snapshot import (
    Matrix,
    Snapshot,
    _counted,
    _flags,
    _matrix,
    _read_only,
    _topologies,
    _used_row,
    resource_columns,
)
from kai_ray.values.api import PodGroup
from kai_ray.values.errors import Problem
from kai_ray.values.resources import GPU


class SnapshotKeeper:
    """The last snapshot and the indexes that patch it; see the module docstring."""

    def __init__(self, scheduler_name: str) -> None:
        self.scheduler_name = scheduler_name
        self.last: Snapshot | None = None
        self._nodes: NodeReading | None = None
        #: Validations and topology layouts, kept across rebuilds (checked against
        #: their inputs at every use), and the group states a rebuild may reuse.
        self.memo = SnapshotMemo()
        self._group_place: dict[str, int] = {}
        self.states = Ordered(self._group_order)
        #: Node capacity and allocatable, and the working device free fractions.
        self.capacity: Matrix = np.zeros((0, 0), dtype=np.float64)
        self.allocatable: Matrix = np.zeros((0, 0), dtype=np.float64)
        self.device_free: Matrix = np.zeros((0, 0), dtype=np.float64)

    def snapshot(self, source: SnapshotSource, nodes: NodeReading, changes: Changes) -> Snapshot:
        """The snapshot after `changes` (the source as it is now)."""
        if self.last is None or changes.everything:
            return self.rebuild(source, nodes)
        self._changed = self._trees = False
        try:
            if nodes is not self._nodes:
                self._patch_nodes(nodes)
            return self._patch(source, changes)
        except Rebuild:
            return self.rebuild(source, nodes)

    def rebuild(self, source: SnapshotSource, nodes: NodeReading) -> Snapshot:
        """Everything from the source's readings: the patch of an empty keeper."""
        earlier = self.states.items
        self._start(nodes)
        keys = list(dict.fromkeys(source.pod_keys()))
        for key in keys:
            self._read(key, source.pod_reading(key), source.pod_order(key))
        self.names = self._columns()
        self._lay_out_nodes(nodes)
        self._queue_tree(source, force=True)
        groups = list(source.group_objects())
        self._group_place.update((key, source.group_order(key)) for key, _ in groups)
        self._validate_all(groups)
        self._settle(keys)
        self._fill_groups(list(self._group_place), earlier)
        self.last = self._publish(source, trees=True)
        return self.last

    def _patch(self, source: SnapshotSource, changes: Changes) -> Snapshot:
        assert self.last is not None
        for key in changes.pods:
            found = source.pod_reading(key)
            self._read(key, found, source.pod_order(key) if found is not None else None)
        if self._columns() != self.names:
            raise Rebuild
        self._settle(sorted(changes.pods, key=self._order))
        self._patch_groups(source, changes.groups)
        if self._queue_tree(source, force=changes.queues):
            self._validate_all(list(source.group_objects()))
        self._fill_groups(self._dirty_groups)
        if not (self._changed or changes.topologies):
            return self.last
        self.last = self._publish(source, trees=changes.topologies or self._trees)
        return self.last

    def _patch_nodes(self, reading: NodeReading) -> None:
        """Nodes read again with the same names in the same order, offering the same
        resources and as many devices at most: only the nodes whose reading changed
        are laid out and accounted again (their pods listed again); otherwise a rebuild."""
        assert self._nodes is not None
        old, new = self._nodes.nodes, reading.nodes
        if len(old) != len(new) or any(a.name != b.name for a, b in zip(old, new, strict=True)):
            raise Rebuild
        if set().union(*(n.capacity for n in new), *(n.allocatable for n in new)) != self.offered:
            raise Rebuild
        changed = [i for i, (a, b) in enumerate(zip(old, new, strict=True)) if a != b]
        capacity, allocatable = self.capacity.copy(), self.allocatable.copy()
        for index in changed:
            capacity[index] = _matrix([new[index].capacity], self.names)[0]
            allocatable[index] = _matrix([new[index].allocatable], self.names)[0]
        counts = np.floor(allocatable[:, self.names.index(GPU)]).astype(np.int64)
        if max(int(counts.max(initial=0)), 1) != self.device_free.shape[1]:
            raise Rebuild  # the device matrix would be of another width
        self.capacity, self.allocatable = _read_only(capacity), _read_only(allocatable)
        self.counts = counts
        self.device_free[changed] = NO_DEVICE  # rows written again by their accounts
        self._touched.update(changed)
        self._nodes = reading
        self.memo.use_nodes(new)
        self._node_columns(new)
        self._changed = self._trees = self._accounted = True

    # ------------------------------------------------------------ the state

    def _start(self, nodes: NodeReading) -> None:
        self._nodes = nodes
        self.memo.use_nodes(nodes.nodes)
        self.node_index = MappingProxyType({n.name: i for i, n in enumerate(nodes.nodes)})
        self.offered: set[str] = set().union(
            *(n.capacity for n in nodes.nodes), *(n.allocatable for n in nodes.nodes)
        )
        #: Resource name -> how many readable pods ask for it.
        self.asked: Counter[str] = Counter()
        #: Every pod key's place, the readings (devices not settled) and what
        #: reading found; keys read again with a new place (deleted and made again).
        self._place: dict[str, int] = {}
        self.read: dict[str, PodState] = {}
        self.read_problems: dict[str, list[Problem]] = {}
        self._moved: set[str] = set()
        #: The counted readings of each node index, and the nodes to account again.
        self.on_node: dict[int, dict[str, PodState]] = {}
        self._touched: set[int] = set()
        self.device_problems: dict[int, tuple[Problem, ...]] = {}
        #: The pods as the snapshot lists them, and what is derived from each.
        self.pods = Ordered(self._order)
        self.unseen: set[str] = set()
        self.pod_problems: dict[str, list[Problem]] = {}
        self.naming: dict[str, dict[str, PodState]] = {}
        self.pending_keys: list[tuple[str, str]] = []
        self.pending: list[PodState] = []
        #: PodGroups by key: valid models, problems, places, every key an object has.
        self.valid: dict[str, PodGroup] = {}
        self.group_problems: dict[str, list[Problem]] = {}
        self._group_place = {}
        self.known: set[str] = set()
        self.states = Ordered(self._group_order)
        self.waiting = Ordered(self._group_order)
        self._waiting_changed = True
        self._dirty_groups: set[str] = set()
        self.queues: QueueTree | None = None
        self.queue_problems: list[Problem] = []
        self._shape: dict[str, tuple[str, ...]] = {}
        self._usage: dict[str, dict[str, float]] | None = None
        self.topology_problems: list[Problem] = []
        self._accounted = self._changed = self._pending_changed = True

    def _order(self, key: str) -> int:
        return self._place.get(key, -1)

    def _group_order(self, key: str) -> int:
        return self._group_place.get(key, -1)

    # ---------------------------------------------------------------- pods

    def _read(
        self, key: str, found: tuple[PodState | None, list[Problem]] | None, place: int | None
    ) -> None:
        """Take in one pod's new reading (None: the pod is gone)."""
        old = self.read.pop(key, None)
        if old is not None:
            self.asked.subtract(old.requests)
            self._count(old, None)
        if self._place.get(key) != place:
            self._moved.add(key)
        self._place.pop(key, None)
        self._changed = self.read_problems.pop(key, None) is not None or self._changed
        if found is None or place is None:
            return
        self._place[key] = place
        state, problems = found
        if problems:
            self.read_problems[key] = problems
            self._changed = True
        if state is not None:
            self.read[key] = state
            self.asked.update(state.requests)
            self._count(state, state)

    def _count(self, pod: PodState, into: PodState | None) -> None:
        """Put the reading on its node (or take it off: `into` None)."""
        if _counted(pod, self.node_index):
            index = self.node_index[pod.node or ""]
            held = self.on_node.setdefault(index, {})
            if into is None:
                held.pop(pod.key, None)
            else:
                held[pod.key] = into
            self._touched.add(index)

    def _columns(self) -> tuple[str, ...]:
        asked = [name for name, count in self.asked.items() if count > 0]
        return resource_columns([self.offered], [asked])

    def _lay_out_nodes(self, reading: NodeReading) -> None:
        nodes, names = reading.nodes, self.names
        self.capacity = _matrix([n.capacity for n in nodes], names)
        self.allocatable = _matrix([n.allocatable for n in nodes], names)
        self.counts = np.floor(self.allocatable[:, names.index(GPU)]).astype(np.int64)
        self.used = np.zeros((len(nodes), len(names)), dtype=np.float64)
        width = max(int(self.counts.max(initial=0)), 1)
        self.device_free = np.full((len(nodes), width), NO_DEVICE, dtype=np.float64)
        self.device_free[np.arange(width) < self.counts[:, None]] = 1.0  # untouched devices
        self.devices = [GpuDevices.untouched(int(count)) for count in self.counts]
        self._node_columns(nodes)

    def _node_columns(self, nodes: Sequence[NodeFacts]) -> None:
        """What the snapshot lists per node besides resources."""
        self.ready = _flags(n.ready for n in nodes)
        self.unschedulable = _flags(n.unschedulable for n in nodes)
        self.labels = tuple(n.labels for n in nodes)
        self.node_names = tuple(n.name for n in nodes)
        self.taints = tuple(n.taints for n in nodes)
        memory = np.array([n.gpu_memory_mib for n in nodes], dtype=np.float64)
        self.gpu_memory_mib = _read_only(memory)

    def _settle(self, keys: Sequence[str]) -> None:
        """Account the touched nodes again, then list every pod whose settled state
        may have changed: those read again, and those on the touched nodes."""
        settled: dict[str, PodState] = {}
        changed = dict.fromkeys(keys)
        for index in sorted(self._touched):
            settled.update((pod.key, pod) for pod in self._account(index))
            changed.update(dict.fromkeys(self.on_node.get(index, ())))
        self._accounted = self._accounted or bool(self._touched)
        self._touched = set()
        for key in changed:
            self._list(key, settled.get(key) or self.read.get(key))
        self._moved = set()

    def _account(self, index: int) -> tuple[PodState, ...]:
        """One node's devices and used row from its counted pods in their order."""
        held = self.on_node.get(index) or {}
        pods = sorted(held.values(), key=lambda pod: self._order(pod.key))
        if not held:
            self.on_node.pop(index, None)
        gpu_pods = [pod for pod in pods if pod.uses_gpu]
        count = int(self.counts[index])
        assert self._nodes is not None
        devices = account_node(count, self._nodes.nodes[index].gpu_memory_mib, gpu_pods)
        settled = {pod.key: pod for pod in devices.pods}
        self.used[index] = _used_row([settled.get(pod.key, pod) for pod in pods], self.names)
        self.devices[index] = devices.devices
        self.device_free[index, :count] = devices.devices.free
        before = self.device_problems.pop(index, ())
        if devices.problems:
            self.device_problems[index] = devices.problems
        self._changed = self._changed or before != devices.problems
        return devices.pods

    def _list(self, key: str, state: PodState | None) -> None:
        """The pod as the snapshot lists it from now on (None: not listed)."""
        before: PodState | None = self.pods.items.get(key)
        moved = key in self._moved
        if before == state and not moved:
            return
        self._changed = True
        if before is not None:
            self._unlist(before)
            if state is None or moved:
                self.pods.pop(key)
        if state is not None:
            self.pods.set(key, state)
            self._enlist(state)

    def _unlist(self, pod: PodState) -> None:
        self.unseen.discard(pod.key)
        self.pod_problems.pop(pod.key, None)
        group = member_of(pod, self.scheduler_name)
        if group is not None:
            members = self.naming[group]
            del members[pod.key]
            if not members:
                del self.naming[group]
            self._dirty_groups.add(group)
        if self._is_pending(pod):
            at = bisect.bisect_left(self.pending_keys, (pod.creation_timestamp, pod.key))
            del self.pending_keys[at], self.pending[at]
            self._pending_changed = True

    def _enlist(self, pod: PodState) -> None:
        if is_unseen(pod, self.node_index):
            self.unseen.add(pod.key)
        self._member_problems(pod)
        group = member_of(pod, self.scheduler_name)
        if group is not None:
            self.naming.setdefault(group, {})[pod.key] = pod
            self._dirty_groups.add(group)
        if self._is_pending(pod):
            sort_key = (pod.creation_timestamp, pod.key)
            at = bisect.bisect_left(self.pending_keys, sort_key)
            self.pending_keys.insert(at, sort_key)
            self.pending.insert(at, pod)
            self._pending_changed = True

    def _member_problems(self, pod: PodState) -> None:
        found = member_problems(pod, self.node_index, self.known, self.scheduler_name)
        if found:
            self.pod_problems[pod.key] = found
        else:
            self.pod_problems.pop(pod.key, None)

    def _is_pending(self, pod: PodState) -> bool:
        """Listed in `pending_pods`, as `snapshot._pending` picks them."""
        return (
            pod.scheduler == self.scheduler_name
            and pod.node is None
            and not pod.terminal
            and not pod.held
        )

    # -------------------------------------------------------------- groups

    def _validate_all(self, groups: list[tuple[str, Obj]]) -> None:
        """Every PodGroup object validated (the memo answers for those seen before)."""
        self._dirty_groups.update(self.valid, self.group_problems)
        self.valid, self.group_problems, self.known = {}, {}, set()
        for key, obj in groups:
            if group_key(obj) in self.known:
                self.group_problems[key] = [listed_twice(obj)]
            else:
                self._validate(key, obj)
        self.memo.pod_groups.keep_only(set(self._group_place))
        self._changed = True

    def _validate(self, key: str, obj: Obj) -> None:
        assert self.queues is not None
        self.known.add(group_key(obj))
        group, problems = validate_group(
            obj, self.queues, lambda k, o: self.memo.pod_groups.get(k, o, PodGroup.model_validate)
        )
        if problems:
            self.group_problems[key] = problems
        if group is not None:
            self.valid[key] = group
        self._dirty_groups.add(key)

    def _patch_groups(self, source: SnapshotSource, keys: Collection[str]) -> None:
        """The PodGroup objects upserted or deleted since the last snapshot."""
        for key in keys:
            obj = source.group_object(key)
            if len(self.known) != len(self._group_place) or (obj and group_key(obj) != key):
                raise Rebuild  # listed twice, or keyed apart from its key: a full build orders it
            was_known = key in self.known
            self.valid.pop(key, None)
            self.group_problems.pop(key, None)
            self.known.discard(key)
            place = source.group_order(key) if obj is not None else None
            if place != self._group_place.pop(key, None):
                self._drop_state(key)  # made again: listed at its new place
            if obj is not None and place is not None:
                self._group_place[key] = place
                self._validate(key, obj)
            else:
                self.memo.pod_groups.entries.pop(key, None)
            self._dirty_groups.add(key)
            self._changed = True
            if was_known != (key in self.known):
                for pod in self.naming.get(key, {}).values():
                    self._member_problems(pod)

    def _fill_groups(
        self, keys: Iterable[str], earlier: Mapping[str, PodGroupState] | None = None
    ) -> None:
        """The states of the groups in `keys` from their members as listed now (a
        state of `earlier`, else of the last snapshot, is reused when nothing in it
        changed)."""
        for key in keys:
            group = self.valid.get(key)
            if group is None:
                self._drop_state(key)
                continue
            members = sorted(self.naming.get(key, {}).values(), key=lambda p: self._order(p.key))
            state = group_state(group, members, earlier or self.states.items, self.unseen)
            if self.states.items.get(key) is not state:
                self.states.set(key, state)
                self._changed = True
                if state.waiting:
                    self.waiting.set(key, state)
                    self._waiting_changed = True
                elif key in self.waiting.items:
                    self.waiting.pop(key)
                    self._waiting_changed = True
        self._dirty_groups = set()

    def _drop_state(self, key: str) -> None:
        if key in self.states.items:
            self.states.pop(key)
            self._changed = True
        if key in self.waiting.items:
            self.waiting.pop(key)
            self._waiting_changed = True

    # -------------------------------------------------------- queues, trees

    def _queue_tree(self, source: SnapshotSource, force: bool) -> bool:
        """The queue tree again when Queues or usage changed; True when the groups
        must be validated again (a queue came or went, or its children changed)."""
        usage = source.current_usage()
        if not force and usage == self._usage:
            return False
        self._usage = {name: dict(amounts) for name, amounts in usage.items()}
        self.queues, self.queue_problems = build_queue_tree(source.queue_objects(), usage)
        self._changed = True
        shape = {name: node.children for name, node in self.queues.nodes.items()}
        reshaped, self._shape = shape != self._shape, shape
        return reshaped

    # ----------------------------------------------------------- publishing

    def _publish(self, source: SnapshotSource, trees: bool) -> Snapshot:
        """The snapshot of the kept state; what did not change is the last one's."""
        last, queues = self.last, self.queues
        assert queues is not None
        if self._accounted or last is None or last.node_index is not self.node_index:
            used = _read_only(self.used.copy())
            free = _read_only(self.allocatable - used)
            gpu_free = _read_only(self.device_free.copy())
            devices = tuple(self.devices)
        else:
            used, free, gpu_free, devices = last.used, last.free, last.gpu_free, last.gpu_devices
        # The trees say which nodes make up each domain: read again when the
        # Topologies or the nodes change, not when pods do.
        if trees or last is None or last.node_index is not self.node_index:
            self.topology_problems = []
            objects = source.topology_objects()
            topologies = _topologies(self.memo, objects, self.labels, self.topology_problems)
        else:
            topologies = last.topologies
        self._accounted = False
        return Snapshot(
            resource_names=self.names,
            node_names=self.node_names,
            node_index=self.node_index,
            capacity=self.capacity,
            allocatable=self.allocatable,
            used=used,
            free=free,
            ready=self.ready,
            unschedulable=self.unschedulable,
            labels=self.labels,
            taints=self.taints,
            gpu_devices=devices,
            gpu_free=gpu_free,
            gpu_memory_mib=self.gpu_memory_mib,
            topologies=topologies,
            queues=queues,
            pod_groups=self.states.published(),
            pods=self.pods.published(),
            pending_pods=self._pending_pods(),
            problems=self._problems(),
            waiting_groups=self._waiting_groups(),
            # Read after publishing (the keyword arguments above ran first).
            pods_changed=self.pods.changed,
            groups_changed=self.states.changed,
        )

    def _waiting_groups(self) -> tuple[PodGroupState, ...]:
        if self._waiting_changed or self.last is None:
            self._waiting_changed = False
            return tuple(self.waiting.published().values())
        return self.last.waiting_groups

    def _pending_pods(self) -> tuple[PodState, ...]:
        if self._pending_changed or self.last is None:
            self._pending_changed = False
            return tuple(self.pending)
        return self.last.pending_pods

    def _problems(self) -> tuple[Problem, ...]:
        """Every problem in the order a full build lists them."""
        assert self._nodes is not None
        pods = sorted(self.read_problems, key=self._order)
        members = sorted(self.pod_problems, key=self._order)
        groups = sorted(self.group_problems, key=self._group_order)
        return (
            *self._nodes.problems,
            *(p for key in pods for p in self.read_problems[key]),
            *(p for index in sorted(self.device_problems) for p in self.device_problems[index]),
            *self.topology_problems,
            *self.queue_problems,
            *(p for key in groups for p in self.group_problems[key]),
            *(p for key in members for p in self.pod_problems[key]),
        )
