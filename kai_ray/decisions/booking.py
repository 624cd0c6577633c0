"""Booking: what a step placed and took back, onto the queues; and what it may place.

Every action books its placements through `book`, and hands placement the same
view of a group, `placeable`, so that no action can forget a quota rule:
- `placeable(ctx, group)`: the group with its pending pods kept off GPU types
  whose per-type limit cannot take even one of them (`admission.avoiding`);
  every action passes this view of the job it admits to `place_gang` and
  `place_extras` (gangs consolidation re-places are judged by `book` alone:
  until the step is booked, the ledger still counts what they held);
- `book(ctx, step)`: the placements and removals of one step
  (`Transaction.attempt`), each added to (or taken from) its group's queue,
  GPUs on nodes of a labelled type to the queue's per-type tallies as well;
  the step then holds (it is committed). When a queue would pass a
  per-GPU-type limit with what it gains, nothing is booked and the reason is
  returned: the step is rolled back;
- `held_ledger(snapshot, shares)`: the ledger as the cycle opens it, with what
  every queue's bound members hold.
Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from kai_ray.decisions.admission import (
    TypedKey,
    avoiding,
    exhausted_types,
    is_preemptible,
    typed_gpus,
    typed_keys,
    typed_limit_refusal,
)
from kai_ray.decisions.context import CycleContext
from kai_ray.decisions.ledger import QueueLedger
from kai_ray.decisions.ordering import group_priority
from kai_ray.decisions.totals import GroupTotals
from kai_ray.decisions.transaction import Attempt, Placement, Transaction
from kai_ray.state.groups import PodGroupState
from kai_ray.state.pod_states import PodState
from kai_ray.state.snapshot import Snapshot
from kai_ray.values.resources import GPU, Resources, add_into


def placeable(ctx: CycleContext, group: PodGroupState) -> PodGroupState:
    """The group as placement should see it: pending pods kept off GPU types whose
    per-type limit cannot take even one of them."""
    avoid = _exhausted(ctx, group)
    if not avoid:
        return group
    pods = tuple(avoiding(pod, avoid) if pod.node is None else pod for pod in group.pods)
    return dataclasses.replace(group, pods=pods)


def _exhausted(ctx: CycleContext, group: PodGroupState) -> list[TypedKey]:
    keys = typed_keys(ctx.snapshot.queues, group.queue)
    if not keys:
        return []  # no per-GPU-type limit on the queue's path: nothing to look at
    placed = ctx.transaction.placed
    gpus = [pod.effective_requests[GPU] for pod in group.pending if pod.key not in placed]
    if not gpus:
        return []
    return exhausted_types(ctx.ledger, group.queue, keys, min(gpus))


#: A queue and whether the work booked on it is preemptible.
Account = tuple[str, bool]


def book(ctx: CycleContext, step: Attempt) -> str | None:
    """Book every placement and removal of `step` on its group's queue, and let the
    step stand; else why not (nothing booked, and the step is rolled back)."""
    amounts, gpus = _deltas(ctx, ctx.transaction.placements[step.mark :])
    typed = {queue: _typed(ctx, queue, on_nodes) for queue, on_nodes in gpus.items()}
    for queue, gained in typed.items():
        refused = typed_limit_refusal(ctx.ledger, queue, _gains(gained)) if gained else None
        if refused:
            return refused
    for (queue, preemptible), amount in amounts.items():
        ctx.ledger.add(queue, Resources.from_canonical(amount), preemptible)
    for queue, gained in typed.items():
        if gained is not None:
            ctx.ledger.add_typed(queue, gained)
    step.holds = True
    return None


def _deltas(
    ctx: CycleContext, placements: Sequence[Placement]
) -> tuple[dict[Account, dict[str, float]], dict[str, list[tuple[int, float]]]]:
    """What each account gains (negative: gives back), and each queue's GPUs per node."""
    amounts: dict[Account, dict[str, float]] = {}
    gpus: dict[str, list[tuple[int, float]]] = {}
    for placement in placements:
        group = ctx.snapshot.pod_groups[placement.bind.group]
        held, sign = held_by(ctx.transaction, placement), -1.0 if placement.removal else 1.0
        account = (group.queue, is_preemptible(group, group_priority(group)))
        add_into(amounts.setdefault(account, {}), held, sign)
        gpus.setdefault(group.queue, []).append((placement.node, sign * held[GPU]))
    return amounts, gpus


def _typed(ctx: CycleContext, queue: str, on_nodes: list[tuple[int, float]]) -> Resources | None:
    """GPUs the queue gains per typed key; None when no typed limit is above it."""
    keys = typed_keys(ctx.snapshot.queues, queue)
    if not keys:
        return None
    labels = ctx.snapshot.labels
    return typed_gpus(keys, [(labels[node], amount) for node, amount in on_nodes])


def _gains(typed: Resources) -> Resources:
    """Only what grows is judged: a queue already past a limit may still give back."""
    return Resources({key: amount for key, amount in typed.items() if amount > 0})


def held_by(tx: Transaction, placement: Placement) -> Resources:
    """What a placement holds (or a removal gives back), a GPU share as a part of a GPU."""
    pod: PodState = tx.snapshot.pods[placement.bind.pod]
    return pod.requests + {GPU: placement.bind.gpu_fraction}


# ------------------------------------------------- what the queues hold at first


def held_ledger(
    snapshot: Snapshot, shares: Mapping[str, Resources], totals: GroupTotals | None = None
) -> QueueLedger:
    """What every queue holds at the start of the cycle (bound live pods), GPUs
    of the types its queues limit included: exact sums (`totals.GroupTotals`),
    from `totals` kept from the last cycle when given."""
    ledger = QueueLedger(snapshot.queues, shares)
    held = (totals or GroupTotals()).update(snapshot).held(snapshot)
    ledger.allocated = held.allocated
    ledger.non_preemptible = held.non_preemptible
    ledger.typed = held.typed
    return ledger
