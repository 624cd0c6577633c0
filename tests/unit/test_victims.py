"""Victim selection as pure functions: units, their order, and the greedy per-node choice."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kai_ray.decisions.victims import (
    Budget,
    FoundOptions,
    KeptOptions,
    Need,
    VictimUnit,
    select_victims,
    unit_order,
    victim_units,
)
from kai_ray.state.groups import PodGroupState
from kai_ray.state.pod_states import PodState
from kai_ray.state.snapshot import ClusterObjects, build_snapshot
from tests.builders import make_node, make_pod, make_pod_group, make_queue

GPU_COLUMN = 2


def groups(*specs: tuple[str, int, int, list[str], int]) -> dict[str, PodGroupState]:
    """(name, minMember, GPUs per pod, nodes of its pods, created) per group; 4 nodes x 8 GPUs."""
    pods, pgs = [], []
    for name, minimum, gpus, nodes, created in specs:
        pgs.append(make_pod_group(name).queue("q").min_member(minimum).created(created).build())
        for i, node in enumerate(nodes):
            pod = make_pod(f"{name}-{i}").group(name).gpus(gpus).on(node).created(created + i)
            pods.append(pod.phase("Running").build())
    objects = ClusterObjects(
        nodes=[make_node(f"n{i}").gpus(8).build() for i in range(4)],
        queues=[make_queue("q").build()],
        pod_groups=pgs,
        pods=pods,
    )
    snapshot = build_snapshot(objects)
    return {g.name: g for g in snapshot.pod_groups.values()}


def _free_of(
    found: Iterable[PodGroupState],
) -> tuple[np.ndarray, Callable[[PodState], np.ndarray], Callable[[PodState], int]]:
    """The four 8-GPU nodes' free rows with the groups' pods on them, a pod's vector
    and a pod's node (`n<i>` is row i)."""
    free = np.zeros((4, 4))
    free[:, GPU_COLUMN] = 8.0
    for group in found:
        for pod in group.pods:
            free[int((pod.node or "n0")[1:]), GPU_COLUMN] -= pod.requests["nvidia.com/gpu"]
    return free, _vector_of, _node_of


def _vector_of(pod: PodState) -> np.ndarray:
    return np.array([0.0, 0.0, pod.requests["nvidia.com/gpu"], 0.0])


def _node_of(pod: PodState) -> int:
    return int((pod.node or "n0")[1:])


def units_of(found: dict[str, PodGroupState], priority: int = 50) -> list[VictimUnit]:
    return [u for g in found.values() for u in victim_units(g, priority, g.creation_timestamp)]


def test_elastic_members_above_the_minimum_are_units_of_their_own_newest_first() -> None:
    found = groups(("e", 2, 1, ["n0", "n0", "n1", "n1"], 0))
    units = victim_units(found["e"], 50, "")
    assert [[p.name for p in u.pods] for u in units] == [["e-3"], ["e-2"], ["e-0", "e-1"]]
    assert [u.extra for u in units] == [True, True, False]


@pytest.mark.parametrize(
    ("a", "b", "first"),
    [
        pytest.param((1.0, 50, 2), (2.0, 50, 9), 0, id="fewer GPUs first"),
        pytest.param((2.0, 10, 1), (2.0, 50, 9), 0, id="then lower priority"),
        pytest.param((2.0, 50, 1), (2.0, 50, 9), 1, id="then the newer by creation time"),
        pytest.param((2.0, 50, 5), (2.0, 50, 5), 0, id="then the name"),
    ],
)
def test_unit_order(a: tuple[float, int, int], b: tuple[float, int, int], first: int) -> None:
    found = groups(("x", 1, int(a[0]), ["n0"], a[2]), ("y", 1, int(b[0]), ["n1"], b[2]))
    # The start times say the opposite of the creation times: creation decides.
    ux = VictimUnit(found["x"], found["x"].pods, a[1], str(10 - a[2]), False)
    uy = VictimUnit(found["y"], found["y"].pods, b[1], str(10 - b[2]), False)
    ranked = sorted([ux, uy], key=unit_order)
    assert ranked[0] is (ux, uy)[first]


def _need(count: int, gpus: float = 8.0) -> Need:
    return Need(np.array([0.0, 0.0, gpus, 0.0]), count, np.ones(4, dtype=bool), GPU_COLUMN)


def _select(
    found: dict[str, PodGroupState], need: Need, budget: Budget | None = None
) -> list[str] | None:
    used = np.zeros((4, 4))
    index = {f"n{i}": i for i in range(4)}
    for group in found.values():
        for pod in group.pods:
            used[index[pod.node or ""], GPU_COLUMN] += pod.requests["nvidia.com/gpu"]
    free = np.zeros((4, 4))
    free[:, GPU_COLUMN] = 8.0
    free -= used
    vector = lambda pod: np.array([0.0, 0.0, pod.requests["nvidia.com/gpu"], 0.0])  # noqa: E731
    chosen = select_victims(
        free, need, units_of(found), vector, lambda p: index[p.node or ""], budget or Budget()
    )
    return None if chosen is None else sorted(u.label() for u in chosen)


def test_the_node_needing_the_fewest_gpus_back_is_freed_and_nothing_more() -> None:
    # n3 is free; n2 needs other's 4 GPUs back, n0 big's 8, n1 small's and other's.
    found = groups(
        ("big", 2, 4, ["n0", "n0"], 0), ("small", 1, 4, ["n1"], 1), ("other", 2, 4, ["n1", "n2"], 2)
    )
    assert _select(found, _need(2)) == ["gang default/other"]


def test_nothing_is_chosen_when_the_job_fits_already() -> None:
    found = groups(("big", 2, 8, ["n0", "n1"], 0))
    assert _select(found, _need(2)) == []


def test_none_when_every_victim_together_is_not_enough() -> None:
    found = groups(("a", 1, 8, ["n0"], 0))
    assert _select(found, _need(5)) is None


class _Refuse(Budget):
    def take(self, units: object) -> bool:
        return False


def test_a_budget_that_refuses_leaves_the_job_waiting() -> None:
    found = groups(
        ("a", 1, 8, ["n0"], 0),
        ("b", 1, 8, ["n1"], 0),
        ("c", 1, 8, ["n2"], 0),
        ("d", 1, 8, ["n3"], 0),
    )
    assert _select(found, _need(1), _Refuse()) is None


def _on_n0(gpus: float) -> Need:
    allowed = np.array([True, False, False, False])
    return Need(np.array([0.0, 0.0, gpus, 0.0]), 1, allowed, GPU_COLUMN)


@pytest.mark.parametrize(
    ("specs", "gpus", "chosen"),
    [
        pytest.param(
            [("big", 1, 4, ["n0"], 0), ("s1", 1, 2, ["n0"], 1), ("s2", 1, 2, ["n0"], 2)],
            4.0,
            ["gang default/big"],
            id="one gang rather than two smaller ones",
        ),
        pytest.param(
            [("a", 1, 4, ["n0"], 0), ("b", 1, 2, ["n0"], 1), ("c", 1, 2, ["n0"], 2)],
            2.0,
            ["gang default/c"],
            id="then the fewest GPUs, then the newest",
        ),
        pytest.param(
            [("e", 1, 2, ["n0", "n0", "n0"], 0), ("g", 1, 2, ["n0"], 1)],
            4.0,
            ["extra pod default/e-1 of default/e", "extra pod default/e-2 of default/e"],
            id="two elastic extras before any whole gang",
        ),
    ],
)
def test_the_least_disruptive_set_on_a_node(
    specs: list[tuple[str, int, int, list[str], int]], gpus: float, chosen: list[str]
) -> None:
    assert _select(groups(*specs), _on_n0(gpus)) == chosen


# ------------------------------------------- the batched choice against a plain one

SPECS = st.lists(
    st.tuples(
        st.integers(1, 3),  # minMember: the pods above it are elastic extras
        st.sampled_from([1, 2, 4]),  # GPUs per pod
        st.lists(st.sampled_from(["n0", "n1", "n2", "n3"]), min_size=1, max_size=5),
        st.integers(0, 5),  # created
        st.sampled_from([10, 50]),  # priority
    ),
    min_size=2,
    max_size=9,
)


def _plain_choice(
    free: np.ndarray, need: Need, units: list[VictimUnit], node: int, fits_now: int, missing: int
) -> tuple[tuple[object, ...], list[VictimUnit], int] | None:
    """One node's option as the rule reads, set by set in plain Python."""
    n = len(units)
    if n <= 10:
        sets = [[bool(code >> k & 1) for k in range(n)] for code in range(1, 1 << n)]
    else:
        sets = [[k <= i for k in range(n)] for i in range(n)]
    cores = {u.group.key for i, u in enumerate(units) if not u.extra}
    for chosen in sets:  # a core takes its group's extras on this node along
        picked = {units[i].group.key for i in range(n) if chosen[i] and not units[i].extra}
        for i, unit in enumerate(units):
            chosen[i] = chosen[i] or (unit.extra and unit.group.key in picked & cores)
    here = [
        sum(p.requests["nvidia.com/gpu"] for p in u.pods if p.node == f"n{node}") for u in units
    ]

    def fits(chosen: list[bool]) -> int:
        room = free[node, GPU_COLUMN] + sum(g for g, c in zip(here, chosen, strict=True) if c)
        return int(np.floor(max(room, 0.0) / need.vector[GPU_COLUMN] + 1e-9))

    best = min(max(fits(c) for c in sets), fits_now + missing)
    if best <= fits_now:
        return None
    age = sorted(range(n), key=lambda i: units[i].among_equals)

    def rank(chosen: list[bool]) -> tuple[object, ...]:
        members = [i for i in range(n) if chosen[i]]
        return (
            sum(not units[i].extra for i in members),
            len(members),
            round(sum(here[i] for i in members), 6),
            max(units[i].priority for i in members),
            max(age.index(i) for i in members),
        )

    chosen = min((c for c in sets if fits(c) >= best), key=rank)
    cores_n, count, gpus, priority, oldest = rank(chosen)
    gain = best - fits_now
    last = units[age[int(oldest)]]
    key = (cores_n / gain, count / gain, gpus / gain, priority, *last.among_equals, node)
    return key, [u for u, c in zip(units, chosen, strict=True) if c], gain


@settings(max_examples=400, deadline=None)
@example(  # fewer GPUs back goes before a lower priority
    specs=[
        (1, 1, ["n0"], 0, 50),
        (1, 2, ["n0"], 1, 10),
        (1, 4, ["n0"], 2, 50),
        (1, 1, ["n0"], 3, 50),
    ],
    gpus=1.0,
    count=1,
    allowed=[True, False, False, False],
)
@given(
    specs=SPECS,
    gpus=st.sampled_from([1.0, 2.0, 4.0, 8.0]),
    count=st.integers(1, 6),
    allowed=st.lists(st.booleans(), min_size=4, max_size=4).filter(any),
)
def test_the_batched_node_choice_is_the_plain_one(
    specs: list[tuple[int, int, list[str], int, int]], gpus: float, count: int, allowed: list[bool]
) -> None:
    """`select_victims` weighs the nodes with as many units together, in arrays; the
    victims it returns are those of weighing each node's sets one by one."""
    found = groups(*((f"g{i}", m, g, nodes, c) for i, (m, g, nodes, c, _) in enumerate(specs)))
    priority = {f"g{i}": spec[4] for i, spec in enumerate(specs)}
    units = [
        u for g in found.values() for u in victim_units(g, priority[g.name], g.creation_timestamp)
    ]
    used = np.zeros((4, 4))
    for group in found.values():
        for pod in group.pods:
            used[int((pod.node or "n0")[1:]), GPU_COLUMN] += pod.requests["nvidia.com/gpu"]
    free = np.zeros((4, 4))
    free[:, GPU_COLUMN] = 8.0
    free -= used
    need = Need(np.array([0.0, 0.0, gpus, 0.0]), count, np.array(allowed), GPU_COLUMN)
    vector = lambda pod: np.array([0.0, 0.0, pod.requests["nvidia.com/gpu"], 0.0])  # noqa: E731
    chosen = select_victims(
        free, need, units, vector, lambda p: int((p.node or "n0")[1:]), Budget()
    )
    fits_now = [
        int(np.floor(max(free[i, GPU_COLUMN], 0.0) / gpus + 1e-9)) if allowed[i] else 0
        for i in range(4)
    ]
    missing = count - sum(fits_now)
    if missing <= 0:
        assert chosen == []
        return
    ordered = sorted(units, key=unit_order)
    options = []
    for node in range(4):
        on_node = [
            u for u in ordered if allowed[node] and any(p.node == f"n{node}" for p in u.pods)
        ]
        option = (
            _plain_choice(free, need, on_node, node, fits_now[node], missing) if on_node else None
        )
        if option is not None:
            options.append(option)
    taken: dict[int, VictimUnit] = {}
    gained, expected = 0, None
    for _, members, gain in sorted(options, key=lambda o: o[0]):
        taken.update((id(u), u) for u in members)
        gained += gain
        if gained >= missing:
            expected = list(taken.values())
            break
    assert (None if chosen is None else [u.label() for u in chosen]) == (
        None if expected is None else [u.label() for u in expected]
    )


# ------------------------------------------- options kept from one search to the next


@settings(max_examples=300, deadline=None)
@given(
    specs=SPECS,
    steps=st.lists(
        st.tuples(
            st.sampled_from(["as is", "room", "gone", "cut again"]),
            st.integers(0, 8),  # which node or group the change is on
            st.sampled_from([1.0, 2.0, 4.0]),  # the room a node gains or loses
            st.sampled_from([1.0, 2.0, 4.0, 8.0]),  # GPUs per pod of the search
            st.integers(1, 4),  # pods the search misses
            st.lists(st.booleans(), min_size=4, max_size=4).filter(any),
        ),
        min_size=1,
        max_size=12,
    ),
)
def test_options_kept_across_searches_choose_what_a_fresh_search_chooses(
    specs: list[tuple[int, int, list[str], int, int]],
    steps: list[tuple[str, int, float, float, int, list[bool]]],
) -> None:
    """Searches one after another, between which a node's free room changes, a group
    goes (its units with it), or a group is cut into units again (new objects, equal
    values), each list searched with two sets of allowed nodes: with one
    `KeptOptions` for all of them, each chooses the victims a search keeping nothing
    chooses."""
    found = groups(*((f"g{i}", m, g, nodes, c) for i, (m, g, nodes, c, _) in enumerate(specs)))
    priority = {f"g{i}": spec[4] for i, spec in enumerate(specs)}

    def cut(group: PodGroupState) -> list[VictimUnit]:
        return victim_units(group, priority[group.name], group.creation_timestamp)

    units_by_group = {name: cut(group) for name, group in found.items()}
    free, vector, node_of = _free_of(found.values())
    kept = KeptOptions().follow(("four nodes",))
    for change, where, room, gpus, count, allowed in steps:
        names = sorted(units_by_group)
        if change == "room":
            free[where % 4, GPU_COLUMN] += room if where % 2 else -room
        elif change == "gone" and names:
            units_by_group.pop(names[where % len(names)])
        elif change == "cut again" and names:
            name = names[where % len(names)]
            units_by_group[name] = cut(found[name])
        units = [u for group_units in units_by_group.values() for u in group_units]
        # The same list searched again with other nodes allowed: what `kept` holds of
        # the list by node is for one set of allowed nodes only.
        for flags in (allowed, [not flag for flag in allowed]):
            need = Need(np.array([0.0, 0.0, gpus, 0.0]), count, np.array(flags), GPU_COLUMN)
            fresh = select_victims(free, need, units, vector, node_of, Budget())
            with_kept = select_victims(free, need, units, vector, node_of, Budget(), kept=kept)
            labels = [None if c is None else [u.label() for u in c] for c in (with_kept, fresh)]
            assert labels[0] == labels[1]
            if with_kept:
                assert all(any(u is v for v in units) for u in with_kept), "the search's own units"


@settings(max_examples=300, deadline=None)
@given(
    specs=SPECS,
    searches=st.lists(
        st.tuples(
            st.sampled_from([1.0, 2.0, 4.0, 8.0]),  # GPUs per pod of the search
            st.integers(1, 6),  # pods the search misses
            st.integers(0, 4),  # what the caller says a node holds at most
        ),
        min_size=1,
        max_size=8,
    ),
    allowed=st.lists(st.booleans(), min_size=4, max_size=4).filter(any),
)
def test_options_found_for_fewer_missing_pods_choose_what_a_fresh_search_chooses(
    specs: list[tuple[int, int, list[str], int, int]],
    searches: list[tuple[float, int, int]],
    allowed: list[bool],
) -> None:
    """Searches at one state of the free rows share the options they found (weighed
    for as many missing pods as `most` says a node holds), whatever `most` says, even
    too few: each chooses the victims a search sharing nothing chooses."""
    found_groups = groups(
        *((f"g{i}", m, g, nodes, c) for i, (m, g, nodes, c, _) in enumerate(specs))
    )
    units = [
        unit
        for i, group in enumerate(found_groups.values())
        for unit in victim_units(group, specs[i][4], group.creation_timestamp)
    ]
    free, vector, node_of = _free_of(found_groups.values())
    shared: FoundOptions = {}
    for gpus, count, most in searches:
        need = Need(np.array([0.0, 0.0, gpus, 0.0]), count, np.array(allowed), GPU_COLUMN)
        fresh = select_victims(free, need, units, vector, node_of, Budget())
        sharing = select_victims(
            free, need, units, vector, node_of, Budget(), most=most, found=shared
        )
        labels = [None if c is None else [u.label() for u in c] for c in (sharing, fresh)]
        assert labels[0] == labels[1]


# ------------------------------------------- room gathered inside one domain


class _AtMost(Budget):
    """Takes units while no more than `most` GPUs have gone in all (a budget counts
    what it took: one of these per domain)."""

    def __init__(self, most: float) -> None:
        self.most, self.taken = most, 0.0

    def take(self, units: object) -> bool:
        assert isinstance(units, list)
        gpus = sum(u.requests["nvidia.com/gpu"] for u in units)
        if self.taken + gpus > self.most:
            return False
        self.taken += gpus
        return True


def _fits_in(free: np.ndarray, allowed: np.ndarray, gpus: float) -> np.ndarray:
    return np.where(allowed, np.floor(np.maximum(free[:, GPU_COLUMN], 0.0) / gpus + 1e-9), 0)


@settings(max_examples=400, deadline=None)
@given(
    specs=SPECS,
    gpus=st.sampled_from([1.0, 2.0, 4.0, 8.0]),
    count=st.integers(1, 4),
    allowed=st.lists(st.booleans(), min_size=4, max_size=4).filter(any),
    domains=st.lists(st.sampled_from([-1, 0, 1]), min_size=4, max_size=4),
    most=st.sampled_from([4.0, 8.0, 16.0, 1e9]),
)
@example(
    # Newest first, the two units to take sit on n3 (domain 1) and n1 (domain 0):
    # across the cluster they would be taken together though no domain is freed.
    specs=[(1, 4, ["n0", "n0"], 0, 50), (1, 4, ["n2", "n2"], 1, 50),
           (1, 4, ["n1", "n1"], 2, 50), (1, 4, ["n3", "n3"], 3, 50)],
    gpus=8.0, count=2, allowed=[True] * 4, domains=[0, 0, 1, 1], most=16.0,
)  # fmt: skip
def test_room_gathered_inside_one_domain(
    specs: list[tuple[int, int, list[str], int, int]],
    gpus: float,
    count: int,
    allowed: list[bool],
    domains: list[int],
    most: float,
) -> None:
    """With `Need.domains`, the victims chosen free room for every pod inside one
    domain, all of them on its nodes and within one budget of the domain's own; none
    chosen only when no domain gathers the room on its own (the search across the
    cluster, made inside each domain, finds none); and with one domain for every node
    the choice is the search across the cluster's."""
    found = groups(*((f"g{i}", m, g, nodes, c) for i, (m, g, nodes, c, _) in enumerate(specs)))
    priority = {f"g{i}": spec[4] for i, spec in enumerate(specs)}
    units = [
        u for g in found.values() for u in victim_units(g, priority[g.name], g.creation_timestamp)
    ]
    free, vector, node_of = _free_of(found.values())
    of_node = np.array(domains, dtype=np.int64)
    inside = np.array(allowed) & (of_node >= 0)
    need = Need(np.array([0.0, 0.0, gpus, 0.0]), count, inside, GPU_COLUMN, of_node)
    budgets: list[_AtMost] = []

    def new_budget() -> _AtMost:
        budgets.append(_AtMost(most))
        return budgets[-1]

    chosen = select_victims(free, need, units, vector, node_of, new_budget(), new_budget=new_budget)

    if chosen is not None:
        room = free.copy()
        for unit in chosen:
            for pod in unit.pods:
                room[node_of(pod), GPU_COLUMN] += pod.requests["nvidia.com/gpu"]
        fits = _fits_in(room, inside, gpus)
        holding = [d for d in (0, 1) if fits[of_node == d].sum() >= count]
        assert holding, "some domain holds every pod once the victims are gone"
        if chosen:
            assert any(
                all(any(of_node[node_of(p)] == d for p in u.pods) for u in chosen) for d in holding
            ), "every victim has a pod in the domain freed"
            assert sum(u.requests["nvidia.com/gpu"] for u in chosen) <= most
    elif gpus == 8.0:
        # One pod per node at most: each node's option is the same whatever the number
        # of pods missing, so the search inside each domain alone finds none either.
        for d in (0, 1):
            alone = Need(need.vector, count, inside & (of_node == d), GPU_COLUMN)
            assert select_victims(free, alone, units, vector, node_of, _AtMost(most)) is None

    one = Need(need.vector, count, np.array(allowed), GPU_COLUMN, np.zeros(4, dtype=np.int64))
    across = Need(need.vector, count, np.array(allowed), GPU_COLUMN)
    labels = [
        None if c is None else [u.label() for u in c]
        for c in (
            select_victims(free, one, units, vector, node_of, _AtMost(most), new_budget=new_budget),
            select_victims(free, across, units, vector, node_of, _AtMost(most)),
        )
    ]
    assert labels[0] == labels[1]
