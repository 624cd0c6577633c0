"""A PodGroup's own `placementStrategy` (or its workload's annotation): validated by name,
and it replaces only the strategy."""

from __future__ import annotations

import pytest

from kai_ray.decisions.placement.gang import gang_config
from kai_ray.effects.reporting import validity_condition
from kai_ray.state.groups import PodGroupState
from kai_ray.values.api import PodGroupSpec
from kai_ray.values.config import SchedulerConfigSpec
from kai_ray.values.errors import InvalidObjectError
from kai_ray.workloads.grouping import derive_group, derive_groups
from tests.unit.workload_builders import job

NOW = "2026-12-03T00:00:00Z"


def _body(strategy: str) -> dict[str, object]:
    return {
        "apiVersion": "scheduling.kai-ray.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": "g", "namespace": "ml"},
        "spec": {"queue": "q", "placementStrategy": strategy},
    }


def test_an_unknown_strategy_is_refused_naming_the_field() -> None:
    condition = validity_condition("PodGroup", _body("pack"), NOW)
    assert condition["status"] == "False"
    assert "spec.placementStrategy" in condition["message"]


def test_fragmentation_is_global_only() -> None:
    condition = validity_condition("PodGroup", _body("fragmentation"), NOW)
    assert condition["status"] == "False"


def test_a_known_strategy_is_valid() -> None:
    assert validity_condition("PodGroup", _body("spread"), NOW)["status"] == "True"


def _group(spec: PodGroupSpec) -> PodGroupState:
    return PodGroupState("ml/g", "g", "ml", spec, None, NOW, ())


def test_unset_keeps_the_configuration_itself() -> None:
    config = SchedulerConfigSpec(placementStrategy="spread")
    group = _group(PodGroupSpec(queue="q"))
    assert gang_config(config, group) is config


def test_set_replaces_only_the_strategy() -> None:
    config = SchedulerConfigSpec(placementStrategy="spread", consolidationMaxJobs=3)
    placed = gang_config(config, _group(PodGroupSpec(queue="q", placementStrategy="binpack")))
    assert placed.placementStrategy == "binpack"
    assert placed.model_dump(exclude={"placementStrategy"}) == config.model_dump(
        exclude={"placementStrategy"}
    )


def test_a_workload_annotation_becomes_the_derived_group_strategy() -> None:
    obj = job(annotations={"kai-ray.io/placement-strategy": "spread"})
    assert derive_group(obj).pod_group.spec.placementStrategy == "spread"


def test_a_workload_without_the_annotation_has_no_strategy() -> None:
    assert derive_group(job()).pod_group.spec.placementStrategy is None


def test_an_unknown_annotation_value_is_refused_naming_the_annotation() -> None:
    with pytest.raises(InvalidObjectError) as caught:
        derive_groups(job(annotations={"kai-ray.io/placement-strategy": "pack"}))
    fields = [p.field for p in caught.value.problems]
    assert "metadata.annotations[kai-ray.io/placement-strategy]" in fields
