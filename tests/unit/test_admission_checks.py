"""What the validating webhook refuses (kai_ray.effects.admission_checks), and the
controller's judging of an update against the object's old version."""

from __future__ import annotations

from typing import Any

import kopf
import pytest

from kai_ray import controller
from kai_ray.effects.admission_checks import (
    deprecation_warnings,
    queue_refusals,
    queue_warnings,
    refusal_message,
    workload_refusals,
)
from kai_ray.values.api import API_VERSION


def queue(name: str, parent: str | None = None, **resources: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"resources": {k.replace("_", "."): v for k, v in resources.items()}}
    if parent is not None:
        spec["parentQueue"] = parent
    return {"apiVersion": API_VERSION, "kind": "Queue", "metadata": {"name": name}, "spec": spec}


def group(queue_name: str, **extra: Any) -> dict[str, Any]:
    meta = {"name": "g", "namespace": "ml", **extra.pop("metadata", {})}
    return {
        "apiVersion": API_VERSION,
        "kind": "PodGroup",
        "metadata": meta,
        "spec": {"queue": queue_name},
        **extra,
    }


def by_name(*queues: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {q["metadata"]["name"]: q for q in queues}


def test_children_fit_their_parent_per_resource_and_only_where_it_has_a_quota() -> None:
    tree = by_name(
        queue("dept", gpu={"quota": 8}),
        queue("a", "dept", gpu={"quota": 6}, cpu={"quota": 100}),
    )
    # cpu: the parent promises none, so its children's cpu quotas over-commit nothing
    assert queue_refusals(queue("b", "dept", gpu={"quota": 2}, cpu={"quota": 50}), tree, []) == []
    refused = queue_refusals(queue("b", "dept", gpu={"quota": "2.5"}), tree, [])
    assert [(p.field, p.obj.name) for p in refused] == [("spec.resources.gpu.quota", "b")]
    assert "add up to 8.5 gpu, more than its quota of 8" in refused[0].message


def test_a_queue_under_a_parent_holding_only_finished_workloads_is_admitted() -> None:
    tree = by_name(queue("a"))
    done = group("a", status={"phase": "Succeeded"})
    assert queue_refusals(queue("b", "a"), tree, [done]) == []
    waiting = group("a", status={"phase": "Pending"})
    assert [p.field for p in queue_refusals(queue("b", "a"), tree, [waiting])] == [
        "spec.parentQueue"
    ]


def test_a_podgroup_kai_ray_derived_is_judged_by_its_workload() -> None:
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "1"}
    derived = group("missing", metadata={"ownerReferences": [owner]})
    assert workload_refusals(derived, {}, "kai-ray") == []
    refused = workload_refusals(group("missing"), {}, "kai-ray")
    assert refusal_message(refused).startswith("PodGroup \"ml/g\": spec.queue: queue 'missing'")


def test_pods_of_other_schedulers_are_never_judged() -> None:
    other = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "ml", "labels": {"kai-ray.io/queue": "nope"}},
        "spec": {"schedulerName": "default-scheduler", "containers": []},
    }
    assert workload_refusals(other, {}, "kai-ray") == []
    ours = {**other, "spec": {"schedulerName": "kai-ray", "containers": []}}
    assert [p.field for p in workload_refusals(ours, {}, "kai-ray")] == [
        "metadata.labels[kai-ray.io/queue]"
    ]


def test_deprecated_fields_are_named_in_warnings() -> None:
    table = {"Queue": (("spec.priority", "use spec.rank"),)}
    body = queue("a")
    assert deprecation_warnings("Queue", body, table) == []
    body["spec"]["priority"] = 3
    assert deprecation_warnings("Queue", body, table) == [
        "Queue 'a': spec.priority is deprecated, use spec.rank"
    ]


def test_an_update_is_refused_only_for_what_it_makes_wrong() -> None:
    """The quotas already over-committed stay writable (a label, a priority), but
    raising one further is refused, as is any problem the old version had not."""
    tree = by_name(queue("dept", gpu={"quota": 4}), queue("a", "dept", gpu={"quota": 6}))

    def refusals(body: kopf.Body) -> list[Any]:
        return queue_refusals(body, tree, [])

    old = kopf.Body(queue("a", "dept", gpu={"quota": 6}))
    relabelled = kopf.Body(
        {**queue("a", "dept", gpu={"quota": 6}), "metadata": {"name": "a", "labels": {"team": "x"}}}
    )
    controller._judge("Queue", relabelled, old, [], refusals)
    with pytest.raises(kopf.AdmissionError, match=r"add up to 7 gpu"):
        controller._judge(
            "Queue", kopf.Body(queue("a", "dept", gpu={"quota": 7})), old, [], refusals
        )


def test_a_failing_check_admits() -> None:
    def broken(body: kopf.Body) -> list[Any]:
        raise RuntimeError("a bug")

    controller._judge("Queue", kopf.Body(queue("a")), None, [], broken)


def test_a_parent_that_does_not_exist_yet_is_a_warning_and_a_cycle_a_refusal() -> None:
    """Trees are applied in any order (Helm writes a chart's Queues at once): a
    missing parent is admitted with a warning; a cycle of parents is refused."""
    queues = by_name(queue("dept"), queue("team", "dept"))
    orphan = queue("orphan", "later")
    assert queue_refusals(orphan, queues, []) == []
    assert queue_warnings(orphan, queues) == [
        "Queue 'orphan': spec.parentQueue: parent queue 'later' does not exist yet; "
        "this queue takes no workloads until it does"
    ]
    assert queue_warnings(queue("team-b", "dept"), queues) == []
    looped = queue("dept", "team")
    refused = queue_refusals(looped, queues, [])
    assert [p.field for p in refused] == ["spec.parentQueue"]
    assert "cycle" in refused[0].message
    assert queue_warnings(looped, queues) == []
