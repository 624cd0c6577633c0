"""The two calls every action makes: `place_gang` and `place_extras`, over a tree of pod sets.

`place_gang` builds the tree of what the group's minimum still misses (per
subgroup: `minMember` minus members already bound or placed; at the top,
`minSubGroup` of the subgroups, all when unset; then any ungrouped pods the
group's own `minMember` still needs) and places it all or nothing.
`place_extras` grows an admitted group: a subgroup still short of its minimum
is placed whole first, then every other pending member one at a time, each
inside the required domains its set already occupies. Neither commits: what
they place stays in the transaction for the caller to commit or roll back
(`Transaction.attempt`). Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kai_ray.decisions.placement.carried import carried_failure, carry_failure
from kai_ray.decisions.placement.equivalence import (
    KnownFailure,
    keep_failure,
    known_failure,
    signature,
)
from kai_ray.decisions.placement.gang import Context, PodSet, explain, place_set
from kai_ray.decisions.placement.reasons import Code
from kai_ray.decisions.transaction import Transaction
from kai_ray.state.groups import PodGroupState
from kai_ray.state.pod_states import PodState
from kai_ray.values.api import SubGroup, TopologyConstraint
from kai_ray.values.config import SchedulerConfigSpec

#: Chooses, for one set, which of its pending pods to place given how many it misses.
Pick = Callable[[str | None, list[PodState], int], list[PodState]]


@dataclass(frozen=True)
class GangOutcome:
    """What placing one group did (`Code`), why not for a person, and pods placed."""

    code: Code
    reason: str = ""
    placed: int = 0
    #: How it failed, when that holds for any equivalent gang at the same state
    #: (`equivalence.KnownFailure`, kept under the gang's signature); else None.
    known: KnownFailure | None = None

    @property
    def admitted(self) -> bool:
        """Its minimum holds (in the transaction, until the caller rolls it back)."""
        return self.code is Code.SUCCESS


def place_gang(tx: Transaction, group: PodGroupState, config: SchedulerConfigSpec) -> GangOutcome:
    """The group's missing minimum, all or nothing: placed in the transaction when it
    holds, and the transaction left as it was when not. A gang equivalent to one that
    failed with the transaction as it is now fails the same way without a search
    (`equivalence.py`), as does one equivalent to a gang no node had room for, while
    none has (`carried.py`)."""
    key = signature(tx, group)
    found = _known_outcome(group, known_failure(tx, key))
    if found is not None:
        return found
    known = None if key is None else carried_failure(tx, key, group)
    reusable = known is not None
    if known is None:
        tree = build_tree(tx, group, _minimum)
        ctx = _context(tx, group, config)
        mark = tx.checkpoint()
        failure = place_set(ctx, tree, ctx.everywhere())
        if failure is None:
            return GangOutcome(Code.SUCCESS, placed=tx.checkpoint() - mark)
        tx.rollback(mark)
        render = lambda f: f"gang of {group.spec.minMember} does not fit: {explain(ctx, f)}"  # noqa: E731
        known = keep_failure(tx, key, group, failure, render)
        reusable = known_failure(tx, key) is known
        if reusable:
            carry_failure(tx, key, group, known)
    return GangOutcome(known.code, known.reason_for(group), known=known if reusable else None)


def known_outcome(tx: Transaction, group: PodGroupState) -> GangOutcome | None:
    """How `place_gang` would answer, when a gang equivalent to `group` already failed
    with the transaction as it is (`equivalence.known_failure`): then it answers
    from that failure without a search or a change, and so can the caller, without
    entering an attempt. None otherwise."""
    return _known_outcome(group, known_failure(tx, signature(tx, group)))


def _known_outcome(group: PodGroupState, known: KnownFailure | None) -> GangOutcome | None:
    if known is None:
        return None
    return GangOutcome(known.code, known.reason_for(group), known=known)


def place_extras(
    tx: Transaction, group: PodGroupState, config: SchedulerConfigSpec, limit: int | None = None
) -> int:
    """Members above the minimum, one by one (short subgroups whole); returns pods placed."""
    ctx = _context(tx, group, config)
    if not _minimum_holds(tx, group):
        return 0
    placed = 0
    for pod in _pending(tx, group):
        if limit is not None and placed >= limit:
            break
        if pod.key in tx.placed:
            continue
        tree = build_tree(tx, group, _one_step(pod))
        mark = tx.checkpoint()
        if place_set(ctx, tree, ctx.everywhere()) is None:
            placed += tx.checkpoint() - mark
    return placed


def _context(tx: Transaction, group: PodGroupState, config: SchedulerConfigSpec) -> Context:
    return Context(tx, group, config)


def _minimum(name: str | None, pending: list[PodState], missing: int) -> list[PodState]:
    return pending[:missing]


def _one_step(pod: PodState) -> Pick:
    """The pod's subgroup minimum when that subgroup is short, else the pod alone."""

    def pick(name: str | None, pending: list[PodState], missing: int) -> list[PodState]:
        if name != pod.subgroup or pod not in pending:
            return []
        return pending[:missing] if missing else [pod]

    return pick


def _minimum_holds(tx: Transaction, group: PodGroupState) -> bool:
    held = sum(1 for p in group.live_pods() if _holds(tx, group, p))
    return held + len(group.succeeded) >= group.spec.minMember


def _done(group: PodGroupState, subgroup: str | None) -> int:
    """Members of `subgroup` that ran to completion: they count as held."""
    return sum(1 for p in group.succeeded if p.subgroup == subgroup)


def _holds(tx: Transaction, group: PodGroupState, pod: PodState) -> bool:
    """Bound to a node the snapshot knows, or placed in this transaction."""
    return pod.key in tx.placed or (pod.node is not None and pod.key not in group.unseen)


def _waits(tx: Transaction, pod: PodState) -> bool:
    """Pending and not placed yet; a pod held by another's gate cannot be placed."""
    return pod.node is None and not pod.held and pod.key not in tx.placed


def _pending(tx: Transaction, group: PodGroupState) -> list[PodState]:
    return [p for p in group.live_pods() if _waits(tx, p)]


def build_tree(tx: Transaction, group: PodGroupState, pick: Pick) -> PodSet:
    """The group as a tree of pod sets, each with the pods `pick` chooses for it."""
    spec = group.spec
    live = group.live_pods()
    known = {s.name for s in spec.subGroups}
    subsets = [_subset(tx, group, s, live, pick) for s in spec.subGroups if s.parent is None]
    ungrouped = [p for p in live if p.subgroup not in known]
    held = sum(_holds(tx, group, p) for p in live) + len(group.succeeded)
    short = spec.minMember - held - _missing_total(tx, group, live)
    root = _set(tx, group, None, ungrouped, (max(short, 0), spec.topologyConstraint), pick)
    root.children = subsets
    root.anchors = [_node_of(tx, p) for p in live if _holds(tx, group, p)]
    root.needed = len(subsets) if spec.minSubGroup is None else spec.minSubGroup
    if pick is not _minimum:
        root.needed = sum(1 for child in subsets if child.members())
        root.children = [child for child in subsets if child.members()]
    return root


def _subset(
    tx: Transaction, group: PodGroupState, sub: SubGroup, live: tuple[PodState, ...], pick: Pick
) -> PodSet:
    own = [p for p in live if p.subgroup == sub.name]
    held = sum(_holds(tx, group, p) for p in own) + _done(group, sub.name)
    missing = max(sub.minMember - held, 0)
    pod_set = _set(tx, group, sub.name, own, (missing, sub.topologyConstraint), pick)
    children = [c for c in group.spec.subGroups if c.parent == sub.name]
    pod_set.children = [_subset(tx, group, c, live, pick) for c in children]
    if pick is not _minimum:
        pod_set.children = [child for child in pod_set.children if child.members()]
    pod_set.needed = len(pod_set.children)
    return pod_set


def _set(
    tx: Transaction,
    group: PodGroupState,
    name: str | None,
    own: list[PodState],
    needs: tuple[int, TopologyConstraint | None],
    pick: Pick,
) -> PodSet:
    """One set: its pending pods as `pick` chooses them, and where its members are;
    `needs` is how many members it misses and its topology constraint."""
    missing, constraint = needs
    pending = [p for p in own if _waits(tx, p)]
    anchors = [_node_of(tx, p) for p in own if _holds(tx, group, p)]
    waiting = ""
    if pick is _minimum and len(pending) < missing:
        waiting = f"waiting for pods: {len(pending)} pending, {missing} needed for the minimum"
    chosen = pick(name, pending, missing)
    return PodSet(name, chosen, constraint, anchors=anchors, waiting=waiting)


def _node_of(tx: Transaction, pod: PodState) -> int:
    """The row of a holding member's node (`_holds`: placed, or on a known node)."""
    if pod.key in tx.placed:
        return tx.placed[pod.key].node
    return tx.snapshot.node_index[pod.node or ""]


def _missing_total(tx: Transaction, group: PodGroupState, live: tuple[PodState, ...]) -> int:
    """What the subgroups' own minimums still miss (counted towards the group's minMember)."""
    total = 0
    for sub in group.spec.subGroups:
        held = sum(_holds(tx, group, p) for p in live if p.subgroup == sub.name)
        total += max(sub.minMember - held - _done(group, sub.name), 0)
    return total
