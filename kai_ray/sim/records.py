"""What the simulator records about jobs, bindings and queues, in report form.

Field names are those of the report contract (docs/architecture.md section 5). No I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kai_ray.values.resources import Resources


@dataclass
class JobRecord:
    name: str
    namespace: str
    kind: str
    queue: str
    min_member: int
    submitted_s: float
    admitted_s: float | None = None
    started_s: float | None = None
    finished_s: float | None = None
    reason: str | None = None

    def to_json(self) -> dict[str, Any]:
        return dict(vars(self))


@dataclass
class BindingRecord:
    name: str
    namespace: str
    job: str
    node: str
    requests: Resources
    gpu_devices: list[int]
    bound_s: float
    released_s: float | None = None
    release_reason: str | None = None
    #: The pod's DRA claims when it was bound: `namespace/name` and `driver/pool/device`s.
    claims: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        out = dict(vars(self))
        out["requests"] = self.requests.to_report()
        return out


@dataclass
class QueueSample:
    t_s: float
    allocated: Resources = field(default_factory=Resources)
    requested: Resources = field(default_factory=Resources)
    fair_share: Resources = field(default_factory=Resources)

    def same_values(self, other: QueueSample) -> bool:
        return (self.allocated, self.requested, self.fair_share) == (
            other.allocated,
            other.requested,
            other.fair_share,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "t_s": self.t_s,
            "allocated": self.allocated.to_report(),
            "requested": self.requested.to_report(),
            "fair_share": self.fair_share.to_report(),
        }
