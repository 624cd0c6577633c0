"""The Ray placement backend: domain room evaluated by long-lived Ray actors, one per shard.

The only module that imports Ray, and only inside functions, so a small
cluster never loads it. The nodes are split into shards of whole topology
domains (the first Topology's widest level with a domain per shard, largest
domains first onto the emptiest shard). One actor per shard lives as long as the process's Ray
connection. Per transaction (one per cycle) each actor is loaded once with its
nodes' domain at every level and their free rows; after that a query sends
only what changed (the rows of the nodes the transaction placed on, evicted
from or rolled back since the last query: `Transaction.changed_nodes`), the
pod shape, and the query's node set (by a number once the actor has it), and
every actor returns its shard's per-domain room, summed here in shard order.
The numbers are the local backend's exactly (same `fit.room`, integer sums).
Another transaction using the actors in between makes the next query reload
them first. `ray.init` joins `address` when one is set, else starts a local
cluster (2 CPUs, no dashboard, worker logs not forwarded); the caller's SIGTERM
handler is put back afterwards (a kopf operator must keep its own).
Every failure of Ray (an address that does not answer, an actor that died, a
query with no answer within the timeout) is raised as `RayUnavailable` after
the connection is dropped (`ray.shutdown`, actors forgotten), so that the next
try makes a new session and new actors; `backend_choice` then goes on locally.
I/O: talks to Ray; holds no Kubernetes state.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import signal
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from kai_ray.decisions.placement.backend import Counts, Indices, RoomQuery, per_domain
from kai_ray.decisions.placement.fit import Matrix, room
from kai_ray.decisions.placement.ray_link import RayUnavailable
from kai_ray.decisions.placement.shapes import PodShape
from kai_ray.decisions.transaction import LevelKey, Transaction

#: Shards (actors) on the local cluster: one per CPU it is started with.
SHARDS = 2
#: At most this many shards on a cluster joined (one per CPU up to it).
MAX_SHARDS = 32
#: Node sets the actors keep per transaction before they are told to forget them all.
NODE_SETS = 256
#: How long a room query (or reaching a Ray address) may take before Ray counts as
#: lost, unless `rayBackend.queryTimeout` says otherwise: far above a query's cost
#: (8 to 15 ms at 50,000 nodes) and a fresh actor's start (about a second).
QUERY_TIMEOUT_S = 10.0
LOG = logging.getLogger("kai_ray.placement")
_lock = threading.Lock()
_actors: list[Any] = []
_tokens = itertools.count(1)


def connect(address: str | None, timeout_s: float = QUERY_TIMEOUT_S) -> Any:
    """The `ray` module, initialised once per process (joined, or a local cluster),
    and the shard actors started (again when Ray was shut down and started since).
    Raises `RayUnavailable` when Ray cannot be reached or started."""
    import ray

    try:
        with _lock:
            if not ray.is_initialized():
                if address:
                    _probe(address, timeout_s)
                with _calling_ray(f"starting Ray ({address or 'a local cluster'})"):
                    _init_keeping_sigterm(ray, address)
            with _calling_ray("starting the shard actors"):
                _start_actors(ray, address)
    except RayUnavailable as err:
        _drop_connection(err)
        raise
    return ray


def _start_actors(ray: Any, address: str | None) -> None:
    """The shard actors of this session (started anew when the session is new)."""
    session = _session(ray)
    if _actors and _Pool.session != session:
        _actors.clear()
    if not _actors:
        actor = ray.remote(num_cpus=1)(Shard)
        count = _shard_count(ray, address)
        _actors.extend(actor.options(scheduling_strategy="SPREAD").remote() for _ in range(count))
        _Pool.session, _Pool.loaded = session, 0


def actors() -> list[Any]:
    """The shard actors of this process (none before `connect`)."""
    return list(_actors)


def _session(ray: Any) -> tuple[str, str]:
    """This connection to Ray: a new local cluster has a new node, a new join a new job."""
    context = ray.get_runtime_context()
    return (context.get_node_id(), context.get_job_id())


def _shard_count(ray: Any, address: str | None) -> int:
    """One shard per CPU: the local cluster's, or the cluster's joined (up to `MAX_SHARDS`)."""
    if not address:
        return SHARDS
    return min(max(int(ray.cluster_resources().get("CPU", 1)), 1), MAX_SHARDS)


def disconnect() -> None:
    """Stop this process's Ray (a local cluster it started goes with it; a joined
    cluster drops this driver's actors with it)."""
    import ray

    with _lock:
        _actors.clear()
        _Pool.loaded = 0
        if ray.is_initialized():
            ray.shutdown()


def _drop_connection(why: RayUnavailable) -> None:
    """After a failure: the actors forgotten and Ray shut down, so that the next
    try starts a new session (a shutdown that fails too is only logged)."""
    LOG.debug("dropping the Ray connection: %s", why)
    try:
        disconnect()
    except Exception as err:
        LOG.debug("ray.shutdown failed too: %s", err)


@contextlib.contextmanager
def _calling_ray(what: str, timeout_s: float | None = None) -> Iterator[None]:
    """Any exception of the calls to Ray inside, as `RayUnavailable` saying what
    failed. (Ray raises its own errors, `ConnectionError`, and bare `Exception`.)"""
    try:
        yield
    except TimeoutError as err:
        within = f" within {timeout_s:g} s" if timeout_s else ""
        raise RayUnavailable(f"{what}: no answer{within}") from err
    except Exception as err:
        raise RayUnavailable(f"{what}: {type(err).__name__}: {err}") from err


def _probe(address: str, timeout_s: float) -> None:
    """Refuse at once to join a Ray cluster whose address does not answer: `ray.init`
    keeps trying an unreachable address for minutes (measured: over a minute)."""
    target = _host_port(address)
    if target is None:
        return  # "auto", or no port to try: ray.init finds out
    try:
        socket.create_connection(target, timeout=timeout_s).close()
    except OSError as err:
        raise RayUnavailable(f"cannot reach Ray at {address}: {err}") from err


def _host_port(address: str) -> tuple[str, int] | None:
    """`host:port` of `ray://host:port` or `host:port`; None without a port."""
    host, colon, port = address.split("://", 1)[-1].rpartition(":")
    if not colon or not port.isdigit() or not host:
        return None
    return host.strip("[]"), int(port)


def _init_keeping_sigterm(ray: Any, address: str | None) -> None:
    """`ray.init` in this thread, then the caller's SIGTERM handler put back.

    Ray replaces the main thread's SIGTERM handler with one that exits, which
    would skip a kopf operator's graceful shutdown. (Initialising Ray in a
    helper thread that then ends is no way out: the process dies on first use.)
    """
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM) if in_main else None
    _init(ray, address)
    if in_main:
        signal.signal(signal.SIGTERM, previous)


def _init(ray: Any, address: str | None) -> None:
    if address:
        ray.init(address=address, log_to_driver=False)
    else:
        # "local": a cluster of its own, even when another's address is recorded
        # on the machine (`/tmp/ray/ray_current_cluster`, which plain init would join).
        ray.init(address="local", num_cpus=SHARDS, include_dashboard=False, log_to_driver=False)


@dataclass
class ShardState:
    """What one shard is loaded with: per level its nodes' domain and the level's
    domain count, and its nodes' free rows, devices and untouched device counts."""

    levels: dict[LevelKey, tuple[npt.NDArray[np.int64], int]]
    free: Matrix
    devices: Matrix
    whole_free: Counts


@dataclass(frozen=True)
class Delta:
    """Rows of a shard that changed since its last query (positions in the shard)."""

    rows: Indices
    free: Matrix
    devices: Matrix
    whole_free: Counts


class Shard:
    """One shard's nodes and their current free rows (a Ray actor; numpy only)."""

    def __init__(self) -> None:
        self.token = 0
        self.state: ShardState | None = None
        #: Node sets of queries by number, as positions in the shard.
        self.node_sets: dict[int, Indices] = {}

    def holds(self) -> int:
        """The transaction the shard holds (0: none yet)."""
        return self.token

    def load(self, token: int, state: ShardState) -> None:
        """Hold a transaction's rows (copied: what Ray hands over is read-only)."""
        rows = (state.free.copy(), state.devices.copy(), state.whole_free.copy())
        self.token, self.state, self.node_sets = token, ShardState(state.levels, *rows), {}

    def room(
        self,
        token: int,
        delta: Delta | None,
        node_set: tuple[int, Indices | None, bool],
        shape: PodShape,
        fraction: Matrix,
        levels: tuple[LevelKey, ...],
    ) -> list[Counts]:
        """The shard's per-domain room for `shape` on the query's nodes, per level."""
        state = self.state
        if state is None or token != self.token:
            raise RuntimeError(f"shard holds transaction {self.token}, asked for {token}")
        if delta is not None:
            state.free[delta.rows] = delta.free
            state.devices[delta.rows] = delta.devices
            state.whole_free[delta.rows] = delta.whole_free
        number, positions, forget = node_set
        if forget:
            self.node_sets.clear()
        if positions is not None:
            self.node_sets[number] = positions
        nodes = self.node_sets[number]
        counts = room(
            state.free[nodes], state.devices[nodes], state.whole_free[nodes], shape, fraction
        )
        return [
            per_domain(state.levels[level][0], nodes, counts, state.levels[level][1])
            for level in levels
        ]


def shard_of_nodes(tx: Transaction, shards: int) -> npt.NDArray[np.intp]:
    """The shard of every node: whole domains of the first Topology's widest level
    with at least a domain per shard (else its narrowest), the largest first onto
    the shard with the fewest nodes; nodes in no such domain (or with no Topology)
    in turn."""
    count = len(tx.snapshot.node_names)
    owner = np.arange(count, dtype=np.intp) % shards
    trees = list(tx.snapshot.topologies.values())
    if not trees or not trees[0].levels:
        return owner
    levels = trees[0].levels
    level = next((lv for lv in levels if len(lv.domains) >= shards), levels[-1])
    node_domain = level.node_domain
    inside = node_domain >= 0
    sizes = np.bincount(node_domain[inside], minlength=len(level.domains))
    load = np.zeros(shards, dtype=np.int64)
    shard_of_domain = np.zeros(len(sizes), dtype=np.intp)
    for domain in np.argsort(-sizes, kind="stable"):
        target = int(np.argmin(load))
        shard_of_domain[domain] = target
        load[target] += sizes[domain]
    owner[inside] = shard_of_domain[node_domain[inside]]
    return owner


class _Pool:
    """Which transaction the actors hold (one at a time per process), and which
    connection to Ray they were started on."""

    loaded = 0
    session: tuple[str, str] = ("", "")


class RayPlacementBackend:
    name = "ray"

    def __init__(
        self, tx: Transaction, address: str | None, timeout_s: float = QUERY_TIMEOUT_S
    ) -> None:
        self._ray = connect(address, timeout_s)
        self._timeout_s = timeout_s
        self._actors = list(_actors)
        self._token = 0
        self._seen = 0
        owner = shard_of_nodes(tx, len(self._actors))
        #: Per shard, its nodes (global indices, ascending); per node, its shard and position.
        self._members = [np.flatnonzero(owner == s) for s in range(len(self._actors))]
        self._owner = owner
        self._position = np.zeros(len(owner), dtype=np.intp)
        for members in self._members:
            self._position[members] = np.arange(len(members), dtype=np.intp)
        #: Bytes each actor was last loaded with (its rows and its nodes' domains).
        self.shard_bytes: list[int] = []
        #: Node sets the actors have, by the identity of the query's array (kept, so
        #: the identity is not reused): the array, its number and its per-shard positions.
        self._node_sets: dict[int, tuple[Indices, int, list[Indices]]] = {}

    def domain_room(self, tx: Transaction, query: RoomQuery) -> list[Counts]:
        """The shards' answers summed; `RayUnavailable` (the connection dropped) when
        Ray fails or does not answer within the timeout."""
        try:
            with _lock:
                results = self._ask(tx, query)
        except RayUnavailable as err:
            _drop_connection(err)
            raise
        return [
            sum((r[i] for r in results), np.zeros_like(results[0][i]))
            for i in range(len(query.levels))
        ]

    def _ask(self, tx: Transaction, query: RoomQuery) -> list[list[Counts]]:
        """Every shard's per-level room for the query (under `_lock`)."""
        deltas = self._sync(tx)
        number, parts, fresh, forget = self._node_set(query.nodes)
        slim = dataclasses.replace(query.shape, fraction=np.zeros(0))
        with _calling_ray("a room query", self._timeout_s):
            refs = [
                actor.room.remote(
                    self._token,
                    delta,
                    (number, part if fresh else None, forget),
                    slim,
                    query.shape.fraction[members[part]]
                    if query.shape.shares_gpu
                    else slim.fraction,
                    query.levels,
                )
                for actor, delta, part, members in zip(
                    self._actors, deltas, parts, self._members, strict=True
                )
            ]
            results: list[list[Counts]] = self._ray.get(refs, timeout=self._timeout_s)
        return results

    def _sync(self, tx: Transaction) -> list[Delta | None]:
        """Per shard, what changed since its last query; the whole state when the
        actors hold another transaction (or none yet)."""
        if _Pool.loaded != self._token or not self._token:
            self._load(tx)
            return [None] * len(self._actors)
        changed = np.unique(np.asarray(tx.changed_nodes[self._seen :], dtype=np.intp))
        self._seen = len(tx.changed_nodes)
        deltas: list[Delta | None] = []
        for shard in range(len(self._actors)):
            rows = changed[self._owner[changed] == shard]
            deltas.append(
                Delta(self._position[rows], tx.free[rows], tx.devices[rows], tx.whole_free[rows])
                if rows.size
                else None
            )
        return deltas

    def _load(self, tx: Transaction) -> None:
        self._token = next(_tokens)
        self._seen = len(tx.changed_nodes)
        self._node_sets = {}
        self.shard_bytes = []
        levels = [
            ((name, index), level.node_domain, len(level.domains))
            for name, tree in tx.snapshot.topologies.items()
            for index, level in enumerate(tree.levels)
        ]
        for actor, members in zip(self._actors, self._members, strict=True):
            state = ShardState(
                {key: (node_domain[members], count) for key, node_domain, count in levels},
                tx.free[members],
                tx.devices[members],
                tx.whole_free[members],
            )
            with _calling_ray("loading the shard actors"):
                actor.load.remote(self._token, state)
            arrays = [state.free, state.devices, state.whole_free]
            arrays += [domain for domain, _ in state.levels.values()]
            self.shard_bytes.append(sum(a.nbytes for a in arrays))
        _Pool.loaded = self._token

    def _node_set(self, nodes: Indices) -> tuple[int, list[Indices], bool, bool]:
        """The query's nodes as a number the actors know, and per shard its positions;
        then whether the actors have yet to get this set, and whether they must first
        forget the ones they have (past `NODE_SETS`)."""
        known = self._node_sets.get(id(nodes))
        if known is not None and known[0] is nodes:
            return known[1], known[2], False, False
        forget = len(self._node_sets) >= NODE_SETS
        if forget:
            self._node_sets.clear()
        shards = self._owner[nodes]
        parts = [self._position[nodes[shards == s]] for s in range(len(self._actors))]
        number = len(self._node_sets)
        self._node_sets[id(nodes)] = (nodes, number, parts)
        return number, parts, True, forget
