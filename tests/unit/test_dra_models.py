"""DRA models: resource.k8s.io/v1 YAML round-trips, and bad input named by field."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from kai_ray.values.dra import (
    DeviceClass,
    ResourceClaim,
    ResourceClaimTemplate,
    ResourceSlice,
)
from kai_ray.values.errors import InvalidFieldError, InvalidObjectError
from kai_ray.values.validation import parse_model
from kai_ray.workloads.pod_claims import PodClaim, pod_claims

FIXTURES = Path(__file__).parent.parent / "fixtures" / "dra"
MODELS: dict[str, type[BaseModel]] = {
    "DeviceClass": DeviceClass,
    "ResourceSlice": ResourceSlice,
    "ResourceClaim": ResourceClaim,
    "ResourceClaimTemplate": ResourceClaimTemplate,
}


def load(name: str) -> dict[str, Any]:
    raw = yaml.safe_load((FIXTURES / name).read_text())
    assert isinstance(raw, dict)
    return raw


@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.glob("*.yaml")))
def test_v1_yaml_round_trips_field_for_field(name: str) -> None:
    raw = load(name)
    model = parse_model(MODELS[raw["kind"]], raw, name)
    assert model.model_dump(mode="json", by_alias=True, exclude_unset=True) == raw


def test_a_claim_reads_as_written() -> None:
    claim = parse_model(ResourceClaim, load("resourceclaim.yaml"))
    gpus, nic = claim.spec.devices.requests
    assert gpus.exactly is not None and gpus.exactly.device_count == 2
    assert [n for n, _ in nic.alternatives()] == ["nic/fast", "nic/any"]
    assert claim.spec.devices.constraints[0].attribute == "gpu.example.com/cliqueId"
    assert claim.status.allocation is not None
    assert [r.device for r in claim.status.allocation.devices.results] == [
        "gpu-0",
        "gpu-1",
        "nic-0",
    ]


def test_count_defaults_to_one_and_all_is_read() -> None:
    template = parse_model(ResourceClaimTemplate, load("resourceclaimtemplate.yaml"))
    request = template.spec.spec.devices.requests[0].exactly
    assert request is not None and request.allocationMode == "All"
    slice_ = parse_model(ResourceSlice, load("resourceslice-node.yaml"))
    assert slice_.spec.devices[0].attributes["index"].typed == ("int", 0)
    assert slice_.spec.devices[0].attributes["driverVersion"].typed == ("version", "550.54.15")


def test_a_newer_driver_field_does_not_hide_a_slice() -> None:
    raw = load("resourceslice-node.yaml")
    raw["spec"]["devices"][0]["fieldOfAFutureRelease"] = {"x": 1}
    raw["spec"]["fieldOfAFutureRelease"] = True
    assert len(parse_model(ResourceSlice, raw).spec.devices) == 2


def _edited(name: str, path: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    raw = copy.deepcopy(load(name))
    target: Any = raw
    for part in path[:-1]:
        target = target[part]
    if value is _DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return raw


_DELETE = object()
_REQUEST = ("spec", "devices", "requests", 0)
_GPUS = (*_REQUEST, "exactly")


@pytest.mark.parametrize(
    ("name", "path", "value", "field", "words"),
    [
        pytest.param(
            "resourceclaim.yaml",
            (*_GPUS, "cout"),
            2,
            "spec.devices.requests[0].exactly.cout",
            "Extra inputs",
            id="a misspelt request field is refused, not ignored",
        ),
        pytest.param(
            "resourceclaim.yaml",
            (*_GPUS, "allocationMode"),
            "All",
            "spec.devices.requests[0].exactly.count",
            "must not be set",
            id="count with allocationMode All",
        ),
        pytest.param(
            "resourceclaim.yaml",
            (*_GPUS, "allocationMode"),
            "Some",
            "spec.devices.requests[0].exactly.allocationMode",
            "ExactCount",
            id="an unknown allocation mode",
        ),
        pytest.param(
            "resourceclaim.yaml",
            (*_GPUS, "count"),
            0,
            "spec.devices.requests[0].exactly.count",
            "greater than or equal to 1",
            id="count zero",
        ),
        pytest.param(
            "resourceclaim.yaml",
            (*_GPUS, "deviceClassName"),
            _DELETE,
            "spec.devices.requests[0].exactly.deviceClassName",
            "required",
            id="a request without a device class",
        ),
        pytest.param(
            "resourceclaim.yaml",
            (*_REQUEST, "firstAvailable"),
            [{"name": "a", "deviceClassName": "c"}],
            "spec.devices.requests[0]",
            "exactly one of exactly, firstAvailable",
            id="exactly and firstAvailable together",
        ),
        pytest.param(
            "resourceclaim.yaml",
            ("spec", "devices", "constraints", 0, "matchAttribute"),
            "cliqueId",
            "spec.devices.constraints[0].matchAttribute",
            "<domain>/<name>",
            id="matchAttribute without its domain",
        ),
        pytest.param(
            "resourceclaim.yaml",
            ("spec", "devices", "constraints", 0, "requests"),
            ["gpu"],
            "spec.devices.constraints[0].requests",
            "no request named 'gpu'",
            id="a constraint naming no request",
        ),
        pytest.param(
            "resourceslice-node.yaml",
            ("spec", "allNodes"),
            True,
            "spec",
            "exactly one of nodeName, nodeSelector, allNodes",
            id="a slice for one node and all nodes",
        ),
        pytest.param(
            "resourceslice-node.yaml",
            ("spec", "devices", 0, "attributes", "index"),
            {"int": 1, "string": "1"},
            "spec.devices[0].attributes.index",
            "exactly one of int",
            id="an attribute with two values",
        ),
        pytest.param(
            "resourceslice-node.yaml",
            ("spec", "devices", 0, "capacity", "memory", "value"),
            "lots",
            "spec.devices[0].capacity.memory.value",
            "not a Kubernetes quantity",
            id="a capacity that is not a quantity",
        ),
        pytest.param(
            "resourceslice-pool.yaml",
            ("spec", "nodeSelector", "nodeSelectorTerms", 0, "matchExpressions", 0, "operator"),
            "Near",
            "spec.nodeSelector.nodeSelectorTerms[0].matchExpressions[0].operator",
            "'In'",
            id="a node selector with an unknown operator",
        ),
        pytest.param(
            "deviceclass.yaml",
            ("spec", "selectors", 0),
            {"cel": {"expression": ""}},
            "spec.selectors[0].cel.expression",
            "at least 1 character",
            id="an empty selector",
        ),
    ],
)
def test_bad_input_names_the_field(
    name: str, path: tuple[str | int, ...], value: Any, field: str, words: str
) -> None:
    raw = _edited(name, path, value)
    with pytest.raises(InvalidObjectError) as caught:
        parse_model(MODELS[raw["kind"]], raw, name)
    problems = caught.value.problems
    assert any(p.field == field and words in p.message for p in problems), [
        str(p) for p in problems
    ]


def _pod(
    claims: list[dict[str, Any]], statuses: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    pod: dict[str, Any] = {"metadata": {"name": "p"}, "spec": {"resourceClaims": claims}}
    if statuses is not None:
        pod["status"] = {"resourceClaimStatuses": statuses}
    return pod


def test_a_pods_claims_by_name_and_from_templates() -> None:
    pod = _pod(
        [
            {"name": "shared", "resourceClaimName": "gang-nvlink"},
            {"name": "gpus", "resourceClaimTemplateName": "all-gpus"},
            {"name": "unused", "resourceClaimTemplateName": "none-needed"},
            {"name": "later", "resourceClaimTemplateName": "all-gpus"},
        ],
        [{"name": "gpus", "resourceClaimName": "p-gpus-x7k2q"}, {"name": "unused"}],
    )
    assert pod_claims(pod) == (
        PodClaim("shared", "gang-nvlink"),
        PodClaim("gpus", "p-gpus-x7k2q", "all-gpus"),
        PodClaim("later", None, "all-gpus"),
    )


@pytest.mark.parametrize(
    ("claims", "field"),
    [
        pytest.param(
            [{"name": "a", "resourceClaimName": "x", "resourceClaimTemplateName": "y"}],
            "spec.resourceClaims[0]",
            id="a claim and a template in one entry",
        ),
        pytest.param([{"resourceClaimName": "x"}], "spec.resourceClaims[0].name", id="no name"),
        pytest.param(
            [{"name": "a", "resourceClaimName": "x"}, {"name": "a", "resourceClaimName": "y"}],
            "spec.resourceClaims",
            id="one entry name twice",
        ),
    ],
)
def test_bad_pod_claims_name_the_field(claims: list[dict[str, Any]], field: str) -> None:
    with pytest.raises(InvalidFieldError) as caught:
        pod_claims(_pod(claims))
    assert caught.value.field == field
