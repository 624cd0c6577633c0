"""SchedulerConfig defaults, durations, and the API models' defaults."""

from __future__ import annotations

import math

import pytest

from kai_ray.values.api import PodGroup, Queue, Topology
from kai_ray.values.config import DEFAULT_ACTIONS, SchedulerConfig, duration_seconds
from kai_ray.values.errors import InvalidObjectError
from kai_ray.values.validation import field_path, parse_model


def test_config_defaults() -> None:
    spec = SchedulerConfig().spec
    assert spec.actions == list(DEFAULT_ACTIONS)
    assert spec.timeBasedFairness.k == 0
    assert spec.staleGangGracePeriod == "60s"
    assert spec.consolidationMinRuntime == "60s"
    assert spec.placementStrategy == "fragmentation"


@pytest.mark.parametrize(("text", "seconds"), [("90s", 90), ("1h30m", 5400), ("250ms", 0.25)])
def test_durations(text: str, seconds: float) -> None:
    assert duration_seconds(text) == seconds


@pytest.mark.parametrize("text", ["", "5", "1d", "m5", "1h 30m"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError):
        duration_seconds(text)


def test_queue_defaults_unset_quota_zero_unset_limit_unlimited_weight_one() -> None:
    queue = Queue.model_validate({"metadata": {"name": "q"}, "spec": {"resources": {"gpu": {}}}})
    gpu = queue.spec.resources["gpu"]
    assert gpu.quota_amount == 0 and math.isinf(gpu.limit_amount) and gpu.overQuotaWeight == 1
    assert queue.spec.priority == 100


def test_queue_accepts_quantities_and_per_gpu_type_keys() -> None:
    queue = Queue.model_validate(
        {
            "metadata": {"name": "q"},
            "spec": {
                "resources": {
                    "cpu": {"quota": "500m"},
                    "memory": {"limit": "64Gi"},
                    "nvidia.com/gpu.product=H100": {"quota": 4},
                    "gpu": {"quota": "0.5"},
                }
            },
        }
    )
    assert queue.spec.resources["cpu"].quota_amount == 0.5
    assert queue.spec.resources["memory"].limit_amount == 64 * 2**30
    assert queue.spec.resources["gpu"].quota_amount == 0.5


def test_podgroup_defaults() -> None:
    group = PodGroup.model_validate({"metadata": {"name": "g"}, "spec": {"queue": "q"}})
    assert group.spec.minMember == 1 and group.spec.preemptible is None


def test_topology_resolves_levels_by_label_or_alias() -> None:
    topo = Topology.model_validate(
        {
            "metadata": {"name": "t"},
            "spec": {
                "levels": [
                    {"nodeLabel": "kai-ray.io/rack", "alias": "rack"},
                    {"nodeLabel": "kubernetes.io/hostname"},
                ]
            },
        }
    )
    assert topo.spec.resolve("rack") == "kai-ray.io/rack"
    assert topo.spec.resolve("kai-ray.io/rack") == "kai-ray.io/rack"
    assert topo.spec.resolve("zone") is None


def test_parse_model_names_object_and_every_field() -> None:
    raw = {
        "kind": "Queue",
        "metadata": {"name": "q"},
        "spec": {"priority": "x", "resources": {"gpu": {"quota": -1}}},
    }
    with pytest.raises(InvalidObjectError) as err:
        parse_model(Queue, raw, "queues.yaml")
    text = str(err.value)
    assert "queues.yaml: Queue q: spec.priority" in text
    assert "spec.resources.gpu.quota" in text


@pytest.mark.parametrize(
    ("location", "path"),
    [
        (("spec", "subGroups", 0, "minMember"), "spec.subGroups[0].minMember"),
        (("spec", "resources", "nvidia.com/gpu", "quota"), "spec.resources[nvidia.com/gpu].quota"),
        ((), "(object)"),
    ],
)
def test_field_path(location: tuple[int | str, ...], path: str) -> None:
    assert field_path(location) == path
