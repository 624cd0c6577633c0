"""The one key of what an attempt reads of a waiting gang (`alike.alike_key`).

Gangs alike in everything an attempt reads share a key (the very same object
while the group states are kept from cycle to cycle); a difference in any part
an attempt reads gives another key; a gang placement has no signature for has
none. That the actions' shortcuts on these keys plan what the plain path plans
is `test_equivalence.py`'s business."""

from __future__ import annotations

from collections.abc import Hashable

import pytest

from kai_ray.decisions import alike, allocate
from kai_ray.decisions.alike import alike_key, alike_keys, kinds_of, with_kinds
from kai_ray.decisions.allocate import AllocateAction
from kai_ray.decisions.context import ActionRegistry, CycleContext
from kai_ray.decisions.cycle import run_cycle
from kai_ray.decisions.kept import KeptPerGroup
from kai_ray.decisions.ordering import candidate_for
from kai_ray.decisions.totals import GroupTotals
from kai_ray.decisions.transaction import MemoKey
from kai_ray.state.cache import NODE, POD, POD_GROUP, QUEUE, ClusterCache
from kai_ray.values.config import SchedulerConfig
from tests.builders import make_node, make_pod, make_pod_group, make_queue

SCHEDULER = "kai-ray"


class _Probe:
    """Stands in for allocate: notes every waiting gang's key."""

    name = "allocate"

    def __init__(self) -> None:
        self.keys: dict[str, Hashable | None] = {}

    def run(self, ctx: CycleContext) -> None:
        key_of = alike_keys(ctx)  # made before any key is kept this cycle
        self.keys = {g.key: alike_key(ctx, g) for g in ctx.snapshot.waiting_groups}
        # the walks' look-up gives the very keys, kept or not
        assert {g.key: key_of(g) for g in ctx.snapshot.waiting_groups} == self.keys


def _gang(
    cache: ClusterCache,
    name: str,
    namespace: str = "default",
    queue: str = "team-a",
    gpus: int = 8,
    size: int = 2,
    priority_class: str | None = None,
    subgroup: bool = False,
) -> None:
    group = make_pod_group(name, namespace).queue(queue).min_member(size)
    if priority_class is not None:
        group.priority_class(priority_class)
    if subgroup:
        group.subgroup("workers", min_member=size)
    cache.upsert(group.build(), POD_GROUP)
    for i in range(size):
        pod = make_pod(f"{name}-{i}", namespace).group(name).gpus(gpus).scheduler(SCHEDULER)
        if subgroup:
            pod.subgroup("workers")
        cache.upsert(pod.build(), POD)


def _keys(cache: ClusterCache, totals: GroupTotals) -> dict[str, Hashable | None]:
    probe = _Probe()
    registry = ActionRegistry()
    registry.register(probe)
    config = SchedulerConfig.model_validate({"spec": {"actions": ["allocate"]}})
    run_cycle(cache.snapshot(), config, 1, 0.0, registry=registry, totals=totals)
    return probe.keys


def test_gangs_alike_share_one_key_and_any_difference_an_attempt_reads_parts_them() -> None:
    cache = ClusterCache(SCHEDULER)
    for queue in ("team-a", "team-b"):
        cache.upsert(make_queue(queue).build(), QUEUE)
    cache.upsert(make_node("n0").gpus(8).build(), NODE)
    _gang(cache, "a")
    _gang(cache, "b")
    _gang(cache, "other-queue", queue="team-b")
    _gang(cache, "other-namespace", namespace="research")
    _gang(cache, "other-shape", gpus=4)
    _gang(cache, "other-size", size=3)
    _gang(cache, "other-priority", priority_class="inference")
    _gang(cache, "with-subgroups", subgroup=True)
    totals = GroupTotals()
    keys = _keys(cache, totals)
    a, b = keys["default/a"], keys["default/b"]
    assert a is not None and a == b
    assert a is b  # interned: equal keys of two groups are one object
    assert keys["default/with-subgroups"] is None
    others = [k for name, k in keys.items() if "other" in name]
    assert len(others) == 5 and None not in others
    assert len({a, *others}) == 6
    again = _keys(cache, totals)
    assert again["default/a"] is a  # kept from cycle to cycle for the same state


def test_interned_values_start_afresh_past_their_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    cache = ClusterCache(SCHEDULER)
    cache.upsert(make_queue("team-a").build(), QUEUE)
    for name in ("a", "b", "c"):
        _gang(cache, name)
    groups = cache.snapshot().pod_groups
    kept = KeptPerGroup()
    monkeypatch.setattr(KeptPerGroup, "INTERNED_AT_MOST", 2)
    slot = MemoKey[tuple[str, ...]]("a key")

    def made(text: str) -> tuple[str, ...]:
        return tuple(text.split())  # a new object each time

    first = kept.get(slot, None, groups["default/a"], lambda: made("key 1"), intern=True)
    second = kept.get(slot, None, groups["default/b"], lambda: made("key 1"), intern=True)
    assert second == first and second is first
    kept.get(slot, None, groups["default/c"], lambda: made("other 2"), intern=True)
    kept.drop("default/c")
    # the table holds two values: a third starts it afresh, so "key 1" is new again
    kept.get(slot, None, groups["default/c"], lambda: made("third 3"), intern=True)
    kept.drop("default/b")
    fresh = made("key 1")
    assert kept.get(slot, None, groups["default/b"], lambda: fresh, intern=True) is fresh
    assert kept.get(slot, None, groups["default/b"], lambda: made("x"), intern=True) is fresh


def test_a_gang_of_no_kind_behind_a_deep_backlog_waits_as_its_turn_would_say(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Twelve alike gangs that do not fit, then one with subgroups (no kind): once
    the walk has met enough repeats the rest of the backlog is stated at once, the
    gang of no kind judged on its own, out of turn, with the very reasons the walk
    in turn gives every gang."""
    cache = ClusterCache(SCHEDULER)
    cache.upsert(make_queue("team-a").build(), QUEUE)
    cache.upsert(make_node("n0").gpus(8).build(), NODE)
    for i in range(12):
        _gang(cache, f"a{i:02}")
    _gang(cache, "with-subgroups", gpus=4, size=3, subgroup=True)
    config = SchedulerConfig.model_validate({"spec": {"actions": ["allocate"]}})
    judged: list[str] = []
    alone = allocate._Allocation.alone_waits

    def spied(allocation: allocate._Allocation, candidate: allocate.Candidate) -> str | None:
        judged.append(candidate.group.key)
        return alone(allocation, candidate)

    def statuses() -> dict[str, tuple[bool, str]]:
        plan = run_cycle(cache.snapshot(), config, 1, 0.0).plan
        return {s.group: (s.admitted, s.reason) for s in plan.statuses}

    monkeypatch.setattr(allocate._Allocation, "alone_waits", spied)
    stated = statuses()
    assert judged == ["default/with-subgroups"]
    assert not stated["default/with-subgroups"][0] and stated["default/with-subgroups"][1]
    monkeypatch.setattr(allocate._Allocation, "rest_wait", lambda *_: False)
    assert statuses() == stated


class _WalkProbe:
    """Runs after allocate: the keys of every waiting gang read many at once
    (`kinds_of`, `with_kinds`), before and after they are kept, against
    `alike_key` one by one."""

    name = "reclaim"

    def __init__(self) -> None:
        self.keys: list[Hashable | None] = []
        self.placed: list[str] = []

    def run(self, ctx: CycleContext) -> None:
        groups = list(ctx.snapshot.waiting_groups)
        self.placed = [g.key for g in groups if ctx.transaction.placed_pending(g.key)]
        at_once = kinds_of(ctx)(groups)  # the first reading of the cycle, nothing kept
        one_by_one = [alike_key(ctx, group) for group in groups]
        assert at_once == one_by_one
        assert kinds_of(ctx)(groups) == one_by_one  # kept now
        walked = list(with_kinds(ctx, [candidate_for(group) for group in groups]))
        assert [candidate.group for candidate, _ in walked] == groups
        assert [kind for _, kind in walked] == one_by_one
        self.keys = one_by_one


def test_kinds_read_many_at_once_are_the_keys_one_by_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """Gangs alike and not, one of no kind, one of a queue with a per-GPU-type limit
    (read afresh), and gangs allocate placed this cycle (no key), walked in chunks of
    two, in two cycles (the keys then kept from the first)."""
    monkeypatch.setattr(alike, "WALK_CHUNK", 2)
    cache = ClusterCache(SCHEDULER)
    cache.upsert(make_queue("team-a").build(), QUEUE)
    typed = make_queue("typed").gpu(limit=64).resource("nvidia.com/gpu.product=H100", limit=16)
    cache.upsert(typed.build(), QUEUE)
    node = make_node("n0").gpus(8).label("nvidia.com/gpu.product", "H100")
    cache.upsert(node.build(), NODE)
    _gang(cache, "fits", gpus=4, size=1)  # placed by allocate: no key after it
    for i in range(5):
        _gang(cache, f"a{i}")
    _gang(cache, "other-shape", gpus=2, size=5)
    _gang(cache, "with-subgroups", subgroup=True)
    _gang(cache, "typed-1", queue="typed")
    _gang(cache, "typed-2", queue="typed")
    registry = ActionRegistry()
    registry.register(AllocateAction())
    probe = _WalkProbe()
    registry.register(probe)
    config = SchedulerConfig.model_validate({"spec": {"actions": ["allocate", "reclaim"]}})
    totals = GroupTotals()
    for cycle in (1, 2, 3):
        if cycle == 3:  # a gang asks for another shape: its kept key is not its key
            for i in range(2):
                pod = make_pod(f"a1-{i}").group("a1").gpus(16).scheduler(SCHEDULER)
                cache.upsert(pod.build(), POD)
        run_cycle(cache.snapshot(), config, cycle, 0.0, registry=registry, totals=totals)
        assert probe.placed == ["default/fits"]
        keys = dict(zip([g.key for g in cache.snapshot().waiting_groups], probe.keys, strict=True))
        assert keys["default/fits"] is None
        assert keys["default/with-subgroups"] is None
        assert keys["default/a0"] is not None and keys["default/a0"] == keys["default/a4"]
        assert (
            keys["default/typed-1"] is not None
            and keys["default/typed-1"] == keys["default/typed-2"]
        )
        assert len({keys["default/a0"], keys["default/other-shape"], keys["default/typed-1"]}) == 3
        assert (keys["default/a1"] == keys["default/a0"]) is (cycle < 3)
