"""Which placement backend a transaction uses: numpy in-process, or Ray actors.

`backend_for` picks one per transaction from `SchedulerConfig.rayBackend` and
keeps it in the transaction's memo (the Ray one loads its shard actors with the
transaction's rows once per cycle). Ray is never imported unless it is picked.
Pure: no I/O (the Ray backend it may make aside).
"""

from __future__ import annotations

from kai_ray.decisions.placement.backend import LocalBackend, PlacementBackend
from kai_ray.decisions.transaction import MemoKey, Transaction
from kai_ray.values.config import RayBackend, SchedulerConfigSpec

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
    if not use_ray(settings, len(tx.snapshot.node_names)):
        return LocalBackend()
    from kai_ray.decisions.placement.ray_backend import RayPlacementBackend

    return RayPlacementBackend(tx, settings.address)
