"""A batch/v1 Job and a bare v1 Pod as gangs.

A Job is one PodGroup. Its minimum is the annotation `kai-ray.io/min-member`,
default 1 so that each pod may start on its own, as under KAI; the Job runs
`parallelism` pods at once (default 1), never more than `completions` when
that is set, and those above the minimum are elastic. A bare pod is a gang of
one. Pure: no I/O; it must not create pods.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kai_ray.values.names import MIN_MEMBER_ANNOTATION
from kai_ray.workloads.fields import EMPTY, FieldReader, keyed
from kai_ray.workloads.workload_group import Member, WorkloadGroup, WorkloadHeader

MIN_MEMBER_PATH = keyed("metadata.annotations", MIN_MEMBER_ANNOTATION)


def job_group(obj: Mapping[str, Any], source: str | None) -> WorkloadGroup:
    header = WorkloadHeader(obj, "Job", source)
    reader = header.reader
    spec = reader.section(obj, "spec", "", required=True)
    template = reader.section(spec, "template", "spec", required=spec is not EMPTY)
    pod_spec = reader.pod_spec(template, "spec.template") if template is not EMPTY else {}
    pods = job_parallelism(reader, spec)
    minimum = _min_member(header, pods)
    return header.build(
        f"job-{header.name}",
        header.queue(_template_labels(reader, template)),
        [],
        priority=_text(pod_spec, "priorityClassName"),
        topology=header.topology(),
        single=Member(header.name, minimum, pods),
    )


def job_parallelism(reader: FieldReader, spec: Mapping[str, Any]) -> int:
    """How many pods the Job runs at once: `parallelism`, bounded by `completions`."""
    parallelism = reader.count(spec, "parallelism", "spec", default=1)
    completions = reader.optional_count(spec, "completions", "spec")
    return parallelism if completions is None else min(parallelism, completions)


def _min_member(header: WorkloadHeader, pods: int) -> int:
    written = header.annotations.get(MIN_MEMBER_ANNOTATION)
    if written is None:
        return min(1, pods)
    try:
        minimum = int(written)
    except ValueError:
        header.reader.problem(MIN_MEMBER_PATH, f"expected a whole number, got {written!r}")
        return 0
    if minimum < 1:
        header.reader.problem(MIN_MEMBER_PATH, f"must be at least 1, got {minimum}")
    elif minimum > pods:
        header.reader.problem(
            MIN_MEMBER_PATH,
            f"{minimum} is more than the {pods} pods the Job runs at once "
            "(spec.parallelism, bounded by spec.completions)",
        )
    return minimum


def pod_group(obj: Mapping[str, Any], source: str | None) -> WorkloadGroup:
    """A pod that names no PodGroup and has no workload controller: a gang of one."""
    header = WorkloadHeader(obj, "Pod", source)
    spec = header.reader.section(obj, "spec", "", required=True)
    if spec is not EMPTY:
        header.reader.pod_fields(spec, "spec")
    return header.build(
        f"pod-{header.name}",
        header.queue(),
        [],
        priority=_text(spec, "priorityClassName"),
        topology=header.topology(),
        single=Member(header.name, 1, 1),
    )


def _template_labels(reader: FieldReader, template: Mapping[str, Any]) -> dict[str, str]:
    return reader.string_map(
        reader.section(template, "metadata", "spec.template"), "labels", "spec.template.metadata"
    )


def _text(values: Mapping[str, Any], key: str) -> str | None:
    value = values.get(key)
    return value if isinstance(value, str) and value else None
