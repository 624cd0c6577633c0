"""NVIDIA Grove PodCliqueSets (`grove.io/v1alpha1`) and PodGangs
(`scheduler.grove.io/v1alpha1`) as gangs.

kai-ray's gangs are Grove's PodGangs, so that reading a PodCliqueSet (as the
simulator does) and reading the PodGangs Grove made from it (as the operator
does) give the same groups, and a pod's `grove.io/podgang` label names its
group. As Grove does, each PodCliqueSet replica `r` is one base gang
`<pcs>-<r>`, holding every standalone clique and the scaling-group replicas
`0..minAvailable-1`; each scaling-group replica above its `minAvailable` is a
gang of its own, `<pcs>-<r>-<group>-<k>` (a "scaled PodGang"). Every PodClique
is a subgroup named as Grove names the PodClique (`<pcs>-<r>-<clique>`, or
`<pcs>-<r>-<group>-<j>-<clique>` inside a scaling group), which is also the name
of its podgroup in the PodGang; its minimum is the clique's `minAvailable`
(default: its replicas), the replicas above it are elastic.

Topology: the kai-ray annotations on the workload win; otherwise Grove's own
`pack.required`/`pack.preferred` (`packConstraint` on a PodGang) are used as
level names, on the gang and on each clique, with the Topology named by the
`kai-ray.io/topology` annotation (Grove's ClusterTopologyBinding is not read).
Scaling-group constraints are not mapped. Pure: no I/O; it must not create pods.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from kai_ray.values.api import TopologyConstraint
from kai_ray.values.names import TOPOLOGY_ANNOTATION
from kai_ray.workloads.fields import EMPTY, FieldReader, child
from kai_ray.workloads.workload_group import Member, WorkloadGroup, WorkloadHeader

API_VERSION = "grove.io/v1alpha1"
SCHEDULER_API_VERSION = "scheduler.grove.io/v1alpha1"


@dataclass(frozen=True)
class CliqueTemplate:
    """One entry of `spec.template.cliques`, read and defaulted as Grove does."""

    path: str
    name: str
    replicas: int
    min_available: int
    entry: Mapping[str, Any]
    topology: TopologyConstraint | None


@dataclass(frozen=True)
class ScalingGroup:
    """One entry of `spec.template.podCliqueScalingGroups`."""

    path: str
    name: str
    clique_names: tuple[str, ...]
    replicas: int
    min_available: int


@dataclass(frozen=True)
class PodCliqueInstance:
    """One PodClique Grove creates for a PodCliqueSet, and the PodGang it belongs to."""

    gang: str
    name: str
    template: CliqueTemplate
    pcs_replica: int
    scaling_group: str | None = None
    scaling_group_replica: int | None = None
    base_gang: str | None = None

    def member(self) -> Member:
        clique = self.template
        return Member(self.name, clique.min_available, clique.replicas, clique.topology)


def podcliqueset_groups(obj: Mapping[str, Any], source: str | None) -> list[WorkloadGroup]:
    """One group per PodGang Grove makes: base gangs first, by replica, then scaled ones."""
    header = WorkloadHeader(obj, "PodCliqueSet", source)
    template, instances = _read_podcliqueset(header, obj)
    queue = header.queue()
    topology = header.topology() or _pack(header, template, "spec.template", "pack")
    priority = header.reader.text(template, "priorityClassName", "spec.template")
    gangs: dict[str, list[Member]] = {}
    for instance in instances:
        gangs.setdefault(instance.gang, []).append(instance.member())
    header.reader.raise_problems()
    return [
        header.build(f"podgang-{gang}", queue, members, priority=priority, topology=topology)
        for gang, members in gangs.items()
    ]


def pod_cliques(obj: Mapping[str, Any], source: str | None = None) -> list[PodCliqueInstance]:
    """Every PodClique Grove would create for a PodCliqueSet; raises if it is malformed."""
    header = WorkloadHeader(obj, "PodCliqueSet", source)
    _, instances = _read_podcliqueset(header, obj)
    header.reader.raise_problems()
    return instances


def _read_podcliqueset(
    header: WorkloadHeader, obj: Mapping[str, Any]
) -> tuple[Mapping[str, Any], list[PodCliqueInstance]]:
    """The template of a PodCliqueSet and the PodCliques of all its replicas, in order."""
    reader = header.reader
    spec = reader.section(obj, "spec", "", required=True)
    replicas = reader.count(spec, "replicas", "spec", default=0)
    template = reader.section(spec, "template", "spec", required=spec is not EMPTY)
    cliques = _clique_templates(header, template) if template is not EMPTY else {}
    groups = _scaling_groups(header, template, cliques)
    instances = [
        instance
        for replica in range(replicas)
        for instance in _replica_cliques(f"{header.name}-{replica}", replica, cliques, groups)
    ]
    return template, instances


def _replica_cliques(
    base: str, replica: int, cliques: dict[str, CliqueTemplate], groups: list[ScalingGroup]
) -> Iterator[PodCliqueInstance]:
    """The PodCliques of one PodCliqueSet replica, whose base gang is named `base`."""
    grouped = {name for group in groups for name in group.clique_names}
    for clique in cliques.values():
        if clique.name not in grouped:
            yield PodCliqueInstance(base, f"{base}-{clique.name}", clique, replica)
    for group in groups:
        fqn = f"{base}-{group.name}"
        for j in range(group.replicas):
            scaled = j >= group.min_available
            gang = f"{fqn}-{j - group.min_available}" if scaled else base
            for name in group.clique_names:
                yield PodCliqueInstance(
                    gang,
                    f"{fqn}-{j}-{name}",
                    cliques[name],
                    replica,
                    fqn,
                    j,
                    base if scaled else None,
                )


def _clique_templates(
    header: WorkloadHeader, template: Mapping[str, Any]
) -> dict[str, CliqueTemplate]:
    cliques: dict[str, CliqueTemplate] = {}
    for at, entry in header.reader.entries(template, "cliques", "spec.template", required=True):
        clique = _clique_template(header, entry, at)
        if clique.name in cliques:
            header.reader.problem(child(at, "name"), f"{clique.name!r} is used twice")
        cliques.setdefault(clique.name, clique)
    return cliques


def _clique_template(header: WorkloadHeader, entry: Mapping[str, Any], path: str) -> CliqueTemplate:
    reader = header.reader
    name = reader.text(entry, "name", path, required=True) or f"<{path}>"
    spec = reader.section(entry, "spec", path, required=True)
    where = child(path, "spec")
    replicas = reader.count(spec, "replicas", where, default=0) or 1
    minimum = reader.optional_count(spec, "minAvailable", where, minimum=1)
    if minimum is not None and minimum > replicas:
        reader.problem(child(where, "minAvailable"), f"{minimum} is above replicas {replicas}")
    pod_spec = reader.section(spec, "podSpec", where, required=spec is not EMPTY)
    if pod_spec is not EMPTY:
        reader.pod_fields(pod_spec, child(where, "podSpec"))
    topology = _pack(header, entry, path, "pack")
    return CliqueTemplate(path, name, replicas, min(minimum or replicas, replicas), entry, topology)


def _scaling_groups(
    header: WorkloadHeader, template: Mapping[str, Any], cliques: dict[str, CliqueTemplate]
) -> list[ScalingGroup]:
    groups: list[ScalingGroup] = []
    owner: dict[str, str] = {}
    for at, entry in header.reader.entries(template, "podCliqueScalingGroups", "spec.template"):
        group = _scaling_group(header.reader, entry, at, cliques)
        if any(group.name == seen.name for seen in groups):
            header.reader.problem(child(at, "name"), f"{group.name!r} is used twice")
        for i, name in enumerate(group.clique_names):
            if owner.setdefault(name, group.name) != group.name:
                header.reader.problem(
                    child(child(at, "cliqueNames"), i),
                    f"clique {name!r} is already in group {owner[name]!r}",
                )
        groups.append(group)
    return groups


def _scaling_group(
    reader: FieldReader, entry: Mapping[str, Any], path: str, cliques: dict[str, CliqueTemplate]
) -> ScalingGroup:
    name = reader.text(entry, "name", path, required=True) or f"<{path}>"
    replicas = reader.count(entry, "replicas", path, default=1, minimum=1)
    minimum = reader.count(entry, "minAvailable", path, default=1, minimum=1)
    if minimum > replicas:
        reader.problem(child(path, "minAvailable"), f"{minimum} is above replicas {replicas}")
    names = _clique_names(reader, entry, path, cliques)
    return ScalingGroup(path, name, names, replicas, min(minimum, replicas))


def _clique_names(
    reader: FieldReader, entry: Mapping[str, Any], path: str, cliques: dict[str, CliqueTemplate]
) -> tuple[str, ...]:
    value = entry.get("cliqueNames")
    where = child(path, "cliqueNames")
    if not isinstance(value, list) or not value:
        reader.problem(where, "missing: needs at least one clique name")
        return ()
    for i, name in enumerate(value):
        if name not in cliques:
            reader.problem(child(where, i), f"no clique named {name!r} in spec.template.cliques")
    return tuple(name for name in value if name in cliques)


def podgang_group(obj: Mapping[str, Any], source: str | None) -> WorkloadGroup:
    """A PodGang: each podgroup is a subgroup of at least `minReplicas` pods."""
    header = WorkloadHeader(obj, "PodGang", source)
    reader = header.reader
    spec = reader.section(obj, "spec", "", required=True)
    found = reader.entries(spec, "podgroups", "spec", required=spec is not EMPTY)
    members = [_podgang_member(header, entry, at) for at, entry in found]
    header.check_unique(
        [(child(at, "name"), m.name) for (at, _), m in zip(found, members, strict=True)]
    )
    return header.build(
        f"podgang-{header.name}",
        header.queue(),
        members,
        priority=reader.text(spec, "priorityClassName", "spec"),
        topology=header.topology() or _pack(header, spec, "spec", "packConstraint"),
    )


def _podgang_member(header: WorkloadHeader, entry: Mapping[str, Any], path: str) -> Member:
    reader = header.reader
    name = reader.text(entry, "name", path, required=True) or f"<{path}>"
    if entry.get("minReplicas") is None:
        reader.problem(child(path, "minReplicas"), "missing")
    minimum = reader.count(entry, "minReplicas", path, default=0)
    references = len(reader.entries(entry, "podReferences", path))
    topology = _pack(header, entry, path, "packConstraint")
    return Member(name, minimum, max(minimum, references), topology)


def _pack(
    header: WorkloadHeader, parent: Mapping[str, Any], path: str, key: str
) -> TopologyConstraint | None:
    """Grove's `topologyConstraint.<key>.{required,preferred}` as a kai-ray constraint."""
    reader = header.reader
    where = child(path, "topologyConstraint")
    constraint = reader.section(parent, "topologyConstraint", path)
    pack = reader.section(constraint, key, where)
    required = reader.text(pack, "required", child(where, key)) or reader.text(
        constraint, "packDomain", where
    )
    preferred = reader.text(pack, "preferred", child(where, key))
    if required is None and preferred is None:
        return None
    topology = header.annotations.get(TOPOLOGY_ANNOTATION) or None
    return TopologyConstraint(topology=topology, requiredLevel=required, preferredLevel=preferred)
