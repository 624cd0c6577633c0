"""What the operator writes on an object it cannot use: a `Valid` condition.

Pure construction of the status patch; kopf applies it. The operator never
crashes on a bad object: it validates with the same models as the CRDs and the
simulator and reports every problem, naming the field, on the object itself.
A Queue is judged with the other Queues too: its parent must exist and the
parents must not form a cycle, as the queue tree judges it (one definition,
`kai_ray.state.queues.unreachable_queues`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from kai_ray.state.queues import PARENT_FIELD, QUEUE, unreachable_queues
from kai_ray.values.api import API_KINDS, Queue
from kai_ray.values.errors import InvalidObjectError, ObjectRef, Problem
from kai_ray.values.validation import parse_model

VALID = "Valid"
INVALID_SPEC = "InvalidSpec"
INVALID_PARENT = "InvalidParentQueue"


def validity_condition(kind: str, body: Mapping[str, Any], now: str) -> dict[str, str]:
    """The `Valid` condition of one kai-ray object, its message naming bad fields."""
    return problems_condition(spec_problems(kind, body), now)


def queue_validity_condition(
    body: Mapping[str, Any], queues: Mapping[str, Mapping[str, Any]], now: str
) -> dict[str, str]:
    """The `Valid` condition of a Queue among `queues` (every Queue object by name;
    `body` need not be in it): its spec first, then its parent: a missing parent,
    a cycle of parents, or an ancestor left out of the tree is named on
    `spec.parentQueue`. A Queue the scheduler's tree leaves out is exactly one
    marked invalid here."""
    problems = spec_problems(QUEUE, body)
    if not problems:
        problems = parent_problems(body, queues)
    return problems_condition(problems, now)


def spec_problems(kind: str, body: Mapping[str, Any]) -> list[Problem]:
    """What is wrong with what the user wrote (the status is ours, not judged)."""
    try:
        parse_model(API_KINDS[kind], _without_status(body))
    except InvalidObjectError as err:
        return list(err.problems)
    return []


def parent_problems(
    body: Mapping[str, Any], queues: Mapping[str, Mapping[str, Any]]
) -> list[Problem]:
    """The queue tree's verdict on this Queue's parent, if it has one to give."""
    name = str((body.get("metadata") or {}).get("name") or "")
    parents = {other: _parent_of(obj) for other, obj in queues.items()}
    parents[name] = _parent_of(body)
    invalid = _first_invalid_ancestor(name, parents, queues)
    if invalid is not None:
        del parents[invalid]
    message = unreachable_queues(parents, invalid={invalid} if invalid else ()).get(name)
    return [] if message is None else [Problem(ObjectRef(QUEUE, name), PARENT_FIELD, message)]


def _first_invalid_ancestor(
    name: str, parents: Mapping[str, str | None], queues: Mapping[str, Mapping[str, Any]]
) -> str | None:
    """The tree leaves out Queues that fail validation; only this queue's ancestors
    decide its fate, so only they are validated (not every queue each time)."""
    seen = {name}
    ancestor = parents[name]
    while ancestor is not None and ancestor in parents and ancestor not in seen:
        if not _is_usable(queues[ancestor]):
            return ancestor
        seen.add(ancestor)
        ancestor = parents[ancestor]
    return None


def _parent_of(obj: Mapping[str, Any]) -> str | None:
    parent = (obj.get("spec") or {}).get("parentQueue")
    return parent if isinstance(parent, str) else None


def _is_usable(obj: Mapping[str, Any]) -> bool:
    """Whether the tree keeps this Queue object (it validates it whole, status included)."""
    try:
        Queue.model_validate(obj)
    except ValidationError:
        return False
    return True


def problems_condition(problems: Sequence[Problem], now: str) -> dict[str, str]:
    """`Valid` True without problems; else False, the message naming each field."""
    if not problems:
        return _condition("True", "SpecValid", "", now)
    message = "; ".join(f"{p.field}: {p.message}" for p in problems)
    only_parent = all(p.field == PARENT_FIELD for p in problems)
    return _condition("False", INVALID_PARENT if only_parent else INVALID_SPEC, message, now)


def _without_status(body: Mapping[str, Any]) -> dict[str, Any]:
    # The status is ours to write; only what the user wrote is judged.
    meta = body.get("metadata") or {}
    kept = {k: meta[k] for k in ("name", "namespace", "labels", "annotations") if k in meta}
    return {
        "apiVersion": body.get("apiVersion"),
        "kind": body.get("kind"),
        "metadata": kept,
        "spec": body.get("spec") or {},
    }


def _condition(status: str, reason: str, message: str, now: str) -> dict[str, str]:
    return {
        "type": VALID,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": now,
    }


def merge_condition(
    conditions: Sequence[Mapping[str, Any]] | None, new: dict[str, str]
) -> list[dict[str, Any]]:
    """Replace the condition of the same type; keep its transition time if unchanged."""
    merged: list[dict[str, Any]] = []
    for old in conditions or []:
        if old.get("type") != new["type"]:
            merged.append(dict(old))
        elif old.get("status") == new["status"]:
            new = {**new, "lastTransitionTime": str(old.get("lastTransitionTime", ""))}
    merged.append(new)
    return merged
