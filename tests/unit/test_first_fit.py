"""The transaction and the first-fit gang allocation of the foundation."""

from __future__ import annotations

import numpy as np
import pytest

from kai_ray.decisions.cycle import run_cycle
from kai_ray.decisions.placement import place_gang
from kai_ray.decisions.plan import Bind
from kai_ray.decisions.transaction import Placement, Transaction
from kai_ray.state.snapshot import ClusterObjects, Snapshot, build_snapshot
from kai_ray.values.config import SchedulerConfig, SchedulerConfigSpec
from tests.builders import make_node, make_pod, make_pod_group, make_queue


def snapshot(nodes: list[dict], pods: list[dict], groups: list[dict]) -> Snapshot:  # type: ignore[type-arg]
    return build_snapshot(
        ClusterObjects(nodes=nodes, pods=pods, pod_groups=groups, queues=[make_queue("q").build()])
    )


def gang(name: str, size: int, gpus: int, min_member: int | None = None) -> tuple[list[dict], dict]:  # type: ignore[type-arg]
    pods = [
        make_pod(f"{name}-{i}").gpus(gpus).scheduler("kai-ray").group(name).build()
        for i in range(size)
    ]
    group = make_pod_group(name).queue("q").min_member(min_member or size).build()
    return pods, group


def cycle(snap: Snapshot) -> list[Bind]:
    return run_cycle(snap, SchedulerConfig(), 1, 0.0).plan.binds


def test_rollback_restores_free_resources_and_devices() -> None:
    snap = snapshot([make_node("n1").gpus(8).cpu("8").build()], [], [])
    tx = Transaction(snap)
    mark = tx.checkpoint()
    need = snap.vector({"nvidia.com/gpu": 2})
    tx.place(Placement(Bind("default/p", "default/g", "n1", (0, 1)), 0, need))
    assert tx.free[0, snap.column("gpu")] == 6 and tx.devices[0][0] == 0
    tx.rollback(mark)
    assert np.array_equal(tx.free, snap.free) and tx.devices[0][0] == 1
    assert tx.binds() == []


def test_committed_work_cannot_be_rolled_back() -> None:
    snap = snapshot([make_node("n1").gpus(8).build()], [], [])
    tx = Transaction(snap)
    tx.place(Placement(Bind("default/p", "default/g", "n1", (0,)), 0, snap.vector({"gpu": 1})))
    tx.commit()
    with pytest.raises(ValueError):
        tx.rollback(0)
    assert len(tx.binds()) == 1


def test_gang_that_does_not_fit_binds_nothing() -> None:
    pods, group = gang("g", 3, 8)
    binds = cycle(snapshot([make_node(f"n{i}").gpus(8).build() for i in range(2)], pods, [group]))
    assert binds == []


def test_gang_that_fits_binds_every_member_on_distinct_devices() -> None:
    pods, group = gang("g", 4, 4)
    binds = cycle(snapshot([make_node(f"n{i}").gpus(8).build() for i in range(2)], pods, [group]))
    assert len(binds) == 4
    used = [(b.node, d) for b in binds for d in b.gpu_devices]
    assert len(used) == len(set(used)) == 16


def test_elastic_members_are_placed_one_by_one_after_the_minimum() -> None:
    pods, group = gang("g", 3, 8, min_member=1)
    binds = cycle(snapshot([make_node(f"n{i}").gpus(8).build() for i in range(2)], pods, [group]))
    assert len(binds) == 2


def test_fractions_pack_onto_one_device_and_whole_gpus_avoid_it() -> None:
    shares = [
        make_pod(f"s{i}").gpu_fraction("0.5").scheduler("kai-ray").group("s").build()
        for i in range(2)
    ]
    share_group = make_pod_group("s").queue("q").min_member(2).build()
    whole, whole_group = gang("w", 1, 7)
    binds = cycle(
        snapshot([make_node("n1").gpus(8).build()], shares + whole, [share_group, whole_group])
    )
    by_pod = {b.pod: b for b in binds}
    assert by_pod["default/s0"].gpu_devices == by_pod["default/s1"].gpu_devices == (0,)
    assert by_pod["default/s0"].gpu_fraction == 0.5
    assert 0 not in by_pod["default/w-0"].gpu_devices
    assert len(by_pod["default/w-0"].gpu_devices) == 7


def _one_gpu(snap: Snapshot) -> Placement:
    return Placement(Bind("default/p", "default/g", "n1", (0,)), 0, snap.vector({"gpu": 1}))


def test_an_attempt_that_holds_is_committed() -> None:
    snap = snapshot([make_node("n1").gpus(8).build()], [], [])
    tx = Transaction(snap)
    with tx.attempt() as step:
        tx.place(_one_gpu(snap))
        step.holds = True
    assert len(tx.binds()) == 1
    with pytest.raises(ValueError):
        tx.rollback(0)


def test_an_attempt_that_does_not_hold_is_rolled_back() -> None:
    snap = snapshot([make_node("n1").gpus(8).build()], [], [])
    tx = Transaction(snap)
    with tx.attempt():
        tx.place(_one_gpu(snap))
    assert tx.binds() == [] and tx.placements == [] and np.array_equal(tx.free, snap.free)


def test_an_attempt_that_raises_is_rolled_back() -> None:
    snap = snapshot([make_node("n1").gpus(8).build()], [], [])
    tx = Transaction(snap)
    with pytest.raises(RuntimeError), tx.attempt() as step:
        tx.place(_one_gpu(snap))
        step.holds = True
        raise RuntimeError("broken")
    assert tx.placements == [] and np.array_equal(tx.free, snap.free)


def test_placement_leaves_committing_to_its_caller() -> None:
    pods, group = gang("g", 2, 4)
    snap = snapshot([make_node("n1").gpus(8).build()], pods, [group])
    tx = Transaction(snap)
    assert place_gang(tx, snap.pod_groups["default/g"], SchedulerConfigSpec()).admitted
    assert len(tx.placements) == 2 and tx.binds() == []
    tx.rollback(0)
    assert np.array_equal(tx.free, snap.free)
