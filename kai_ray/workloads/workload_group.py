"""The derived gang of a workload, and the parts every workload kind shares.

`WorkloadGroup` is what grouping returns: the PodGroup kai-ray schedules a
workload as, plus what the PodGroup alone does not say (how many pods the
workload will create in all, per subgroup, and whether admission can hold it
with `spec.suspend`). `WorkloadHeader` reads the metadata every kind has: name,
namespace, queue label, topology annotations. Pure: no I/O; nothing here knows
a particular workload kind.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from pydantic import ValidationError

from kai_ray.values.api import ObjectMeta, PodGroup, PodGroupSpec, SubGroup, TopologyConstraint
from kai_ray.values.errors import InvalidObjectError, ObjectRef, Problem
from kai_ray.values.names import (
    PLACEMENT_STRATEGY_ANNOTATION,
    QUEUE_LABEL,
    QUEUE_LABEL_ALIASES,
    TOPOLOGY_ANNOTATION,
    TOPOLOGY_PREFERRED_ANNOTATION,
    TOPOLOGY_REQUIRED_ANNOTATION,
    first_of,
)
from kai_ray.workloads.fields import FieldReader, child, keyed

#: Written on every derived PodGroup: the kind of the workload it stands for.
WORKLOAD_KIND_LABEL = "kai-ray.io/workload-kind"
DEFAULT_NAMESPACE = "default"
_UNNAMED = "<unnamed>"

Model = TypeVar("Model")
Strategy = Literal["binpack", "spread"]


@dataclass(frozen=True)
class WorkloadGroup:
    """A workload seen as a gang: its PodGroup and the sizes the PodGroup leaves out."""

    pod_group: PodGroup
    workload: ObjectRef
    #: Every pod the workload will create: the minimum plus the elastic extras.
    max_members: int
    #: Per subgroup, every pod it will create; empty when the group has no subgroups.
    subgroup_max: Mapping[str, int]
    #: RayCluster and RayJob: admission holds the workload with `spec.suspend`.
    suspendable: bool

    @property
    def name(self) -> str:
        return self.pod_group.metadata.name

    @property
    def min_member(self) -> int:
        return self.pod_group.spec.minMember


@dataclass(frozen=True)
class Member:
    """One subgroup while it is being derived: its minimum, its total, its constraint."""

    name: str
    min_member: int
    max_member: int
    topology: TopologyConstraint | None = None


class WorkloadHeader:
    """The metadata of one workload, read once, with a reader for the rest of it."""

    def __init__(self, obj: Mapping[str, Any], kind: str, source: str | None) -> None:
        metadata = obj.get("metadata")
        metadata = metadata if isinstance(metadata, Mapping) else {}
        self.name = _text_or(metadata.get("name"), _UNNAMED)
        self.namespace = _text_or(metadata.get("namespace"), DEFAULT_NAMESPACE)
        self.kind = kind
        self.ref = ObjectRef(kind, self.name, self.namespace, source)
        self.reader = FieldReader(self.ref)
        if self.name == _UNNAMED:
            self.reader.problem("metadata.name", "missing")
        self.labels = self.reader.string_map(metadata, "labels", "metadata")
        self.annotations = self.reader.string_map(metadata, "annotations", "metadata")

    def queue(self, *fallbacks: Mapping[str, str]) -> str:
        """The queue label on the workload, else on the first fallback that has it."""
        for labels in (self.labels, *fallbacks):
            queue = first_of(labels, QUEUE_LABEL, QUEUE_LABEL_ALIASES)
            if queue:
                return queue
        self.reader.problem(
            keyed("metadata.labels", QUEUE_LABEL),
            f"missing: label the {self.kind} with the queue it belongs to "
            f"({' or '.join(QUEUE_LABEL_ALIASES)} is accepted too)",
        )
        return ""

    def topology(self) -> TopologyConstraint | None:
        """The topology constraint written as annotations on the workload, if any."""
        name = self.annotations.get(TOPOLOGY_ANNOTATION) or None
        required = self.annotations.get(TOPOLOGY_REQUIRED_ANNOTATION) or None
        preferred = self.annotations.get(TOPOLOGY_PREFERRED_ANNOTATION) or None
        if name is None and required is None and preferred is None:
            return None
        if name is None:
            self.reader.problem(
                keyed("metadata.annotations", TOPOLOGY_ANNOTATION),
                "missing: a required or preferred level needs the Topology it belongs to",
            )
        return TopologyConstraint(topology=name, requiredLevel=required, preferredLevel=preferred)

    def placement_strategy(self) -> Strategy | None:
        """The gang's own placement strategy, written as an annotation on the workload so
        that a derived PodGroup can carry it as an explicit one does in its spec."""
        value = self.annotations.get(PLACEMENT_STRATEGY_ANNOTATION)
        if value == "binpack":
            return "binpack"
        if value == "spread":
            return "spread"
        if value is not None:
            self.reader.problem(
                keyed("metadata.annotations", PLACEMENT_STRATEGY_ANNOTATION),
                f"must be binpack or spread, got {value!r}",
            )
        return None

    def check_unique(self, names: Sequence[tuple[str, str]]) -> None:
        """Subgroup names must be unique; each comes as (path of its field, name)."""
        seen: set[str] = set()
        for path, name in names:
            if name in seen:
                self.reader.problem(path, f"{name!r} is used twice")
            seen.add(name)

    def build(
        self,
        group_name: str,
        queue: str,
        members: Sequence[Member],
        *,
        priority: str | None = None,
        topology: TopologyConstraint | None = None,
        suspendable: bool = False,
        single: Member | None = None,
    ) -> WorkloadGroup:
        """The WorkloadGroup, once every field has been read; raises what was found wrong.

        `members` become subgroups; a workload without subgroups passes its one
        `single` member instead.
        """
        strategy = self.placement_strategy()
        self.reader.raise_problems()
        parts = list(members) if single is None else [single]
        spec = self._spec(queue, parts, priority, topology, with_subgroups=single is None)
        if strategy is not None:
            spec = spec.model_copy(update={"placementStrategy": strategy})
        return WorkloadGroup(
            pod_group=PodGroup(metadata=self._metadata(group_name, queue), spec=spec),
            workload=self.ref,
            max_members=sum(m.max_member for m in parts),
            subgroup_max={m.name: m.max_member for m in members},
            suspendable=suspendable,
        )

    def _metadata(self, group_name: str, queue: str) -> ObjectMeta:
        labels = {QUEUE_LABEL: queue, WORKLOAD_KIND_LABEL: self.kind}
        return _validated(
            self.ref,
            "metadata.name",
            lambda: ObjectMeta(name=group_name, namespace=self.namespace, labels=labels),
        )

    def _spec(
        self,
        queue: str,
        parts: Sequence[Member],
        priority: str | None,
        topology: TopologyConstraint | None,
        with_subgroups: bool,
    ) -> PodGroupSpec:
        subgroups = [
            SubGroup(name=m.name, minMember=m.min_member, topologyConstraint=m.topology)
            for m in parts
        ]
        return _validated(
            self.ref,
            "spec",
            lambda: PodGroupSpec(
                queue=queue,
                minMember=sum(m.min_member for m in parts),
                priorityClassName=priority,
                topologyConstraint=topology,
                subGroups=subgroups if with_subgroups else [],
            ),
        )


def _validated(ref: ObjectRef, path: str, make: Callable[[], Model]) -> Model:
    """Build a model; what pydantic refuses becomes a problem on `path`."""
    try:
        return make()
    except ValidationError as err:
        problems = [Problem(ref, _error_path(path, e["loc"]), e["msg"]) for e in err.errors()]
        raise InvalidObjectError(problems) from None


def _error_path(path: str, loc: tuple[int | str, ...]) -> str:
    for part in loc:
        path = child(path, part)
    return path


def _text_or(value: Any, default: str) -> str:
    return value if isinstance(value, str) and value else default
