"""What the validating webhook refuses: the checks one object's CEL rules cannot make.

Each check asks the rule's one definition; none is written again here:
- a Queue's spec (`spec_problems`) and no cycle of parents (`parent_problems`,
  the queue tree's `unreachable_queues`); a parent that does not exist yet is a
  warning, not a refusal (`queue_warnings`: trees are applied in any order);
- children's quotas fitting their parent's (`over_committed`, the judge of the
  `QuotaOverCommitted` condition): per resource, when the parent has a quota of
  it, the sum of its children's quotas is at most that quota;
- a workload's queue existing and being a leaf (`queue_problem`, the judge of
  the PodGroups the tree keeps) and admitting its namespace (`namespace_refusal`,
  the judge of each cycle's admission);
- a PodGroup's and a Topology's specs (their models: subgroup cycles, level
  names used twice as a label and an alias).

Besides, a queue holding workloads may not be given child queues: only leaves
take workloads, so its PodGroups would stop being scheduled.

Each refusal is a `Problem` naming the object and the field. Pure: the caller
hands in the objects (the operator's cache) and turns problems into answers.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kai_ray.decisions.admission import namespace_refusal
from kai_ray.decisions.fairness import over_committed
from kai_ray.effects.reporting import parent_problems, spec_problems
from kai_ray.effects.status import quantity
from kai_ray.state.groups import POD_GROUP, queue_problem
from kai_ray.state.queues import PARENT_FIELD, QUEUE, QueueTree, build_queue_tree
from kai_ray.values.api import Phase
from kai_ray.values.errors import ObjectRef, Problem
from kai_ray.values.names import QUEUE_LABEL, QUEUE_LABEL_ALIASES
from kai_ray.values.resources import Resources, canonical_name, short_name
from kai_ray.values.validation import object_ref
from kai_ray.workloads.membership import needs_derived_group

TOPOLOGY = "Topology"
#: PodGroups that no longer hold their queue as a leaf (their work is over).
FINISHED = (Phase.SUCCEEDED.value, Phase.FAILED.value)
#: Deprecated fields by kind: (dotted path under the object, what to use instead).
#: The validating webhook admits them with a warning (docs/lts.md, "Deprecation").
DEPRECATED: dict[str, tuple[tuple[str, str], ...]] = {}


def queue_refusals(
    body: Mapping[str, Any],
    queues: Mapping[str, Mapping[str, Any]],
    pod_groups: Iterable[Mapping[str, Any]],
) -> list[Problem]:
    """Why this Queue may not be written, among `queues` (every other Queue by
    name; its own old version may be there) and the cluster's PodGroups."""
    if missing_parent(body, queues) is not None:
        return spec_problems(QUEUE, body)  # admitted with a warning (`queue_warnings`)
    problems = spec_problems(QUEUE, body) or parent_problems(body, queues)
    if problems:
        return [_settled(p) for p in problems]
    name = _name(body)
    others = {other: obj for other, obj in queues.items() if other != name}
    tree, _ = build_queue_tree([*others.values(), body], {})
    return _quota_problems(body, tree) + _parent_holding_work(body, pod_groups)


def missing_parent(body: Mapping[str, Any], queues: Mapping[str, Mapping[str, Any]]) -> str | None:
    """The parent this Queue names when no Queue of that name exists (yet)."""
    parent = (body.get("spec") or {}).get("parentQueue")
    return parent if isinstance(parent, str) and parent not in queues else None


def queue_warnings(body: Mapping[str, Any], queues: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """A parent that does not exist yet is not refused: declarative tools (Helm,
    Argo CD, `kubectl apply -f` of a folder) write a tree's Queues in any order, even
    at once. The Queue takes no workloads, and says so in its `Valid` condition,
    until its parent is there."""
    parent = missing_parent(body, queues)
    if parent is None:
        return []
    return [
        f"Queue {_name(body)!r}: spec.parentQueue: parent queue {parent!r} does not exist "
        "yet; this queue takes no workloads until it does"
    ]


def _settled(problem: Problem) -> Problem:
    # The tree's words are about a Queue already written; refused, it is in no tree.
    message = problem.message.removesuffix("; left out of the tree")
    return Problem(problem.obj, problem.field, message)


def _quota_problems(body: Mapping[str, Any], tree: QueueTree) -> list[Problem]:
    name = _name(body)
    if name not in tree:
        return []
    resources = {canonical_name(key) for node in tree.nodes.values() for key in node.spec.resources}
    # The top level is judged against the cluster, which changes with its nodes:
    # that stays a warning (QuotaOverCommitted), so it is given no bound here.
    unbounded = Resources(dict.fromkeys(resources, math.inf))
    problems = []
    for found in over_committed(tree, unbounded):
        if found.parent is None or name not in (found.parent, *found.children):
            continue
        key = short_name(found.resource)
        quotas = quantity(found.resource, found.quotas)
        there = quantity(found.resource, found.available)
        message = (
            f"the quotas of the children of queue {found.parent!r} "
            f"({', '.join(found.children)}) add up to {quotas} {key}, "
            f"more than its quota of {there}"
        )
        problems.append(
            Problem(_ref(body), f"spec.resources.{_spec_key(body, found.resource)}.quota", message)
        )
    return problems


def _parent_holding_work(
    body: Mapping[str, Any], pod_groups: Iterable[Mapping[str, Any]]
) -> list[Problem]:
    parent = (body.get("spec") or {}).get("parentQueue")
    if not isinstance(parent, str):
        return []
    holding = sorted(
        str(object_ref(group, kind=POD_GROUP)).removeprefix(f"{POD_GROUP} ")
        for group in pod_groups
        if (group.get("spec") or {}).get("queue") == parent
        and ((group.get("status") or {}).get("phase")) not in FINISHED
    )
    if not holding:
        return []
    shown = ", ".join(holding[:3]) + (f" and {len(holding) - 3} more" if len(holding) > 3 else "")
    message = (
        f"queue {parent!r} holds workloads (PodGroups {shown}); only leaf queues take "
        "workloads, so it cannot take child queues until they end or move"
    )
    return [Problem(_ref(body), PARENT_FIELD, message)]


def workload_refusals(
    obj: Mapping[str, Any], queues: Mapping[str, Mapping[str, Any]], scheduler: str
) -> list[Problem]:
    """Why this workload (a PodGroup, or a Pod, Job, RayCluster or RayJob of kai-ray
    naming its queue by label) may not be written. Workloads another workload's
    gang covers (a Job's pods, a RayJob's cluster) were judged as that workload."""
    if obj.get("kind") == POD_GROUP:
        problems = spec_problems(POD_GROUP, obj)
        if problems or (obj.get("metadata") or {}).get("ownerReferences"):
            # A PodGroup kai-ray derived for a workload: the workload was judged (or
            # admitted while the webhook was down, and then its PodGroup reports why).
            return problems
        return _queue_problems(obj, str(obj["spec"]["queue"]), "spec.queue", queues)
    if not needs_derived_group(obj, scheduler):
        return []
    labels = (obj.get("metadata") or {}).get("labels") or {}
    for key in (QUEUE_LABEL, *QUEUE_LABEL_ALIASES):
        if key in labels:
            return _queue_problems(obj, str(labels[key]), f"metadata.labels[{key}]", queues)
    return []


def _queue_problems(
    obj: Mapping[str, Any], queue: str, field: str, queues: Mapping[str, Mapping[str, Any]]
) -> list[Problem]:
    tree, _ = build_queue_tree(list(queues.values()), {})
    namespace = str((obj.get("metadata") or {}).get("namespace") or "default")
    message = queue_problem(queue, tree) or namespace_refusal(tree[queue], namespace)
    return [] if message is None else [Problem(_ref(obj), field, message)]


def topology_refusals(body: Mapping[str, Any]) -> list[Problem]:
    """Why this Topology may not be written (its levels' names used twice)."""
    return spec_problems(TOPOLOGY, body)


def deprecation_warnings(
    kind: str,
    body: Mapping[str, Any],
    deprecated: Mapping[str, Sequence[tuple[str, str]]] = DEPRECATED,
) -> list[str]:
    """One warning per deprecated field the object sets, as kubectl prints them."""
    warnings = []
    for path, instead in deprecated.get(kind, ()):
        value: Any = body
        for part in path.split("."):
            value = value.get(part) if isinstance(value, Mapping) else None
        if value is not None:
            warnings.append(f"{kind} {_name(body)!r}: {path} is deprecated, {instead}")
    return warnings


def refusal_message(problems: Sequence[Problem]) -> str:
    """`Queue "a": spec.parentQueue: ...; spec.resources.gpu.quota: ...`."""
    ref = problems[0].obj
    name = f"{ref.namespace}/{ref.name}" if ref.namespace else ref.name
    fields = "; ".join(f"{p.field}: {p.message}" for p in problems)
    return f'{ref.kind} "{name}": {fields}'


def _spec_key(body: Mapping[str, Any], resource: str) -> str:
    """The key the Queue wrote for a resource (`gpu` for nvidia.com/gpu, as written)."""
    for key in (body.get("spec") or {}).get("resources") or {}:
        if canonical_name(key) == resource:
            return str(key)
    return short_name(resource)


def _name(body: Mapping[str, Any]) -> str:
    return str((body.get("metadata") or {}).get("name") or "")


def _ref(obj: Mapping[str, Any]) -> ObjectRef:
    return object_ref(obj)
