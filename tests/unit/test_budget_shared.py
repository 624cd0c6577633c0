"""`FairShareBudget.shared`: a value worked out from what a budget takes alone is
shared only by budgets that take alike. Reclaimers of two departments meet the
same victims of a department that holds its fair share, one of whose teams is
over its own: the sibling team may take from it, the other department may not.
Each must read its own answers, however many budgets of the run asked before."""

from __future__ import annotations

from kai_ray.decisions.ledger import QueueLedger
from kai_ray.decisions.reclaim import AloneAnswers, Contested, FairShareBudget
from kai_ray.decisions.runtime import started_at
from kai_ray.decisions.victims import VictimUnit, victim_units
from kai_ray.state.snapshot import ClusterObjects, Snapshot, build_snapshot
from kai_ray.values.resources import GPU, Resources
from tests.builders import make_node, make_pod, make_pod_group, make_queue

#: Fair shares: dept-a holds its own (24 GPUs), all of it a2's, 16 above a2's share.
SHARES = {"dept-a": 24, "a1": 16, "a2": 8, "b1": 24}


def _snapshot() -> Snapshot:
    nodes = [make_node(f"n{i}").gpus(8).build() for i in range(3)]
    queues = [
        make_queue("root").build(),
        make_queue("dept-a").parent("root").build(),
        make_queue("a1").parent("dept-a").build(),
        make_queue("a2").parent("dept-a").build(),
        make_queue("b1").parent("root").build(),
    ]
    groups, pods = [], []
    for i, node in enumerate(nodes):
        name = f"run-{i}"
        groups.append(make_pod_group(name).queue("a2").min_member(1).build())
        pod = make_pod(f"{name}-0").gpus(8).group(name).controlled_by("Job", name)
        pods.append(pod.on(node["metadata"]["name"]).phase("Running").build())
    return build_snapshot(ClusterObjects(nodes=nodes, pods=pods, pod_groups=groups, queues=queues))


def _units(snapshot: Snapshot) -> list[VictimUnit]:
    found: list[VictimUnit] = []
    for group in snapshot.pod_groups.values():
        found += victim_units(group, 0, started_at(group))
    return found


def test_budgets_of_other_reclaimers_do_not_share_what_they_take_alone() -> None:
    snapshot = _snapshot()
    units = _units(snapshot)
    assert len(units) == 3
    ledger = QueueLedger(snapshot.queues, {q: Resources({GPU: s}) for q, s in SHARES.items()})
    ledger.add("a2", Resources({GPU: 24}), True)
    contested = Contested(frozenset({GPU}), {})
    answers: AloneAnswers = {}

    def budget(leaf: str, shared: AloneAnswers | None) -> FairShareBudget:
        return FairShareBudget(ledger, contested, leaf, Resources({GPU: 8}), shared)

    def taken(leaf: str) -> list[bool]:
        # Each budget of the run asks through `shared`, as the victim search's bound does.
        asking = budget(leaf, answers)
        return asking.shared(units, lambda: [asking.takes_alone(unit) for unit in units])

    def afresh(leaf: str) -> list[bool]:
        return [budget(leaf, None).take([unit]) for unit in units]

    # The sibling team may take from a2 (over its share within dept-a); the other
    # department may not (dept-a holds no more than its share).
    assert afresh("a1") == [True, True, True]
    assert afresh("b1") == [False, False, False]
    for leaf in ("a1", "b1", "a1", "b1"):
        assert taken(leaf) == afresh(leaf), leaf
