"""Node filters that do not change within a cycle, as numpy masks over all nodes.

A node may take a pod only when it is ready, not cordoned, matches the pod's
nodeSelector and required node affinity (In, NotIn, Exists, DoesNotExist,
Gt, Lt; `matchFields` on `metadata.name`), and every NoSchedule or NoExecute
taint on it is tolerated (PreferNoSchedule never filters). These depend only
on the snapshot, so each distinct (selector, affinity, tolerations) signature
is evaluated once per cycle and cached in the transaction's memo, as are the
label columns they read. `static_rejections` says, per reason, how many nodes
a pod is kept off and why, for the failure messages. Pure: no I/O.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import numpy.typing as npt

from kai_ray.decisions.placement.claims import claims_example, claims_mask, claims_signature
from kai_ray.decisions.placement.node_kept import node_static
from kai_ray.decisions.transaction import MemoKey, Transaction
from kai_ray.state.nodes import Taint
from kai_ray.state.pod_states import PodState
from kai_ray.workloads.pod_fields import (
    NODE_NAME_FIELD,
    NodeRequirement,
    NodeSelectorTerm,
    Toleration,
)

Flags = npt.NDArray[np.bool_]
Indices = npt.NDArray[np.intp]
FILTERING_EFFECTS = ("NoSchedule", "NoExecute")
TaintMasks = tuple[tuple[Taint, Flags], ...]
#: Per filter signature: the nodes that pass, as flags and as sorted indices.
STATIC_MASK = MemoKey[Flags]("static mask")
STATIC_NODES = MemoKey[Indices]("static nodes")
#: Per label key: every node's value, as read and as an integer.
LABEL = MemoKey[npt.NDArray[np.object_]]("label column")
NUMERIC_LABEL = MemoKey[npt.NDArray[np.float64]]("numeric label column")
TAINTS = MemoKey[TaintMasks]("taint masks")


def signature(pod: PodState) -> tuple[Any, ...]:
    return (pod.node_selector, pod.node_affinity, pod.tolerations)


def static_mask(tx: Transaction, pod: PodState) -> Flags:
    """Nodes that pass every filter but resources, for pods with this signature."""
    key = _key(tx, pod)
    if pod.claim_entries:  # the claims' part reads more than the nodes' static facts
        return tx.memo.get(STATIC_MASK, key, lambda: _static_mask(tx, pod))
    return node_static(tx, STATIC_MASK, key, lambda: _static_mask(tx, pod))


def static_nodes(tx: Transaction, pod: PodState) -> Indices:
    """`static_mask` as sorted node indices."""
    build = lambda: np.flatnonzero(static_mask(tx, pod)).astype(np.intp)  # noqa: E731
    if pod.claim_entries:
        return tx.memo.get(STATIC_NODES, _key(tx, pod), build)
    return node_static(tx, STATIC_NODES, _key(tx, pod), build)


def _key(tx: Transaction, pod: PodState) -> tuple[Any, ...]:
    """The filter signature, with the DRA claims' for a pod that has claims."""
    if not pod.claim_entries:
        return signature(pod)
    return (*signature(pod), claims_signature(tx, pod))


def _static_mask(tx: Transaction, pod: PodState) -> Flags:
    mask = tx.snapshot.schedulable.copy()
    mask &= selector_mask(tx, pod.node_selector)
    mask &= affinity_mask(tx, pod.node_affinity)
    mask &= ~untolerated_mask(tx, pod.tolerations)
    if pod.claim_entries:
        mask &= claims_mask(tx, pod)
    mask.setflags(write=False)
    return mask


def selector_mask(tx: Transaction, selector: tuple[tuple[str, str], ...]) -> Flags:
    mask = np.ones(len(tx.snapshot.node_names), dtype=np.bool_)
    for key, value in selector:
        mask &= label_column(tx, key) == value
    return mask


def affinity_mask(tx: Transaction, terms: tuple[NodeSelectorTerm, ...]) -> Flags:
    """Any term holds; no terms means no constraint; an empty term matches no node."""
    nodes = len(tx.snapshot.node_names)
    if not terms:
        return np.ones(nodes, dtype=np.bool_)
    mask = np.zeros(nodes, dtype=np.bool_)
    for term in terms:
        term_mask = np.full(nodes, bool(term), dtype=np.bool_)
        for requirement in term:
            term_mask &= requirement_mask(tx, requirement)
        mask |= term_mask
    return mask


def requirement_mask(tx: Transaction, requirement: NodeRequirement) -> Flags:
    values = label_column(tx, requirement.key)
    present: Flags = np.array([v is not None for v in values], dtype=np.bool_)
    operator = requirement.operator
    if operator in ("In", "NotIn"):
        member: Flags = present & np.isin(values, np.array(requirement.values, dtype=object))
        return member if operator == "In" else ~member
    if operator in ("Exists", "DoesNotExist"):
        return present if operator == "Exists" else ~present
    numbers = numeric_label_column(tx, requirement.key)
    bound = float(requirement.values[0])
    with np.errstate(invalid="ignore"):
        return numbers > bound if operator == "Gt" else numbers < bound


def label_column(tx: Transaction, key: str) -> npt.NDArray[np.object_]:
    """Every node's value of one label (None where unset); the node name for metadata.name."""

    def build() -> npt.NDArray[np.object_]:
        if key == NODE_NAME_FIELD:
            return np.array(tx.snapshot.node_names, dtype=object)
        return np.array([labels.get(key) for labels in tx.snapshot.labels], dtype=object)

    return node_static(tx, LABEL, key, build)


def numeric_label_column(tx: Transaction, key: str) -> npt.NDArray[np.float64]:
    """A label read as an integer per node; NaN where unset or not an integer (never matches)."""

    def build() -> npt.NDArray[np.float64]:
        return np.array([_integer(v) for v in label_column(tx, key)], dtype=np.float64)

    return node_static(tx, NUMERIC_LABEL, key, build)


def _integer(value: object) -> float:
    try:
        return float(int(str(value)))
    except ValueError:
        return float("nan")


def taint_masks(tx: Transaction) -> TaintMasks:
    """Each distinct filtering taint with the nodes that carry it, in first-seen order."""

    def build() -> TaintMasks:
        carriers: dict[Taint, list[int]] = {}
        for node, taints in enumerate(tx.snapshot.taints):
            for taint in taints:
                if taint.effect in FILTERING_EFFECTS:
                    carriers.setdefault(taint, []).append(node)
        nodes = len(tx.snapshot.node_names)
        return tuple((taint, _flags_at(nodes, rows)) for taint, rows in carriers.items())

    return node_static(tx, TAINTS, None, build)


def _flags_at(size: int, rows: list[int]) -> Flags:
    flags = np.zeros(size, dtype=np.bool_)
    flags[rows] = True
    return flags


def tolerated(taint: Taint, tolerations: tuple[Toleration, ...]) -> bool:
    return any(t.tolerates(taint.key, taint.value, taint.effect) for t in tolerations)


def untolerated_mask(tx: Transaction, tolerations: tuple[Toleration, ...]) -> Flags:
    mask = np.zeros(len(tx.snapshot.node_names), dtype=np.bool_)
    for taint, carriers in taint_masks(tx):
        if not tolerated(taint, tolerations):
            mask |= carriers
    return mask


def describe_taint(taint: Taint) -> str:
    value = f"={taint.value}" if taint.value else ""
    return f"{taint.key}{value}:{taint.effect}"


def _claims_example(tx: Transaction, pod: PodState, rejected: Flags) -> str:
    """Why the first node of `rejected` cannot serve the pod's claims, as " (on n: why)"."""
    nodes = np.flatnonzero(rejected)
    if not len(nodes):
        return ""
    why = claims_example(tx, pod, int(nodes[0])).replace("|", "\u2223")
    return f" (on {tx.snapshot.node_names[int(nodes[0])]}: {why})" if why else ""


def static_rejections(tx: Transaction, pod: PodState, within: Flags) -> Counter[str]:
    """How many nodes of `within` each filter rejects (the first failing filter per node).

    Reasons are "plural phrase|singular phrase" so a message can agree with its count.
    """
    snapshot = tx.snapshot
    counts: Counter[str] = Counter()
    left = within.copy()
    stages: list[tuple[str, Flags]] = [
        ("are not ready|is not ready", ~snapshot.ready),
        ("are cordoned|is cordoned", snapshot.unschedulable),
        (
            "do not match the nodeSelector|does not match the nodeSelector",
            ~selector_mask(tx, pod.node_selector),
        ),
        (
            "do not match the required node affinity|does not match the required node affinity",
            ~affinity_mask(tx, pod.node_affinity),
        ),
    ]
    stages += [
        (f"have taint {describe_taint(taint)}|has taint {describe_taint(taint)}", carriers)
        for taint, carriers in taint_masks(tx)
        if not tolerated(taint, pod.tolerations)
    ]
    if pod.claim_entries:
        rejected = ~claims_mask(tx, pod)
        example = _claims_example(tx, pod, left & rejected)
        stages.append(
            (
                f"cannot reach the devices its ResourceClaims ask for{example}|cannot reach "
                f"the devices its ResourceClaims ask for{example}",
                rejected,
            )
        )
    for reason, rejected in stages:
        hit = left & rejected
        counts[reason] += int(np.count_nonzero(hit))
        left &= ~hit
    return counts
