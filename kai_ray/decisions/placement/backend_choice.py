"""Which placement backend a transaction uses: numpy in-process, or Ray actors.

`backend_for` picks one per transaction from `SchedulerConfig.rayBackend` and
keeps it in the transaction's memo (the Ray one loads its shard actors with the
transaction's rows once per cycle). Ray is never imported unless it is picked.
When Ray cannot be reached, or fails or times out mid-transaction, the query is
answered by the local backend, and so is the rest of the transaction (the same
numbers, so the same plan); later transactions stay local until
`rayBackend.retryAfter` has passed (`ray_link.RAY_LINK` keeps that state, for
the operator to show). Pure: no I/O (the Ray backend it may make aside).
"""

from __future__ import annotations

from kai_ray.decisions.placement import ray_link
from kai_ray.decisions.placement.backend import Counts, LocalBackend, PlacementBackend, RoomQuery
from kai_ray.decisions.placement.ray_link import RayLink, RayUnavailable
from kai_ray.decisions.transaction import MemoKey, Transaction
from kai_ray.values.config import RayBackend, SchedulerConfigSpec, duration_seconds

BACKEND = MemoKey[PlacementBackend]("placement backend")


def use_ray(settings: RayBackend, node_count: int) -> bool:
    """Ray when told to; in auto mode only when joined to a Ray cluster (`address`)
    and from `minNodes` nodes on. On the scheduler's own cores Ray was slower than
    numpy at every size measured (docs/placement.md), so auto never starts a
    local Ray cluster."""
    if settings.mode == "never":
        return False
    if settings.mode == "always":
        return True
    return settings.address is not None and node_count >= settings.minNodes


def backend_for(tx: Transaction, config: SchedulerConfigSpec) -> PlacementBackend:
    """The backend of this transaction (one per cycle: the Ray one loads its shards once)."""
    return tx.memo.get(BACKEND, None, lambda: _new_backend(tx, config.rayBackend))


def _new_backend(tx: Transaction, settings: RayBackend) -> PlacementBackend:
    link = ray_link.RAY_LINK
    if not use_ray(settings, len(tx.snapshot.node_names)) or not link.may_try():
        return LocalBackend()
    from kai_ray.decisions.placement.ray_backend import RayPlacementBackend

    try:
        backend = RayPlacementBackend(tx, settings.address, duration_seconds(settings.queryTimeout))
    except RayUnavailable as err:
        link.lost(str(err), duration_seconds(settings.retryAfter))
        return LocalBackend()
    link.connected()
    return RayOrLocal(backend, settings, link)


class RayOrLocal:
    """The Ray backend until Ray fails; from then on, for the rest of the
    transaction, the local one (the query that failed included)."""

    def __init__(self, ray: PlacementBackend, settings: RayBackend, link: RayLink) -> None:
        self.ray: PlacementBackend | None = ray
        self.local = LocalBackend()
        self.settings, self.link = settings, link

    @property
    def name(self) -> str:
        return self.ray.name if self.ray is not None else self.local.name

    def domain_room(self, tx: Transaction, query: RoomQuery) -> list[Counts]:
        if self.ray is not None:
            try:
                return self.ray.domain_room(tx, query)
            except RayUnavailable as err:
                self.ray = None
                self.link.lost(str(err), duration_seconds(self.settings.retryAfter))
        return self.local.domain_room(tx, query)
