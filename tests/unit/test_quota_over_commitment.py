"""Quotas that add up to more than there is: still deserved, and a warning on the Queue."""

from __future__ import annotations

import pytest

from kai_ray.decisions.cycle import CycleResult, run_cycle
from kai_ray.decisions.fairness import OverCommitment, over_committed
from kai_ray.effects.status import QUOTA_OVER_COMMITTED, queue_status
from kai_ray.sim.tables import over_commitment_line
from kai_ray.state.snapshot import ClusterObjects, Snapshot, build_snapshot
from kai_ray.values.config import SchedulerConfig
from kai_ray.values.resources import GPU, Resources
from tests.builders import make_node, make_pod, make_pod_group, make_queue


def snapshot(quotas: dict[str, tuple[str | None, int]], nodes: int = 2) -> Snapshot:
    """Queues by name: (parent, GPU quota); `nodes` nodes of 8 GPUs; a 4-GPU job per leaf."""
    queues = [
        (make_queue(name).parent(parent) if parent else make_queue(name)).gpu(quota).build()
        for name, (parent, quota) in quotas.items()
    ]
    parents = {parent for parent, _ in quotas.values()}
    leaves = [name for name in quotas if name not in parents]
    groups = [make_pod_group(leaf).queue(leaf).min_member(1).build() for leaf in leaves]
    pods = [make_pod(f"{leaf}-0").group(leaf).gpus(4).build() for leaf in leaves]
    node_objects = [make_node(f"n{i}").gpus(8).build() for i in range(nodes)]
    return build_snapshot(ClusterObjects(node_objects, pods, groups, queues=queues))


def cycle(state: Snapshot) -> CycleResult:
    return run_cycle(state, SchedulerConfig(), 1, 1000.0)


@pytest.mark.parametrize(
    ("quotas", "found"),
    [
        pytest.param(
            {"a": (None, 12), "b": (None, 12)},
            [OverCommitment(None, ("a", "b"), GPU, 24, 16)],
            id="top-level quotas over the cluster",
        ),
        pytest.param({"a": (None, 8), "b": (None, 8)}, [], id="quotas that fit warn of nothing"),
        pytest.param(
            {"dept": (None, 8), "a": ("dept", 6), "b": ("dept", 6)},
            [OverCommitment("dept", ("a", "b"), GPU, 12, 8)],
            id="children's quotas over their parent's quota",
        ),
        pytest.param(
            {"dept": (None, 0), "a": ("dept", 6), "b": ("dept", 6)},
            [],
            id="a parent without a quota promises its children nothing to over-commit",
        ),
    ],
)
def test_over_committed_levels(
    quotas: dict[str, tuple[str | None, int]], found: list[OverCommitment]
) -> None:
    state = snapshot(quotas)
    assert over_committed(state.queues, Resources({GPU: 16.0})) == found
    assert cycle(state).over_committed == tuple(found)


def test_the_queue_carries_a_warning_while_its_quotas_are_over_committed() -> None:
    state = snapshot({"a": (None, 12), "b": (None, 12)})
    status = queue_status("a", state, cycle(state), 0)
    (warning,) = [c for c in status["conditions"] if c["type"] == QUOTA_OVER_COMMITTED]
    assert (warning["status"], warning["reason"]) == ("True", "QuotasExceedCapacity")
    assert "top-level queues add up to 24 gpu; the cluster has 16" in warning["message"]
    assert status["fairShare"]["gpu"] == 4  # what it asks for: quota up to the request


def test_the_warning_goes_once_the_quotas_fit() -> None:
    state = snapshot({"a": (None, 8), "b": (None, 8)})
    before = {"conditions": [{"type": QUOTA_OVER_COMMITTED, "status": "True"}]}
    status = queue_status("a", state, cycle(state), 0, previous=before)
    assert QUOTA_OVER_COMMITTED not in [c["type"] for c in status["conditions"]]


def test_the_simulator_prints_the_warning() -> None:
    warning = {
        "parent": None,
        "queues": ["a", "b"],
        "resource": GPU,
        "quotas": 24.0,
        "available": 12.0,
        "first_s": 0.0,
    }
    line = over_commitment_line(warning)
    assert "a, b add up to 24 nvidia.com/gpu, more than the cluster has 12" in line
