"""Inter-pod affinity and anti-affinity read from a Pod: which pods a term selects, and where.

`spec.affinity.podAffinity` and `.podAntiAffinity`, required and preferred, as
Kubernetes defines them: a term selects pods by label selector in some
namespaces (the pod's own by default; `namespaces` lists others; an empty
`namespaceSelector: {}` means every namespace) and names a node label
(`topologyKey`) whose value is the domain the pods share or avoid.
`matchLabelKeys` / `mismatchLabelKeys` are resolved here against the pod's own
labels (as the API server merges them into the selector), so a term is a
self-contained value. A `namespaceSelector` with labels is refused: kai-ray
does not read Namespace objects. Errors raise `InvalidFieldError` naming the
field. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kai_ray.values.errors import InvalidFieldError
from kai_ray.workloads.pod_fields import Pod, pod_labels, pod_namespace

AFFINITY_FIELD = "spec.affinity"
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"
_OPERATORS = frozenset({"In", "NotIn", "Exists", "DoesNotExist"})


@dataclass(frozen=True, slots=True)
class LabelRequirement:
    """One label selector requirement: `key` `operator` `values`; the operator is one of
    In, NotIn, Exists, DoesNotExist."""

    key: str
    operator: str
    values: tuple[str, ...] = ()

    def holds(self, labels: Mapping[str, str]) -> bool:
        value = labels.get(self.key)
        if self.operator == "In":
            return value is not None and value in self.values
        if self.operator == "NotIn":
            return value is None or value not in self.values
        return (value is not None) == (self.operator == "Exists")


@dataclass(frozen=True, slots=True)
class PodAffinityTerm:
    """Pods matching `selector` in `namespaces`, seen through the node label `topology_key`."""

    #: Every requirement holds; None: the term had no labelSelector and selects no pod.
    selector: tuple[LabelRequirement, ...] | None
    #: None: every namespace.
    namespaces: frozenset[str] | None
    topology_key: str
    #: 1-100 for a preferred term; 0 for a required one.
    weight: int = 0

    def matches(self, namespace: str, labels: Mapping[str, str]) -> bool:
        """Whether a pod with this namespace and these labels is one the term selects."""
        if self.selector is None:
            return False
        if self.namespaces is not None and namespace not in self.namespaces:
            return False
        return all(requirement.holds(labels) for requirement in self.selector)


@dataclass(frozen=True, slots=True)
class PodAffinity:
    """A pod's inter-pod terms. Required: `affinity` (all hold), `anti_affinity` (none
    is broken). Preferred: weights summed per node, affinity adding, anti-affinity taking."""

    affinity: tuple[PodAffinityTerm, ...] = ()
    anti_affinity: tuple[PodAffinityTerm, ...] = ()
    preferred_affinity: tuple[PodAffinityTerm, ...] = ()
    preferred_anti_affinity: tuple[PodAffinityTerm, ...] = ()

    @property
    def required(self) -> bool:
        return bool(self.affinity or self.anti_affinity)

    @property
    def preferred(self) -> bool:
        return bool(self.preferred_affinity or self.preferred_anti_affinity)


def pod_inter_affinity(pod: Pod) -> PodAffinity | None:
    """The pod's inter-pod affinity terms; None when it has none (the common case)."""
    affinity = (pod.get("spec") or {}).get("affinity") or {}
    if not isinstance(affinity, Mapping):
        raise InvalidFieldError(AFFINITY_FIELD, f"expected a map, got {affinity!r}")
    if not (affinity.get("podAffinity") or affinity.get("podAntiAffinity")):
        return None
    reading = _Reading(pod_namespace(pod), pod_labels(pod))
    like = reading.block(affinity.get("podAffinity"), f"{AFFINITY_FIELD}.podAffinity")
    unlike = reading.block(affinity.get("podAntiAffinity"), f"{AFFINITY_FIELD}.podAntiAffinity")
    found = PodAffinity(like[0], unlike[0], like[1], unlike[1])
    return found if found.required or found.preferred else None


Terms = tuple[PodAffinityTerm, ...]


@dataclass(frozen=True)
class _Reading:
    """Reads the terms of one pod, whose namespace and labels the terms resolve against."""

    namespace: str
    labels: Mapping[str, str]

    def block(self, block: Any, field: str) -> tuple[Terms, Terms]:
        """(required, preferred) terms of a podAffinity or podAntiAffinity block."""
        if block is None:
            return (), ()
        if not isinstance(block, Mapping):
            raise InvalidFieldError(field, f"expected a map, got {block!r}")
        required = [
            self.term(term, 0, f"{field}.{REQUIRED}[{i}]")
            for i, term in enumerate(_list(block.get(REQUIRED), f"{field}.{REQUIRED}"))
        ]
        preferred = [
            self.weighted(entry, f"{field}.{PREFERRED}[{i}]")
            for i, entry in enumerate(_list(block.get(PREFERRED), f"{field}.{PREFERRED}"))
        ]
        return tuple(required), tuple(preferred)

    def weighted(self, entry: Any, field: str) -> PodAffinityTerm:
        if not isinstance(entry, Mapping):
            raise InvalidFieldError(field, f"expected a weighted term, got {entry!r}")
        weight = entry.get("weight")
        if isinstance(weight, bool) or not isinstance(weight, int) or not 1 <= weight <= 100:
            raise InvalidFieldError(f"{field}.weight", f"must be an integer 1-100, got {weight!r}")
        return self.term(entry.get("podAffinityTerm"), weight, f"{field}.podAffinityTerm")

    def term(self, term: Any, weight: int, field: str) -> PodAffinityTerm:
        if not isinstance(term, Mapping):
            raise InvalidFieldError(field, f"expected a pod affinity term, got {term!r}")
        topology_key = term.get("topologyKey")
        if not topology_key or not isinstance(topology_key, str):
            raise InvalidFieldError(f"{field}.topologyKey", "a term needs a topologyKey")
        selector = _selector(term.get("labelSelector"), f"{field}.labelSelector")
        if selector is not None:
            selector = (*selector, *self._label_keys(term, field))
        return PodAffinityTerm(selector, self._namespaces(term, field), topology_key, weight)

    def _label_keys(self, term: Mapping[str, Any], field: str) -> list[LabelRequirement]:
        """matchLabelKeys as `key In (own value)`, mismatchLabelKeys as `NotIn`; keys the
        pod does not carry are ignored, as Kubernetes does."""
        resolved = []
        for name, operator in (("matchLabelKeys", "In"), ("mismatchLabelKeys", "NotIn")):
            for key in _list(term.get(name), f"{field}.{name}"):
                if str(key) in self.labels:
                    resolved.append(LabelRequirement(str(key), operator, (self.labels[str(key)],)))
        return resolved

    def _namespaces(self, term: Mapping[str, Any], field: str) -> frozenset[str] | None:
        listed = frozenset(str(n) for n in _list(term.get("namespaces"), f"{field}.namespaces"))
        chooser = term.get("namespaceSelector")
        if chooser is None:
            return listed or frozenset({self.namespace})
        if not isinstance(chooser, Mapping):
            raise InvalidFieldError(
                f"{field}.namespaceSelector", f"expected a map, got {chooser!r}"
            )
        if chooser.get("matchLabels") or chooser.get("matchExpressions"):
            raise InvalidFieldError(
                f"{field}.namespaceSelector",
                "only the empty selector {} (every namespace) is supported: kai-ray does not "
                "read Namespace labels; list the namespaces in namespaces instead",
            )
        return None


def _selector(selector: Any, field: str) -> tuple[LabelRequirement, ...] | None:
    """A label selector as requirements; None when absent (it then selects no pod)."""
    if selector is None:
        return None
    if not isinstance(selector, Mapping):
        raise InvalidFieldError(field, f"expected a label selector, got {selector!r}")
    labels = selector.get("matchLabels") or {}
    if not isinstance(labels, Mapping):
        raise InvalidFieldError(f"{field}.matchLabels", f"expected a map, got {labels!r}")
    requirements = [LabelRequirement(str(k), "In", (str(v),)) for k, v in labels.items()]
    for i, expression in enumerate(
        _list(selector.get("matchExpressions"), f"{field}.matchExpressions")
    ):
        requirements.append(_requirement(expression, f"{field}.matchExpressions[{i}]"))
    return tuple(requirements)


def _requirement(expression: Any, field: str) -> LabelRequirement:
    if not isinstance(expression, Mapping) or not expression.get("key"):
        raise InvalidFieldError(f"{field}.key", "a requirement needs a key")
    operator = str(expression.get("operator") or "")
    if operator not in _OPERATORS:
        raise InvalidFieldError(f"{field}.operator", f"unknown operator {operator!r}")
    values = tuple(str(v) for v in _list(expression.get("values"), f"{field}.values"))
    if operator in ("In", "NotIn") and not values:
        raise InvalidFieldError(f"{field}.values", f"{operator} needs at least one value")
    if operator in ("Exists", "DoesNotExist") and values:
        raise InvalidFieldError(f"{field}.values", f"{operator} takes no values")
    return LabelRequirement(str(expression["key"]), operator, values)


def _list(value: Any, field: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidFieldError(field, f"expected a list, got {value!r}")
    return value
