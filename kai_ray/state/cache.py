"""The cluster cache: one state fed by events, and the snapshot derived from it.

The operator's watches and the simulator's events feed the same `ClusterCache`
through `upsert` and `delete`; the cycle reads only the `snapshot()` it builds.
The cache records which keys changed (`Changes`), and `SnapshotKeeper`
(`state/incremental.py`) patches the last snapshot with them: a cycle in which
nothing changed gets the last snapshot itself, one in which a pod changed
costs that pod, its node and its group; one in which a node's reading changed
costs that node and its pods. A node come or gone, a new resource column, or
the placeholder pods of suspended workloads rebuild it from the readings the
cache keeps; tests hold it to `build_snapshot` of `objects()`.

Binds the binder made but the watch has not shown yet are held as *assumed*
(`assume`): the pod is read as bound to that node until the watch brings the
bound pod or the assumption expires, so the next cycle neither books the node
twice nor forgets the pod. Expiry is measured on a clock passed in.

Objects are kept as the plain mappings they arrived as, in arrival order (an
update keeps its place), which is the order the snapshot lists them in.
Pure: no I/O, no threads; the operator serialises access.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cachetools import TTLCache

from kai_ray.state.devices import account_node
from kai_ray.state.dra_allocate import ClaimAllocation
from kai_ray.state.dra_status import allocation_body
from kai_ray.state.dra_view import EMPTY as EMPTY_DRA
from kai_ray.state.dra_view import (
    DeviceSide,
    DraView,
    build_device_side,
    build_dra_view,
    with_claims,
    with_devices,
)
from kai_ray.state.heap import collector_paused
from kai_ray.state.incremental import SnapshotKeeper
from kai_ray.state.keeping import Changes
from kai_ray.state.nodes import NodeFacts, NodeReading, read_node, read_nodes
from kai_ray.state.pod_states import PodState, read_pod
from kai_ray.state.snapshot import ClusterObjects, Snapshot, with_dra
from kai_ray.values.dra import DraSettings
from kai_ray.values.errors import InvalidFieldError, InvalidObjectError, Problem
from kai_ray.values.names import (
    GPU_DEVICES_ANNOTATION,
    PLACEHOLDER_ANNOTATION,
    POD_GROUP_ANNOTATION,
    SCHEDULER_NAME,
)
from kai_ray.values.resources import EPSILON, GPU, Resources
from kai_ray.workloads.expected_pods import pods_for_workload
from kai_ray.workloads.grouping import derive_groups
from kai_ray.workloads.membership import needs_derived_group
from kai_ray.workloads.pod_claims import PodClaim, pod_claims
from kai_ray.workloads.pod_fields import pod_node, pod_requests

Obj = Mapping[str, Any]
#: Kinds the snapshot is built from; any other kind is kept as a workload.
NODE, POD, POD_GROUP, QUEUE, TOPOLOGY = "Node", "Pod", "PodGroup", "Queue", "Topology"
#: DRA kinds (resource.k8s.io/v1), read into the snapshot's `DraView`.
DEVICE_CLASS, RESOURCE_SLICE = "DeviceClass", "ResourceSlice"
RESOURCE_CLAIM, CLAIM_TEMPLATE = "ResourceClaim", "ResourceClaimTemplate"
DRA_KINDS = (DEVICE_CLASS, RESOURCE_SLICE, RESOURCE_CLAIM, CLAIM_TEMPLATE)
#: Placeholder pods are listed after every stored pod.
PLACEHOLDERS_PLACE = 1 << 62


def object_key(obj: Obj, kind: str | None = None) -> str:
    """`namespace/name` for namespaced objects, `name` for cluster-scoped ones."""
    meta = obj.get("metadata") or {}
    name = str(meta.get("name") or "")
    if (kind or obj.get("kind")) in (NODE, QUEUE, TOPOLOGY):
        return name
    return f"{meta.get('namespace') or 'default'}/{name}"


@dataclass(frozen=True)
class Assumed:
    """A bind not yet seen on the watch: the node and the devices recorded."""

    node: str
    devices: str


class ClusterCache:
    """Every object the scheduler reads, by kind and key; see the module docstring."""

    def __init__(
        self,
        scheduler_name: str = SCHEDULER_NAME,
        clock: Callable[[], float] | None = None,
        assume_ttl_s: float = 30.0,
        dra: DraSettings | None = None,
    ) -> None:
        self.scheduler_name = scheduler_name
        self.dra_settings = dra or DraSettings()
        self._clock = clock or (lambda: 0.0)
        self._objects: dict[str, dict[str, Obj]] = {
            kind: {} for kind in (NODE, POD, POD_GROUP, QUEUE, TOPOLOGY, *DRA_KINDS)
        }
        #: Workloads (RayCluster, RayJob, Job, ...) by (kind, key).
        self.workloads: dict[tuple[str, str], Obj] = {}
        self.usage: Mapping[str, Mapping[str, float]] = {}
        self._nodes: NodeReading | None = None
        #: Each node's reading, to tell a change the snapshot sees from one it does not.
        self._node_facts: dict[str, tuple[NodeFacts, list[Problem]]] = {}
        self._keeper = SnapshotKeeper(scheduler_name)
        self._changes = Changes()
        #: The place of each pod and PodGroup key in arrival order (kept by an update).
        self._places: dict[str, dict[str, int]] = {POD: {}, POD_GROUP: {}}
        self._arrivals = 0
        self._placeholder_places: dict[str, tuple[int, Obj]] | None = None
        self._pods: dict[str, tuple[PodState | None, list[Problem]]] = {}
        #: Each stored pod's requests, with the object they were read from (the
        #: binder's room check sums them for every bind); None: unreadable.
        self._requests: dict[str, tuple[Obj, Resources | None]] = {}
        #: Assumed binds expire on their own (a TTL cache on the clock passed in);
        #: `_assumed_keys` remembers them so that an expiry is noticed and re-read.
        self._assumed: TTLCache[str, Assumed] = TTLCache(
            maxsize=1 << 20, ttl=assume_ttl_s, timer=self._clock
        )
        self._assumed_keys: set[str] = set()
        #: Binds reserved and not made yet (queued behind others): they do not
        #: expire; the bind's outcome turns them into an assumption or forgets them.
        self._pinned: dict[str, Assumed] = {}
        #: Pods deleted before they were bound (`_leaving`): left out of the snapshot.
        self._leaving: set[str] = set()
        #: Node name -> keys of pods bound there (as stored or assumed).
        self._on_node: dict[str, set[str]] = {}
        #: A suspended workload's gang, as the pods its controller will create once
        #: admitted (pending, marked): (kind, key) -> pods. Placing them is admitting it.
        self._placeholders: dict[tuple[str, str], list[Obj]] = {}
        self._placeholder_owner: dict[str, tuple[str, str]] = {}
        #: Room held for a workload just released, until its controller has made its
        #: pods (or `reserve_ttl_s` ends): pods of no gang and no scheduler of ours,
        #: bound where its placeholders were placed, so that nobody else takes it.
        self._reserved: dict[tuple[str, str], Reservation] = {}
        #: Stored pods per group their annotation names (key: `namespace/group`), and
        #: the group each pod was counted in: how many pods a released workload made.
        self._made: Counter[str] = Counter()
        self._made_in: dict[str, str] = {}
        self._released: dict[tuple[str, str], list[Obj]] = {}
        self.reserve_ttl_s = 60.0
        #: DRA: what slices and classes give (built again when they or node labels
        #: change), the view of the claims over it (again when a claim changes), the
        #: claims each live pod names, the pods naming each claim, and the pods with
        #: any claim entry (read again when a template, class or slice changes).
        self._device_side: DeviceSide | None = None
        self._dra_view: DraView | None = None
        self._pod_claim_keys: dict[str, tuple[str, ...]] = {}
        self._claim_users: dict[str, set[str]] = {}
        self._claim_pods: set[str] = set()
        self._published: tuple[Snapshot, DraView, Snapshot] | None = None
        #: Claim allocations of binds made or reserved that the watch has not shown
        #: yet: claim key -> (pod key, allocation), read as allocated meanwhile.
        self._claims_assumed: dict[str, tuple[str, ClaimAllocation]] = {}

    # ------------------------------------------------------------- feeding

    def upsert(self, obj: Obj, kind: str | None = None) -> None:
        """Add or replace one object (`kind`, else the object's own, says where it goes)."""
        kind = kind or str(obj.get("kind") or "")
        key = object_key(obj, kind)
        if kind not in self._objects:
            self.workloads[(kind, key)] = obj
            self._set_placeholders(kind, key, obj)
            return
        if kind == POD:
            self._unindex(key)
            self._pod_changed(key)
            self._count_made(key, obj)
            self._claims_named(key, obj)
            (self._leaving.add if _leaving(obj) else self._leaving.discard)(key)
            if key in self._assumed_keys and pod_node(obj) is not None:
                self._assumed.pop(key, None)  # the watch caught up with the bind
                self._pinned.pop(key, None)
                self._assumed_keys.discard(key)
        elif kind == NODE:
            self._node_changed(key, obj)
        elif kind in DRA_KINDS:
            self._dra_changed(kind, key, obj)
        self._note(kind, key)
        self._objects[kind][key] = obj
        if kind == POD:
            self._index(key)

    def delete(self, kind: str, key: str) -> None:
        """Forget one object; forgetting what is not there is harmless."""
        if kind not in self._objects:
            self.workloads.pop((kind, key), None)
            self._set_placeholders(kind, key, None)
            self._released.pop((kind, key), None)
            self._reserved.pop((kind, key), None)
            return
        if kind == POD:
            self._unindex(key)
            self._pod_changed(key)
            self._requests.pop(key, None)
            self._count_made(key, None)
            self._assumed.pop(key, None)
            self._pinned.pop(key, None)
            self._assumed_keys.discard(key)
            self._leaving.discard(key)
            self._claims_named(key, None)
        elif kind in DRA_KINDS:
            self._dra_changed(kind, key)
        if self._objects[kind].pop(key, None) is not None:
            self._note(kind, key, gone=True)
            if kind == NODE:
                self._node_changed(key, None)

    def _note(self, kind: str, key: str, gone: bool = False) -> None:
        """Record what the next snapshot must read again; a new key takes the last place."""
        places = self._places.get(kind)
        if places is not None:
            if gone:
                places.pop(key, None)
            elif key not in places:
                self._arrivals += 1
                places[key] = self._arrivals
        if kind == POD_GROUP:
            self._changes.groups.add(key)
        elif kind == QUEUE:
            self._changes.queues = True
        elif kind == TOPOLOGY:
            self._changes.topologies = True

    def _count_made(self, key: str, pod: Obj | None) -> None:
        before = self._made_in.pop(key, None)
        if before is not None:
            self._made[before] -= 1
        annotations = ((pod or {}).get("metadata") or {}).get("annotations") or {}
        group = annotations.get(POD_GROUP_ANNOTATION)
        if group:
            self._made_in[key] = f"{key.partition('/')[0]}/{group}"
            self._made[self._made_in[key]] += 1

    def _pod_changed(self, key: str) -> None:
        self._pods.pop(key, None)
        self._changes.pods.add(key)

    def _claims_named(self, key: str, pod: Obj | None) -> None:
        """Keep the claims each live pod names; the users of a claim whose users
        changed are read again (the first of them counts a shared claim)."""
        entries = _claim_entries(pod)
        (self._claim_pods.add if entries else self._claim_pods.discard)(key)
        live = pod is not None and not _finished(pod) and not _leaving(pod)
        namespace = key.partition("/")[0]
        named = tuple(f"{namespace}/{e.claim}" for e in entries if e.claim) if live else ()
        before = self._pod_claim_keys.pop(key, ())
        if named:
            self._pod_claim_keys[key] = named
        if before == named:
            return
        for claim in {*before, *named}:
            users = self._claim_users.setdefault(claim, set())
            (users.add if claim in named else users.discard)(key)
            for user in users:
                self._pod_changed(user)
            if not users:
                del self._claim_users[claim]
        self._dra_view = None

    def _dra_changed(self, kind: str, key: str, obj: Obj | None = None) -> None:
        """A DRA object changed: the view again, and the pods it may change."""
        self._dra_view = None
        if kind == RESOURCE_CLAIM:
            if obj is None or ((obj.get("status") or {}).get("allocation")):
                self._claims_assumed.pop(key, None)  # the watch caught up (or it is gone)
            for user in self._claim_users.get(key, ()):
                self._pod_changed(user)
            return
        if kind in (DEVICE_CLASS, RESOURCE_SLICE):
            self._device_side = None
            self._nodes = None
        for pod in self._claim_pods:
            self._pod_changed(pod)

    def _node_changed(self, key: str, obj: Obj | None) -> None:
        """Nodes are read again only when what the snapshot takes from them changed
        (a status heartbeat changes nothing it reads)."""
        facts = read_node(obj) if obj is not None else None
        before = self._node_facts.get(key)
        if (facts is None) != (before is None) or (
            facts is not None and before is not None and facts[0].labels != before[0].labels
        ):
            self._device_side = None  # slices may select nodes by label
            self._dra_view = None
        if facts is None or before != facts:
            self._nodes = None
        if facts is None:
            self._node_facts.pop(key, None)
        else:
            self._node_facts[key] = facts

    def _placeholders_changed(self) -> None:
        self._placeholder_places = None
        self._changes.everything = True

    def replace_all(self, kind: str, objects: Sequence[Obj]) -> None:
        """The whole list of one kind (a re-list after a watch expired)."""
        keys = {object_key(obj, kind) for obj in objects}
        for gone in [key for key, _ in self.items(kind) if key not in keys]:
            self.delete(kind, gone)
        for obj in objects:
            self.upsert(obj, kind)

    def _set_placeholders(self, kind: str, key: str, obj: Obj | None) -> None:
        gone = self._placeholders.pop((kind, key), [])
        if gone:  # kept for `assume_resumed`: the watch may show the release first
            self._released[(kind, key)] = gone
        for pod in gone:
            self._pods.pop(object_key(pod, POD), None)
            self._placeholder_owner.pop(object_key(pod, POD), None)
        pods = placeholder_pods(obj, self.scheduler_name) if obj is not None else []
        if pods:
            self._placeholders[(kind, key)] = pods
            for pod in pods:
                self._placeholder_owner[object_key(pod, POD)] = (kind, key)
        if gone or pods:
            self._placeholders_changed()

    def placeholder_owner(self, pod: str) -> tuple[str, str] | None:
        """The suspended workload (kind, key) a placeholder pod stands for, if it is one."""
        return self._placeholder_owner.get(pod)

    def assume_resumed(self, kind: str, key: str, placed: Mapping[str, str]) -> None:
        """The binder released a suspended workload whose placeholders were placed on
        `placed` (pod -> node): read it unsuspended until the watch shows it, and hold
        that room for its pods until they exist."""
        obj = self.workloads.get((kind, key))
        if obj is None:
            return
        pictured = self._placeholders.get((kind, key)) or self._released.pop((kind, key), [])
        pods = {object_key(p, POD): p for p in pictured}
        held = [_reserving(pods[pod], node) for pod, node in placed.items() if pod in pods]
        groups = {str(p["metadata"]["annotations"][POD_GROUP_ANNOTATION]) for p in pods.values()}
        namespace = key.partition("/")[0]
        self._reserved[(kind, key)] = Reservation(
            [f"{namespace}/{g}" for g in sorted(groups)],
            len(pods),
            held,
            self._clock() + self.reserve_ttl_s,
        )
        self._placeholders_changed()
        self.upsert({**obj, "spec": {**(obj.get("spec") or {}), "suspend": False}}, kind)

    def _release_reservations(self) -> None:
        """Room held for released workloads goes once their pods exist (or in time)."""
        if not self._reserved:
            return
        now = self._clock()
        made = self._made
        for owner, held in list(self._reserved.items()):
            if held.expires_at <= now or sum(made[g] for g in held.groups) >= held.pods:
                del self._reserved[owner]
                self._released.pop(owner, None)
                for pod in held.reserving:
                    self._pods.pop(object_key(pod, POD), None)
                self._placeholders_changed()

    def set_usage(self, usage: Mapping[str, Mapping[str, float]]) -> None:
        self.usage = usage

    # ------------------------------------------------------------ assuming

    def assume(self, key: str, node: str, devices: str = "") -> None:
        """Read the pod as bound to `node` until the watch shows it (or the TTL,
        counted from now, ends)."""
        self._hold(key, Assumed(node, devices), pinned=False)

    def reserve(self, key: str, node: str, devices: str = "") -> None:
        """Read the pod as bound to `node` while its bind waits to be made: no TTL
        runs until `assume` (the bind made) or `forget_assumed` (it failed)."""
        self._hold(key, Assumed(node, devices), pinned=True)

    def _hold(self, key: str, held: Assumed, pinned: bool) -> None:
        self._unindex(key)
        self._assumed.pop(key, None)
        self._pinned.pop(key, None)
        if pinned:
            self._pinned[key] = held
        else:
            self._assumed[key] = held
        self._assumed_keys.add(key)
        self._pod_changed(key)
        self._index(key)

    def assume_claims(self, key: str, claims: Sequence[ClaimAllocation]) -> None:
        """The pod's bind allocates these claims: read them as allocated until the
        watch shows them so, or the pod's assumption ends (`forget_assumed`, expiry)."""
        for claim in claims:
            if claim.new:
                claim_key = f"{claim.namespace}/{claim.name}"
                self._claims_assumed[claim_key] = (key, claim)
                self._dra_view = None
                for user in self._claim_users.get(claim_key, ()):
                    self._pod_changed(user)

    def _forget_claims(self, key: str) -> None:
        for claim in [c for c, (pod, _) in self._claims_assumed.items() if pod == key]:
            del self._claims_assumed[claim]
            self._dra_changed(RESOURCE_CLAIM, claim)

    def forget_assumed(self, key: str) -> None:
        """A bind failed: the pod is read as it was stored."""
        if self._claims_assumed:
            self._forget_claims(key)
        if key in self._assumed_keys:
            self._unindex(key)
            self._assumed.pop(key, None)
            self._pinned.pop(key, None)
            self._assumed_keys.discard(key)
            self._pod_changed(key)
            self._index(key)

    def _expire_assumed(self) -> None:
        self._assumed.expire()
        for key in [k for k in self._assumed_keys if k not in self._assumed]:
            if key in self._pinned:
                continue
            self._on_node_drop(key)
            self._assumed_keys.discard(key)
            self._pod_changed(key)
            self._index(key)
            if self._claims_assumed:
                self._forget_claims(key)

    # ------------------------------------------------------------- reading

    def get(self, kind: str, key: str) -> Obj | None:
        if kind not in self._objects:
            return self.workloads.get((kind, key))
        return self._objects[kind].get(key)

    def items(self, kind: str) -> Iterator[tuple[str, Obj]]:
        if kind in self._objects:
            yield from self._objects[kind].items()
        else:
            yield from ((k, o) for (c, k), o in self.workloads.items() if c == kind)

    def pod(self, key: str) -> Obj | None:
        """The pod as the cycle reads it (an assumed bind included)."""
        obj = self._objects[POD].get(key)
        assumed = self._assumed.get(key) or self._pinned.get(key)
        if obj is None or assumed is None or pod_node(obj) is not None:
            return obj
        return _with_binding(obj, assumed)

    def objects(self) -> ClusterObjects:
        pods = self._objects[POD]
        waiting = [pod for group in self._placeholders.values() for pod in group]
        waiting += [pod for held in self._reserved.values() for pod in held.reserving]
        return ClusterObjects(
            nodes=list(self._objects[NODE].values()),
            pods=[*self._pods_as_read(pods), *waiting],
            pod_groups=list(self._objects[POD_GROUP].values()),
            queues=list(self._objects[QUEUE].values()),
            topologies=list(self._objects[TOPOLOGY].values()),
            usage=self.usage,
            device_classes=list(self._objects[DEVICE_CLASS].values()),
            resource_slices=list(self._objects[RESOURCE_SLICE].values()),
            resource_claims=list(self._objects[RESOURCE_CLAIM].values()),
            claim_templates=list(self._objects[CLAIM_TEMPLATE].values()),
            dra=self.dra_settings,
        )

    def _pods_as_read(self, pods: Mapping[str, Obj]) -> list[Obj]:
        if not self._assumed_keys and not self._leaving:
            return list(pods.values())
        assumed = self._assumed_keys
        read = (self.pod(key) or obj if key in assumed else obj for key, obj in pods.items())
        return [obj for obj in read if not _leaving(obj)]

    def snapshot(self) -> Snapshot:
        """This cycle's snapshot: the last one patched with what changed since."""
        self._expire_assumed()
        self._release_reservations()
        with collector_paused():
            view = self.dra_view()
            if self._nodes is None:
                self._nodes = self._node_reading()
            snapshot = self._keeper.snapshot(self, self._nodes, self._changes)
        self._changes.clear()
        if view is EMPTY_DRA:
            return snapshot
        published = self._published
        if published is None or published[0] is not snapshot or published[1] is not view:
            published = (snapshot, view, with_dra(snapshot, view))
            self._published = published
        return published[2]

    def dra_view(self) -> DraView:
        """What this cycle knows of DRA (`state/dra_view.py`); EMPTY_DRA without DRA objects."""
        if self._dra_view is None:
            self._dra_view = self._build_dra_view()
        return self._dra_view

    def _build_dra_view(self) -> DraView:
        if not any(self._objects[kind] for kind in DRA_KINDS):
            return EMPTY_DRA
        if self._device_side is None:
            labels = {name: facts.labels for name, (facts, _) in self._node_facts.items()}
            self._device_side = build_device_side(
                classes=self._objects[DEVICE_CLASS].values(),
                slices=self._objects[RESOURCE_SLICE].values(),
                node_labels=labels,
                settings=self.dra_settings,
            )
        users = {claim: tuple(sorted(keys)) for claim, keys in self._claim_users.items()}
        claims = self._objects[RESOURCE_CLAIM]
        return build_dra_view(
            self._device_side,
            claims=[_assumed_claim(o, self._claims_assumed.get(k)) for k, o in claims.items()],
            templates=self._objects[CLAIM_TEMPLATE].values(),
            users=users,
            settings=self.dra_settings,
        )

    def _node_reading(self) -> NodeReading:
        """The nodes as `read_nodes` reads them, from the readings kept per node
        (read again only where their names could collide)."""
        facts = self._node_facts
        if any(key not in facts or facts[key][0].name != key for key in self._objects[NODE]):
            reading = read_nodes(list(self._objects[NODE].values()))
        else:
            read = [facts[key] for key in self._objects[NODE]]
            reading = NodeReading(
                [node for node, _ in read], [p for _, found in read for p in found]
            )
        view = self.dra_view()
        if view is not EMPTY_DRA:
            reading = NodeReading([with_devices(n, view) for n in reading.nodes], reading.problems)
        return reading

    # ------------------------------------- what the snapshot keeper reads

    def pod_keys(self) -> list[str]:
        return [*self._objects[POD], *self._placeholder_pods()]

    def pod_reading(self, key: str) -> tuple[PodState | None, list[Problem]] | None:
        """The pod as read (read once per change); None when there is no such pod."""
        cached = self._pods.get(key)
        if cached is None:
            obj = self.pod(key)
            if obj is None:
                placeholder = self._placeholder_pods().get(key)
                if placeholder is None:
                    return None
                obj = placeholder[1]
            found: list[Problem] = []
            state = None if _leaving(obj) else read_pod(obj, found)
            if state is not None and state.claim_entries:
                state = with_claims(state, self.dra_view())
            cached = self._pods[key] = (state, found)
        return cached

    def pod_order(self, key: str) -> int:
        place = self._places[POD].get(key)
        return place if place is not None else self._placeholder_pods()[key][0]

    def group_objects(self) -> Iterator[tuple[str, Obj]]:
        yield from self._objects[POD_GROUP].items()

    def group_object(self, key: str) -> Obj | None:
        return self._objects[POD_GROUP].get(key)

    def group_order(self, key: str) -> int:
        return self._places[POD_GROUP][key]

    def queue_objects(self) -> list[Obj]:
        return list(self._objects[QUEUE].values())

    def topology_objects(self) -> list[Obj]:
        return list(self._objects[TOPOLOGY].values())

    def current_usage(self) -> Mapping[str, Mapping[str, float]]:
        return self.usage

    def _placeholder_pods(self) -> dict[str, tuple[int, Obj]]:
        """Placeholder and reserving pods by key, with their places after stored pods."""
        if self._placeholder_places is None:
            listed = [pod for group in self._placeholders.values() for pod in group]
            listed += [pod for held in self._reserved.values() for pod in held.reserving]
            places: dict[str, tuple[int, Obj]] = {}
            for pod in listed:  # a key listed twice: the first place, the last pod
                prior = places.get(object_key(pod, POD))
                place = prior[0] if prior else PLACEHOLDERS_PLACE + len(places)
                places[object_key(pod, POD)] = (place, pod)
            self._placeholder_places = places
        return self._placeholder_places

    # ------------------------------------------------------ live node room

    def room_problem(
        self, key: str, node: str, devices: tuple[int, ...] = (), fraction: float = 0.0
    ) -> str | None:
        """Why binding pod `key` to `node` now would overcommit it, from the latest
        events (pods of every scheduler, assumed binds included); None if it fits.
        The binder asks this just before a bind, as the cycle's snapshot is older.
        A GPU share (`fraction` of each of `devices`) and whole GPUs are checked
        against the node's devices too: a share asks no `nvidia.com/gpu`, so the
        resources alone let a share onto a device a pod being deleted still holds
        (a cycle places onto such room as soon as the pod is going)."""
        obj = self._objects[NODE].get(node)
        pod = self._objects[POD].get(key)
        if obj is None:
            return f"node {node} is gone"
        if pod is None:
            return f"pod {key} is gone"
        asked = self._requests_of(key, pod)
        if asked is None:
            return None  # unreadable requests: the snapshot reports the pod
        allocatable = _allocatable(obj)
        free = allocatable - self._held_on(node, excluding=key)
        short = [name for name in asked.insufficient(free) if asked[name] > 0]
        if short:
            return f"node {node} has {free[short[0]]:g} {short[0]} free"
        if asked[GPU] <= 0 and fraction <= 0:
            return None
        return self._device_problem(key, node, int(allocatable[GPU]), devices, fraction, asked)

    def _device_problem(
        self,
        key: str,
        node: str,
        count: int,
        devices: tuple[int, ...],
        fraction: float,
        asked: Resources,
    ) -> str | None:
        """The node's devices as the snapshot accounts them (`account_node`) from the
        other GPU pods on it: the share's devices have room for it, or there are
        untouched devices for the whole GPUs."""
        facts = self._node_facts.get(node)
        memory = facts[0].gpu_memory_mib if facts is not None else 0.0
        others = []
        for other in sorted(self._on_node.get(node, ())):
            reading = self.pod_reading(other) if other != key else None
            state = reading[0] if reading is not None else None
            if state is not None and state.uses_gpu and not state.terminal and state.node == node:
                others.append(state)
        held = account_node(count, memory, others).devices
        if fraction <= 0:
            if held.whole_free < int(asked[GPU]):
                return f"node {node} has {held.whole_free} untouched GPU devices"
            return None
        for device in devices:
            room = float(held.free[device]) if device < held.count else 0.0
            if room + EPSILON < fraction:
                return f"GPU device {device} of node {node} has {max(room, 0.0):g} free"
        return None

    def _held_on(self, node: str, excluding: str) -> Resources:
        total = Resources()
        for key in self._on_node.get(node, ()):
            obj = self._objects[POD].get(key)
            if key == excluding or obj is None or _finished(obj):
                continue
            asked = self._requests_of(key, obj)
            if asked is not None:
                total = total + asked
        return total

    def _requests_of(self, key: str, obj: Obj) -> Resources | None:
        """The stored pod's requests, read once per object; None when unreadable."""
        kept = self._requests.get(key)
        if kept is not None and kept[0] is obj:
            return kept[1]
        try:
            asked: Resources | None = pod_requests(obj)
        except ValueError:
            asked = None
        self._requests[key] = (obj, asked)
        return asked

    def _index(self, key: str) -> None:
        obj = self.pod(key)
        node = pod_node(obj) if obj is not None else None
        if node is not None:
            self._on_node.setdefault(node, set()).add(key)

    def _on_node_drop(self, key: str) -> None:
        """Take an expired assumption's pod off the node it was assumed on."""
        for keys in self._on_node.values():
            keys.discard(key)

    def _unindex(self, key: str) -> None:
        obj = self.pod(key)
        node = pod_node(obj) if obj is not None else None
        if node is not None:
            self._on_node.get(node, set()).discard(key)


@dataclass
class Reservation:
    """Room held for a released workload: its gangs, how many pods it makes, the
    reserving pods, and when the hold ends regardless."""

    groups: list[str]
    pods: int
    reserving: list[Obj]
    expires_at: float


#: The scheduler name of reserving pods: nobody's, so they are only counted.
RESERVED = "kai-ray.io/reserved"


def _reserving(placeholder: Obj, node: str) -> Obj:
    """A placeholder turned into room held on `node`, in no gang."""
    meta = dict(placeholder.get("metadata") or {})
    meta["name"] = f"{meta.get('name')}-reserved"
    meta["annotations"] = {PLACEHOLDER_ANNOTATION: "true"}
    spec = {**(placeholder.get("spec") or {}), "nodeName": node, "schedulerName": RESERVED}
    return {**placeholder, "metadata": meta, "spec": spec, "status": {"phase": "Running"}}


def placeholder_pods(obj: Obj, scheduler_name: str) -> list[Obj]:
    """The pods a suspended workload of kai-ray would make, marked as placeholders;
    none for a running workload, another scheduler's, or one that cannot be read
    (the operator reports that on the workload)."""
    if not (obj.get("spec") or {}).get("suspend") or not needs_derived_group(obj, scheduler_name):
        return []
    try:
        groups = derive_groups(obj)
    except InvalidObjectError:
        return []
    pods: list[Obj] = []
    for group in groups:
        for pod in pods_for_workload(obj, group):
            pod["metadata"].setdefault("annotations", {})[PLACEHOLDER_ANNOTATION] = "true"
            pod["metadata"]["creationTimestamp"] = (obj.get("metadata") or {}).get(
                "creationTimestamp", ""
            )
            pods.append(pod)
    return pods


def _with_binding(obj: Obj, assumed: Assumed) -> dict[str, Any]:
    """A copy of the pod as bound by the binder (node and recorded devices)."""
    meta = dict(obj.get("metadata") or {})
    if assumed.devices:
        meta["annotations"] = {
            **(meta.get("annotations") or {}),
            GPU_DEVICES_ANNOTATION: assumed.devices,
        }
    spec = {**(obj.get("spec") or {}), "nodeName": assumed.node}
    return {**obj, "metadata": meta, "spec": spec}


def _allocatable(node: Obj) -> Resources:
    status = node.get("status") or {}
    try:
        return Resources.parse(
            status.get("allocatable") or status.get("capacity") or {}, "status.allocatable"
        )
    except ValueError:
        return Resources()


def _leaving(pod: Obj) -> bool:
    """Deleted before it was bound: nothing holds room for it and nothing may bind it
    (the API server refuses: "being deleted"), so the cycle does not see it. A bound
    pod being deleted still holds its node until it is gone."""
    return bool((pod.get("metadata") or {}).get("deletionTimestamp")) and pod_node(pod) is None


def _finished(pod: Obj) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def _assumed_claim(claim: Obj, assumed: tuple[str, ClaimAllocation] | None) -> Obj:
    """The claim as read while a bind's allocation of it is not on the watch yet."""
    if assumed is None:
        return claim
    status = {**(claim.get("status") or {}), "allocation": allocation_body(assumed[1])}
    return {**claim, "status": status}


def _claim_entries(pod: Obj | None) -> tuple[PodClaim, ...]:
    """The pod's claim entries; none when it has none or they cannot be read (the
    pod's reading reports that)."""
    if pod is None or not (pod.get("spec") or {}).get("resourceClaims"):
        return ()
    try:
        return pod_claims(pod)
    except InvalidFieldError:
        return ()
