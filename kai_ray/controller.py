"""The kopf operator's entry point (`kopf run -m kai_ray.controller`).

This is the only module that imports kopf. In this release it watches the
kai-ray objects and reports, as a `Valid` condition on each, whether the
scheduler can use it; the scheduling loop joins it in the operator issue.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import kopf

from kai_ray.effects.reporting import merge_condition, validity_condition
from kai_ray.values.api import GROUP, VERSION

PLURALS = {"Queue": "queues", "PodGroup": "podgroups", "Topology": "topologies"}


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    # Status is written by us; kopf's own progress goes to an annotation-free store
    # so that users' objects keep only what they and kai-ray's status put there.
    settings.persistence.progress_storage = kopf.StatusProgressStorage(field="status.kopf")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="kai-ray.io", key="last-handled-configuration"
    )
    settings.posting.level = 30  # warnings and errors become Kubernetes events


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    # In a pod: the service account; elsewhere: $KUBECONFIG (or ~/.kube/config), read at
    # login time, so the operator needs no Kubernetes client library to authenticate.
    info: kopf.ConnectionInfo | None = kopf.login_with_service_account(**kwargs)
    return info or kopf.login_with_kubeconfig(**kwargs)


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _report(kind: str, body: kopf.Body, patch: kopf.Patch) -> None:
    condition = validity_condition(kind, body, _now())
    conditions = merge_condition(list(body.get("status", {}).get("conditions") or []), condition)
    patch.status["conditions"] = conditions
    if condition["status"] == "False":
        kopf.warn(body, reason="InvalidSpec", message=condition["message"])


def _register(kind: str) -> None:
    plural = PLURALS[kind]

    @kopf.on.resume(GROUP, VERSION, plural)
    @kopf.on.create(GROUP, VERSION, plural)
    @kopf.on.update(GROUP, VERSION, plural, field="spec")
    def report_validity(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
        _report(kind, body, patch)


for _kind in PLURALS:
    _register(_kind)
