"""What changed between two kept snapshots: `Snapshot.pods_changed` and
`groups_changed` (`keeping.Ordered`), which followers of every pod or group read
to pay for the changes only (`snapshot.differences`)."""

from __future__ import annotations

from kai_ray.state.cache import POD, POD_GROUP
from kai_ray.state.keeping import Ordered
from kai_ray.state.snapshot import Changed, changed_keys, differences
from tests.builders import make_pod, make_pod_group
from tests.unit.test_incremental_snapshot import SCHEDULER, started

PLACES = {"a": 0, "b": 1, "c": 2, "d": 3}


def ordered() -> Ordered:
    return Ordered(lambda key: PLACES.get(key, -1))


def test_publishing_with_nothing_changed_gives_the_same_mapping() -> None:
    kept = ordered()
    kept.set("a", 1)
    first = kept.published()
    assert kept.changed is None  # nothing published before: unknown
    assert kept.published() is first
    assert kept.changed == Changed(first, first, ())


def test_the_keys_set_or_popped_since_the_last_publishing_in_place_order() -> None:
    kept = ordered()
    for key in "abc":
        kept.set(key, key)
    first = kept.published()
    kept.set("d", "d")
    kept.pop("a")
    kept.set("b", "B")
    second = kept.published()
    assert dict(first) == {"a": "a", "b": "b", "c": "c"}  # a published mapping never changes
    assert kept.changed == Changed(first, second, ("a", "b", "d"))


def test_a_key_put_back_is_in_place_order_and_named() -> None:
    kept = ordered()
    for key in "abc":
        kept.set(key, key)
    first = kept.published()
    kept.pop("a")
    kept.set("a", "A")  # inserted last, then put back in its place
    second = kept.published()
    assert list(second) == ["a", "b", "c"]
    assert kept.changed == Changed(first, second, ("a",))


def test_changed_keys_only_for_the_two_mappings_they_span() -> None:
    kept = ordered()
    kept.set("a", 1)
    first = kept.published()
    kept.set("b", 2)
    second = kept.published()
    changed = kept.changed
    assert changed_keys(first, second, changed) == ("b",)
    assert changed_keys(second, second, changed) == ()
    assert changed_keys(None, second, changed) is None  # a follower that saw nothing
    assert changed_keys({}, second, changed) is None  # one that saw another mapping


def test_differences_are_those_of_comparing_every_entry() -> None:
    kept = ordered()
    for key in "abc":
        kept.set(key, [key])
    first = kept.published()
    kept.pop("b")
    kept.set("c", ["C"])
    kept.set("d", ["d"])
    second = kept.published()
    told = differences(first, second, kept.changed)
    walked = differences(first, second, None)
    assert told == walked == (["b"], [("c", ["C"]), ("d", ["d"])])


def test_the_cache_says_which_pods_and_groups_changed() -> None:
    cache, _ = started()
    cache.upsert(make_pod_group("g", "ns").queue("team-a").build(), POD_GROUP)
    cache.upsert(make_pod("p1", "ns").group("g").scheduler(SCHEDULER).gpus(1).build(), POD)
    first = cache.snapshot()
    cache.upsert(make_pod("p2", "ns").group("g").scheduler(SCHEDULER).gpus(1).build(), POD)
    second = cache.snapshot()
    assert changed_keys(first.pods, second.pods, second.pods_changed) == ("ns/p2",)
    assert changed_keys(first.pod_groups, second.pod_groups, second.groups_changed) == ("ns/g",)
    cache.delete(POD, "ns/p1")
    third = cache.snapshot()
    assert changed_keys(second.pods, third.pods, third.pods_changed) == ("ns/p1",)
