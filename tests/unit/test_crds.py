"""The committed CRDs match the models, and carry what a person and the API server need."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from kai_ray.tools.crds import CRD_SPECS, build_crd, crd_filename, render_crd

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("kind", sorted(CRD_SPECS))
def test_committed_crd_matches_the_model(kind: str) -> None:
    committed = (ROOT / "crds" / crd_filename(kind)).read_text()
    assert committed == render_crd(kind), f"crds/ drifted from the models: run `make crds` ({kind})"


def _schema(kind: str) -> dict:  # type: ignore[type-arg]
    return build_crd(kind)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def _all_nodes(node: object) -> list[dict]:  # type: ignore[type-arg]
    found = []
    if isinstance(node, dict):
        found.append(node)
        for value in node.values():
            found.extend(_all_nodes(value))
    elif isinstance(node, list):
        for value in node:
            found.extend(_all_nodes(value))
    return found


@pytest.mark.parametrize("kind", sorted(CRD_SPECS))
def test_schema_is_structural(kind: str) -> None:
    for node in _all_nodes(_schema(kind)):
        assert "$ref" not in node and "title" not in node and "allOf" not in node
        if "anyOf" in node:
            assert node.get("x-kubernetes-int-or-string") is True
        if "properties" in node or "additionalProperties" in node:
            assert node.get("type") == "object"


def test_podgroup_has_short_name_pg_and_status_subresource() -> None:
    crd = build_crd("PodGroup")
    assert "pg" in crd["spec"]["names"]["shortNames"]
    assert crd["spec"]["versions"][0]["subresources"] == {"status": {}}


@pytest.mark.parametrize(
    ("kind", "columns"),
    [
        (
            "Queue",
            [
                "Parent",
                "Priority",
                "GPU Quota",
                "GPU Allocated",
                "GPU Fair Share",
                "Pending",
                "Quota Over-Committed",
                "Age",
            ],
        ),
        ("PodGroup", ["Queue", "Phase", "Min", "Bound", "Running", "Reason", "Age"]),
    ],
)
def test_printer_columns(kind: str, columns: list[str]) -> None:
    names = [c["name"] for c in build_crd(kind)["spec"]["versions"][0]["additionalPrinterColumns"]]
    assert names == columns


def _columns(kind: str) -> list[dict]:  # type: ignore[type-arg]
    return build_crd(kind)["spec"]["versions"][0]["additionalPrinterColumns"]  # type: ignore[no-any-return]


def _field(kind: str, json_path: str) -> dict | None:  # type: ignore[type-arg]
    """The schema of `.a.b.c`; a map's entry is its `additionalProperties`; a filtered
    list, `.a[?(@.type=="X")].b`, is read through its `items`."""
    node: dict | None = _schema(kind)  # type: ignore[type-arg]
    for part in re.sub(r"\[\?\(.*?\)\]", "[]", json_path).strip(".").split("."):
        listed = part.endswith("[]")
        part = part.removesuffix("[]")
        if node is None:
            return None
        if "properties" in node:
            node = node["properties"].get(part)
        else:
            node = node.get("additionalProperties")
        if listed and node is not None:
            node = node.get("items")
    return node


@pytest.mark.parametrize("kind", sorted(CRD_SPECS))
def test_every_printer_column_reads_a_field_of_the_schema(kind: str) -> None:
    for column in _columns(kind):
        path = column["jsonPath"]
        if path.startswith(".metadata") or "[*]" in path:
            continue
        assert _field(kind, path) is not None, f"{kind} column {column['name']}: no {path}"


@pytest.mark.parametrize("kind", sorted(CRD_SPECS))
def test_status_columns_have_no_schema_default(kind: str) -> None:
    """A default shows in `kubectl get` as if the operator had written it (0 pending)."""
    for column in _columns(kind):
        if column["jsonPath"].startswith(".status"):
            assert "default" not in (_field(kind, column["jsonPath"]) or {}), column["name"]


@pytest.mark.parametrize("kind", sorted(CRD_SPECS))
def test_every_kind_has_a_status_schema_with_conditions(kind: str) -> None:
    """With a status subresource and no status schema, the API server drops the status."""
    status = _schema(kind)["properties"]["status"]
    assert status["properties"]["conditions"]["type"] == "array"


def _rules(kind: str) -> list[str]:
    return [
        rule["rule"]
        for node in _all_nodes(_schema(kind))
        for rule in node.get("x-kubernetes-validations", [])
    ]


def test_queue_cel_rules_check_quota_within_limit_and_no_negatives() -> None:
    rules = " ".join(_rules("Queue"))
    assert "compareTo" in rules and "isLessThan" in rules


def test_topology_cel_rules_check_unique_levels() -> None:
    assert any("exists_one" in rule for rule in _rules("Topology"))


def test_podgroup_min_member_is_not_negative() -> None:
    spec = _schema("PodGroup")["properties"]["spec"]["properties"]
    assert spec["minMember"]["minimum"] == 0


def test_crds_are_valid_yaml_with_the_group() -> None:
    for kind in CRD_SPECS:
        doc = yaml.safe_load(render_crd(kind))
        assert doc["spec"]["group"] == "scheduling.kai-ray.io"
