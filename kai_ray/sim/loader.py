"""Read the simulator's input: YAML files or folders of Kubernetes objects.

Every document is checked before anything runs; the first problem found is
reported with the file, the object and the field, so that `kai-ray simulate`
can exit with status 2 and one line. Reading files is the only I/O here.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from kai_ray.sim.dra_input import (
    DraObjects,
    add_published,
    check_dra_references,
    check_pod_claims,
    is_dra_kind,
    pod_claim_refs,
    read_dra_object,
)
from kai_ray.sim.events import ClusterEvent, check_events
from kai_ray.sim.nodepool import SIM_API_VERSION, NodePool, device_classes, expand, resource_slices
from kai_ray.sim.references import check_references
from kai_ray.values.api import API_VERSION, PodGroup, Queue, Topology
from kai_ray.values.config import CONFIG_API_VERSION, SchedulerConfig, duration_seconds
from kai_ray.values.errors import InvalidFieldError, InvalidObjectError, ObjectRef, Problem
from kai_ray.values.names import (
    POD_GROUP_ANNOTATION,
    SIM_DURATION,
    SIM_SUBMIT_AT,
    SIM_TERMINATION_GRACE,
)
from kai_ray.values.resources import Resources
from kai_ray.values.validation import object_ref, parse_model
from kai_ray.workloads.expected_pods import pods_for_workload
from kai_ray.workloads.grouping import WorkloadGroup, derive_groups
from kai_ray.workloads.pod_fields import gpu_share, pod_requests

#: On a bound Pod: it holds its requests on its node for the whole run, in no gang
#: (another scheduler's pod; `kai-ray snapshot --kubeconfig` writes them).
HELD_ANNOTATION = "sim.kai-ray.io/held"
#: (apiVersion, kind) of every workload kind the simulator can play the controller of.
WORKLOAD_KINDS = {
    ("v1", "Pod"),
    ("batch/v1", "Job"),
    ("ray.io/v1", "RayCluster"),
    ("ray.io/v1", "RayJob"),
    ("grove.io/v1alpha1", "PodCliqueSet"),
}


@dataclass(frozen=True)
class Document:
    raw: Mapping[str, Any]
    source: str

    @functools.cached_property
    def ref(self) -> ObjectRef:
        """Who the document is (read once: every pod checked from a template names it)."""
        return object_ref(self.raw, self.source)


@dataclass(frozen=True)
class Workload:
    """One submitted workload: its derived groups and their pods, when it arrives, how long
    it runs."""

    raw: Mapping[str, Any]
    ref: ObjectRef
    groups: tuple[WorkloadGroup, ...]
    pods: tuple[tuple[dict[str, Any], ...], ...]  # per group, as the controller creates them
    submit_at: float
    duration: float | None


@dataclass
class SimInput:
    nodes: list[dict[str, Any]] = field(default_factory=list)
    topologies: list[Topology] = field(default_factory=list)
    queues: list[Queue] = field(default_factory=list)
    pod_groups: list[tuple[PodGroup, float, float | None]] = field(default_factory=list)
    member_pods: list[Document] = field(default_factory=list)
    workloads: list[Workload] = field(default_factory=list)
    config: SchedulerConfig = field(default_factory=SchedulerConfig)
    events: list[ClusterEvent] = field(default_factory=list)
    #: Pods the simulator does not play, bound for the whole run (`HELD_ANNOTATION`).
    held_pods: list[dict[str, Any]] = field(default_factory=list)
    #: DeviceClasses, ResourceSlices, ResourceClaims and ResourceClaimTemplates, those
    #: NodePools publish included.
    dra: DraObjects = field(default_factory=DraObjects)
    #: Which file each object came from, by (kind, namespace, name).
    sources: dict[tuple[str, str | None, str], str] = field(default_factory=dict)


def iter_documents(paths: Sequence[Path]) -> Iterator[Document]:
    """Every YAML document under `paths` (folders recursively, sorted)."""
    for path in paths:
        files = sorted(path.rglob("*.y*ml")) if path.is_dir() else [path]
        if not path.exists():
            raise InvalidObjectError([Problem(ObjectRef("File", str(path)), "path", "not found")])
        for file in files:
            yield from _documents_of(file)


#: libyaml's C parser when PyYAML was built with it (the same safe constructors, some
#: ten times faster than the pure-Python one); else the pure-Python safe loader.
SAFE_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _documents_of(file: Path) -> Iterator[Document]:
    ref = ObjectRef("File", file.name, source=str(file))
    try:
        docs = list(yaml.load_all(file.read_text(), Loader=SAFE_LOADER))
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else "(document)"
        what = getattr(err, "problem", None) or "cannot be parsed"
        raise InvalidObjectError([Problem(ref, where, f"not valid YAML: {what}")]) from None
    except (OSError, UnicodeDecodeError) as err:
        raise InvalidObjectError([Problem(ref, "(file)", f"cannot read: {err}")]) from None
    for i, doc in enumerate(docs):
        if doc is None:
            continue
        if not isinstance(doc, dict):
            raise InvalidObjectError([Problem(ref, f"document {i + 1}", "is not a mapping")])
        yield Document(doc, str(file))


def sim_times(raw: Mapping[str, Any], ref: ObjectRef) -> tuple[float, float | None]:
    """The `sim.kai-ray.io/submit-at` and `duration` annotations, in seconds."""
    meta = raw.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    try:
        submit = _duration(annotations, SIM_SUBMIT_AT)
        duration = _duration(annotations, SIM_DURATION)
    except InvalidFieldError as err:
        raise InvalidObjectError([Problem(ref, err.field, err.message)]) from None
    return submit or 0.0, duration


#: How long an evicted pod takes to go when its workload does not say: Kubernetes'
#: default `terminationGracePeriodSeconds`.
DEFAULT_TERMINATION_GRACE_S = 30.0


def termination_grace(raw: Mapping[str, Any], ref: ObjectRef) -> float:
    """The `sim.kai-ray.io/termination-grace` annotation in seconds (default 30 s):
    an evicted pod of the workload holds its node this long before it is gone."""
    annotations = (raw.get("metadata") or {}).get("annotations") or {}
    try:
        grace = _duration(annotations, SIM_TERMINATION_GRACE)
    except InvalidFieldError as err:
        raise InvalidObjectError([Problem(ref, err.field, err.message)]) from None
    return DEFAULT_TERMINATION_GRACE_S if grace is None else grace


def explicit_ref(group: PodGroup) -> ObjectRef:
    return ObjectRef("PodGroup", group.metadata.name, group.metadata.namespace)


def _duration(annotations: Mapping[str, Any], key: str) -> float | None:
    if key not in annotations:
        return None
    try:
        return duration_seconds(str(annotations[key]))
    except ValueError as err:
        raise InvalidFieldError(f"metadata.annotations[{key}]", str(err)) from None


def _check_node(doc: Document) -> dict[str, Any]:
    raw = dict(doc.raw)
    meta = raw.get("metadata")
    if not isinstance(meta, Mapping) or not meta.get("name"):
        raise InvalidObjectError([Problem(doc.ref, "metadata.name", "a Node needs a name")])
    status = raw.get("status") or {}
    if not isinstance(status, Mapping):
        raise InvalidObjectError([Problem(doc.ref, "status", "must be a mapping")])
    try:
        capacity = Resources.parse(status.get("capacity"), "status.capacity")
        Resources.parse(status.get("allocatable"), "status.allocatable")
    except InvalidFieldError as err:
        raise InvalidObjectError([Problem(doc.ref, err.field, err.message)]) from None
    if not capacity:
        raise InvalidObjectError([Problem(doc.ref, "status.capacity", "a Node needs a capacity")])
    return raw


def _read_document(doc: Document, sim: SimInput) -> None:
    api_version, kind = doc.raw.get("apiVersion"), doc.raw.get("kind")
    if (api_version, kind) == ("v1", "Node"):
        sim.nodes.append(_check_node(doc))
    elif (api_version, kind) == (SIM_API_VERSION, "NodePool"):
        pool = parse_model(NodePool, doc.raw, doc.source)
        sim.nodes.extend(expand(pool))
        add_published(sim.dra, resource_slices(pool), device_classes(pool))
    elif is_dra_kind(api_version, kind):
        read_dra_object(doc.raw, doc.source, sim.dra)
    elif (api_version, kind) == (SIM_API_VERSION, "ClusterEvent"):
        sim.events.append(parse_model(ClusterEvent, doc.raw, doc.source))
    elif (api_version, kind) == (API_VERSION, "Queue"):
        sim.queues.append(parse_model(Queue, doc.raw, doc.source))
    elif (api_version, kind) == (API_VERSION, "Topology"):
        sim.topologies.append(parse_model(Topology, doc.raw, doc.source))
    elif (api_version, kind) == (API_VERSION, "PodGroup"):
        group = parse_model(PodGroup, doc.raw, doc.source)
        termination_grace(doc.raw, doc.ref)  # refused here, not halfway through the run
        sim.pod_groups.append((group, *sim_times(doc.raw, doc.ref)))
    elif (api_version, kind) == (CONFIG_API_VERSION, "SchedulerConfig"):
        sim.config = parse_model(SchedulerConfig, doc.raw, doc.source)
    elif (api_version, kind) == ("v1", "Pod") and _held(doc.raw):
        sim.held_pods.append(_checked_held_pod(doc))
    elif (api_version, kind) == ("v1", "Pod") and _names_pod_group(doc.raw):
        check_pod(doc.raw, doc.ref)
        sim.member_pods.append(doc)
    elif (api_version, kind) in WORKLOAD_KINDS:
        groups = tuple(derive_groups(doc.raw, doc.source))
        pods = tuple(_checked_pods(doc, group) for group in groups)
        times = sim_times(doc.raw, doc.ref)
        termination_grace(doc.raw, doc.ref)
        sim.workloads.append(Workload(doc.raw, doc.ref, groups, pods, *times))
    else:
        known = "Node, NodePool, Queue, Topology, PodGroup, Pod, Job, RayCluster, RayJob, "
        known += "PodCliqueSet, SchedulerConfig, ClusterEvent, DeviceClass, ResourceSlice, "
        known += "ResourceClaim, ResourceClaimTemplate"
        raise InvalidObjectError(
            [Problem(doc.ref, "apiVersion/kind", f"{api_version}/{kind} is not one of {known}")]
        )


def check_pod(pod: Mapping[str, Any], ref: ObjectRef, prefix: str = "") -> None:
    """The pod's requests, GPU share and resource claims can be read; else a problem on
    `ref`."""
    try:
        pod_requests(pod)
        gpu_share(pod)
    except InvalidFieldError as err:
        raise InvalidObjectError([Problem(ref, prefix + err.field, err.message)]) from None
    pod_claim_refs(pod, ref, prefix)


def _checked_pods(doc: Document, group: WorkloadGroup) -> tuple[dict[str, Any], ...]:
    pods = pods_for_workload(doc.raw, group)
    for pod in pods:
        name = (pod.get("metadata") or {}).get("name")
        check_pod(pod, doc.ref, f"pod {name} from the template: ")
    return tuple(pods)


def _held(raw: Mapping[str, Any]) -> bool:
    meta = raw.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
    if not isinstance(annotations, Mapping):
        return False  # a malformed pod is refused, naming the field, where pods are read
    return str(annotations.get(HELD_ANNOTATION, "")).lower() == "true"


def _checked_held_pod(doc: Document) -> dict[str, Any]:
    check_pod(doc.raw, doc.ref)
    spec = doc.raw.get("spec")
    if not isinstance(spec, Mapping) or not spec.get("nodeName"):
        field = "spec.nodeName"
        raise InvalidObjectError(
            [Problem(doc.ref, field, f"a pod with {HELD_ANNOTATION} is bound")]
        )
    return dict(doc.raw)


def _check_held_nodes(sim: SimInput) -> None:
    nodes = {str(node["metadata"]["name"]) for node in sim.nodes}
    for pod in sim.held_pods:
        node = str(pod["spec"]["nodeName"])
        if node not in nodes:
            problem = Problem(object_ref(pod), "spec.nodeName", f"no Node named {node!r}")
            raise InvalidObjectError([problem])


def _names_pod_group(raw: Mapping[str, Any]) -> bool:
    annotations = (raw.get("metadata") or {}).get("annotations") or {}
    return POD_GROUP_ANNOTATION in annotations or "pod-group-name" in annotations


def load(paths: Sequence[Path]) -> SimInput:
    """Read and check every document; raise InvalidObjectError on the first bad one."""
    return load_documents(iter_documents(paths))


def load_documents(documents: Iterable[Document]) -> SimInput:
    """Check documents already read (from files, a trace, a snapshot) into a `SimInput`."""
    sim = SimInput()
    for doc in documents:
        _read_document(doc, sim)
        ref = doc.ref
        sim.sources.setdefault((ref.kind, ref.namespace, ref.name), doc.source)
    try:
        check_references(sim)
        _check_held_nodes(sim)
        check_dra_references(sim.dra, {str(node["metadata"]["name"]) for node in sim.nodes})
        check_pod_claims(sim.dra, _all_pods(sim))
        event_sources = {k[2]: v for k, v in sim.sources.items() if k[0] == "ClusterEvent"}
        check_events(sim.events, sim.nodes, sim.queues, event_sources)
    except InvalidObjectError as err:
        raise InvalidObjectError([_with_source(p, sim.sources) for p in err.problems]) from None
    return sim


def _all_pods(sim: SimInput) -> Iterator[tuple[Mapping[str, Any], ObjectRef, str]]:
    """Every pod of the input with who to blame and the prefix of its fields."""
    for workload in sim.workloads:
        for group_pods in workload.pods:
            for pod in group_pods:
                name = (pod.get("metadata") or {}).get("name")
                yield pod, workload.ref, f"pod {name} from the template: "
    for doc in sim.member_pods:
        yield doc.raw, doc.ref, ""
    for pod in sim.held_pods:
        yield pod, object_ref(pod), ""


def _with_source(problem: Problem, sources: Mapping[tuple[str, str | None, str], str]) -> Problem:
    obj = problem.obj
    if obj.source is not None:
        return problem
    source = sources.get((obj.kind, obj.namespace, obj.name))
    if source is None and obj.namespace is None:
        source = sources.get((obj.kind, "default", obj.name))
    return Problem(replace(obj, source=source), problem.field, problem.message)
