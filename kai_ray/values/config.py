"""SchedulerConfig (`config.kai-ray.io/v1alpha1`): the settings the operator reads.

The same object is read by the operator (from a ConfigMap mounted as a file) and
by the simulator (as one of its input documents). It is a file format, not a
CRD: like kube-scheduler's configuration, it changes with a rollout, not with
`kubectl edit`. Pure: no I/O.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Final, Literal

from croniter import croniter
from pydantic import Field, model_validator

from kai_ray.values.api import ApiModel, Duration, ObjectMeta
from kai_ray.values.dra import DraSettings

CONFIG_API_VERSION: Final = "config.kai-ray.io/v1alpha1"
DEFAULT_ACTIONS = ("allocate", "consolidate", "reclaim", "preempt", "stale-gang-eviction")

_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def duration_seconds(text: str) -> float:
    """Seconds in a Go-style duration ("1h30m", "90s", "250ms")."""
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"{text!r} is not a duration such as 90s, 5m or 1h30m")
    return sum(float(n) * _UNIT_SECONDS[u] for n, u in parts)


class TimeBasedFairness(ApiModel):
    """Decayed usage shifts over-quota weights: P = max(0, W + k*(W - U)).
    The window fields are KAI's `usageParams` (`windowSize` is `window` here)."""

    k: float = Field(default=0.0, ge=0, description="0 turns time-based fairness off.")
    halfLife: Duration = Field(
        default="1h", description="Half-life of the usage decay; 0s: no decay (KAI's default)."
    )
    window: Duration = Field(
        default="168h", description="Size of the usage window (KAI's windowSize)."
    )
    windowType: Literal["sliding", "tumbling", "cron"] = Field(
        default="sliding",
        description="sliding: the last `window`; tumbling: reset every `window` from "
        "`tumblingWindowStartTime`; cron: reset whenever `cronString` fires.",
    )
    tumblingWindowStartTime: datetime | None = Field(
        default=None, description="The first reset of a tumbling window (RFC 3339)."
    )
    cronString: str = Field(default="", description="When a cron window resets (5 fields).")
    normalization: Literal["elapsed", "steady"] = Field(
        default="elapsed",
        description="elapsed (KAI's): usage over the capacity of the recorded part of the "
        "window; steady: the part before the first record counts as idle capacity.",
    )

    @model_validator(mode="after")
    def _window_is_whole(self) -> TimeBasedFairness:
        if self.windowType == "tumbling" and self.tumblingWindowStartTime is None:
            raise ValueError("windowType tumbling needs tumblingWindowStartTime")
        if self.windowType == "cron" and not croniter.is_valid(self.cronString):
            raise ValueError(f"windowType cron needs a valid cronString, not {self.cronString!r}")
        if self.windowType != "cron" and duration_seconds(self.window) <= 0:
            raise ValueError("window must be longer than 0s")
        return self


class RayBackend(ApiModel):
    """When the placement module fans candidates out to Ray workers."""

    mode: Literal["auto", "always", "never"] = "auto"
    minNodes: int = Field(
        default=2000,
        ge=1,
        description="In auto mode, use a joined Ray cluster (address) from this size.",
    )
    address: str | None = Field(
        default=None,
        description="Join this Ray cluster (auto mode uses Ray only then); "
        "unset, mode always starts a local one.",
    )
    queryTimeout: Duration = Field(
        default="10s",
        description="A Ray connection or room query taking longer counts as Ray lost: "
        "placement falls back to the local backend (docs/placement.md).",
    )
    retryAfter: Duration = Field(
        default="30s",
        description="After Ray is lost, placement stays local this long before Ray is tried again.",
    )


class FragmentationScoring(ApiModel):
    """How `placementStrategy: fragmentation` learns the workload mix (docs/placement.md)."""

    halfLife: Duration = Field(
        default="1h", description="Half-life of a pod's weight in the mix, by age; 0s: no decay."
    )
    coverage: float = Field(
        default=0.95, gt=0, le=1, description="Score the heaviest classes covering this share."
    )
    maxClasses: int = Field(default=8, ge=1, description="Score at most this many classes.")


class SchedulerConfigSpec(ApiModel):
    schedulerName: str = "kai-ray"
    cyclePeriod: Duration = "1s"
    actions: list[str] = Field(default_factory=lambda: list(DEFAULT_ACTIONS), min_length=1)
    placementStrategy: Literal["binpack", "spread", "fragmentation"] = "fragmentation"
    fragmentation: FragmentationScoring = Field(default_factory=FragmentationScoring)
    timeBasedFairness: TimeBasedFairness = Field(default_factory=TimeBasedFairness)
    staleGangGracePeriod: Duration = "60s"
    consolidationMaxJobs: int = Field(default=8, ge=0)
    consolidationMinRuntime: Duration = Field(
        default="60s",
        description="A gang whose minimum started less than this long ago is not moved by "
        "consolidation; a moved gang starts again, so this is also the least time between "
        "two moves of one gang (docs/disruption.md). 0s: no protection, as in KAI.",
    )
    rayBackend: RayBackend = Field(default_factory=RayBackend)
    dra: DraSettings = Field(
        default_factory=DraSettings,
        description="How Dynamic Resource Allocation devices count in queues (docs/dra.md).",
    )


class SchedulerConfig(ApiModel):
    apiVersion: Literal["config.kai-ray.io/v1alpha1"] = CONFIG_API_VERSION
    kind: Literal["SchedulerConfig"] = "SchedulerConfig"
    metadata: ObjectMeta = Field(default_factory=lambda: ObjectMeta(name="default"))
    spec: SchedulerConfigSpec = Field(default_factory=SchedulerConfigSpec)
