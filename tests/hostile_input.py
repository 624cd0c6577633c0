"""Hostile input: malformed and adversarial Queues, PodGroups, Topologies and pods.

`case(tag, index, queues, selector)` is a hypothesis strategy of one `Case` of
the shape `SHAPES[index % len(SHAPES)]` (so that a run of consecutive indexes
covers every shape), its fields drawn by hypothesis; `any_case` draws the shape
too. A case is one object, or the few that only mean something together (a
cycle of parents, a child whose parent is then deleted). What makes them
hostile: wrong types, huge numbers, negative and fractional quantities, unicode
and overlong names, self-parents and cycles, missing parents, a thousand
subgroups or levels, labels and annotations naming nothing, unknown fields.
Most fields are drawn well-formed and one or two hostile, so that some cases
pass the API server's schema and reach kai-ray.

A case names the field kai-ray must report when the API server lets the case in
(`bad_field`) when the generator knows it is wrong in a way only kai-ray can
tell; None when the case may be valid (the API server's schema and CEL rules
refuse the rest at the door, naming the field themselves).

Fed to the e2e cluster through kubectl (tests/e2e/test_hostile_input.py) and to
the simulator's loader (tests/unit/test_hostile_input_loader.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

from kai_ray.values.api import API_VERSION
from kai_ray.values.names import (
    GPU_FRACTION_ANNOTATION,
    GPU_MEMORY_ANNOTATION,
    POD_GROUP_ANNOTATION,
    QUEUE_LABEL,
    SCHEDULER_NAME,
    TOPOLOGY_ANNOTATION,
    TOPOLOGY_REQUIRED_ANNOTATION,
)

GPU = "nvidia.com/gpu"
PARENT_FIELD = "spec.parentQueue"


@dataclass(frozen=True)
class Case:
    kind: str
    objects: tuple[dict[str, Any], ...]
    #: What is hostile about it (its shape), for a person reading a failure.
    note: str
    #: A field kai-ray must name if the API server lets the case in.
    bad_field: str | None = None
    #: Objects to delete once all are created (a parent that goes away).
    deleted_after: tuple[dict[str, Any], ...] = field(default=())


@dataclass(frozen=True)
class Queues:
    """Good queues of the run: a leaf that takes workloads and its parent."""

    leaf: str
    parent: str


# ----------------------------------------------------------------- values

HUGE = st.sampled_from([10**18, 10**30, 2**63, -(2**63), 1e308, -1e308])
QUANTITY = st.one_of(st.integers(0, 64), st.sampled_from(["0.5", "2", "500m", "1k"]))
NUMBERISH = st.one_of(
    st.integers(-(10**6), 10**6),
    HUGE,
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.sampled_from(["0.5", "-1", "1e3", "1Gi", "NaN", "inf", "∞", "", " 1", "1..2"]),
    st.text(max_size=8),
)
WRONG_TYPE = st.one_of(
    st.none(),
    st.booleans(),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.sampled_from(["a", "b"]), st.integers(), max_size=2),
)
HOSTILE_VALUE = st.one_of(NUMBERISH, WRONG_TYPE)
HOSTILE_TEXT = st.one_of(
    st.text(min_size=1, max_size=12),
    st.sampled_from(["队列", "q" * 300, "UPPER", "-lead", "trail-", "a_b", "a.b", "ünï", "\u202e"]),
)


def mostly(good: st.SearchStrategy[Any], hostile: st.SearchStrategy[Any]) -> Any:
    """Well-formed three times in four."""
    return st.integers(0, 3).flatmap(lambda n: hostile if n == 0 else good)


def kai_ray_object(kind: str, name: str, spec: Any) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": kind, "metadata": {"name": name}, "spec": spec}


# ----------------------------------------------------------------- Queues


def queue_resources() -> st.SearchStrategy[Any]:
    keys = st.sampled_from(["gpu", "cpu", "memory", GPU, "nvidia.com/gpu.product=H100", "x y"])
    amount = mostly(QUANTITY, HOSTILE_VALUE)
    entry = st.fixed_dictionaries(
        {}, optional={"quota": amount, "limit": amount, "overQuotaWeight": amount}
    )
    return st.dictionaries(keys, mostly(entry, WRONG_TYPE), max_size=3)


@st.composite
def queue_fields(draw: st.DrawFn, name: str, queues: Queues) -> Case:
    spec = draw(
        st.fixed_dictionaries(
            {"parentQueue": st.just(queues.parent)},
            optional={
                "resources": mostly(queue_resources(), WRONG_TYPE),
                "priority": mostly(st.integers(0, 1000), HOSTILE_VALUE),
                "namespaces": mostly(st.lists(HOSTILE_TEXT, max_size=3), HOSTILE_VALUE),
                "preemptMinRuntime": mostly(st.just("10m"), HOSTILE_TEXT),
                "bogus": HOSTILE_VALUE,
            },
        )
    )
    return Case("Queue", (kai_ray_object("Queue", name, spec),), "queue fields")


@st.composite
def queue_hostile_name(draw: st.DrawFn, name: str, queues: Queues) -> Case:
    obj = kai_ray_object("Queue", draw(HOSTILE_TEXT), {"parentQueue": queues.parent})
    return Case("Queue", (obj,), "queue with a hostile name")


@st.composite
def queue_parents(draw: st.DrawFn, name: str, queues: Queues, shape: str) -> Case:
    if shape == "self-parent":
        objects = (kai_ray_object("Queue", name, {"parentQueue": name}),)
        return Case("Queue", objects, "queue its own parent", PARENT_FIELD)
    if shape == "cycle":
        other = f"{name}-b"
        objects = (
            kai_ray_object("Queue", name, {"parentQueue": other}),
            kai_ray_object("Queue", other, {"parentQueue": name}),
        )
        return Case("Queue", objects, "queues each other's parent", PARENT_FIELD)
    if shape == "missing-parent":
        parent = draw(st.sampled_from([f"{name}-nobody", "队列", "Q"]))
        objects = (kai_ray_object("Queue", name, {"parentQueue": parent}),)
        return Case("Queue", objects, "queue whose parent does not exist", PARENT_FIELD)
    parent = kai_ray_object("Queue", f"{name}-parent", {})
    child = kai_ray_object("Queue", name, {"parentQueue": f"{name}-parent"})
    return Case("Queue", (parent, child), "queue whose parent is deleted", PARENT_FIELD, (parent,))


# -------------------------------------------------------------- PodGroups


def subgroups(shape: str) -> st.SearchStrategy[Any]:
    if shape == "subgroups-twice":
        return st.just([{"name": "a"}, {"name": "a"}])
    if shape == "subgroups-missing-parent":
        return st.just([{"name": "a", "parent": "nobody"}])
    if shape == "subgroups-cycle":
        return st.just([{"name": "a", "parent": "b"}, {"name": "b", "parent": "a"}])
    if shape == "subgroups-thousand":
        return st.just([{"name": f"s{i}"} for i in range(1000)])
    entry = st.fixed_dictionaries(
        {"name": mostly(st.sampled_from(["a", "b", "c"]), HOSTILE_TEXT)},
        optional={"minMember": mostly(st.integers(0, 4), HOSTILE_VALUE), "parent": HOSTILE_TEXT},
    )
    return st.lists(mostly(entry, WRONG_TYPE), max_size=3)


@st.composite
def pod_group_case(draw: st.DrawFn, name: str, queues: Queues, shape: str) -> Case:
    queue: Any = queues.leaf
    bad_field = None
    if shape == "podgroup-queue":
        queue = draw(st.sampled_from([f"{name}-nowhere", queues.parent, "队列"]))
        bad_field = "spec.queue"
    constraint = st.fixed_dictionaries(
        {},
        optional={
            "topology": HOSTILE_TEXT,
            "requiredLevel": HOSTILE_TEXT,
            "preferredLevel": HOSTILE_VALUE,
        },
    )
    optional = {
        "minMember": mostly(st.integers(0, 8), HOSTILE_VALUE),
        "minSubGroup": mostly(st.integers(0, 2), HOSTILE_VALUE),
        "topologyConstraint": mostly(constraint, WRONG_TYPE),
        "staleGracePeriod": mostly(st.just("90s"), HOSTILE_TEXT),
        "preemptible": mostly(st.booleans(), HOSTILE_VALUE),
    }
    spec = draw(st.fixed_dictionaries({"queue": st.just(queue)}, optional=optional))
    if shape.startswith("subgroups") or shape == "podgroup-fields":
        spec["subGroups"] = draw(subgroups(shape))
    if shape == "subgroups-cycle":
        bad_field = "spec.subGroups"  # no root: none of them can ever be placed
    return Case("PodGroup", (kai_ray_object("PodGroup", name, spec),), shape, bad_field)


# ------------------------------------------------------------- Topologies


@st.composite
def topology_case(draw: st.DrawFn, name: str, queues: Queues, shape: str) -> Case:
    levels: Any
    if shape == "levels-twice":
        levels = [{"nodeLabel": "kai-ray.io/rack"}, {"nodeLabel": "kai-ray.io/rack", "alias": "r"}]
    elif shape == "levels-thousand":
        levels = [{"nodeLabel": f"l{i}"} for i in range(1000)]
    elif shape == "levels-empty":
        levels = draw(st.sampled_from([[], "rack", None]))
    else:
        level = st.fixed_dictionaries(
            {"nodeLabel": mostly(st.sampled_from(["kai-ray.io/rack", "zone"]), HOSTILE_TEXT)},
            optional={"alias": mostly(st.sampled_from(["rack", "zone"]), HOSTILE_VALUE)},
        )
        levels = draw(st.lists(mostly(level, WRONG_TYPE), max_size=4))
    spec = {"levels": levels} if levels is not None else {}
    return Case("Topology", (kai_ray_object("Topology", name, spec),), shape)


# ------------------------------------------------------------------- pods

POD_ANNOTATIONS = {
    GPU_FRACTION_ANNOTATION: st.sampled_from(["abc", "-0.5", "0", "2", "1e-9", "0.5", "NaN"]),
    GPU_MEMORY_ANNOTATION: st.sampled_from(["lots", "-1Gi", "0", "10Gi", "1e40Gi"]),
    POD_GROUP_ANNOTATION: HOSTILE_TEXT,
    TOPOLOGY_ANNOTATION: HOSTILE_TEXT,
    TOPOLOGY_REQUIRED_ANNOTATION: HOSTILE_TEXT,
}
#: Annotation values kai-ray must report when it reads the pod.
REPORTED = {
    GPU_FRACTION_ANNOTATION: {"abc", "-0.5", "2", "NaN"},
    GPU_MEMORY_ANNOTATION: {"lots", "-1Gi"},
}


@st.composite
def pod_case(draw: st.DrawFn, name: str, queues: Queues, selector: dict[str, str]) -> Case:
    annotations = draw(st.fixed_dictionaries({}, optional=POD_ANNOTATIONS))
    queue = draw(mostly(st.just(queues.leaf), st.sampled_from([f"{name}-nowhere", "Q", "队列"])))
    amount = draw(mostly(st.sampled_from(["1", "0", "2"]), st.sampled_from(["-1", "0.5", "abc"])))
    container = {"name": "c", "image": "example.invalid/x:1", "resources": {}}
    if amount != "0":
        container["resources"] = {"limits": {GPU: amount}}
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {QUEUE_LABEL: queue}, "annotations": annotations},
        "spec": {
            "schedulerName": SCHEDULER_NAME,
            "nodeSelector": dict(selector),
            "containers": [container],
        },
    }
    bad = next((k for k, values in REPORTED.items() if annotations.get(k) in values), None)
    bad_field = None if bad is None else f"metadata.annotations[{bad}]"
    return Case("Pod", (pod,), "pod annotations and labels", bad_field)


# -------------------------------------------------------------------- all

SHAPES = (
    ("Queue", "queue-fields"),
    ("PodGroup", "podgroup-fields"),
    ("Topology", "levels-random"),
    ("Pod", "pod"),
    ("Queue", "hostile-name"),
    ("PodGroup", "podgroup-queue"),
    ("Queue", "self-parent"),
    ("PodGroup", "subgroups-twice"),
    ("Topology", "levels-twice"),
    ("Pod", "pod"),
    ("Queue", "cycle"),
    ("PodGroup", "subgroups-missing-parent"),
    ("Topology", "levels-empty"),
    ("Queue", "missing-parent"),
    ("PodGroup", "subgroups-cycle"),
    ("Pod", "pod"),
    ("Queue", "deleted-parent"),
    ("Queue", "queue-fields"),
    ("PodGroup", "podgroup-fields"),
    ("Topology", "levels-random"),
)
#: Shapes of a thousand members, once per run (heavy on a cluster).
THOUSANDS = (("PodGroup", "subgroups-thousand"), ("Topology", "levels-thousand"))


@st.composite
def case(
    draw: st.DrawFn,
    tag: str,
    index: int,
    queues: Queues,
    selector: dict[str, str],
    shape: tuple[str, str] | None = None,
) -> Case:
    """The case number `index` of a run: of shape `SHAPES[index % len(SHAPES)]`
    unless `shape` is given, named `<tag>-<index>`."""
    kind, form = shape or SHAPES[index % len(SHAPES)]
    name = f"{tag}-{index}"
    if kind == "Pod":
        return draw(pod_case(name, queues, selector))
    if kind == "Topology":
        return draw(topology_case(name, queues, form))
    if kind == "PodGroup":
        return draw(pod_group_case(name, queues, form))
    if form == "queue-fields":
        return draw(queue_fields(name, queues))
    if form == "hostile-name":
        return draw(queue_hostile_name(name, queues))
    return draw(queue_parents(name, queues, form))


def any_case(tag: str, queues: Queues, selector: dict[str, str]) -> st.SearchStrategy[Case]:
    """A case of any shape (the thousands included)."""
    shapes = st.sampled_from([*SHAPES, *THOUSANDS])
    return shapes.flatmap(lambda shape: case(tag, 0, queues, selector, shape))
