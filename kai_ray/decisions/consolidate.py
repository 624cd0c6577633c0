"""The consolidate action: move running gangs so that a waiting gang fits.

For each gang still waiting for its minimum after the actions before this one
(higher priority first, then older):
1. it must pass admission as allocate judges it (limits; quota for
   non-preemptible work): the limit rule of every evicting action
   (`admission.refusal` with what the victims free), where the gangs moved
   free nothing, since each is placed again in the same step; and fit the free
   resources of the schedulable nodes
   in total, yet not fit on any set of nodes as they are: fragmentation, not
   shortage (taking resources back is reclaim's and preempt's business);
2. the movable gangs: this scheduler's, running whole (at least their minimum
   bound), of any queue, preemptible, every pod with a controller that makes it
   again (a bare pod evicted is gone for good: a move would destroy its work),
   untouched by this cycle so far, and whose minimum started at least
   `consolidationMinRuntime` ago (`runtime.started_at`; a moved gang's pods are
   new, so this is also the least time between two moves of one gang: without
   it the soak saw one gang moved three times in 14 s); ordered by the free GPUs
   of the emptiest node they sit on (moving them empties whole nodes first),
   then the smaller first, then the newest (`victims.newest_first`);
3. inside the transaction, release the first k movable gangs (k = 1 up to
   `consolidationMaxJobs`), place the waiting gang's minimum, then re-place
   every released pod (minimum first, then the rest); the first k for which all
   of that holds wins, less any gang that landed back where it was;
4. the moves stay in the cycle's transaction (`Transaction.evict`, then the new
   placements), so later actions see them, and are booked on the queues
   (`booking.book`); any failure, or a per-GPU-type limit a queue would pass
   with the move, undoes it all.
A moved pod is `Evict(reason "consolidation")` plus a `Nominate` of its new
place, never a bind: on a cluster its controller makes it again under a new
name, and a pod's `nodeName` cannot change. The moved gang's status carries
the nominated nodes (`GroupStatus.nominated`, kept on the PodGroup), and the
next cycle places its pending pods there first while they fit (placement's
`place_pods`), so a move completes one cycle later. A pod is never evicted here
unless its new place was found. Off with `placementStrategy: spread` (packing
fights spreading) and with `consolidationMaxJobs: 0`. Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kai_ray.decisions.admission import is_preemptible, refusal
from kai_ray.decisions.alike import alike_keys
from kai_ray.decisions.booking import book, placeable
from kai_ray.decisions.context import CycleContext, admitted
from kai_ray.decisions.eviction import (
    NodeDomains,
    domain_could_hold,
    domain_holds,
    gang_domains,
)
from kai_ray.decisions.kept import PER_GROUP
from kai_ray.decisions.ordering import group_priority
from kai_ray.decisions.placement import place_extras, place_gang
from kai_ray.decisions.placement.equivalence import signature
from kai_ray.decisions.plan import Evict, GroupStatus, Nominate
from kai_ray.decisions.runtime import started_at
from kai_ray.decisions.totals import Tally, kept_members
from kai_ray.decisions.transaction import Matrix, MemoKey, Transaction, held_vector
from kai_ray.decisions.victims import Vector, newest_first
from kai_ray.decisions.waiting import waiting_asks, waiting_in_turn
from kai_ray.state.groups import PodGroupState
from kai_ray.values.arrays import add_rows
from kai_ray.values.clock import unix_seconds
from kai_ray.values.config import SchedulerConfigSpec, duration_seconds
from kai_ray.values.resources import EPSILON, GPU, Resources

CONSOLIDATION = "consolidation"


class ConsolidateAction:
    name = "consolidate"

    def run(self, ctx: CycleContext) -> None:
        if ctx.config.consolidationMaxJobs == 0 or ctx.config.placementStrategy == "spread":
            return
        if not some_could_be_tried(ctx):
            return  # every attempt would stop at admission or the total, changing nothing
        tx, nothing, key_of = ctx.transaction, set[Hashable](), alike_keys(ctx)
        for group in in_turn(ctx):
            # A gang judged alike to one nothing came of at this very state (the
            # transaction, the evictions planned, the ledger) is not judged again:
            # nothing would come of it either, and the failed attempt left no trace
            # that the first did not (its wake-up is asked again, a no-op). A gang
            # with a key has no member bound, so it is never among the movable.
            # Only an attempt moves the state: `nothing` holds the kinds judged at
            # the state as it is, and starts afresh when an attempt moved it.
            alike = key_of(group)
            if alike is not None and alike in nothing:
                continue
            before = (tx.version, len(ctx.plan.evictions), ctx.ledger.version)
            with tx.attempt() as step:
                moved = consolidation_for(ctx, group)
                if moved is not None and book(ctx, step) is None:
                    _adopt(ctx, group, moved)
            if (tx.version, len(ctx.plan.evictions), ctx.ledger.version) != before:
                nothing = set()
            if alike is not None and moved is None:
                nothing.add(alike)


def in_turn(ctx: CycleContext) -> list[PodGroupState]:
    """The waiting gangs (`ordering.waits`), higher priority first, then older: the
    kept lists of each queue's candidates merged (`waiting.waiting_in_turn`, in
    `ordering.job_key` order, which for a gang's missing minimum is exactly that)."""
    return waiting_in_turn(ctx.transaction)


def consolidation_for(ctx: CycleContext, group: PodGroupState) -> list[PodGroupState] | None:
    """The gangs to move so that `group` fits, with the moves left in the transaction;
    None (and the transaction as it was) when no move within the bound does it.

    Past admission and the total, what happens reads only the transaction's state,
    the plan's evictions (the movable gangs) and what placement reads of the gang
    as `placeable` shows it: a gang equivalent to one no move helped at the same
    state (`equivalence.signature`) is not tried again (`NO_MOVE`)."""
    request = group.missing_requests
    preemptible = is_preemptible(group, group_priority(group))
    if refusal(ctx.ledger, group, request, preemptible) or not fits_in_total(ctx, request):
        return None
    shape = _attempt_key(ctx, group)
    if shape is not None and ctx.transaction.memo.find(NO_MOVE, shape):
        return None
    moved = _consolidation(ctx, group)
    if moved is None and shape is not None:
        ctx.transaction.memo.keep(NO_MOVE, shape, True)
    if moved is None:
        _wake_when_protection_ends(ctx)
    return moved


#: Per (transaction version, evictions planned, gang signature): no move helped such a gang.
NO_MOVE = MemoKey[bool]("no consolidation move")


def _attempt_key(ctx: CycleContext, group: PodGroupState) -> Hashable | None:
    """What an attempt past admission reads, or None when it is not to be kept: the
    gang has no placement signature. A gang with one has no member bound, so it is
    never among the movable gangs (which hold their minimum bound): the movable
    gangs are not worked out here, only where a move is tried, as on the plain
    path."""
    placement = signature(ctx.transaction, placeable(ctx, group))
    if placement is None:
        return None
    return (ctx.transaction.version, len(ctx.plan.evictions), placement)


def _consolidation(ctx: CycleContext, group: PodGroupState) -> list[PodGroupState] | None:
    """The first k movable gangs (k = 1, 2, ... up to the bound) whose move lets the
    gang fit, unless it fits as things are.

    The gang is first judged by counting (`eviction.domain_could_hold`, over the
    domains of its required topology level, else the whole cluster): when no
    domain could hold its missing members even with every gang within the bound
    gone and none placed again, no move can do it, nor can it fit as things are
    (less room still), and the moves are not tried. Exact: a move frees at most
    what the first k gangs hold, and the gang's members must then be placed on
    one domain's nodes. The count as things are comes first, so that the movable
    gangs are worked out in the same cases as without it (working them out notes
    when protected gangs may move, which wakes a later cycle)."""
    tx = ctx.transaction
    view = placeable(ctx, group)
    domains = gang_domains(tx, view)
    mark = tx.checkpoint()
    as_is = domains is None or domain_could_hold(tx, view, domains, ())
    if as_is and try_move(ctx, group, ()):
        tx.rollback(mark)
        return None  # it fits as things are: not a matter of fragmentation
    movable = movable_gangs(ctx, group)
    bound = len(movable)
    if domains is not None and not domain_could_hold_moved(tx, view, domains, movable):
        return None
    counted_out = moves_counted_out(tx, view, movable[:bound])
    for count in range(1, bound + 1):
        if counted_out[count - 1]:
            continue  # `could_pack` would rule it out: `try_move` would answer no
        if try_move(ctx, group, movable[:count]):
            return _without_stayers(ctx, group, movable[:count], mark)
    return None


def domain_could_hold_moved(
    tx: Transaction, target: PodGroupState, domains: NodeDomains, moved: Sequence[PodGroupState]
) -> bool:
    """`eviction.domain_could_hold` with every bound pod of `moved` freed: the room
    they free added from their layouts (`_freed`, kept for the cycle) rather than pod
    by pod, in the same order, so the same sums to the bit."""
    room = tx.free.copy()
    for gang in moved:
        freed = _freed(tx, gang)
        add_rows(room, freed.nodes, freed.rows)
    return domain_holds(tx, target, domains, room)


def moves_counted_out(
    tx: Transaction, target: PodGroupState, movable: Sequence[PodGroupState]
) -> list[bool]:
    """For k = 1 up to the number of `movable` gangs: whether `could_pack` rules out
    moving the first k by its first count of GPUs alone (`first_counts_fail`),
    worked out for every k at once. On a full, fragmented cluster that count
    rules out most moves: a waiting gang is tried with one gang moved, then two,
    up to the bound, and each `could_pack` call otherwise adds up the room again.
    Exact: a move counted out here is one `could_pack` answers no for (the same
    count, on the same rooms to the bit), so `try_move` would answer no."""
    if not movable:
        return []
    gpu = tx.snapshot.column(GPU)
    freed = [_freed(tx, gang) for gang in movable]
    least = _target_least(tx, target)[:, gpu]
    room = np.maximum(tx.free[:, gpu], 0.0)
    nodes, sizes = [gang.nodes for gang in freed], [gang.rows[:, gpu] for gang in freed]
    return [bool(failed) for failed in first_counts_fail(room, least, nodes, sizes)]


def first_counts_fail(
    room: Vector,
    least: Vector,
    nodes: Sequence[npt.NDArray[np.intp]],
    sizes: Sequence[Vector],
) -> npt.NDArray[np.bool_]:
    """For k = 1 up to len(`sizes`): whether `sizes_could_fit`'s first count fails
    for the items `least` and the first k of `sizes` (one resource), in the nodes'
    `room` plus what the first k free (`sizes[i]` on `nodes[i]`, added in order as
    `add_rows` adds them): for some size t among those items, the items asking t or
    more outnumber Σ floor(room / t). The same numbers as that count, for every k
    in one pass: only the nodes the gangs sit on have room that differs from `room`."""
    count = len(sizes)
    touched = np.unique(np.concatenate(nodes))
    local = room[touched]  # a copy
    rooms = np.empty((count, len(touched)))
    for k, (on, held) in enumerate(zip(nodes, sizes, strict=True)):
        np.add.at(local, np.searchsorted(touched, on), held)
        rooms[k] = local
    items = np.concatenate([least, *sizes])
    asked = items > EPSILON
    distinct = np.unique(items[asked])
    if not distinct.size:
        return np.zeros(count, dtype=np.bool_)
    # Per k and size: the items of the first k (least's with k's) asking that size or
    # more, and whether some asks exactly that size (a size `np.unique` gives for them).
    ends = np.cumsum([len(least), *(len(held) for held in sizes)])[1:] - 1
    at_least = (items[:, None] >= distinct - EPSILON) & asked[:, None]
    many = np.cumsum(at_least, axis=0)[ends]
    present = np.cumsum(items[:, None] == distinct, axis=0)[ends] > 0
    untouched = np.floor(room / distinct[:, None] + EPSILON)
    held = untouched.sum(axis=1) - untouched[:, touched].sum(axis=1)
    slots = held + np.floor(rooms[:, :, None] / distinct + EPSILON).sum(axis=1)
    failed: npt.NDArray[np.bool_] = np.any(present & (many > slots), axis=1)
    return failed


def some_could_be_tried(ctx: CycleContext) -> bool:
    """Whether some waiting gang passes admission (`refusal`, nothing freed) and its
    missing minimum fits the free room added up. Without one, every attempt returns
    at those first tests with the transaction and the ledger as they were, so the
    next meets the same: the action is skipped whole, the waiting gangs neither
    sorted nor judged one by one (a full cluster; a flood of one queue at its
    limit). The waiting groups of the snapshot hold every gang it could try; the
    answer reads only a gang's queue, namespace, request and whether it is
    preemptible, so each such combination is judged once (`waiting.waiting_asks`)."""
    ledger = ctx.ledger
    return any(
        fits_in_total(ctx, ask.request)
        and not refusal(ledger, ask.group, ask.request, ask.preemptible)
        for ask in waiting_asks(ctx.transaction)
    )


def fits_in_total(ctx: CycleContext, request: Resources) -> bool:
    """The request fits the free resources of the schedulable nodes added up; once per
    transaction version and request (the waiting gangs of a backlog ask a few
    requests, interned, over and over while nothing changes)."""
    tx = ctx.transaction

    def fits() -> bool:
        return bool((ctx.snapshot.vector(request) <= total_free(tx) + EPSILON).all())

    return tx.memo.get(FITS_IN_TOTAL, (tx.version, request), fits)


#: Per (transaction version, request): whether it fits the free room added up.
FITS_IN_TOTAL = MemoKey[bool]("fits the free room added up")


#: Per transaction version: the free resources of the schedulable nodes added up.
TOTAL_FREE = MemoKey[Vector]("total free")


def total_free(tx: Transaction) -> Vector:
    """`summed_free`, once per transaction version (equal versions, equal free room):
    every waiting gang is judged against it, and with a deep backlog most are
    judged while nothing changes."""
    return tx.memo.get(TOTAL_FREE, tx.version, lambda: summed_free(tx))


def summed_free(tx: Transaction) -> Vector:
    """The free resources of the schedulable nodes added up (read only: shared)."""
    schedulable = tx.snapshot.schedulable[:, None]
    free: Vector = np.where(schedulable, np.maximum(tx.free, 0.0), 0.0).sum(axis=0)
    free.setflags(write=False)
    return free


#: Per (transaction version, evictions planned): the first movable gangs in order
#: (`_movable_gangs`), and every movable gang's key.
MOVABLE = MemoKey[tuple[list[PodGroupState], frozenset[str]]]("movable gangs")
#: Per cycle: the earliest end of a `consolidationMinRuntime` protection (None: none).
PROTECTED_UNTIL = MemoKey[float | None]("consolidation protection ends")


def movable_gangs(ctx: CycleContext, target: PodGroupState) -> list[PodGroupState]:
    """The first movable gangs in order (as many as a move may take): running
    preemptible gangs this cycle has not touched, emptiest nodes first.

    What they are depends only on the transaction's state and the plan's evictions,
    so the list is worked out once per (version, evictions) and shared by every
    waiting gang judged meanwhile (each attempt that fails rolls the transaction
    back to the same version): without this, a backlog of waiting gangs would
    each walk every group of the cluster."""
    gangs, keys = _movable_memo(ctx)
    bound = ctx.config.consolidationMaxJobs
    if target.key in keys:
        return [gang for gang in gangs if gang.key != target.key][:bound]
    return gangs[:bound]


def _movable_memo(ctx: CycleContext) -> tuple[list[PodGroupState], frozenset[str]]:
    key = (ctx.transaction.version, len(ctx.plan.evictions))
    return ctx.transaction.memo.get(MOVABLE, key, lambda: _movable_gangs(ctx))


def _movable_gangs(ctx: CycleContext) -> tuple[list[PodGroupState], frozenset[str]]:
    """The first `consolidationMaxJobs` + 1 movable gangs in order (one more, in
    case the gang judged is among them), and the keys of every movable gang."""
    evicted = {evict.pod for evict in ctx.plan.evictions}
    touched = evicted | set(ctx.transaction.placed) | set(ctx.transaction.removed)
    groups, ours = ctx.snapshot.pod_groups, ctx.config.schedulerName
    minimum = duration_seconds(ctx.config.consolidationMinRuntime)
    # Only the groups that may be moved at all are looked at (followed from cycle
    # to cycle, with what is read of each), in any order: the order below is total
    # (a group's key is its own), and the earliest protection's end is kept
    # whatever the order it is met in.
    movers = kept_members(ctx.transaction.memo, MOVERS, groups, _mover)
    gangs, earliest = list[PodGroupState](), None
    for key, mover in movers.items():
        if mover.scheduler != ours or not touched.isdisjoint(mover.pods):
            continue
        if minimum > 0 and mover.started is not None and mover.started + minimum > ctx.now:
            end = mover.started + minimum  # protected: its minimum started too recently
            earliest = end if earliest is None else min(earliest, end)
            continue
        gangs.append(groups[key])
    if earliest is not None:
        kept = ctx.transaction.memo.find(PROTECTED_UNTIL, None)
        ctx.transaction.memo.keep(
            PROTECTED_UNTIL, None, earliest if kept is None else min(kept, earliest)
        )
    first = first_movable(ctx, gangs, ctx.config.consolidationMaxJobs + 1)
    return first, frozenset(gang.key for gang in gangs)


def first_movable(
    ctx: CycleContext, gangs: Sequence[PodGroupState], count: int
) -> list[PodGroupState]:
    """The first `count` of `gangs` (each with a pod bound) in the movable order:
    the most free GPUs on a node a gang sits on first, then the fewest GPUs
    bound, then the newest (`movable_order`). The first two keys are worked out
    for every gang at once, in arrays; only the gangs among the first `count` by
    them, and those tied with the last of those, are sorted by the whole key
    (the same gangs in the same order as sorting every gang)."""
    if not gangs:
        return []
    free_gpus = ctx.transaction.free[:, ctx.snapshot.column(GPU)]
    kept, index = _kept_seats(ctx.transaction), ctx.snapshot.node_index
    nodes, sizes, gpus = [], np.empty(len(gangs), dtype=np.intp), np.empty(len(gangs))
    for position, gang in enumerate(gangs):
        found = kept.get(gang.key)
        if found is None or found[0] is not gang:
            rows = np.array([index[pod.node or ""] for pod in gang.bound], dtype=np.intp)
            found = kept[gang.key] = (gang, (rows, gang.bound_requests[GPU]))
        rows, gpus[position] = found[1]
        nodes.append(rows)
        sizes[position] = len(rows)
    starts = np.cumsum(sizes) - sizes
    emptiest = np.maximum.reduceat(free_gpus[np.concatenate(nodes)], starts)
    ranked = np.lexsort((gpus, -emptiest))
    chosen = ranked[:count]
    if len(ranked) > count:
        last = ranked[count - 1]
        rest = ranked[count:]
        tied = rest[(emptiest[rest] == emptiest[last]) & (gpus[rest] == gpus[last])]
        chosen = np.concatenate([chosen, tied])
    key = lambda i: movable_order(gangs[i], float(emptiest[i]))  # noqa: E731
    return [gangs[i] for i in sorted(chosen.tolist(), key=key)[:count]]


#: A gang's seats: the nodes (rows) its bound pods sit on, in order, and the GPUs they
#: hold; by group key, each with the very state it was read from.
Seats = dict[str, tuple[PodGroupState, tuple[npt.NDArray[np.intp], float]]]
#: The gangs' seats, kept from cycle to cycle with the groups for one order of nodes
#: (`KeptPerGroup.flat`); for this cycle alone when nothing is kept across cycles.
SEATS = MemoKey[tuple[npt.NDArray[np.intp], float]]("a movable gang's seats")
SEATS_NOW = MemoKey[Seats]("movable gangs' seats this cycle")


def _kept_seats(tx: Transaction) -> Seats:
    """The movable gangs' seats (`Seats`): read once per state of a gang rather than
    pod by pod every cycle, a full cluster's running gangs being mostly the same."""
    per_group = tx.memo.find(PER_GROUP, None)
    if per_group is None:
        return tx.memo.get(SEATS_NOW, None, dict)
    return per_group.flat(SEATS, tx.snapshot.node_names)


def movable_order(gang: PodGroupState, emptiest: float) -> tuple[object, ...]:
    """A movable gang's place in the order, `emptiest` the most free GPUs on a node
    it sits on."""
    among_equals = newest_first(gang.creation_timestamp, gang.key)
    return (-emptiest, gang.bound_requests[GPU], *among_equals)


@dataclass(frozen=True, eq=False)
class _Mover:
    """What the movable gangs read of a group that may be moved, from the group alone."""

    #: The scheduler whose consolidation may move it.
    scheduler: str
    #: When its minimum started (`runtime.started_at`, Unix seconds; None: unknown),
    #: which `consolidationMinRuntime` counts from.
    started: float | None
    #: Its live pods' keys (a gang this cycle placed or evicted a pod of is not moved).
    pods: frozenset[str]


#: Per group: what the movable gangs read of it when it may be moved (`_mover`),
#: followed from cycle to cycle (`totals.kept_members`).
MOVERS = MemoKey[Tally[_Mover]]("groups that may be moved")


def _mover(group: PodGroupState) -> _Mover | None:
    """What the movable gangs read of the group, reading it alone, when some
    scheduler may move it: its live pods all name that scheduler, each is made
    again by a controller (a move evicts the pods for their controller to create
    again; a bare pod has none), the group is seen whole, at its minimum, and
    preemptible. None: no scheduler may."""
    bound = group.bound
    live = group.live_pods()
    schedulers = {pod.scheduler for pod in live}
    if len(schedulers) != 1 or not all(pod.controlled for pod in live):
        return None
    whole = len(bound) >= max(group.spec.minMember, 1)
    if not (group.seen_whole and whole and is_preemptible(group, group_priority(group))):
        return None
    started = unix_seconds(started_at(group))
    return _Mover(schedulers.pop(), started, frozenset(pod.key for pod in live))


def _wake_when_protection_ends(ctx: CycleContext) -> None:
    """A gang waits while movable gangs are protected: a cycle when the first may move."""
    end = ctx.transaction.memo.find(PROTECTED_UNTIL, None)
    if end is not None:
        ctx.plan.wake_no_later_than(end)


def try_move(ctx: CycleContext, target: PodGroupState, moved: Sequence[PodGroupState]) -> bool:
    """Release `moved`, place the target's minimum, re-place every released pod; on
    failure the transaction is put back as it was. A move that `could_pack` rules
    out is not tried."""
    tx = ctx.transaction
    view = placeable(ctx, target)
    if moved and not could_pack(tx, view, moved):
        return False
    mark = tx.checkpoint()
    for gang in moved:
        for pod in gang.bound:
            tx.evict(pod, gang.key)
    holds = place_gang(tx, view, ctx.config).admitted and all(
        replace_gang(tx, gang, ctx.config) for gang in moved
    )
    if not holds:
        tx.rollback(mark)
    return holds


def could_pack(tx: Transaction, target: PodGroupState, moved: Sequence[PodGroupState]) -> bool:
    """Whether the target's missing members (as the least of its pending pods
    ask) and every bound pod of `moved` could all be placed were the moved pods
    gone: first whether those held to the target's required topology level could
    each be given a domain of it (`could_pack_in_domains`), then by counting
    (`sizes_could_fit`): for each resource and
    each size t among the pods' requests of it, the pods asking at least t must
    not outnumber the pods of t the nodes' room (the room left plus what the
    moved pods free) could hold, node by node, rounded down. What moving a gang
    frees is worked out once a cycle (`_freed`).

    Exact, in that a move it rules out fails anyway: every placed pod sits on one
    node within that node's room, and a node with room f of a resource holds at
    most f // t pods asking t or more of it. Rarely false for a gang that could
    fit, often for a move whose last gang finds no room: on a full, fragmented
    cluster most tries fail there, each after placing the target and the other
    gangs again."""
    free = np.maximum(tx.free, 0.0)  # a copy
    freed = [_freed(tx, gang) for gang in moved]
    for gang in freed:
        add_rows(free, gang.nodes, gang.rows)
    least = _target_least(tx, target)
    if not could_pack_in_domains(tx, target, least, freed, free):
        return False
    sizes = np.vstack([least, *(gang.rows for gang in freed)])
    # GPUs first: where a move fails, they are what runs out (the answer is the same).
    gpu = tx.snapshot.column(GPU)
    columns = [gpu, *(c for c in range(sizes.shape[1]) if c != gpu)]
    return all(sizes_could_fit(sizes[:, c], free[:, c]) for c in columns)


def _target_least(tx: Transaction, target: PodGroupState) -> Matrix:
    """The target's missing members as the least of its pending pods ask, resource by
    resource (whichever of them placement completes its minimum with)."""
    asked = [held_vector(tx.snapshot, pod) for pod in target.pending]
    width = len(tx.snapshot.resource_names)
    return _least(np.array(asked).reshape(len(asked), width), len(target.missing))


@dataclass(frozen=True, eq=False)
class _Freed:
    """What moving a gang frees and asks again, as the counts read it."""

    #: Each bound pod's node (an index) and what it holds there (a row each).
    nodes: npt.NDArray[np.intp]
    rows: Matrix
    #: What its minimum asks at the least (`_least`), and the domains of its
    #: required topology level (None: it has none).
    least: Matrix
    domains: NodeDomains | None


#: Per movable gang: `_Freed`, worked out once a cycle (every waiting gang's moves,
#: for every number of gangs moved, try the same first movable gangs).
FREED = MemoKey[_Freed]("what a move of a gang frees")


def _freed(tx: Transaction, gang: PodGroupState) -> _Freed:
    def build() -> _Freed:
        index, snapshot = tx.snapshot.node_index, tx.snapshot
        nodes = np.array([index[pod.node or ""] for pod in gang.bound], dtype=np.intp)
        rows = np.array([held_vector(snapshot, pod) for pod in gang.bound]).reshape(
            len(gang.bound), len(snapshot.resource_names)
        )
        count = max(gang.spec.minMember - len(gang.succeeded), 0)
        return _Freed(nodes, rows, _least(rows, count), _required_domains(tx, gang))

    return tx.memo.get(FREED, gang.key, build)


def _least(rows: Matrix, count: int) -> Matrix:
    """What any `count` of the pods of `rows` (what each holds or asks, a row each)
    ask at the least, resource by resource: the `count` smallest of each column
    (at most as many as there are pods; a row is not a pod's own row)."""
    return np.sort(rows, axis=0)[:count]


#: Assignments of gangs to domains tried by `could_pack_in_domains` before it
#: answers that they could (an answer it cannot rule out is a try, never a miss).
_ASSIGNMENTS = 256


def could_pack_in_domains(
    tx: Transaction,
    target: PodGroupState,
    least: Matrix,
    moved: Sequence[_Freed],
    room: Matrix,
) -> bool:
    """Whether the target's missing members (`least`: as the least of its pending
    pods ask) and the minimum of each moved gang that must share a domain of the
    same required topology level as the target could each be given one domain of
    that level, with `room` the nodes' room once the moved pods are gone: in each
    domain, for each resource and each size t asked, the pods of the gangs given
    it that ask t or more may not outnumber the pods of t its nodes could hold,
    node by node, rounded down (`sizes_could_fit`'s first count, per domain).

    Exact, in that a move it rules out fails anyway: placement puts each gang's
    minimum inside one domain of its required level (a narrower domain lies
    inside one of those), every placed pod on one node within its room; the
    gangs of other levels, and the pods above a minimum, are left out, which
    only rules out less. On a full cluster of gangs held to racks this is where
    most moves fail: the target takes the rack the moved gangs freed, and the
    last of them finds no rack with room for it. The assignments are searched
    largest gang first, domains of equal counts tried once; past `_ASSIGNMENTS`
    tries the move is tried."""
    domains = _required_domains(tx, target)
    if domains is None:
        return True
    items = [least, *(gang.least for gang in moved if gang.domains is domains)]
    return len(items) < 2 or gangs_could_share(items, domains, room)


def gangs_could_share(items: Sequence[Matrix], domains: NodeDomains, room: Matrix) -> bool:
    """Whether each item (a gang's pods, a row each) could be given one domain of
    `domains` (each node's, -1: in none) so that, in each domain, for each resource
    and each size t asked, the pods given it that ask t or more do not outnumber
    the pods of t its nodes' `room` could hold, node by node, rounded down: a
    necessary condition for placing every item's pods inside one domain each.
    True also when the search gives up (`_ASSIGNMENTS`)."""
    items = [item for item in items if len(item)]
    if not items:
        return True
    inside = domains >= 0
    width = int(domains[inside].max(initial=-1)) + 1
    asked = np.vstack(items)
    caps, needs = [], []
    for column in range(asked.shape[1]):
        for size in np.unique(asked[:, column][asked[:, column] > EPSILON]):
            fits = np.floor(room[inside, column] / size + EPSILON)
            caps.append(np.bincount(domains[inside], weights=fits, minlength=width))
            needs.append([np.count_nonzero(item[:, column] >= size - EPSILON) for item in items])
    if not caps:
        return True
    return _assignable(
        np.array(caps, dtype=np.float64).T.copy(), np.array(needs, dtype=np.float64).T
    )


def _required_domains(tx: Transaction, group: PodGroupState) -> NodeDomains | None:
    """The domains of the group's required topology level, None without one."""
    constraint = group.spec.topologyConstraint
    if constraint is None or constraint.requiredLevel is None:
        return None
    return gang_domains(tx, group)


def _assignable(caps: Matrix, needs: Matrix) -> bool:
    """Whether each row of `needs` (a gang's counts) can be given a row of `caps` (a
    domain's), the counts given one domain adding up to no more than its own;
    True also once `_ASSIGNMENTS` tries found none."""
    order = sorted(range(len(needs)), key=lambda i: -float(needs[i].sum()))
    tries = 0

    def give(position: int) -> bool:
        nonlocal tries
        if position == len(order):
            return True
        need = needs[order[position]]
        tried: set[bytes] = set()
        for domain in np.flatnonzero(np.all(caps >= need, axis=1)).tolist():
            left = caps[domain].tobytes()
            if left in tried:
                continue
            tried.add(left)
            tries += 1
            if tries > _ASSIGNMENTS:
                return True
            caps[domain] -= need
            placed = give(position + 1)
            caps[domain] += need
            if placed:
                return True
        return False

    return give(0)


#: At most this many request sizes of one resource are judged as thresholds by
#: `sizes_could_fit`'s second count (each is a necessary condition of its own, so
#: judging fewer only rules out less); the largest are kept.
_THRESHOLDS = 16
#: `_most_weight` counts the larger items per node exactly up to this many.
_EXACT_LARGER = 64


def sizes_could_fit(asked: Vector, room: Vector) -> bool:
    """Whether items of the sizes `asked` (one resource; zeros ask nothing) could be
    packed into nodes with room `room`, by two counts, each a necessary condition
    (a packing exists only if both hold):

    1. for each size t asked, the items asking t or more do not outnumber
       Σ floor(room / t): a node with room f holds at most f // t of them;
    2. for each size k asked (a threshold), weigh an item 1 when it asks more than
       k, 1/2 when it asks k, and 0 when less: the items' weight is at most what
       the nodes could hold of it, a node with room f at most the largest
       a + floor((f - a * s) / k) / 2 over a = 0, 1, ... with a * s <= f, where s
       is the smallest size asked above k (a items above k take a * s or more;
       what is left holds at most that many items of k). Two items of more than
       half a node cannot share it: the count the first misses (four items of
       6, 5, 5 and 4 GPUs on three nodes with 8 free each pass 1 and fail 2).
    3. when both hold and the nodes' rooms take few distinct values, a search
       for a packing itself (`_packs`), which gives up (answering that they
       could) past `_PACKING_STATES` states. On a fragmented cluster of single
       pods of 1 to 8 GPUs, nearly every move that passes the counts fails at
       its last pod, on rooms of nine values.
    """
    items = asked[asked > EPSILON]
    if items.size == 0:
        return True
    distinct = np.unique(items)
    for size in distinct:
        if np.count_nonzero(items >= size - EPSILON) > np.floor(room / size + EPSILON).sum():
            return False
    for i in range(max(len(distinct) - _THRESHOLDS, 0), len(distinct)):
        k = float(distinct[i])
        above = distinct[i + 1 :]
        weight = float(np.count_nonzero(items > k + EPSILON))
        weight += 0.5 * float(np.count_nonzero(np.abs(items - k) <= EPSILON))
        if weight > _most_weight(room, k, float(above[0]) if above.size else None) + EPSILON:
            return False
    return len(distinct) < 2 or _packs(items, room)


#: `_packs` searches rooms of at most this many distinct values (GPUs left on a node),
#: and at most this many states of the search, before it gives up.
_DISTINCT_ROOMS = 32
_PACKING_STATES = 4096


class _GaveUp(Exception):
    pass


def _packs(items: Vector, room: Vector) -> bool:
    """Whether the items (sizes of one resource) could be packed into nodes of room
    `room`: each item, largest first, tried on each distinct room left that holds
    it (nodes of equal room are alike), the failed states kept. True also when
    the rooms take too many distinct values or the search grows too large: this
    only ever rules out a move that fails anyway."""
    sizes = sorted((float(size) for size in items), reverse=True)
    smallest = sizes[-1]
    counts: dict[float, int] = {}
    for left in room.tolist():
        if left + EPSILON >= smallest:
            counts[left] = counts.get(left, 0) + 1
    if len(counts) > _DISTINCT_ROOMS:
        return True
    failed: set[tuple[int, tuple[tuple[float, int], ...]]] = set()

    def place(i: int, rooms: tuple[tuple[float, int], ...]) -> bool:
        if i == len(sizes):
            return True
        if (i, rooms) in failed:
            return False
        if len(failed) >= _PACKING_STATES:
            raise _GaveUp
        size = sizes[i]
        for position, (left, count) in enumerate(rooms):
            if left + EPSILON < size:
                continue
            after = dict(rooms[:position] + rooms[position + 1 :])
            if count > 1:
                after[left] = count - 1
            rest = left - size
            if rest + EPSILON >= smallest:
                after[rest] = after.get(rest, 0) + 1
            if place(i + 1, tuple(sorted(after.items()))):
                return True
        failed.add((i, rooms))
        return False

    try:
        return place(0, tuple(sorted(counts.items())))
    except _GaveUp:
        return True


def _most_weight(room: Vector, k: float, s: float | None) -> float:
    """`sizes_could_fit`'s count 2: Σ over nodes of the most weight each could hold.
    Where a node could hold more than `_EXACT_LARGER` items of size s, the larger
    end of the bound's real relaxation is taken instead (every term is at most
    a + (f - a * s) / (2k), linear in a, so at most its value at a = 0 or at
    a = f / s): looser, and still a bound."""
    room = np.maximum(room, 0.0)
    halves = np.floor(room / k + EPSILON) * 0.5
    if s is None:
        return float(halves.sum())
    larger = np.floor(room / s + EPSILON)
    exact = larger <= _EXACT_LARGER
    best = np.where(exact, halves, np.maximum(room / (2.0 * k), room / s))
    for a in range(1, int(larger[exact].max(initial=0)) + 1):
        left = room - a * s
        held = a + np.floor(np.maximum(left, 0.0) / k + EPSILON) * 0.5
        best = np.where(exact & (left >= -EPSILON), np.maximum(best, held), best)
    return float(best.sum())


def replace_gang(tx: Transaction, gang: PodGroupState, config: SchedulerConfigSpec) -> bool:
    """Every bound pod of `gang` placed again (its minimum together, then one by one)."""
    view = tx.memo.get(AS_PENDING, gang.key, lambda: as_pending(gang))
    if not place_gang(tx, view, config).admitted:
        return False
    place_extras(tx, view, config)
    return all(pod.key in tx.placed for pod in view.pods)


#: Per cycle: each movable gang as placement sees it once released (`as_pending`,
#: a function of the snapshot's gang alone), for the many moves that try it.
AS_PENDING = MemoKey[PodGroupState]("gang as pending")


def as_pending(gang: PodGroupState) -> PodGroupState:
    """The gang as placement should see it once released: its bound pods waiting,
    and nothing else (pods that were waiting anyway are not moved)."""
    pods = tuple(dataclasses.replace(pod, node=None, devices=()) for pod in gang.bound)
    return dataclasses.replace(gang, pods=pods)


def _without_stayers(
    ctx: CycleContext, target: PodGroupState, moved: list[PodGroupState], mark: int
) -> list[PodGroupState]:
    """The gangs moved, less those that landed back where they were when the move
    still holds without them; the transaction holds the move returned."""
    kept = [gang for gang in moved if not _stayed(ctx.transaction, gang)]
    if len(kept) == len(moved):
        return moved
    ctx.transaction.rollback(mark)
    if try_move(ctx, target, kept):
        return kept
    if not try_move(ctx, target, moved):
        raise RuntimeError(f"{target.key}: a move that held failed again on the same state")
    return moved


def _stayed(tx: Transaction, gang: PodGroupState) -> bool:
    for pod in gang.bound:
        bind = tx.placed[pod.key].bind
        if (bind.node, bind.gpu_devices) != (pod.node, pod.devices):
            return False
    return True


def _adopt(ctx: CycleContext, target: PodGroupState, moved: list[PodGroupState]) -> None:
    """Into the plan: the target admitted (its binds are the transaction's), and each
    moved pod evicted, with where its replacement should go nominated."""
    for gang in moved:
        nodes = []
        for pod in gang.bound:
            bind = ctx.transaction.placed[pod.key].bind
            ctx.plan.evictions.append(Evict(pod.key, gang.key, CONSOLIDATION))
            nomination = Nominate(gang.key, bind.node, bind.gpu_devices, bind.gpu_fraction, pod.key)
            ctx.plan.nominations.append(nomination)
            nodes.append(bind.node)
        ctx.plan.statuses.state(GroupStatus(gang.key, True, nominated=tuple(nodes)))
    ctx.plan.statuses.state(admitted(target))
    ctx.log.info("%s fits after moving %s", target.key, ", ".join(g.key for g in moved))
