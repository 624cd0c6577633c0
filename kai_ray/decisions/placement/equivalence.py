"""Equivalent gangs are judged once: a gang that did not fit, remembered until the cluster changes.

Two gangs are equivalent when placement reads the same from both: the same
minimum, minimum of subgroups, topology constraint and placement strategy, and pods alike, in
order, in everything a filter, a fit or a score reads (requests, GPU share,
node selector, affinity, tolerations; and, once any pod of the snapshot has
inter-pod terms, those terms, the namespace and the labels). Only plain gangs have a signature: no
subgroups, no nominated nodes, and every live pod pending and not placed this
cycle (so no anchor, no member already held). Placement is a function of the
transaction's state and of what the signature holds, so while the transaction
is at the same `version` an equivalent gang fails the same way: the same code,
and the same reason but for the key of the pod it names, which is the pod at
the same position of the other gang. The reason is kept with NUL where that key
goes (NUL is in no Kubernetes name or label, so it cannot be anything else).
A property test (`tests/unit/test_equivalence.py`) holds cycles with this
shortcut to cycles without it. Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from kai_ray.decisions.kept import kept_per_group
from kai_ray.decisions.placement.claims import claims_signature
from kai_ray.decisions.placement.inter_pod import in_play
from kai_ray.decisions.placement.reasons import Code, Failure
from kai_ray.decisions.transaction import MemoKey, Transaction
from kai_ray.state.groups import PodGroupState
from kai_ray.state.pod_states import PodState

#: Where the failing pod's key goes in a kept reason.
POD_KEY = "\x00"


@dataclass(frozen=True)
class KnownFailure:
    """How a gang did not fit: its code, its reason with `POD_KEY` for the key of
    the pod the reason names, and that pod's position among the gang's live pods."""

    code: Code
    reason: str
    pod_position: int | None

    def reason_for(self, group: PodGroupState) -> str:
        if self.pod_position is None:
            return self.reason
        return self.reason.replace(POD_KEY, group.live_pods()[self.pod_position].key)


#: Per (transaction version, gang signature): how such a gang failed at that version.
KNOWN_FAILURE = MemoKey[KnownFailure]("known gang failure")


@dataclass(frozen=True, eq=False)
class Signature:
    """A gang's signature, its hash worked out once: it is looked up many times a
    cycle (allocate, then reclaim, preempt and consolidation, for every waiting
    gang). Equal when the parts are equal."""

    parts: tuple[object, ...]
    #: Whether a live pod claims devices (the signature then grows by their claims).
    claims: bool = False
    hashed: int = dataclasses.field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "hashed", hash(self.parts))

    def __hash__(self) -> int:
        return self.hashed

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, Signature) or other.hashed != self.hashed:
            return False
        return self.parts == other.parts


#: What placement reads of a group's state alone (None: not a plain gang), kept
#: from cycle to cycle for the very state (`kept.KeptPerGroup`).
PLAIN = MemoKey[Signature | None]("plain gang signature")


def signature(tx: Transaction, group: PodGroupState) -> Hashable | None:
    """What placement reads from a plain gang; None for any other."""
    plain = plain_signature(group, tx)
    if plain is None:
        return None
    live = group.live_pods()
    if tx.placed and any(pod.key in tx.placed for pod in live):
        return None
    extra: tuple[object, ...] = ()
    if plain.claims:
        extra += tuple(claims_signature(tx, pod) for pod in live)
    if in_play(tx):
        extra += tuple(_inter_pod_signature(pod) for pod in live)
    return Signature((plain.parts, extra)) if extra else plain


def plain_signature(group: PodGroupState, tx: Transaction | None = None) -> Signature | None:
    """The part of the signature that reads the group alone: no subgroups, no
    nominated nodes, no live member bound; its minimum and members done (the reason
    names the minimum), its constraint and strategy, and its live pods alike in
    order, held by a gate or not. Kept from cycle to
    cycle for the very state when `tx`'s memo keeps values per group."""
    if tx is not None:
        build = lambda: plain_signature(group)  # noqa: E731
        return kept_per_group(tx.memo, PLAIN, None, group, build, intern=True)
    spec = group.spec
    if spec.subGroups or (group.status is not None and group.status.nominatedNodes):
        return None
    live = group.live_pods()
    if any(pod.node is not None for pod in live):
        return None
    pods = tuple(_pod_signature(pod) for pod in live)
    done = len(group.succeeded)
    parts = (
        spec.minMember,
        done,
        spec.minSubGroup,
        spec.topologyConstraint,
        spec.placementStrategy,
        pods,
    )
    return Signature(parts, claims=any(pod.claim_entries for pod in live))


def _pod_signature(pod: PodState) -> Hashable:
    return (
        pod.requests,
        pod.gpu_share,
        pod.gpu_fraction,
        pod.node_selector,
        pod.node_affinity,
        pod.tolerations,
        pod.held,
    )


def _inter_pod_signature(pod: PodState) -> Hashable:
    """What inter-pod rules read of a pod: its terms, and the namespace and labels the
    other pods' terms (and its own, for a pod affine to itself) match."""
    return (pod.pod_affinity, pod.namespace, tuple(sorted(pod.labels.items())))


def known_failure(tx: Transaction, key: Hashable | None) -> KnownFailure | None:
    return None if key is None else tx.memo.find(KNOWN_FAILURE, (tx.version, key))


def keep_failure(
    tx: Transaction,
    key: Hashable | None,
    group: PodGroupState,
    failure: Failure,
    render: Callable[[Failure], str],
) -> KnownFailure:
    """The failure as a `KnownFailure`, kept under the transaction's version (the
    attempt rolled back: the version it started from) and the gang's signature.
    A failure that names a pod deeper than its top (a subgroup's) is not kept."""
    if failure.pod is None:
        known = KnownFailure(failure.code, render(failure), None)
    else:
        position = next(i for i, pod in enumerate(group.live_pods()) if pod is failure.pod)
        named = dataclasses.replace(failure, pod=dataclasses.replace(failure.pod, key=POD_KEY))
        known = KnownFailure(failure.code, render(named), position)
    if key is not None and failure.cause is None:
        tx.memo.keep(KNOWN_FAILURE, (tx.version, key), known)
    return known
