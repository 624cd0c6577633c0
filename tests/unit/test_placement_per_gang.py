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


@pytest.mark.parametrize(("strategy", "devices"), [("spread", 4), ("binpack", 1)])
def test_a_gangs_strategy_spreads_or_packs_its_gpu_shares_over_devices(
    strategy: str, devices: int
) -> None:
    """Spread gives each share the device with the most room (an untouched one
    first); bin-packing stacks them on the fullest device that holds them."""
    from kai_ray.decisions.cycle import run_cycle
    from kai_ray.state.snapshot import ClusterObjects, build_snapshot
    from kai_ray.values.config import SchedulerConfig
    from tests.builders import make_node, make_pod, make_pod_group, make_queue

    group = make_pod_group("shares").queue("q").min_member(4)
    group.set("spec.placementStrategy", strategy)
    objects = ClusterObjects(
        nodes=[make_node("n1").gpus(4).build()],
        queues=[make_queue("q").build()],
        pod_groups=[group.build()],
        pods=[make_pod(f"s{i}").group("shares").gpu_fraction("0.25").build() for i in range(4)],
    )
    binds = run_cycle(build_snapshot(objects), SchedulerConfig(), 1, 0.0).plan.binds
    assert len(binds) == 4
    assert len({bind.gpu_devices for bind in binds}) == devices
