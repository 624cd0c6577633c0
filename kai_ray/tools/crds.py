"""Generate the CustomResourceDefinitions in `crds/` from the pydantic models.

The models in `kai_ray.values.api` are the single source of truth; this module
turns their JSON schema into Kubernetes structural schemas (references inlined,
nullable unions collapsed, titles dropped), adds the CEL rules each model
declares in its `CEL` class attribute, and the printer columns a person sees in
`kubectl get`. Pure apart from `write_crds`, which writes files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from kai_ray.values import api
from kai_ray.values.api import ApiModel

_KEEP_KEYS = {
    "type",
    "properties",
    "additionalProperties",
    "items",
    "required",
    "enum",
    "description",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "maxProperties",
    "pattern",
    "anyOf",
    "x-kubernetes-int-or-string",
    "x-kubernetes-validations",
    "x-kubernetes-preserve-unknown-fields",
    "default",
    "format",
    "exclusiveMinimum",
}

_AGE = {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}

CRD_SPECS: dict[str, dict[str, Any]] = {
    "Queue": {
        "model": api.Queue,
        "plural": "queues",
        "scope": "Cluster",
        "shortNames": ["q"],
        "columns": [
            {"name": "Parent", "type": "string", "jsonPath": ".spec.parentQueue"},
            {"name": "Priority", "type": "integer", "jsonPath": ".spec.priority"},
            {"name": "GPU Quota", "type": "string", "jsonPath": ".spec.resources.gpu.quota"},
            {"name": "GPU Allocated", "type": "string", "jsonPath": ".status.allocated.gpu"},
            {"name": "GPU Fair Share", "type": "string", "jsonPath": ".status.fairShare.gpu"},
            {"name": "Pending", "type": "integer", "jsonPath": ".status.pendingWorkloads"},
            {
                "name": "Quota Over-Committed",
                "type": "string",
                "jsonPath": '.status.conditions[?(@.type=="QuotaOverCommitted")].status',
            },
            _AGE,
        ],
    },
    "PodGroup": {
        "model": api.PodGroup,
        "plural": "podgroups",
        "scope": "Namespaced",
        "shortNames": ["pg"],
        "columns": [
            {"name": "Queue", "type": "string", "jsonPath": ".spec.queue"},
            {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
            {"name": "Min", "type": "integer", "jsonPath": ".spec.minMember"},
            {"name": "Bound", "type": "integer", "jsonPath": ".status.bound"},
            {"name": "Running", "type": "integer", "jsonPath": ".status.running"},
            {"name": "Reason", "type": "string", "jsonPath": ".status.reason"},
            _AGE,
        ],
    },
    "Topology": {
        "model": api.Topology,
        "plural": "topologies",
        "scope": "Cluster",
        "shortNames": ["topo"],
        "columns": [
            {"name": "Levels", "type": "string", "jsonPath": ".spec.levels[*].nodeLabel"},
            _AGE,
        ],
    },
}


def _cel_rules() -> dict[str, list[dict[str, str]]]:
    """CEL rules keyed by model name, from every model that declares `CEL`."""
    rules: dict[str, list[dict[str, str]]] = {}
    for value in vars(api).values():
        if isinstance(value, type) and issubclass(value, ApiModel) and "CEL" in vars(value):
            rules[value.__name__] = list(vars(value)["CEL"])
    return rules


def _structural(node: Any, defs: dict[str, Any], cel: dict[str, list[dict[str, str]]]) -> Any:
    """Inline `$ref`s, collapse `X | None`, keep only keys a CRD schema allows."""
    if isinstance(node, list):
        return [_structural(item, defs, cel) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[-1]
        inlined = _structural(defs[name], defs, cel)
        if name in cel:
            inlined["x-kubernetes-validations"] = cel[name]
        return {**inlined, **_structural(_without(node, "$ref"), defs, cel)}
    if "anyOf" in node and not node.get("x-kubernetes-int-or-string"):
        options = [o for o in node["anyOf"] if o.get("type") != "null"]
        if len(options) == 1:
            return _structural({**_without(node, "anyOf", "default"), **options[0]}, defs, cel)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key not in _KEEP_KEYS or (key == "default" and value in (None, [], {})):
            continue
        if key == "properties":
            out[key] = {k: _structural(v, defs, cel) for k, v in value.items()}
        elif key == "additionalProperties" and isinstance(value, bool):
            continue
        else:
            out[key] = _structural(value, defs, cel)
    return out


def _without(node: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in node.items() if k not in keys}


def _object_schema(model: type[ApiModel]) -> dict[str, Any]:
    schema = model.model_json_schema(mode="validation")
    defs = schema.get("$defs", {})
    cel = _cel_rules()
    props = {
        k: _structural(schema["properties"][k], defs, cel)
        for k in ("spec", "status")
        if k in schema["properties"]
    }
    for part in props.values():
        part.pop("default", None)
    required = [k for k in schema.get("required", []) if k == "spec"]
    return {
        "type": "object",
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            **props,
        },
        **({"required": required} if required else {}),
    }


def build_crd(kind: str) -> dict[str, Any]:
    """The CRD of one kind, as a plain dict ready for YAML."""
    spec = CRD_SPECS[kind]
    plural = spec["plural"]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{api.GROUP}"},
        "spec": {
            "group": api.GROUP,
            "scope": spec["scope"],
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": spec["shortNames"],
                "categories": ["kai-ray"],
            },
            "versions": [
                {
                    "name": api.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": spec["columns"],
                    "schema": {"openAPIV3Schema": _object_schema(spec["model"])},
                }
            ],
        },
    }


def render_crd(kind: str) -> str:
    header = "# Generated by `kai-ray crds` from kai_ray/values/api.py. Do not edit.\n"
    return header + yaml.safe_dump(build_crd(kind), sort_keys=False, width=100)


def crd_filename(kind: str) -> str:
    return f"{api.GROUP}_{CRD_SPECS[kind]['plural']}.yaml"


def write_crds(directory: Path) -> list[Path]:
    """Write one file per kind into `directory`; returns the paths written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for kind in CRD_SPECS:
        path = directory / crd_filename(kind)
        path.write_text(render_crd(kind))
        written.append(path)
    return written
