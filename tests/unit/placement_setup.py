"""Set-up the placement tests share (not a test module): a snapshot, a transaction, one gang."""

from __future__ import annotations

from typing import Any

from kai_ray.decisions.placement import GangOutcome, place_extras, place_gang
from kai_ray.decisions.transaction import Transaction
from kai_ray.state.snapshot import ClusterObjects, Snapshot, build_snapshot
from kai_ray.values.config import SchedulerConfigSpec
from tests.builders import PodBuilder, make_pod, make_pod_group, make_queue

#: The strategy these helpers place with unless told (the rules most placement tests hold).
BINPACK = SchedulerConfigSpec(placementStrategy="binpack")

Obj = dict[str, Any]


def cluster(
    nodes: list[Obj], pods: list[Obj], groups: list[Obj], topologies: list[Obj] | None = None
) -> Snapshot:
    return build_snapshot(
        ClusterObjects(
            nodes=nodes,
            pods=pods,
            pod_groups=groups,
            queues=[make_queue("q").build()],
            topologies=topologies or [],
        )
    )


def gang_pods(name: str, size: int, gpus: int = 0, subgroup: str | None = None) -> list[PodBuilder]:
    pods = []
    for i in range(size):
        pod = make_pod(f"{name}-{subgroup or 'm'}-{i}").group(name).created(i)
        if gpus:
            pod.gpus(gpus)
        if subgroup:
            pod.subgroup(subgroup)
        pods.append(pod)
    return pods


def simple_gang(
    name: str, size: int, gpus: int, min_member: int | None = None
) -> tuple[list[Obj], Obj]:
    pods = [p.build() for p in gang_pods(name, size, gpus)]
    group = make_pod_group(name).queue("q").min_member(min_member or size).build()
    return pods, group


def place(
    snapshot: Snapshot, group: str = "default/g", strategy: str = "binpack"
) -> tuple[GangOutcome, Transaction]:
    """The gang placed and, when its minimum holds, committed (as an action would)."""
    tx = Transaction(snapshot)
    config = SchedulerConfigSpec(placementStrategy=strategy)  # type: ignore[arg-type]
    outcome = place_gang(tx, snapshot.pod_groups[group], config)
    if outcome.admitted:
        tx.commit()
    return outcome, tx


def extras(tx: Transaction, group: str = "default/g", limit: int | None = None) -> int:
    """Extras placed and committed."""
    placed = place_extras(tx, tx.snapshot.pod_groups[group], BINPACK, limit)
    tx.commit()
    return placed


def nodes_of(tx: Transaction) -> dict[str, str]:
    return {b.pod.split("/")[1]: b.node for b in tx.binds()}
