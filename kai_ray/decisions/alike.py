"""Waiting gangs judged alike: the one key of what an attempt for a waiting gang reads of it.

Every action that tries a waiting gang (allocate's minimum, consolidation's
moves, reclaim's victim search) reads the cycle's state and, of the gang: its
queue and namespace (admission), the minimum it misses (`missing_requests`),
its priority and whether it is preemptible (admission, the victims it may
take), and what placement reads of it as `booking.placeable` shows it
(`equivalence.signature`). `alike_key` gives all of that as one hashable
value, so an action that judged one gang at a state (the transaction's and
the ledger's versions, and whatever else it reads) knows the answer for every
gang with an equal key at that state, with one dictionary look-up instead of
the attempt's first tests. With a deep backlog most waiting gangs share their
key with others (a few shapes per queue), and most are judged while nothing
changes. The part read from the group's state alone is kept from cycle to
cycle (`kept.KeptPerGroup`) with its hash. None for a gang placement has no
signature for (subgroups, nominated nodes, a member bound): such a gang is
always tried. Pure: no I/O.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence

from kai_ray.decisions.admission import is_preemptible
from kai_ray.decisions.booking import placeable
from kai_ray.decisions.context import CycleContext
from kai_ray.decisions.kept import PER_GROUP, kept_per_group
from kai_ray.decisions.ordering import Candidate, group_priority
from kai_ray.decisions.placement.equivalence import Signature, plain_signature, signature
from kai_ray.decisions.placement.inter_pod import in_play
from kai_ray.decisions.transaction import MemoKey, Transaction
from kai_ray.state.groups import PodGroupState

#: Per group state: its `alike_key` when the state alone gives it (None: it does not).
_KEPT = MemoKey[Signature | None]("what an attempt reads of a waiting gang")
#: By group key: the group's state and its key when the state alone gave it, kept from
#: cycle to cycle with the groups (`KeptPerGroup.flat`), under the queues with typed
#: limits; None for a cycle with inter-pod terms in play.
_KEYS = MemoKey[Signature]("alike keys")
_THIS_CYCLE = MemoKey[tuple[dict[str, tuple[PodGroupState, Signature]] | None]](
    "alike keys this cycle"
)


def alike_key(ctx: CycleContext, group: PodGroupState) -> Hashable | None:
    """What an attempt for the waiting `group` reads of it (see the module), or None
    when placement has no signature for it."""
    return _key(ctx, _this_cycle(ctx), group)


def alike_keys(ctx: CycleContext) -> Callable[[PodGroupState], Hashable | None]:
    """`alike_key` for the many gangs of one walk, the keys kept for the cycle
    looked up once for the walk rather than once per gang; a gang whose key is kept
    for its very state, no member of it placed this cycle, is answered by the look-up
    alone (as `_key` answers it)."""
    keys = _this_cycle(ctx)
    if keys is None:
        return functools.partial(_key, ctx, None)
    placed_pending = ctx.transaction.placed_pending

    def key_of(group: PodGroupState) -> Hashable | None:
        found = keys.get(group.key)
        if found is not None and found[0] is group and not placed_pending(group.key):
            return found[1]
        return _key(ctx, keys, group)

    return key_of


def kinds_of(ctx: CycleContext) -> Callable[[Sequence[PodGroupState]], list[Hashable | None]]:
    """`alike_key` of many gangs at once, in order, for the walks over the whole
    backlog that judging does not change (allocate's rest, reclaim's judged
    kinds): every gang whose key is kept for its very state, no member of it
    placed this cycle, is answered inside one comprehension, without a call per
    gang; the others as `_key` answers them, in their order. The same keys as
    `alike_keys` gives one by one while the state does not move."""
    keys = _this_cycle(ctx)
    if keys is None:
        return lambda groups: [_key(ctx, None, group) for group in groups]
    placed = ctx.transaction.groups_placed_pending

    def of(groups: Sequence[PodGroupState]) -> list[Hashable | None]:
        return [
            found[1]
            if (found := keys.get(group.key)) is not None
            and found[0] is group
            and group.key not in placed
            else _key(ctx, keys, group)
            for group in groups
        ]

    return of


#: How many gangs a walk reads the kinds of at once (`with_kinds`): a walk that stops
#: early has read at most this many ahead.
WALK_CHUNK = 256


def with_kinds(
    ctx: CycleContext, candidates: Iterable[Candidate]
) -> Iterator[tuple[Candidate, Hashable | None]]:
    """Each candidate with its gang's `alike_key`, the keys read a chunk at a time
    (`kinds_of`), for a walk that does not move the state (judging changes nothing)
    and may stop at any job."""
    of, jobs = kinds_of(ctx), iter(candidates)
    while chunk := list(itertools.islice(jobs, WALK_CHUNK)):
        yield from zip(chunk, of([candidate.group for candidate in chunk]), strict=True)


def _key(
    ctx: CycleContext,
    keys: dict[str, tuple[PodGroupState, Signature]] | None,
    group: PodGroupState,
) -> Hashable | None:
    """`alike_key`, with the keys kept for this cycle (`_this_cycle`) given."""
    tx = ctx.transaction
    if tx.placed_pending(group.key):
        return None  # placement's signature has none (a member placed this cycle)
    # Three actions ask of every waiting gang each cycle, and the next cycle asks
    # again: a key the state alone gave holds while what decides that path (no
    # inter-pod terms in play, no typed limit on the queue) does, so it is read once.
    if keys is not None:
        found = keys.get(group.key)
        if found is not None and found[0] is group:
            return found[1]
        if not ctx.snapshot.queues.typed_names(group.queue):
            build = lambda: _alone(tx, group)  # noqa: E731
            kept = kept_per_group(tx.memo, _KEPT, None, group, build, intern=True)
            if kept is not None:
                keys[group.key] = (group, kept)
                return kept
    # Read afresh: inter-pod terms, per-GPU-type limits or devices claimed.
    placement = signature(tx, placeable(ctx, group))
    return None if placement is None else Signature((_job(group), placement))


def _alone(tx: Transaction, group: PodGroupState) -> Signature | None:
    """The key when the group's state alone gives it: a plain gang claiming no devices
    (no inter-pod rules in play and no per-GPU-type limit: checked by the caller)."""
    plain = plain_signature(group, tx)
    if plain is None or plain.claims:
        return None
    return Signature((_job(group), plain))


def _job(group: PodGroupState) -> tuple[object, ...]:
    priority = group_priority(group)
    preemptible = is_preemptible(group, priority)
    return (group.queue, group.namespace, group.missing_requests, priority, preemptible)


def _this_cycle(ctx: CycleContext) -> dict[str, tuple[PodGroupState, Signature]] | None:
    """The keys kept (`_KEYS`) for this cycle, None when inter-pod terms are in play."""
    tx = ctx.transaction
    found = tx.memo.find(_THIS_CYCLE, None)
    if found is None:
        keys = None
        if not in_play(tx):
            tree = ctx.snapshot.queues
            typed = frozenset(leaf for leaf in tree.leaves() if tree.typed_names(leaf))
            kept = tx.memo.find(PER_GROUP, None)
            keys = {} if kept is None else kept.flat(_KEYS, typed)
        found = (keys,)
        tx.memo.keep(_THIS_CYCLE, None, found)
    return found[0]
