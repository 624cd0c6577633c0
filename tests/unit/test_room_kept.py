"""The room of every node kept per shape (`fit.room_on` on many nodes) equals `fit.room`
worked out afresh, through placements, evictions and rollbacks, and in a later
transaction that takes what an earlier one kept (`node_kept.KeptAcrossCycles`)."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from kai_ray.decisions.placement import fit, place_extras, place_gang
from kai_ray.decisions.placement.node_kept import ACROSS_CYCLES, KeptAcrossCycles
from kai_ray.decisions.placement.shapes import shape_of
from kai_ray.decisions.transaction import Transaction
from kai_ray.state.snapshot import Snapshot
from kai_ray.values.config import SchedulerConfigSpec
from tests.builders import make_node, make_pod, make_pod_group
from tests.unit.placement_setup import cluster

NODES = 2 * fit.KEPT_FROM  # enough that a query of every node reads the kept room


def generated(seed: int) -> Snapshot:
    """Nodes of 4 or 8 GPUs, some partly used (whole GPUs and shares), and gangs of
    whole-GPU and half-GPU pods waiting."""
    rng = random.Random(seed)
    nodes: list[dict[str, Any]] = []
    pods: list[dict[str, Any]] = []
    groups: list[dict[str, Any]] = []
    for i in range(NODES):
        nodes.append(make_node(f"n{i}").gpus(rng.choice([4, 8]), memory_mib=81920).build())
        if rng.random() < 0.3:
            pods.append(make_pod(f"busy{i}").gpus(rng.randint(1, 4)).on(f"n{i}").build())
        if rng.random() < 0.2:
            share = make_pod(f"share{i}").gpu_fraction(0.5).cpu("1").on(f"n{i}")
            pods.append(share.annotate("kai-ray.io/gpu-devices", "3").build())
    for g in range(40):
        size = rng.randint(1, 8)
        half = rng.random() < 0.3
        for k in range(size + rng.randint(0, 2)):
            pod = make_pod(f"g{g}-{k}").group(f"g{g}").created(g)
            pods.append((pod.gpu_fraction(0.5).cpu("1") if half else pod.gpus(8)).build())
        groups.append(make_pod_group(f"g{g}").queue("q").min_member(size).created(g).build())
    return cluster(nodes, pods, groups)


def assert_kept_equals_fresh(tx: Transaction) -> None:
    every = np.arange(len(tx.snapshot.node_names), dtype=np.intp)
    some = every[::3]
    for pod in tx.snapshot.pending_pods:
        shape = shape_of(tx, pod)
        fresh = fit.room(tx.free, tx.devices, tx.whole_free, shape, shape.fraction)
        assert fit.room_on(tx, shape, every).tolist() == fresh.tolist()
        assert fit.room_on(tx, shape, some).tolist() == fresh[some].tolist()


@pytest.mark.parametrize(
    ("seed", "values_kept"),
    [(0, KeptAcrossCycles.AT_MOST), (1, KeptAcrossCycles.AT_MOST), (2, 1)],
    ids=["seed 0", "seed 1", "seed 2, one value kept across transactions at a time"],
)
def test_the_kept_room_follows_placements_evictions_and_rollbacks(
    monkeypatch: pytest.MonkeyPatch, seed: int, values_kept: int
) -> None:
    monkeypatch.setattr(KeptAcrossCycles, "AT_MOST", values_kept)
    snapshot = generated(seed)
    across = KeptAcrossCycles()
    config = SchedulerConfigSpec()
    groups = sorted(snapshot.pod_groups.values(), key=lambda g: g.creation_timestamp)
    rng = random.Random(seed)
    for _ in range(3):  # each transaction after the first takes what the last one kept
        tx = Transaction(snapshot)
        tx.memo.keep(ACROSS_CYCLES, None, across)
        assert_kept_equals_fresh(tx)
        for group in rng.sample(groups, len(groups) // 2):
            mark = tx.checkpoint()
            place_gang(tx, group, config)
            place_extras(tx, group, config, limit=1)
            if rng.random() < 0.3:
                busy = [p for p in snapshot.pods.values() if p.node and p.key not in tx.removed]
                tx.evict(rng.choice(busy), "ns/busy")
            assert_kept_equals_fresh(tx)
            if rng.random() < 0.4:
                tx.rollback(mark)
                assert_kept_equals_fresh(tx)
            else:
                tx.commit()
        assert tx.placed, "some pods were placed"
