"""Convert a set of KAI manifests: each document to kai-ray's, with the findings.

Documents keep their order. KAI's Queues, PodGroups and Topologies become kai-ray's;
a SchedulingShard, or KAI's scheduler configuration file (alone or in its
ConfigMap), becomes a SchedulerConfig; the operator `Config` says which scheduler
name KAI's pods carry (read first, not written); workloads get kai-ray's labels,
annotations and scheduler name; BindRequests
(KAI's runtime objects) are dropped; anything else passes as it is. Every kai-ray
object written is validated by kai-ray's own models, so what comes out is what
the operator and the simulator accept. Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from kai_ray.decisions.fairness import over_committed
from kai_ray.state.queues import build_queue_tree
from kai_ray.tools.migrate.findings import Finding, Findings
from kai_ray.tools.migrate.podgroups import (
    KAI_POD_GROUP_API,
    KAI_TOPOLOGY_API,
    convert_pod_group,
    convert_topology,
)
from kai_ray.tools.migrate.queues import KAI_QUEUE_API, convert_queue
from kai_ray.tools.migrate.scheduler import (
    KAI_OPERATOR_API,
    KAI_SCHEDULER_NAME,
    Settings,
    config_settings,
    file_settings,
    scheduler_config,
    shard_settings,
)
from kai_ray.tools.migrate.workloads import KAI_DEFAULT_QUEUE, WorkloadMigration
from kai_ray.values.api import API_KINDS, API_VERSION
from kai_ray.values.config import SchedulerConfig
from kai_ray.values.errors import InvalidFieldError, InvalidObjectError, Problem
from kai_ray.values.names import QUEUE_LABEL, SCHEDULER_NAME
from kai_ray.values.resources import Resources, canonical_name, short_name
from kai_ray.values.validation import object_ref, parse_model

KAI_GROUPS = ("scheduling.run.ai/", "kai.scheduler/")
#: The key of KAI's scheduler configuration in the ConfigMap its operator renders.
KAI_CONFIG_KEY = "config.yaml"
Converter = Callable[[dict[str, Any], Findings], dict[str, Any]]
CONVERTERS: dict[tuple[str, str], Converter] = {
    (KAI_QUEUE_API, "Queue"): convert_queue,
    (KAI_POD_GROUP_API, "PodGroup"): convert_pod_group,
    (KAI_TOPOLOGY_API, "Topology"): convert_topology,
}


@dataclass(frozen=True)
class Document:
    source: str
    body: dict[str, Any]


@dataclass
class Migration:
    documents: list[dict[str, Any]] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)

    @property
    def changes_behaviour(self) -> bool:
        return any(f.changes_behaviour for f in self.findings)


def migrate(documents: Sequence[Document], scheduler_name: str = SCHEDULER_NAME) -> Migration:
    """Convert every document; raise InvalidObjectError naming each field that is wrong."""
    migration, problems = Migration(), list[Problem]()
    kai_scheduler = _kai_scheduler_name(documents, migration, problems)
    written: dict[tuple[str, ...], str] = {}
    for doc in documents:
        findings = Findings(doc.source, str(object_ref(doc.body)))
        try:
            converted = _convert(doc.body, findings, kai_scheduler, scheduler_name)
            _validate(converted, doc.source)
            _once(converted, doc.source, written)
        except InvalidFieldError as err:
            problems.append(Problem(object_ref(doc.body, doc.source), err.field, err.message))
            continue
        except InvalidObjectError as err:
            problems.extend(err.problems)
            continue
        migration.findings.extend(findings.found)
        if converted:
            migration.documents.append(converted)
    if problems:
        raise InvalidObjectError(problems)
    _default_queue(migration)
    _children_over_parent(migration)
    return migration


def _children_over_parent(migration: Migration) -> None:
    """KAI accepts children whose quotas add up to more than their parent's; kai-ray's
    webhook refuses them (the one judge: `over_committed`, below the top level)."""
    queues = [d for d in migration.documents if d.get("kind") == "Queue"]
    tree, _ = build_queue_tree(queues, {})
    resources = {canonical_name(k) for node in tree.nodes.values() for k in node.spec.resources}
    unbounded = Resources(dict.fromkeys(resources, math.inf))
    for found in over_committed(tree, unbounded):
        if found.parent is None:
            continue  # the top level is judged against the cluster, at run time
        message = (
            f"the quotas of its children ({', '.join(found.children)}) add up to "
            f"{found.quotas:g} {short_name(found.resource)}, more than its quota of "
            f"{found.available:g}: kai-ray refuses such Queues when they are applied (KAI "
            "accepts them); lower the children's quotas or raise this one"
        )
        field = f"spec.resources.{short_name(found.resource)}.quota"
        migration.findings.append(
            Finding("(inputs)", f"Queue {found.parent}", field, message, True)
        )


def _default_queue(migration: Migration) -> None:
    """Workloads sent to KAI's `default-queue` need that Queue in kai-ray too."""
    queues = {d["metadata"]["name"] for d in migration.documents if d.get("kind") == "Queue"}
    labelled = sum(
        ((d.get("metadata") or {}).get("labels") or {}).get(QUEUE_LABEL) == KAI_DEFAULT_QUEUE
        for d in migration.documents
    )
    if labelled and KAI_DEFAULT_QUEUE not in queues:
        message = (
            f"{labelled} converted workload(s) go to it, and it is not among the inputs: "
            f"convert KAI's (kubectl get queues.scheduling.run.ai {KAI_DEFAULT_QUEUE} "
            "default-parent-queue -o yaml)"
        )
        found = Finding("(inputs)", f"Queue {KAI_DEFAULT_QUEUE}", "metadata.name", message, False)
        migration.findings.append(found)


def _once(
    converted: dict[str, Any] | None, source: str, written: dict[tuple[str, ...], str]
) -> None:
    """Two documents that become one object (a Queue in two files) are a conflict
    to settle by hand: applied in turn, the second would replace the first."""
    if converted is None:
        return
    meta = converted.get("metadata") or {}
    key = tuple(
        str(part or "")
        for part in (
            converted.get("apiVersion"),
            converted.get("kind"),
            meta.get("namespace"),
            meta.get("name"),
        )
    )
    if key in written:
        raise InvalidFieldError("metadata.name", f"written already, from {written[key]}; keep one")
    written[key] = source


def _kai_scheduler_name(
    documents: Sequence[Document], migration: Migration, problems: list[Problem]
) -> str:
    """KAI's scheduler name: the operator Config's `global.schedulerName`, else its default."""
    name = KAI_SCHEDULER_NAME
    for doc in documents:
        if (doc.body.get("apiVersion"), doc.body.get("kind")) != (KAI_OPERATOR_API, "Config"):
            continue
        findings = Findings(doc.source, str(object_ref(doc.body)))
        try:
            name = config_settings(doc.body, findings).get("kaiSchedulerName", name)
        except InvalidFieldError as err:
            problems.append(Problem(object_ref(doc.body, doc.source), err.field, err.message))
        migration.findings.extend(findings.found)
    return name


def _convert(
    body: dict[str, Any], findings: Findings, kai_scheduler: str, scheduler_name: str
) -> dict[str, Any] | None:
    api, kind = str(body.get("apiVersion") or ""), str(body.get("kind") or "")
    converter = CONVERTERS.get((api, kind))
    if converter is not None:
        return converter(body, findings)
    settings = _scheduler_settings(body, api, kind, findings)
    if settings is not None:
        return scheduler_config(settings, scheduler_name)
    if (api, kind) == (KAI_OPERATOR_API, "Config"):
        return None  # read first: its scheduler name is in every SchedulerConfig
    if api.startswith(KAI_GROUPS):
        if kind == "BindRequest":
            findings.note("kind", "KAI's binder's work item; dropped")
            return None
        findings.change("apiVersion", f"kai-ray does not read KAI's {api} {kind}; kept as it is")
        return body
    return WorkloadMigration(kai_scheduler, scheduler_name, findings).convert(body)


def _scheduler_settings(
    body: dict[str, Any], api: str, kind: str, findings: Findings
) -> Settings | None:
    if (api, kind) == (KAI_OPERATOR_API, "SchedulingShard"):
        return shard_settings(body, findings)
    if not api and isinstance(body.get("actions"), str):
        return file_settings(body, findings)
    if (api, kind) == ("v1", "ConfigMap"):
        data = body.get("data") or {}
        text = data.get(KAI_CONFIG_KEY) if isinstance(data, dict) else None
        parsed = _parse_config_file(text) if isinstance(text, str) else None
        if isinstance(parsed, dict) and isinstance(parsed.get("actions"), str):
            findings.note(f"data[{KAI_CONFIG_KEY}]", "KAI's scheduler configuration; converted")
            return file_settings(parsed, findings)
    return None


def _validate(converted: dict[str, Any] | None, source: str) -> None:
    """What is written must be what kai-ray reads: its own models judge it."""
    if converted is None:
        return
    kind = converted.get("kind")
    if kind == "SchedulerConfig":
        parse_model(SchedulerConfig, converted, source)
    elif converted.get("apiVersion") == API_VERSION and kind in API_KINDS:
        parse_model(API_KINDS[str(kind)], converted, source)


def _parse_config_file(text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise InvalidFieldError(f"data[{KAI_CONFIG_KEY}]", f"not YAML: {err}") from None
