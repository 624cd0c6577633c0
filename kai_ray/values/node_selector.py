"""Kubernetes node selectors (`core/v1` NodeSelector) as models, and whether a node matches.

Used where a ResourceSlice says which nodes reach its devices and where a claim's
allocation says which nodes may use them. Fields a newer API server adds are
ignored. Pure: no I/O.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True, frozen=True)


class NodeSelectorRequirement(_Lenient):
    key: str = Field(min_length=1)
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
    values: list[str] = Field(default_factory=list)

    def holds(self, value: str | None) -> bool:
        """Kubernetes' rule for one label (or field) value; None: the node lacks it."""
        if self.operator == "Exists":
            return value is not None
        if self.operator == "DoesNotExist":
            return value is None
        if self.operator == "In":
            return value in self.values
        if self.operator == "NotIn":
            return value not in self.values
        return _integer_compare(self.operator, value, self.values)


def _integer_compare(operator: str, value: str | None, values: list[str]) -> bool:
    try:
        node_value, bound = int(value or ""), int(values[0])
    except (ValueError, IndexError):
        return False
    return node_value > bound if operator == "Gt" else node_value < bound


class NodeSelectorTerm(_Lenient):
    matchExpressions: list[NodeSelectorRequirement] = Field(default_factory=list)
    matchFields: list[NodeSelectorRequirement] = Field(default_factory=list)

    def matches(self, node: str, labels: dict[str, str]) -> bool:
        """Every requirement holds; an empty term matches nothing, as in Kubernetes."""
        if not self.matchExpressions and not self.matchFields:
            return False
        return all(r.holds(labels.get(r.key)) for r in self.matchExpressions) and all(
            r.holds(node if r.key == "metadata.name" else None) for r in self.matchFields
        )


class NodeSelector(_Lenient):
    nodeSelectorTerms: list[NodeSelectorTerm] = Field(min_length=1)

    def matches(self, node: str, labels: dict[str, str]) -> bool:
        """Any term matches."""
        return any(term.matches(node, labels) for term in self.nodeSelectorTerms)


def node_name_selector(node: str) -> NodeSelector:
    """The selector kube-scheduler writes for devices local to one node."""
    requirement = NodeSelectorRequirement(key="metadata.name", operator="In", values=[node])
    return NodeSelector(nodeSelectorTerms=[NodeSelectorTerm(matchFields=[requirement])])
