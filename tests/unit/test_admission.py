"""Admission: namespace, limit, non-preemptible quota and per-GPU-type limits."""

from __future__ import annotations

from typing import Any

import pytest

from kai_ray.decisions.admission import (
    describe,
    is_preemptible,
    refusal,
    typed_gpus,
    typed_keys,
    typed_limit_refusal,
)
from kai_ray.decisions.ledger import QueueLedger
from kai_ray.decisions.ordering import group_priority
from kai_ray.state.snapshot import ClusterObjects, build_snapshot
from kai_ray.values.resources import GPU, Resources
from tests.builders import make_pod_group, make_queue

H100 = "nvidia.com/gpu.product=H100"


def _queues() -> list[Any]:
    return [
        make_queue("org").gpu(quota=16, limit=20),
        make_queue("team-a").parent("org").gpu(quota=8, limit=16).namespaces("ml", "research"),
        make_queue("team-b").parent("org").gpu(quota=8).resource(H100, limit=4),
    ]


def _refusal(group: Any, held: dict[str, tuple[float, bool]], gpus: float) -> str | None:
    snapshot = build_snapshot(
        ClusterObjects(queues=[q.build() for q in _queues()], pod_groups=[group.build()])
    )
    ledger = QueueLedger(snapshot.queues, {})
    for queue, (amount, preemptible) in held.items():
        ledger.add(queue, Resources({GPU: amount}), preemptible)
    (state,) = snapshot.pod_groups.values()
    preemptible = is_preemptible(state, group_priority(state))
    return refusal(ledger, state, Resources({GPU: gpus}), preemptible)


def _group(queue: str, namespace: str = "ml") -> Any:
    return make_pod_group("job", namespace).queue(queue)


@pytest.mark.parametrize(
    ("group", "held", "gpus", "expected"),
    [
        pytest.param(
            _group("team-a"),
            {"team-a": (4.0, True)},
            8,
            None,
            id="within limit and preemptible: admitted even past quota",
        ),
        pytest.param(
            _group("team-a", "web"),
            {},
            1,
            "namespace web may not use queue team-a (allowed: ml, research)",
            id="a namespace not in the queue's list is refused",
        ),
        pytest.param(
            _group("team-a"),
            {"team-a": (12.0, True)},
            8,
            "queue team-a is at its limit of 16 GPUs: it holds 12 and the job asks for 8",
            id="the leaf's limit refuses with the numbers",
        ),
        pytest.param(
            _group("team-b"),
            {"team-a": (14.0, True), "team-b": (2.0, True)},
            6,
            "queue org is at its limit of 20 GPUs: it holds 16 and the job asks for 6",
            id="an ancestor's limit refuses too",
        ),
        pytest.param(
            _group("team-a").set("spec.preemptible", False),
            {"team-a": (6.0, False)},
            4,
            "queue team-a would go over its quota of 8 GPUs with this non-preemptible job "
            "(non-preemptible work runs only within quota; it holds 6 of such work and "
            "the job asks for 4)",
            id="a non-preemptible job may not take its queue over quota",
        ),
        pytest.param(
            _group("team-a").priority_class("inference"),
            {"team-a": (6.0, False)},
            4,
            "queue team-a would go over its quota",
            id="priority 100 or more without a preemptible field means non-preemptible",
        ),
        pytest.param(
            _group("team-a").set("spec.preemptible", False),
            {"team-a": (6.0, True)},
            2,
            None,
            id="only non-preemptible work counts against the non-preemptible quota",
        ),
    ],
)
def test_refusal(
    group: Any, held: dict[str, tuple[float, bool]], gpus: float, expected: str | None
) -> None:
    reason = _refusal(group, held, gpus)
    if expected is None:
        assert reason is None
    else:
        assert reason is not None and reason.startswith(expected)


def test_per_gpu_type_limit_counts_gpus_on_nodes_of_that_type() -> None:
    snapshot = build_snapshot(ClusterObjects(queues=[q.build() for q in _queues()]))
    keys = typed_keys(snapshot.queues, "team-b")
    assert [k.key for k in keys] == [H100]
    h100 = {"nvidia.com/gpu.product": "H100"}
    a100 = {"nvidia.com/gpu.product": "A100"}
    placed = typed_gpus(keys, [(h100, 2.0), (a100, 8.0), (h100, 1.0)])
    assert placed == Resources({H100: 3.0})
    ledger = QueueLedger(snapshot.queues, {})
    ledger.add_typed("team-b", Resources({H100: 2.0}))
    assert typed_limit_refusal(ledger, "team-b", placed) == (
        f"queue team-b is at its limit of 4 {H100} GPUs: it holds 2 and the job asks for 3"
    )


@pytest.mark.parametrize(
    ("resource", "amount", "text"),
    [
        pytest.param(GPU, 1, "1 GPU", id="one GPU"),
        pytest.param(GPU, 16, "16 GPUs", id="GPUs"),
        pytest.param("memory", 2**30 * 64, "64Gi memory", id="memory in binary units"),
        pytest.param("cpu", 0.5, "500m cpu", id="cpu in millicores"),
    ],
)
def test_describe(resource: str, amount: float, text: str) -> None:
    assert describe(resource, amount) == text
