"""`FairShareBudget.take_each`: offering every victim unit one by one skips a unit
alike to one refused since the budget last took (the same leaf and requests), and
nothing else: what it takes is what `take([unit])` in turn takes."""

from __future__ import annotations

import itertools

import pytest

from kai_ray.decisions.ledger import QueueLedger
from kai_ray.decisions.reclaim import Contested, FairShareBudget
from kai_ray.decisions.runtime import started_at
from kai_ray.decisions.victims import Budget, VictimUnit, victim_units
from kai_ray.state.snapshot import ClusterObjects, Snapshot, build_snapshot
from kai_ray.values.resources import GPU, Resources
from tests.builders import make_node, make_pod, make_pod_group, make_queue

#: Victim groups of team-b: name -> the nodes of its 8-GPU pods.
GROUPS = {"big": ("n0", "n1"), "one": ("n2",), "two": ("n3",), "late": ("n4", "n5")}


def _snapshot() -> Snapshot:
    nodes = [make_node(f"n{i}").gpus(8).build() for i in range(6)]
    queues = [
        make_queue("root").build(),
        make_queue("team-a").parent("root").gpu(quota=8).build(),
        make_queue("team-b").parent("root").gpu(quota=8).build(),
    ]
    groups, pods = [], []
    for name, on in GROUPS.items():
        groups.append(make_pod_group(name).queue("team-b").min_member(len(on)).build())
        for k, node in enumerate(on):
            pod = make_pod(f"{name}-{k}").gpus(8).group(name).controlled_by("Job", name)
            pods.append(pod.on(node).phase("Running").build())
    objects = ClusterObjects(nodes=nodes, pods=pods, pod_groups=groups, queues=queues)
    return build_snapshot(objects)


def _units(snapshot: Snapshot) -> list[VictimUnit]:
    found = []
    for name in GROUPS:
        group = snapshot.pod_groups[f"default/{name}"]
        found += victim_units(group, 0, started_at(group))
    return found


def _budget(snapshot: Snapshot, may_lose: float) -> FairShareBudget:
    # team-b holds its fair share (32 GPUs) and `may_lose` above it.
    shares = {"team-a": Resources({GPU: 16}), "team-b": Resources({GPU: 32})}
    ledger = QueueLedger(snapshot.queues, shares)
    ledger.add("team-b", Resources({GPU: 32 + may_lose}), True)
    contested = Contested(frozenset({GPU}), {})
    return FairShareBudget(ledger, contested, "team-a", Resources({GPU: 8}))


def test_a_refused_unit_does_not_stop_a_smaller_one_of_its_queue() -> None:
    snapshot = _snapshot()
    big, one, two, late = _units(snapshot)
    # team-b may lose 8: big (16) is refused, one (8) taken, two and late refused.
    assert _budget(snapshot, 8).take_each([big, one, two, late]) == [one]


@pytest.mark.parametrize("may_lose", [0.0, 8.0, 16.0, 24.0, 48.0])
def test_every_order_takes_what_offering_one_by_one_takes(may_lose: float) -> None:
    snapshot = _snapshot()
    for order in itertools.permutations(_units(snapshot)):
        plain = _budget(snapshot, may_lose)
        expected = [unit for unit in order if plain.take([unit])]
        assert _budget(snapshot, may_lose).take_each(list(order)) == expected
        assert Budget.take_each(_budget(snapshot, may_lose), list(order)) == expected
