"""The what-ifs of `kai-ray explain`, each on the snapshot of what was read.

Each runs in a fresh transaction that is thrown away, with the placement the
cycle uses: whether a gang's missing minimum fits as a gang now, how many of its
missing members fit one by one (no gang rule, no topology), and, under a
topology constraint, the best domain of each candidate level with its room (or,
for a bound gang, the domains its members are in). Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kai_ray.decisions.placement import LocalBackend, RoomQuery, domains, place_gang
from kai_ray.decisions.placement.domains import Scope
from kai_ray.decisions.placement.gang import Context, kinds_of, place_pods
from kai_ray.decisions.transaction import Transaction
from kai_ray.state.groups import PodGroupState
from kai_ray.state.pod_states import PodState
from kai_ray.state.snapshot import Snapshot
from kai_ray.values.config import SchedulerConfig
from kai_ray.values.resources import CPU, GPU


@dataclass(frozen=True)
class Closeness:
    """The best domain of one candidate level: room for `room` of the `needed` pods."""

    level: str
    domain: str
    room: int
    needed: int
    pod: str
    required: bool


@dataclass(frozen=True)
class Gang:
    min_member: int
    bound: int
    pending: int
    #: (name, minMember, bound, pending) of each subgroup.
    subgroups: list[tuple[str, int, int, int]]
    missing: int
    fits_one_by_one: int
    fits_whole: bool
    not_now: str


def gang_now(snapshot: Snapshot, group: PodGroupState, config: SchedulerConfig) -> Gang:
    subgroups = [
        (sub.name, sub.minMember, *_counts(group.pods_of_subgroup(sub.name), group))
        for sub in group.spec.subGroups
    ]
    outcome = place_gang(Transaction(snapshot), group, config.spec) if group.waiting else None
    return Gang(
        min_member=group.spec.minMember,
        bound=len(group.bound),
        pending=len(group.pending),
        subgroups=subgroups,
        missing=len(group.missing),
        fits_one_by_one=_one_by_one(snapshot, group, config),
        fits_whole=outcome is None or outcome.admitted,
        not_now="" if outcome is None or outcome.admitted else outcome.reason,
    )


def _counts(pods: tuple[PodState, ...], group: PodGroupState) -> tuple[int, int]:
    bound = {pod.key for pod in group.bound}
    live = [pod for pod in pods if not pod.terminal]
    return sum(1 for pod in live if pod.key in bound), sum(1 for pod in live if pod.node is None)


def _one_by_one(snapshot: Snapshot, group: PodGroupState, config: SchedulerConfig) -> int:
    """How many missing members fit, each alone, anywhere (no gang rule, no topology)."""
    ctx = Context(Transaction(snapshot), group, config.spec)
    pods = sorted(
        group.missing,
        key=lambda p: (p.requests[GPU], p.gpu_fraction, p.requests[CPU]),
        reverse=True,
    )
    return sum(1 for pod in pods if place_pods(ctx, [pod], ctx.everywhere()) is None)


def _scope(
    snapshot: Snapshot, group: PodGroupState, config: SchedulerConfig
) -> tuple[Context, Scope | str | None]:
    ctx = Context(Transaction(snapshot), group, config.spec)
    return ctx, domains.resolve(ctx.tx, group.spec.topologyConstraint, ctx.topology)


def closeness(
    snapshot: Snapshot, group: PodGroupState, config: SchedulerConfig
) -> list[Closeness] | str | None:
    """Per candidate level, the best domain for the missing members and its room."""
    ctx, scope = _scope(snapshot, group, config)
    if scope is None or isinstance(scope, str) or not group.missing:
        return scope if isinstance(scope, str) else None
    kinds = kinds_of(ctx, list(group.missing), ctx.everywhere())
    levels = tuple((scope.tree.name, level) for level in scope.levels)
    rooms = [LocalBackend().domain_room(ctx.tx, RoomQuery(k.shape, k.nodes, levels)) for k in kinds]
    found = []
    for position, level in enumerate(scope.levels):
        per_kind = [room[position] for room in rooms]
        if not per_kind[0].size:
            continue
        ratios = np.min(
            [room / kind.count for room, kind in zip(per_kind, kinds, strict=True)], axis=0
        )
        best = int(np.argmax(ratios))
        limiting = int(
            np.argmin([room[best] / kind.count for room, kind in zip(per_kind, kinds, strict=True)])
        )
        found.append(
            Closeness(
                level=scope.level_name(level),
                domain=scope.tree.levels[level].domains[best].id,
                room=int(per_kind[limiting][best]),
                needed=kinds[limiting].count,
                pod=kinds[limiting].shape.describe(),
                required=level == scope.levels[-1] and not scope.fallback_to_all,
            )
        )
    return found


def placed_in(
    snapshot: Snapshot, group: PodGroupState, config: SchedulerConfig
) -> list[tuple[str, list[str]]]:
    """The domains its bound members are in, at each level of its constraint."""
    _, scope = _scope(snapshot, group, config)
    if scope is None or isinstance(scope, str) or not group.bound:
        return []
    index = snapshot.node_index
    nodes = [index[pod.node] for pod in group.bound if pod.node is not None and pod.node in index]
    placed = []
    for level in reversed(scope.levels):
        tree_level = scope.tree.levels[level]
        ids = sorted({tree_level.domains[d].id for d in tree_level.node_domain[nodes] if d >= 0})
        placed.append((scope.level_name(level), ids))
    return placed
