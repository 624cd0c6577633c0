"""Fragmentation-aware placement (`placementStrategy: fragmentation`).

On random small clusters, partly filled, with a random workload mix, the score
is held to a plain reference (a loop over classes and devices, written from the
definition in `stranding.py`): its value for every candidate is the reference's,
and the placement it picks never strands strictly more of every resource
(CPU, memory, GPUs) than another placement of the same pod would. Then named
cases: what the score is for, and the workload mix's decay.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kai_ray.decisions.placement.filters import static_mask, static_nodes
from kai_ray.decisions.placement.fit import (
    choose_devices,
    choose_node,
    imbalance_added,
    room_on,
)
from kai_ray.decisions.placement.mix import MIX, TransactionMix, WorkloadMix, mix_of
from kai_ray.decisions.placement.node_kept import ACROSS_CYCLES, KeptAcrossCycles
from kai_ray.decisions.placement.shapes import PodShape, shape_of
from kai_ray.decisions.placement.stranding import resource_weights, score_nodes
from kai_ray.decisions.plan import Bind
from kai_ray.decisions.transaction import Placement, Transaction
from kai_ray.state.pod_states import PodState, read_pod
from kai_ray.state.snapshot import ClusterObjects, build_snapshot
from kai_ray.values.config import SchedulerConfigSpec
from kai_ray.values.resources import EPSILON, GPU
from tests.builders import make_node, make_pod

Vector = npt.NDArray[np.float64]
FRAGMENTATION = SchedulerConfigSpec(placementStrategy="fragmentation")
BINPACK = SchedulerConfigSpec(placementStrategy="binpack")
#: (CPUs, memory GiB, whole GPUs, share) of the pods the tests draw.
PALETTE = (
    (1, 4, 0, 0.0),
    (6, 30, 0, 0.0),
    (2, 8, 1, 0.0),
    (4, 16, 2, 0.0),
    (1, 4, 0, 0.25),
    (2, 8, 0, 0.5),
    (1, 2, 0, 0.75),
    (3, 8, 0, 0.3),
)
NODE_SHAPES = ((4, 16, 0), (8, 32, 2), (16, 64, 4), (8, 64, 4), (6, 24, 1))


def pod(cpu: float, memory_gib: float, gpus: int = 0, share: float = 0.0) -> PodState:
    builder = make_pod(f"p-{cpu}-{memory_gib}-{gpus}-{share}").cpu(cpu).memory(f"{memory_gib}Gi")
    if gpus:
        builder.gpus(gpus)
    if share:
        builder.gpu_fraction(share)
    state = read_pod(builder.build(), [])
    assert state is not None
    return state


def transaction(nodes: list[dict[str, Any]]) -> Transaction:
    return Transaction(build_snapshot(ClusterObjects(nodes=nodes)))


def place(tx: Transaction, state: PodState, node: int, devices: tuple[int, ...]) -> None:
    shape = shape_of(tx, state)
    fraction = float(shape.fraction[node]) if shape.shares_gpu else 0.0
    key = f"default/placed-{len(tx.placements)}"
    bind = Bind(key, "default/g", tx.snapshot.node_names[node], devices, fraction)
    tx.place(Placement(bind, node, shape.taken(node, tx.snapshot.column(GPU)), fraction))


def observe(tx: Transaction, classes: list[tuple[PodState, float]]) -> None:
    mix = mix_of(tx, FRAGMENTATION.fragmentation).mix
    for state, count in classes:
        mix.observe(state, 0.0, count)


# ---------------------------------------------------------------- the reference


def reference_stranded(tx: Transaction, free: Vector, devices: Vector, node: int) -> Vector:
    """The expected stranded vector of one node, by the definition, one class at a time."""
    gpu = tx.snapshot.column(GPU)
    stranded = np.zeros(len(free))
    for example, probability in mix_of(tx, FRAGMENTATION.fragmentation).mix.heaviest():
        shape = shape_of(tx, example)
        if not _fits(tx, shape, example, free, devices, node):
            stranded += probability * np.maximum(free, 0.0)
            continue
        limit = float(shape.fraction[node]) if shape.shares_gpu else float(shape.whole_gpus > 0)
        small = [d for d in devices if d > EPSILON and d + EPSILON < limit]
        stranded[gpu] += probability * sum(small)
    return stranded


def _fits(
    tx: Transaction, shape: PodShape, example: PodState, free: Vector, devices: Vector, node: int
) -> bool:
    if not static_mask(tx, example)[node]:
        return False
    if any(free[c] + EPSILON < shape.need[c] for c in range(len(free)) if shape.need[c] > 0):
        return False
    if shape.shares_gpu:
        return any(d + EPSILON >= shape.fraction[node] for d in devices)
    return sum(d >= 1.0 - EPSILON for d in devices) >= shape.whole_gpus


def placements(tx: Transaction, shape: PodShape, node: int) -> list[tuple[int, Vector, Vector]]:
    """Every way to place one pod of `shape` on `node`: (device or -1, free, devices) after."""
    free, devices = tx.free[node], tx.devices[node]
    if shape.shares_gpu:
        fraction = shape.fraction[node]
        options = []
        for device in np.flatnonzero(devices + EPSILON >= fraction):
            after = devices.copy()
            after[device] -= fraction
            taken = shape.taken(node, tx.snapshot.column(GPU))
            options.append((int(device), free - taken, after))
        return options
    after = devices.copy()
    after[np.flatnonzero(devices >= 1.0 - EPSILON)[: shape.whole_gpus]] = 0.0
    return [(-1, free - shape.need, after)]


def reference_deltas(tx: Transaction, shape: PodShape, nodes: Any) -> list[tuple[int, int, Vector]]:
    """(node, device, how much the placement raises the node's expected stranded vector)."""
    deltas = []
    for node in nodes:
        before = reference_stranded(tx, tx.free[node], tx.devices[node], int(node))
        for device, free, devices in placements(tx, shape, int(node)):
            after = reference_stranded(tx, free, devices, int(node))
            deltas.append((int(node), device, after - before))
    return deltas


# ------------------------------------------------------------ random clusters


@st.composite
def scenes(draw: st.DrawFn) -> tuple[Transaction, PodState]:
    count = draw(st.integers(2, 6))
    nodes = []
    for i in range(count):
        cpu, memory, gpus = draw(st.sampled_from(NODE_SHAPES))
        node = make_node(f"n{i}").cpu(cpu).memory(f"{memory}Gi")
        nodes.append((node.gpus(gpus) if gpus else node).build())
    tx = transaction(nodes)
    for _ in range(draw(st.integers(0, 14))):
        filler = pod(*draw(st.sampled_from(PALETTE)))
        shape = shape_of(tx, filler)
        fit = static_nodes(tx, filler)
        fit = fit[room_on(tx, shape, fit) > 0]
        if fit.size:
            node = int(fit[draw(st.integers(0, len(fit) - 1))])
            place(tx, filler, node, choose_devices(tx, shape, node, BINPACK))
    classes = draw(st.lists(st.sampled_from(PALETTE), min_size=1, max_size=5, unique=True))
    weights = draw(st.lists(st.integers(1, 6), min_size=len(classes), max_size=len(classes)))
    observe(tx, [(pod(*c), float(w)) for c, w in zip(classes, weights, strict=True)])
    return tx, pod(*draw(st.sampled_from(PALETTE)))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scene=scenes())
def test_the_score_is_the_reference_and_never_prefers_stranding_more_of_everything(
    scene: tuple[Transaction, PodState],
) -> None:
    tx, state = scene
    shape = shape_of(tx, state)
    nodes = static_nodes(tx, state)
    fit = nodes[room_on(tx, shape, nodes) > 0]
    chosen = choose_node(tx, shape, nodes, FRAGMENTATION)
    if not fit.size:
        assert chosen is None
        return
    assert chosen is not None
    device = choose_devices(tx, shape, chosen, FRAGMENTATION)
    weights = resource_weights(tx)
    deltas = reference_deltas(tx, shape, fit)
    best = {n: min(d @ weights for m, _, d in deltas if m == n) for n in fit}
    scores = score_nodes(tx, shape, fit, mix_of(tx, FRAGMENTATION.fragmentation).arrays(tx))
    assert scores.score == pytest.approx([best[n] for n in fit], abs=1e-9)
    columns = [tx.snapshot.column(name) for name in ("cpu", "memory", GPU)]
    (mine,) = [
        d for n, dev, d in deltas if n == chosen and dev == (device[0] if shape.shares_gpu else -1)
    ]
    for _, _, other in deltas:
        assert not np.all(mine[columns] > other[columns] + 1e-9)


def fresh_copy(tx: Transaction) -> Transaction:
    """The same state and mix in a new transaction: nothing kept from earlier scoring."""
    copy = Transaction(tx.snapshot)
    for placement in tx.placements:
        copy.place(placement)
    copy.memo.keep(MIX, None, TransactionMix(mix_of(tx, FRAGMENTATION.fragmentation).mix))
    return copy


def assert_kept_is_fresh(tx: Transaction) -> None:
    """Every palette shape's room, scores and chosen node in `tx` (with what it kept)
    are those of a fresh transaction of the same state and mix."""
    fresh = fresh_copy(tx)
    for probe in (pod(*p) for p in PALETTE):
        kept_shape, fresh_shape = shape_of(tx, probe), shape_of(fresh, probe)
        nodes = static_nodes(tx, probe)
        room = room_on(tx, kept_shape, nodes)
        assert room.tolist() == room_on(fresh, fresh_shape, nodes).tolist()
        fit = nodes[room > 0]
        if not fit.size:
            continue
        mine = score_nodes(tx, kept_shape, fit, mix_of(tx, FRAGMENTATION.fragmentation).arrays(tx))
        theirs = score_nodes(
            fresh, fresh_shape, fit, mix_of(fresh, FRAGMENTATION.fragmentation).arrays(fresh)
        )
        assert mine.score.tolist() == theirs.score.tolist()
        assert mine.device.tolist() == theirs.device.tolist()
        assert choose_node(tx, kept_shape, nodes, FRAGMENTATION) == choose_node(
            fresh, fresh_shape, nodes, FRAGMENTATION
        )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scene=scenes(), steps=st.lists(st.integers(-1, len(PALETTE) - 1), max_size=12))
def test_scores_kept_across_placements_and_rollbacks_are_the_fresh_ones(
    scene: tuple[Transaction, PodState], steps: list[int]
) -> None:
    """Placing with the strategy (-1: roll back to the mark before the last placement),
    then scoring every palette shape: the kept scores equal a fresh transaction's."""
    tx, _ = scene
    marks: list[int] = []
    for step in steps:
        if step < 0:
            if marks:
                tx.rollback(marks.pop())
            continue
        state = pod(*PALETTE[step])
        shape = shape_of(tx, state)
        node = choose_node(tx, shape, static_nodes(tx, state), FRAGMENTATION)
        if node is not None:
            marks.append(tx.checkpoint())
            place(tx, state, node, choose_devices(tx, shape, node, FRAGMENTATION))
        assert_kept_is_fresh(tx)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    scene=scenes(),
    steps=st.lists(
        st.tuples(st.integers(0, len(PALETTE) - 1), st.integers(0, 30), st.booleans()),
        max_size=8,
    ),
    other=st.lists(st.sampled_from(PALETTE), min_size=1, max_size=4, unique=True),
)
def test_values_kept_across_transactions_are_the_fresh_ones(
    scene: tuple[Transaction, PodState],
    steps: list[tuple[int, int, bool]],
    other: list[tuple[float, float, int, float]],
) -> None:
    """Cycle after cycle: each transaction takes the per-node values the ones before it
    kept (`node_kept.KeptAcrossCycles`), starts from some of the placements made so far
    (its nodes partly changed, partly not), sees one of two workload mixes and places
    one more pod with the strategy; then every palette shape's room, scores and chosen
    node are a fresh transaction's."""
    base, _ = scene
    mixes = (mix_of(base, FRAGMENTATION.fragmentation).mix, WorkloadMix(3600.0))
    for i, drawn in enumerate(other):
        mixes[1].observe(pod(*drawn), 0.0, float(i + 1))
    across = KeptAcrossCycles()
    placements = list(base.placements)
    for index, cut, first_mix in steps:
        tx = Transaction(base.snapshot)
        tx.memo.keep(ACROSS_CYCLES, None, across)
        tx.memo.keep(MIX, None, TransactionMix(mixes[0 if first_mix else 1]))
        for placement in placements[: cut % (len(placements) + 1)]:
            tx.place(placement)
        state = pod(*PALETTE[index])
        shape = shape_of(tx, state)
        node = choose_node(tx, shape, static_nodes(tx, state), FRAGMENTATION)
        if node is not None:
            place(tx, state, node, choose_devices(tx, shape, node, FRAGMENTATION))
            placements.append(tx.placements[-1])
        assert_kept_is_fresh(tx)


# ----------------------------------------------------------------- named cases


def chosen_node(tx: Transaction, state: PodState) -> str:
    node = choose_node(tx, shape_of(tx, state), static_nodes(tx, state), FRAGMENTATION)
    assert node is not None
    return tx.snapshot.node_names[node]


def test_a_cpu_only_pod_goes_to_a_node_without_gpus() -> None:
    tx = transaction(
        [
            make_node("gpu").cpu(64).memory("256Gi").gpus(8).build(),
            make_node("cpu").cpu(64).memory("256Gi").build(),
        ]
    )
    observe(tx, [(pod(8, 32, gpus=1), 5.0), (pod(4, 8), 1.0)])
    assert chosen_node(tx, pod(4, 8)) == "cpu"


def test_a_cpu_only_pod_avoids_the_gpu_node_whose_gpus_it_would_strand() -> None:
    """Bin-packing takes the fuller node and leaves its two GPUs behind exhausted CPU."""
    tx = transaction(
        [
            make_node("small").cpu(10).memory("64Gi").gpus(2).build(),
            make_node("big").cpu(64).memory("256Gi").gpus(2).build(),
        ]
    )
    observe(tx, [(pod(4, 16, gpus=1), 5.0), (pod(8, 8), 1.0)])
    cpu_pod = pod(8, 8)
    binpack = choose_node(tx, shape_of(tx, cpu_pod), static_nodes(tx, cpu_pod), BINPACK)
    assert tx.snapshot.node_names[binpack or 0] == "small"
    assert chosen_node(tx, cpu_pod) == "big"


def test_a_share_keeps_room_for_the_shares_the_mix_asks_for() -> None:
    """Device 0 has 0.5 left, device 1 0.75: a 0.25 share on device 1 leaves both able to
    take the 0.5 shares that keep coming; on device 0 (bin-packing's) it strands 0.25."""
    tx = transaction([make_node("n").cpu(64).memory("256Gi").gpus(2).build()])
    place(tx, pod(1, 1, share=0.5), 0, (0,))
    place(tx, pod(1, 1, share=0.25), 0, (1,))
    observe(tx, [(pod(1, 4, share=0.5), 10.0)])
    share = pod(1, 4, share=0.25)
    shape = shape_of(tx, share)
    assert choose_devices(tx, shape, 0, BINPACK) == (0,)
    assert choose_node(tx, shape, static_nodes(tx, share), FRAGMENTATION) == 0
    assert choose_devices(tx, shape, 0, FRAGMENTATION) == (1,)


def test_a_single_gpu_pod_keeps_the_whole_node_an_eight_gpu_pod_needs() -> None:
    tx = transaction(
        [
            make_node("whole").cpu(96).memory("512Gi").gpus(8).build(),
            make_node("started").cpu(96).memory("512Gi").gpus(8).build(),
        ]
    )
    place(tx, pod(1, 1, gpus=1), 1, (0,))
    observe(tx, [(pod(8, 64, gpus=8), 1.0), (pod(2, 8, gpus=1), 3.0)])
    assert chosen_node(tx, pod(2, 8, gpus=1)) == "started"


def test_on_a_tie_a_pod_light_on_cpu_evens_out_the_node_short_of_cores() -> None:
    """Every class of the mix fits on both nodes before and after (the scores tie).
    "half" is half used in its own proportion; "cores" has given most of its CPU to a
    CPU-only pod, so its GPUs need pods light on CPU. Bin-packing takes the fuller
    "half"; the tie-break takes "cores", which the pod evens out, and keeps "half"
    able to take the pods heavy on CPU the mix asks for too."""
    tx = transaction(
        [
            make_node("half").cpu(64).memory("256Gi").gpus(8).build(),
            make_node("cores").cpu(64).memory("256Gi").gpus(8).build(),
        ]
    )
    place(tx, pod(32, 128, gpus=4), 0, (0, 1, 2, 3))
    place(tx, pod(40, 40), 1, ())
    observe(tx, [(pod(1, 8, gpus=1), 3.0), (pod(12, 32, gpus=1), 3.0)])
    light = pod(1, 8, gpus=1)
    shape = shape_of(tx, light)
    mix = mix_of(tx, FRAGMENTATION.fragmentation).arrays(tx)
    scores = score_nodes(tx, shape, np.arange(2), mix)
    assert scores.score[0] == pytest.approx(scores.score[1])  # a tie on what is stranded
    assert imbalance_added(tx, shape, np.arange(2)) == pytest.approx([0.109375, -0.109375])
    binpack = choose_node(tx, shape, static_nodes(tx, light), BINPACK)
    assert tx.snapshot.node_names[binpack or 0] == "half"
    assert chosen_node(tx, light) == "cores"


@given(st.data())
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_the_imbalance_a_pod_adds_is_alike_on_nodes_alike_in_proportion(
    data: st.DataObject,
) -> None:
    """An empty node and one used in the node's own proportion get the same imbalance
    from a pod, so packing decides between them (GPU pods keep packing); and a pod
    asking for one resource only adds none."""
    cpus, memory, gpus = data.draw(st.sampled_from(NODE_SHAPES[1:]))
    used = data.draw(st.integers(1, gpus - 1)) if gpus > 1 else 0
    nodes = [
        make_node(name).cpu(cpus).memory(f"{memory}Gi").gpus(gpus).build()
        for name in ("empty", "used")
    ]
    tx = transaction(nodes)
    if used:
        place(tx, pod(cpus * used / gpus, memory * used / gpus, gpus=used), 1, tuple(range(used)))
    c, m, g, share = data.draw(st.sampled_from(PALETTE))
    state = pod(c, m, g, share)
    shape = shape_of(tx, state)
    if np.all(room_on(tx, shape, np.arange(2)) > 0):
        added = imbalance_added(tx, shape, np.arange(2))
        assert added[0] == pytest.approx(added[1])
    alone = pod(0, 0, gpus=1)
    assert np.all(imbalance_added(tx, shape_of(tx, alone), np.arange(2)) == 0)


def test_without_a_mix_the_strategy_packs() -> None:
    tx = transaction(
        [
            make_node("a").cpu(8).memory("32Gi").gpus(4).build(),
            make_node("b").cpu(8).memory("32Gi").gpus(4).build(),
        ]
    )
    place(tx, pod(1, 1, gpus=1), 1, (0,))
    assert chosen_node(tx, pod(1, 4, gpus=1)) == "b"


# ------------------------------------------------------------------- the mix


def test_the_mix_weighs_a_pod_by_its_age_with_the_half_life() -> None:
    old, new = pod(1, 4, gpus=1), pod(1, 4, share=0.5)
    mix = WorkloadMix(half_life_s=3600.0, coverage=1.0)
    mix.observe(old, 0.0, 3.0)
    mix.observe(new, 7200.0, 1.0)
    assert dict((p.gpu_share is None, w) for p, w in mix.heaviest()) == pytest.approx(
        {False: 4 / 7, True: 3 / 7}
    )


def test_the_mix_stays_finite_over_long_times() -> None:
    mix = WorkloadMix(half_life_s=1.0, coverage=1.0)
    mix.observe(pod(1, 4, gpus=1), 0.0)
    mix.observe(pod(1, 4, share=0.5), 1000.0)
    ((kept, weight),) = mix.heaviest()
    assert kept.gpu_share is not None and weight == 1.0


def test_the_mix_scores_the_heaviest_classes_covering_its_share() -> None:
    mix = WorkloadMix(half_life_s=0.0, coverage=0.9, max_classes=8)
    for cpu, count in ((1, 50), (2, 30), (3, 15), (4, 5)):
        mix.observe(pod(cpu, 4), 0.0, count)
    kept = mix.heaviest()
    assert [p.requests["cpu"] for p, _ in kept] == [1, 2, 3]
    assert sum(w for _, w in kept) == pytest.approx(1.0)


def test_the_cycle_mix_counts_the_snapshots_live_pods() -> None:
    snapshot = build_snapshot(
        ClusterObjects(
            nodes=[make_node("n").gpus(4).build()],
            pods=[
                make_pod("a").gpus(1).on("n").created(0).build(),
                make_pod("b").gpus(1).scheduler("kai-ray").created(10).build(),
                make_pod("c").gpu_fraction(0.5).on("n").created(20).build(),
                make_pod("d").gpu_fraction(0.5).on("n").phase("Succeeded").created(30).build(),
            ],
        )
    )
    kept = mix_of(Transaction(snapshot), FRAGMENTATION.fragmentation).mix.heaviest()
    by_kind = {p.gpu_share is None: w for p, w in kept}
    assert by_kind[True] == pytest.approx(2 / 3, abs=0.01)
