"""The committed CRDs match the models, and carry what a person and the API server need."""

from __future__ import annotations

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
        ("Queue", ["Parent", "Priority", "GPU Quota", "GPU Allocated", "GPU Fair Share", "Age"]),
        ("PodGroup", ["Queue", "Phase", "Min Member", "Running", "Reason", "Age"]),
    ],
)
def test_printer_columns(kind: str, columns: list[str]) -> None:
    names = [c["name"] for c in build_crd(kind)["spec"]["versions"][0]["additionalPrinterColumns"]]
    for column in columns:
        assert column in names


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
