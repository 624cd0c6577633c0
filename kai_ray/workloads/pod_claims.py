"""Which ResourceClaims a pod uses (`spec.resourceClaims`), by name.

An entry names a ResourceClaim directly, or a ResourceClaimTemplate from which
the controller-manager's resource claim controller makes a claim for the pod and
records its name in `status.resourceClaimStatuses`. Until it has, the pod's
claim is not known and the pod cannot be placed. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from kai_ray.values.dra import PodResourceClaim
from kai_ray.values.errors import InvalidFieldError
from kai_ray.values.validation import field_path
from kai_ray.workloads.pod_fields import Pod

FIELD = "spec.resourceClaims"


@dataclass(frozen=True)
class PodClaim:
    """One entry of a pod's claims and the ResourceClaim it stands for."""

    entry: str
    #: The ResourceClaim's name; None while the claim of a template is not made yet.
    claim: str | None
    template: str | None = None


def pod_resource_claims(pod: Pod) -> tuple[PodResourceClaim, ...]:
    """The pod's `spec.resourceClaims`; InvalidFieldError naming the bad field."""
    entries = (pod.get("spec") or {}).get("resourceClaims") or []
    if not isinstance(entries, list):
        raise InvalidFieldError(FIELD, f"expected a list, got {entries!r}")
    claims = tuple(_entry(raw, f"{FIELD}[{i}]") for i, raw in enumerate(entries))
    names = [c.name for c in claims]
    if len(set(names)) != len(names):
        raise InvalidFieldError(FIELD, f"entry names must be unique, got {names}")
    return claims


def _entry(raw: Any, field: str) -> PodResourceClaim:
    try:
        return PodResourceClaim.model_validate(raw)
    except ValidationError as err:
        first = err.errors()[0]
        path = field_path(tuple(first["loc"]))
        where = field if path == "(object)" else f"{field}.{path}"
        raise InvalidFieldError(where, str(first["msg"]).removeprefix("Value error, ")) from None


def pod_claims(pod: Pod) -> tuple[PodClaim, ...]:
    """Every claim the pod uses. A template entry whose status says no claim was
    needed is left out, as Kubernetes does."""
    made = _claims_made(pod)
    found: list[PodClaim] = []
    for entry in pod_resource_claims(pod):
        if entry.resourceClaimName:
            found.append(PodClaim(entry.name, entry.resourceClaimName))
        elif entry.name not in made or made[entry.name] is not None:
            found.append(
                PodClaim(entry.name, made.get(entry.name), entry.resourceClaimTemplateName)
            )
    return tuple(found)


def _claims_made(pod: Pod) -> dict[str, str | None]:
    """Entry name -> the claim made for it (None: none was needed)."""
    statuses = (pod.get("status") or {}).get("resourceClaimStatuses") or []
    field = "status.resourceClaimStatuses"
    if not isinstance(statuses, list):
        raise InvalidFieldError(field, f"expected a list, got {statuses!r}")
    made: dict[str, str | None] = {}
    for i, status in enumerate(statuses):
        if not isinstance(status, Mapping) or not status.get("name"):
            raise InvalidFieldError(f"{field}[{i}].name", "an entry needs a name")
        claim = status.get("resourceClaimName")
        made[str(status["name"])] = str(claim) if claim else None
    return made
