"""`ClusterEvent` (`sim.kai-ray.io/v1alpha1`): failures and changes at a virtual time.

So that a run can ask "what if a rack fails at 2h" or "what if team-b's weight is
raised on Monday":

    apiVersion: sim.kai-ray.io/v1alpha1
    kind: ClusterEvent
    metadata: {name: rack-3-fails}
    spec:
      at: 2h                       # a duration from the start
      action: NodeDown             # NodeDown | NodeUp | PodFailure | QueueUpdate
      selector: {kai-ray.io/rack: block-0-rack-3}   # or node: n1, or nodes: [n1, n2]

- NodeDown: the nodes become NotReady; their pods fail (released with the reason
  `node-down`) and their controllers create them again, pending.
- NodeUp: the nodes are Ready again.
- PodFailure: `pod: namespace/name`, or `job: namespace/<PodGroup name>` for every
  bound pod of the job, fails (reason `failed`) and is created again, pending.
- QueueUpdate: `queue` is patched with `patch` (a JSON merge patch of the Queue,
  e.g. `{spec: {resources: {gpu: {overQuotaWeight: 3}}}}`).
Checks that need the other objects (the nodes exist, the patched queue is valid)
are in `check_events`. Pure: no I/O.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import Field, model_validator

from kai_ray.values.api import ApiModel, Duration, ObjectMeta, Queue
from kai_ray.values.config import duration_seconds
from kai_ray.values.errors import InvalidObjectError, ObjectRef, Problem
from kai_ray.values.validation import parse_model

Action = Literal["NodeDown", "NodeUp", "PodFailure", "QueueUpdate"]
NODE_DOWN_REASON = "node-down"
POD_FAILED_REASON = "failed"


class ClusterEventSpec(ApiModel):
    at: Duration = Field(description="When, as a duration from the start.")
    action: Action
    node: str | None = None
    nodes: list[str] = Field(default_factory=list)
    selector: dict[str, str] = Field(default_factory=dict)
    pod: str | None = Field(default=None, description="namespace/name of a pod.")
    job: str | None = Field(default=None, description="namespace/name of a PodGroup.")
    queue: str | None = None
    patch: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _targets_fit_the_action(self) -> ClusterEventSpec:
        if self.action in ("NodeDown", "NodeUp"):
            if not (self.node or self.nodes or self.selector):
                raise ValueError(f"{self.action} needs node, nodes or selector")
        elif self.action == "PodFailure":
            if (self.pod is None) == (self.job is None):
                raise ValueError("PodFailure needs exactly one of pod or job")
        elif self.queue is None or not self.patch:
            raise ValueError("QueueUpdate needs queue and patch")
        return self


class ClusterEvent(ApiModel):
    apiVersion: Literal["sim.kai-ray.io/v1alpha1"] = "sim.kai-ray.io/v1alpha1"
    kind: Literal["ClusterEvent"] = "ClusterEvent"
    metadata: ObjectMeta
    spec: ClusterEventSpec

    @property
    def at_s(self) -> float:
        return duration_seconds(self.spec.at)

    @property
    def ref(self) -> ObjectRef:
        return ObjectRef("ClusterEvent", self.metadata.name)


def selected_nodes(spec: ClusterEventSpec, nodes: Sequence[Mapping[str, Any]]) -> list[str]:
    """Names of the nodes the event names or selects, in input order."""
    named = {*spec.nodes, *([spec.node] if spec.node else [])}
    chosen = []
    for node in nodes:
        meta = node.get("metadata") or {}
        labels = meta.get("labels") or {}
        selected = spec.selector and all(labels.get(k) == v for k, v in spec.selector.items())
        if meta.get("name") in named or selected:
            chosen.append(str(meta.get("name")))
    return chosen


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: mappings merge, null deletes, anything else replaces."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    merged = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = merge_patch(merged.get(key), value)
    return merged


def patched_queue(queue: Queue, patch: Mapping[str, Any], source: str | None) -> Queue:
    raw = merge_patch(queue.model_dump(mode="json", exclude_none=True), patch)
    return parse_model(Queue, raw, source)


def check_events(
    events: Sequence[ClusterEvent],
    nodes: Sequence[Mapping[str, Any]],
    queues: Sequence[Queue],
    sources: Mapping[str, str],
) -> None:
    """Every event names nodes that exist and queues it can patch into valid ones."""
    by_name = {q.metadata.name: q for q in queues}
    known_nodes = {str((n.get("metadata") or {}).get("name")) for n in nodes}
    for event in events:
        ref = ObjectRef(
            "ClusterEvent", event.metadata.name, source=sources.get(event.metadata.name)
        )
        spec = event.spec
        missing = [
            n for n in [*spec.nodes, *([spec.node] if spec.node else [])] if n not in known_nodes
        ]
        if missing:
            raise InvalidObjectError([Problem(ref, "spec.nodes", f"no node named {missing[0]!r}")])
        if spec.selector and not selected_nodes(spec, nodes):
            raise InvalidObjectError([Problem(ref, "spec.selector", "selects no node")])
        if spec.action == "QueueUpdate":
            _check_queue_patch(ref, spec, by_name)


def _check_queue_patch(ref: ObjectRef, spec: ClusterEventSpec, queues: Mapping[str, Queue]) -> None:
    queue = queues.get(spec.queue or "")
    if queue is None:
        raise InvalidObjectError([Problem(ref, "spec.queue", f"no queue named {spec.queue!r}")])
    try:
        patched_queue(queue, spec.patch, ref.source)
    except InvalidObjectError as err:
        first = err.problems[0]
        raise InvalidObjectError(
            [Problem(ref, f"spec.patch: {first.field}", first.message)]
        ) from None
