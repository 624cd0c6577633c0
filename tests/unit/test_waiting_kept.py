"""What the waiting gangs ask and their candidates in queue order, followed from
tuple to tuple of waiting groups (`decisions/waiting.py`), are what working them
out afresh gives, on random sequences of backlogs: gangs that come, go, change
(request, priority, queue, creation, a member being deleted) or stay the very
same object."""

from __future__ import annotations

import copy
import heapq
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kai_ray.decisions import waiting
from kai_ray.decisions.ordering import Candidate, candidate_for, job_key, releasing_members
from kai_ray.decisions.waiting import WaitingAsks, WaitingCandidates, ask_of
from kai_ray.state.cache import NODE, POD, POD_GROUP, QUEUE, ClusterCache
from kai_ray.state.groups import PodGroupState
from kai_ray.state.snapshot import ClusterObjects, build_snapshot, changed_keys
from tests.builders import make_node, make_pod, make_pod_group, make_queue

GROUPS = 10
#: How each variant of a group differs: (queue, GPUs per pod, priority class,
#: creation second, namespace, a bound member being deleted).
VARIANTS: tuple[tuple[str, int, str | None, int, str, bool], ...] = (
    ("team-a", 1, None, 10, "ml", False),
    ("team-a", 2, None, 10, "ml", False),
    ("team-a", 1, "inference", 10, "ml", False),
    ("team-b", 1, None, 10, "ml", False),
    ("team-a", 1, None, 5, "other", False),
    ("team-a", 1, None, 10, "ml", True),
)


def _variant_objects(variant: int) -> list[dict[str, Any]]:
    queue, gpus, priority, created, namespace, releasing = VARIANTS[variant]
    objects: list[dict[str, Any]] = []
    for i in range(GROUPS):
        group = (
            make_pod_group(f"g{i}", namespace).queue(queue).min_member(3).created(created + i % 3)
        )
        if priority is not None:
            group = group.priority_class(priority)
        objects.append(group.build())
        for p in range(2):
            pod = make_pod(f"g{i}-p{p}", namespace).group(f"g{i}").gpus(gpus).created(created)
            objects.append(pod.build())
        if releasing:
            bound = make_pod(f"g{i}-b", namespace).group(f"g{i}").gpus(gpus).on("n0")
            objects.append(bound.set("metadata.deletionTimestamp", "2026-01-01T00:00:00Z").build())
    return objects


def _pool() -> dict[tuple[int, int], PodGroupState]:
    """Every (group, variant) as a waiting group state of its own."""
    pool: dict[tuple[int, int], PodGroupState] = {}
    queues = [make_queue(q).gpu(quota=8).build() for q in ("team-a", "team-b")]
    node = make_node("n0").gpus(8).build()
    for variant in range(len(VARIANTS)):
        objects = _variant_objects(variant)
        snapshot = build_snapshot(
            ClusterObjects(
                nodes=[node],
                pods=[o for o in objects if o["kind"] == "Pod"],
                pod_groups=[o for o in objects if o["kind"] == "PodGroup"],
                queues=queues,
            )
        )
        by_name = {group.name: group for group in snapshot.waiting_groups}
        for i in range(GROUPS):
            pool[(i, variant)] = by_name[f"g{i}"]
    return pool


POOL = _pool()

backlog = st.dictionaries(
    st.integers(0, GROUPS - 1), st.integers(0, len(VARIANTS) - 1), max_size=GROUPS
)
#: One change to a backlog: a group comes or changes to a variant (a variant), or goes (None).
edit = st.tuples(st.integers(0, GROUPS - 1), st.none() | st.integers(0, len(VARIANTS) - 1))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    start=backlog,
    edits=st.lists(st.lists(edit, max_size=3), min_size=1, max_size=10),
    afresh_from=st.sampled_from([waiting.AFRESH_FROM, 2.0]),
    order=st.randoms(use_true_random=False),
)
def test_followed_candidates_and_asks_are_what_afresh_gives(
    start: dict[int, int],
    edits: list[list[tuple[int, int | None]]],
    afresh_from: float,
    order: Any,
) -> None:
    """Each step is the last backlog with a few edits, in a shuffled order (the
    cache's tuple follows its own order); `afresh_from` 2.0 never starts afresh."""
    kept = waiting.AFRESH_FROM
    waiting.AFRESH_FROM = afresh_from
    try:
        candidates, asks = WaitingCandidates(), WaitingAsks()
        current = dict(start)
        for step in [[], *edits]:
            for group, variant in step:
                if variant is None:
                    current.pop(group, None)
                else:
                    current[group] = variant
            picks = list(current.items())
            order.shuffle(picks)
            _check(candidates, asks, tuple(POOL[pick] for pick in picks))
    finally:
        waiting.AFRESH_FROM = kept


def _sorted(backlog: tuple[PodGroupState, ...]) -> dict[str, list[Candidate]]:
    """Each queue's candidates sorted afresh."""
    by_queue: dict[str, list[Candidate]] = {}
    for group in backlog:
        if not releasing_members(group):
            by_queue.setdefault(group.queue, []).append(candidate_for(group))
    return {queue: sorted(jobs, key=job_key) for queue, jobs in by_queue.items()}


def _check(
    candidates: WaitingCandidates, asks: WaitingAsks, backlog: tuple[PodGroupState, ...]
) -> None:
    candidates.follow(backlog)
    asks.follow(backlog)
    _as_afresh(candidates, asks, backlog)


def _as_afresh(
    candidates: WaitingCandidates, asks: WaitingAsks, backlog: tuple[PodGroupState, ...]
) -> None:
    fresh = _sorted(backlog)
    assert candidates.in_turn == list(heapq.merge(*fresh.values(), key=job_key))
    assert {q: [c.group for c in jobs] for q, jobs in candidates.by_queue.items()} == {
        q: [c.group for c in jobs] for q, jobs in fresh.items()
    }
    assert {q: list(jobs) for q, jobs in candidates.by_queue.items()} == fresh
    followed = {(a.queue, a.namespace, a.request, a.priority, a.preemptible) for a in asks.asks}
    assert followed == {ask_of(group) for group in backlog}
    assert len(asks.asks) == len(followed)
    for ask in asks.asks:
        assert (ask.group.queue, ask.group.namespace) == (ask.queue, ask.namespace)


def test_the_pool_has_what_the_sequences_need() -> None:
    """Each variant differs from the first in what it is meant to (else the property
    above would follow fewer kinds of change than it claims)."""
    first = POOL[(0, 0)]
    keys = {ask_of(POOL[(0, v)]) for v in range(len(VARIANTS))}
    assert len(keys) == len(VARIANTS) - 1  # the releasing variant asks what the first does
    assert POOL[(0, 5)].bound and not POOL[(0, 0)].bound
    assert [c.group for c in _sorted((POOL[(0, 5)],)).get("team-a", [])] == []
    assert POOL[(1, 0)].creation_timestamp != first.creation_timestamp


#: A cache's events on six gangs of two queues: a pending member comes (GPUs), a
#: member is bound to the node, a member goes, the PodGroup is made again with
#: another minimum, queue or priority class, or goes; or nothing happens.
CACHE_EVENTS = st.one_of(
    st.tuples(st.just("pending"), st.integers(0, 5), st.integers(0, 2), st.sampled_from((1, 2))),
    st.tuples(st.just("bind"), st.integers(0, 5), st.integers(0, 2)),
    st.tuples(st.just("delete pod"), st.integers(0, 5), st.integers(0, 2)),
    st.tuples(
        st.just("group"),
        st.integers(0, 5),
        st.integers(1, 3),
        st.sampled_from(("team-a", "team-b")),
        st.sampled_from((None, "inference")),
    ),
    st.tuples(st.just("delete group"), st.integers(0, 5)),
    st.tuples(st.just("nothing")),
)


def _cache() -> ClusterCache:
    cache = ClusterCache()
    for name in ("team-a", "team-b"):
        cache.upsert(make_queue(name).gpu(quota=8).build(), QUEUE)
    cache.upsert(make_node("n0").gpus(64).build(), NODE)
    for index in range(6):
        group = make_pod_group(f"g{index}", "ml").queue("team-a").min_member(2)
        cache.upsert(group.created(index).build(), POD_GROUP)
    return cache


def _apply(cache: ClusterCache, event: tuple[Any, ...]) -> None:
    kind, *args = event
    if kind == "pending":
        group, member, gpus = args
        pod = make_pod(f"g{group}-{member}", "ml").group(f"g{group}").gpus(gpus)
        cache.upsert(pod.created(group).build(), POD)
    elif kind == "bind":
        found = cache.get(POD, f"ml/g{args[0]}-{args[1]}")
        if found is not None:
            found = copy.deepcopy(found)
            found["spec"]["nodeName"] = "n0"
            found["status"] = {"phase": "Running"}
            cache.upsert(found, POD)
    elif kind == "delete pod":
        cache.delete(POD, f"ml/g{args[0]}-{args[1]}")
    elif kind == "group":
        index, minimum, queue, priority = args
        group = make_pod_group(f"g{index}", "ml").queue(queue).min_member(minimum)
        if priority is not None:
            group = group.priority_class(priority)
        cache.upsert(group.created(index).build(), POD_GROUP)
    elif kind == "delete group":
        cache.delete(POD_GROUP, f"ml/g{args[0]}")


def test_followed_by_what_the_snapshot_says_changed_they_are_what_afresh_gives() -> None:
    """A cache's events; after each, followers given the kept snapshot's groups and
    what changed among them (`Snapshot.groups_changed`) look at the changed groups
    alone, and must hold what sorting the waiting groups afresh gives; a snapshot
    whose tuple of waiting groups is the one followed last only tells them its
    groups (`same`), as `KeptForWaiting` does. Snapshots not shown to them (False)
    make the next one span more than its change says: they compare every waiting
    group then; shown every snapshot, they never do."""
    #: Per follow that looked at changed keys alone: how many of them were waiting
    #: groups seen before (changed or gone since).
    keyed: list[int] = []

    @settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.lists(st.tuples(CACHE_EVENTS, st.booleans()), min_size=1, max_size=40))
    def followed(steps: list[tuple[tuple[Any, ...], bool]]) -> None:
        cache = _cache()
        candidates, asks = WaitingCandidates(), WaitingAsks()
        last: tuple[PodGroupState, ...] | None = None
        shown_before = False  # the snapshot before this one was shown to them
        for event, shown in steps:
            _apply(cache, event)
            snapshot = cache.snapshot()
            if not shown:
                shown_before = False
                continue
            groups, changed = snapshot.pod_groups, snapshot.groups_changed
            keys = changed_keys(candidates.seen.groups, groups, changed)
            # Told every snapshot (followed, or told its groups when its waiting tuple
            # was the one followed), they read each change the snapshot names.
            assert keys is not None or not shown_before
            shown_before = True
            if keys:
                keyed.append(sum(key in candidates.seen.by_key for key in keys))
            for follower in (candidates, asks):
                # As `KeptForWaiting` does: the very tuple followed last is not followed.
                if snapshot.waiting_groups is last:
                    follower.same(groups)
                else:
                    follower.follow(snapshot.waiting_groups, groups, changed)
            last = snapshot.waiting_groups
            _as_afresh(candidates, asks, snapshot.waiting_groups)
            assert candidates.seen.by_key == {g.key: g for g in snapshot.waiting_groups}

    followed()
    assert any(keyed), "no follow met a waiting group seen before among the changed keys"
