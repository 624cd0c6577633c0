"""The operator's `Valid` condition on kai-ray objects."""

from __future__ import annotations

from kai_ray.effects.reporting import merge_condition, validity_condition

NOW = "2026-12-02T00:00:00Z"


def test_a_valid_queue_is_reported_valid() -> None:
    body = {
        "apiVersion": "scheduling.kai-ray.io/v1alpha1",
        "kind": "Queue",
        "metadata": {"name": "q", "uid": "1", "resourceVersion": "5"},
        "spec": {"resources": {"gpu": {"quota": 4}}},
        "status": {"kopf": {}},
    }
    condition = validity_condition("Queue", body, NOW)
    assert condition["status"] == "True"


def test_an_invalid_podgroup_names_the_field() -> None:
    body = {
        "apiVersion": "scheduling.kai-ray.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": "g", "namespace": "ml"},
        "spec": {"queue": "q", "subGroups": [{"name": "a"}, {"name": "a"}]},
    }
    condition = validity_condition("PodGroup", body, NOW)
    assert condition["status"] == "False"
    assert "spec.subGroups[1].name" in condition["message"]


def test_merge_keeps_transition_time_when_status_unchanged() -> None:
    old = [
        {"type": "Valid", "status": "True", "lastTransitionTime": "earlier"},
        {"type": "Other", "status": "True"},
    ]
    new = {
        "type": "Valid",
        "status": "True",
        "reason": "SpecValid",
        "message": "",
        "lastTransitionTime": NOW,
    }
    merged = merge_condition(old, new)
    assert {c["type"] for c in merged} == {"Valid", "Other"}
    assert next(c for c in merged if c["type"] == "Valid")["lastTransitionTime"] == "earlier"
