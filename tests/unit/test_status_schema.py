"""The check the status tests rely on refuses what the API server would drop or refuse."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest
from pydantic import ValidationError

from tests.unit.status_checks import assert_kept_by_the_api_server, merge_patch

CONDITION = {"type": "Valid", "status": "True", "reason": "SpecValid", "message": ""}


@pytest.mark.parametrize(
    ("kind", "status"),
    [
        pytest.param("PodGroup", {"phase": "Running", "queue": "q"}, id="a field the schema lacks"),
        pytest.param("PodGroup", {"phase": "Starting"}, id="a phase the enum lacks"),
        pytest.param("Queue", {"allocated": {"gpu": 2.5}}, id="a fractional GPU as a number"),
        pytest.param("Queue", {"usage": {"gpu": "1e-07"}}, id="a negative exponent"),
        pytest.param("Queue", {"pendingWorkloads": -1}, id="a negative count"),
        pytest.param(
            "Queue", {"conditions": [{**CONDITION, "lastTransitionTime": None}]}, id="a null time"
        ),
    ],
)
def test_what_the_api_server_would_drop_or_refuse_fails(kind: str, status: dict[str, Any]) -> None:
    with pytest.raises((jsonschema.ValidationError, ValidationError)):
        assert_kept_by_the_api_server(kind, status)


def test_a_topology_keeps_its_valid_condition() -> None:
    assert_kept_by_the_api_server("Topology", {"conditions": [CONDITION]})


@pytest.mark.parametrize(
    ("target", "patch", "merged"),
    [
        pytest.param(
            {"a": {"x": 1, "y": 2}}, {"a": {"y": None}}, {"a": {"x": 1}}, id="null removes"
        ),
        pytest.param({"l": [1, 2]}, {"l": [3]}, {"l": [3]}, id="lists are replaced whole"),
        pytest.param({}, {"a": {"b": 1}}, {"a": {"b": 1}}, id="maps are made"),
    ],
)
def test_merge_patch(target: Any, patch: Any, merged: Any) -> None:
    assert merge_patch(target, patch) == merged
