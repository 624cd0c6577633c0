"""`eviction.could_fit_without`: a set of victims whose pods, freed, leave no domain
able to hold a rack-bound gang's missing members is answered "does not fit" by
counting, without the evictions and the placement; a set that frees one rack is
tried as before. (`test_equivalence.py` holds the whole cycle to the plain path
on random clusters; this pins the cut itself.)"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from kai_ray.decisions import eviction
from kai_ray.decisions.eviction import could_fit_without
from kai_ray.decisions.runtime import started_at
from kai_ray.decisions.transaction import Transaction
from kai_ray.decisions.victims import VictimUnit, victim_units
from kai_ray.state.snapshot import ClusterObjects, Snapshot, build_snapshot
from kai_ray.values.config import SchedulerConfig
from tests.builders import make_node, make_pod, make_pod_group, make_queue, make_topology

#: Two racks of two 8-GPU nodes; node i runs the 8-GPU pod of group `run-i`.
RACK_OF = {"n0": "r0", "n1": "r0", "n2": "r1", "n3": "r1"}


def _cluster() -> Snapshot:
    nodes = [make_node(n).gpus(8).in_domains(rack=r).build() for n, r in RACK_OF.items()]
    queues = [make_queue("root").build(), make_queue("team").parent("root").gpu(quota=32).build()]
    pods: list[dict[str, Any]] = []
    groups = []
    for node in RACK_OF:
        name = f"run-{node}"
        groups.append(make_pod_group(name).queue("team").min_member(1).build())
        pod = make_pod(f"{name}-0").gpus(8).group(name).controlled_by("Job", name)
        pods.append(pod.on(node).phase("Running").build())
    gang = make_pod_group("wait").queue("team").min_member(2).topology("dc", required="rack")
    groups.append(gang.build())
    pods += [make_pod(f"wait-{k}").gpus(8).group("wait").build() for k in range(2)]
    topology = make_topology("dc", "rack").hostname().build()
    objects = ClusterObjects(
        nodes=nodes, pods=pods, pod_groups=groups, queues=queues, topologies=[topology]
    )
    return build_snapshot(objects)


def _unit(snapshot: Snapshot, node: str) -> VictimUnit:
    group = snapshot.pod_groups[f"default/run-{node}"]
    (unit,) = victim_units(group, 0, started_at(group))
    return unit


@pytest.mark.parametrize(
    ("victims", "fits"),
    [(("n0", "n2"), False), (("n1", "n3"), False), (("n0", "n1"), True), (("n2", "n3"), True)],
)
def test_a_set_is_counted_per_rack(victims: tuple[str, ...], fits: bool) -> None:
    snapshot = _cluster()
    tx = Transaction(snapshot)
    gang = snapshot.pod_groups["default/wait"]
    units = [_unit(snapshot, node) for node in victims]
    assert could_fit_without(tx, gang, units) is fits


def test_a_set_spread_over_racks_is_neither_evicted_nor_placed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    snapshot = _cluster()
    tx = Transaction(snapshot)
    ctx: Any = SimpleNamespace(transaction=tx, config=SchedulerConfig().spec)
    gang = snapshot.pod_groups["default/wait"]
    placed = []
    place_gang = eviction.place_gang
    monkeypatch.setattr(
        eviction, "place_gang", lambda *args: placed.append(args[1].key) or place_gang(*args)
    )
    version = tx.version
    spread = [_unit(snapshot, "n0"), _unit(snapshot, "n2")]
    assert not eviction._try_fit(ctx, gang, spread)
    assert placed == [] and tx.version == version and not tx.removed
    # One rack freed: evicted and placed there, as without the count.
    one_rack = [_unit(snapshot, "n2"), _unit(snapshot, "n3")]
    assert eviction._try_fit(ctx, gang, one_rack)
    assert placed == ["default/wait"]
    nodes = {tx.placed[f"default/wait-{k}"].bind.node for k in range(2)}
    assert nodes == {"n2", "n3"}
