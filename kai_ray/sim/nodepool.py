"""`NodePool` (`sim.kai-ray.io/v1alpha1`): many simulated nodes from one object.

`count` nodes named `<namePrefix>-<i>` are split evenly and in order over the
topology domains. Each level of `spec.topology` gives the number of domains
under each domain of the wider level; a node's label value for a level is
`<last segment of the label>-<index within the parent>` joined to the wider
levels' values with `-` (`block-0`, then `block-0-rack-3`). Pure: no I/O.
"""

from __future__ import annotations

import math
from typing import Any, Final, Literal

from pydantic import Field, field_validator, model_validator

from kai_ray.values.api import HOSTNAME_LABEL, ApiModel, ObjectMeta, Quantity

SIM_API_VERSION: Final = "sim.kai-ray.io/v1alpha1"


class PoolTaint(ApiModel):
    key: str = Field(min_length=1)
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]


class PoolLevel(ApiModel):
    label: str = Field(min_length=1, description="Node label of this level.")
    domains: int = Field(ge=1, description="Domains under each domain of the wider level.")


class NodePoolSpec(ApiModel):
    count: int = Field(ge=1, le=100_000)
    namePrefix: str = Field(min_length=1, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    capacity: dict[str, Quantity] = Field(min_length=1)
    labels: dict[str, str] = Field(default_factory=dict)
    taints: list[PoolTaint] = Field(default_factory=list)
    topology: list[PoolLevel] = Field(default_factory=list)

    @field_validator("topology")
    @classmethod
    def _unique_labels(cls, levels: list[PoolLevel]) -> list[PoolLevel]:
        labels = [level.label for level in levels]
        for i, label in enumerate(labels):
            if label in labels[:i]:
                raise ValueError(f"[{i}].label: {label!r} is used twice")
        return levels

    @model_validator(mode="after")
    def _enough_nodes(self) -> NodePoolSpec:
        total = math.prod(level.domains for level in self.topology)
        if total > self.count:
            raise ValueError(f"topology: {total} domains in all but only {self.count} nodes")
        return self


class NodePool(ApiModel):
    apiVersion: Literal["sim.kai-ray.io/v1alpha1"] = SIM_API_VERSION
    kind: Literal["NodePool"] = "NodePool"
    metadata: ObjectMeta
    spec: NodePoolSpec


def _segment(label: str) -> str:
    return label.rsplit("/", 1)[-1]


def topology_labels(spec: NodePoolSpec, index: int) -> dict[str, str]:
    """The topology labels of node `index` of the pool."""
    labels: dict[str, str] = {}
    value = ""
    total = 1
    for level in spec.topology:
        total *= level.domains
        local = (index * total // spec.count) % level.domains
        part = f"{_segment(level.label)}-{local}"
        value = f"{value}-{part}" if value else part
        labels[level.label] = value
    return labels


def expand(pool: NodePool) -> list[dict[str, Any]]:
    """The Node objects of a pool, in order."""
    spec = pool.spec
    capacity = {name: str(amount) for name, amount in spec.capacity.items()}
    nodes = []
    for i in range(spec.count):
        name = f"{spec.namePrefix}-{i}"
        labels = {**spec.labels, **topology_labels(spec, i), HOSTNAME_LABEL: name}
        nodes.append(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": name, "labels": labels},
                "spec": {"taints": [t.model_dump(exclude_none=True) for t in spec.taints]},
                "status": {"capacity": dict(capacity), "allocatable": dict(capacity)},
            }
        )
    return nodes
