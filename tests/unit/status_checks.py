"""Holding a status body to what the API server keeps: the model and the CRD schema.

The API server prunes fields its structural schema does not name and refuses
values of the wrong type; `closed_status_schema` turns the generated CRD's status
schema into a JSON schema that refuses both (every object with `properties`
closed), so a test fails where the API server would drop data without a word.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jsonschema

from kai_ray.tools.crds import build_crd
from kai_ray.values.api import API_KINDS


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386, as the API server applies `application/merge-patch+json`."""
    if not isinstance(patch, Mapping):
        return patch
    merged = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = merge_patch(merged.get(key), value)
    return merged


def _closed(node: Any) -> Any:
    if isinstance(node, list):
        return [_closed(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: _closed(value) for key, value in node.items()}
    if "properties" in node and not node.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


def closed_status_schema(kind: str) -> dict[str, Any]:
    schema = build_crd(kind)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return _closed(schema["properties"]["status"])  # type: ignore[no-any-return]


def assert_kept_by_the_api_server(kind: str, status: Mapping[str, Any]) -> None:
    """`status` (after the merge patch) survives the CRD schema whole and reads back
    through the model, as the next snapshot reads it."""
    jsonschema.validate(dict(status), closed_status_schema(kind))
    model = API_KINDS[kind]
    body: dict[str, Any] = {"metadata": {"name": "x", "namespace": "ns"}, "status": status}
    if kind == "PodGroup":
        body["spec"] = {"queue": "q"}
    if kind == "Topology":
        body["spec"] = {"levels": [{"nodeLabel": "kubernetes.io/hostname"}]}
    model.model_validate(body)
