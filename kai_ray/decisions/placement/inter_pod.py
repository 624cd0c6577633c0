"""Inter-pod affinity and anti-affinity: which nodes a pod may take, and which it prefers.

Kubernetes' rules (kube-scheduler's InterPodAffinity), evaluated on the pods
that exist in the transaction's state: every pod bound in the snapshot (any
scheduler's, terminal ones aside), less those the transaction evicted, plus
those it placed, so a gang's pods see the members placed before them.

Required, as node filters (`required_nodes`):
- the pod's affinity: a node passes when it carries every term's topology key
  and, for each term, a pod matching *all* the terms runs in the node's domain
  of that key. When no such pod runs anywhere and the pod matches its own
  terms, any node with the keys passes (the first of a series of pods affine
  to each other);
- the pod's anti-affinity: no pod matching a term runs in the node's domain of
  that term's key (a node without the key passes);
- the existing pods' anti-affinity: no pod whose anti-affinity term matches
  this pod runs in the node's domain of that term's key.

Preferred, as a score (`preferred_nodes`), below every filter and below the
topology search: per node, the weight of each of the pod's preferred terms
times the pods matching it in the node's domain (anti-affinity subtracts),
plus the existing pods' preferred terms that match this pod (weight), and
their required affinity terms that match it (weight 1, kube-scheduler's
default `hardPodAffinityWeight`). Only the nodes with the best score are
handed to the strategy, which breaks the tie.

When no pod of the snapshot has inter-pod terms (`in_play` is false) both
calls return the nodes they were given, after one scan of the pods per
transaction. Per term (and per pod labels, for the existing pods' terms) the
bound pods are counted once per transaction, and the count is kept up to date
with what the transaction placed and evicted (`log_fold.py`, exact across
rollbacks), so a pod placed costs what changed since the last, not the log.
Pure: no I/O.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Iterator, Mapping

import numpy as np
import numpy.typing as npt

from kai_ray.decisions.placement.domains import MAX_TRIES_PER_LEVEL
from kai_ray.decisions.placement.filters import label_column
from kai_ray.decisions.placement.fit import room_on
from kai_ray.decisions.placement.log_fold import Change, LogFold
from kai_ray.decisions.placement.shapes import NodeSet, PodShape
from kai_ray.decisions.transaction import MemoKey, Transaction
from kai_ray.state.pod_states import PodState
from kai_ray.state.snapshot import Changed, differences
from kai_ray.values.resources import GPU
from kai_ray.workloads.pod_affinity import PodAffinityTerm

Flags = npt.NDArray[np.bool_]
Indices = npt.NDArray[np.intp]
Counts = npt.NDArray[np.float64]
Terms = tuple[PodAffinityTerm, ...]
#: (topology key, domain code) -> how much lands there.
DomainTally = Counter[tuple[str, int]]
#: kube-scheduler's default weight of an existing pod's required affinity in the score.
HARD_AFFINITY_WEIGHT = 1

IN_PLAY = MemoKey[bool]("some pod has inter-pod terms")
BOUND = MemoKey[tuple[tuple[PodState, int], ...]]("bound pods with their node rows")
DOMAINS = MemoKey[tuple[Indices, int]]("domain codes of a topology key")
#: The existing pods' own terms on a pod: domains they exclude it from, score they give it.
Effects = tuple[DomainTally, DomainTally]
MATCHES = MemoKey[LogFold[Counts]]("existing pods matching terms, per node")
EFFECTS = MemoKey[LogFold[Effects]]("existing pods' terms on a pod of these labels")

#: Reasons as "plural phrase|singular phrase" (`filters.static_rejections`).
AFFINITY = (
    "are outside the domains its pod affinity requires"
    "|is outside the domains its pod affinity requires"
)
ANTI_AFFINITY = (
    "are in a domain its pod anti-affinity excludes|is in a domain its pod anti-affinity excludes"
)
THEIR_ANTI = (
    "are in a domain another pod's anti-affinity keeps it out of"
    "|is in a domain another pod's anti-affinity keeps it out of"
)


def in_play(tx: Transaction) -> bool:
    """Whether any pod of the snapshot has inter-pod terms (else nothing here applies):
    from the count the caller keeps across cycles (`WithTerms`), or one of its own."""
    snapshot = tx.snapshot

    def build() -> bool:
        counted = tx.memo.get(WITH_TERMS, None, WithTerms)
        return counted.follow(snapshot.pods, snapshot.pods_changed).count > 0

    return tx.memo.get(IN_PLAY, None, build)


class WithTerms:
    """How many pods of the snapshots it follows have inter-pod terms, following each
    by the pods that changed (`snapshot.differences`): a cycle pays for what changed,
    not for a look at every pod."""

    def __init__(self) -> None:
        self._pods: Mapping[str, PodState] | None = None
        self._with: set[str] = set()

    @property
    def count(self) -> int:
        return len(self._with)

    def follow(self, pods: Mapping[str, PodState], changed: Changed | None) -> WithTerms:
        if pods is self._pods:
            return self
        gone, replaced = differences(self._pods, pods, changed)
        self._with.difference_update(gone)
        for key, pod in replaced:
            if pod.pod_affinity:
                self._with.add(key)
            else:
                self._with.discard(key)
        self._pods = pods
        return self


#: The count of pods with inter-pod terms, kept across cycles by a caller (`run_cycle`'s totals).
WITH_TERMS = MemoKey[WithTerms]("pods with inter-pod terms")


def required_nodes(tx: Transaction, pod: PodState, nodes: Indices) -> Indices:
    """The nodes of `nodes` that every required inter-pod rule allows for `pod`."""
    if not in_play(tx) or not nodes.size:
        return nodes
    ok = np.ones(len(tx.snapshot.node_names), dtype=np.bool_)
    for _, passing in _required_stages(tx, pod):
        ok &= passing
    allowed: Indices = nodes[ok[nodes]]
    return allowed


def rejections(tx: Transaction, pod: PodState, nodes: Indices) -> Counter[str]:
    """How many of `nodes` each required rule refuses (the first it fails), for messages."""
    counts: Counter[str] = Counter()
    if not in_play(tx):
        return counts
    left = np.zeros(len(tx.snapshot.node_names), dtype=np.bool_)
    left[nodes] = True
    for reason, passing in _required_stages(tx, pod):
        hit = left & ~passing
        counts[reason] += int(np.count_nonzero(hit))
        left &= passing
    return +counts


def preferred_nodes(tx: Transaction, pod: PodState, shape: PodShape, nodes: Indices) -> Indices:
    """The nodes of `nodes` that fit the pod and score best on preferred terms; `nodes`
    as given when no preferred term applies (the strategy then chooses among them)."""
    if not in_play(tx) or not nodes.size:
        return nodes
    score = _preference(tx, pod)
    if score is None:
        return nodes
    fit = nodes[room_on(tx, shape, nodes) > 0]
    if not fit.size:
        return nodes
    scores = score[fit]
    best: Indices = fit[scores == scores.max()]
    return best


# ------------------------------------------------------------------ required


def _required_stages(tx: Transaction, pod: PodState) -> Iterator[tuple[str, Flags]]:
    terms = pod.pod_affinity
    if terms is not None and terms.affinity:
        yield AFFINITY, _affinity_passes(tx, pod, terms.affinity)
    if terms is not None and terms.anti_affinity:
        yield ANTI_AFFINITY, _anti_affinity_passes(tx, terms.anti_affinity)
    excluded, _ = _effects(tx, pod)
    if excluded:
        yield THEIR_ANTI, ~_in_tallied_domains(tx, excluded)


def _affinity_passes(tx: Transaction, pod: PodState, terms: Terms) -> Flags:
    counts = _matching(tx, ("all", terms), _selected_by_all(terms))
    if _starts_series(tx, pod, terms, counts):
        has_keys = np.ones(len(counts), dtype=np.bool_)
        for term in terms:
            has_keys &= _domains(tx, term.topology_key)[0] >= 0
        return has_keys
    passes = np.ones(len(counts), dtype=np.bool_)
    for term in terms:
        passes &= _per_domain(tx, term.topology_key, counts) > 0
    return passes


def _starts_series(tx: Transaction, pod: PodState, terms: Terms, counts: Counts) -> bool:
    """Kubernetes' exception for the first of pods affine to each other: no pod the terms
    select runs on a node with any of their keys, and the pod matches its own terms."""
    anywhere = any(np.any(counts[_domains(tx, t.topology_key)[0] >= 0] > 0) for t in terms)
    return not anywhere and _selected_by_all(terms)(pod)


def first_member_domains(tx: Transaction, pods: list[PodState], node_set: NodeSet) -> list[NodeSet]:
    """Where a set of pods may start when one of them is the first of a series affine to
    each other: its first term's domains within `node_set`, fullest first (at most
    `MAX_TRIES_PER_LEVEL`), for the caller to try one by one, since the first member
    decides where the others must go. Empty when no pod of `pods` starts a series."""
    if not in_play(tx):
        return []
    for pod in pods:
        terms = pod.pod_affinity.affinity if pod.pod_affinity is not None else ()
        if terms and _starts_series(
            tx, pod, terms, _matching(tx, ("all", terms), _selected_by_all(terms))
        ):
            return _split(tx, terms[0].topology_key, node_set)
    return []


def _split(tx: Transaction, key: str, node_set: NodeSet) -> list[NodeSet]:
    codes = _domains(tx, key)[0][node_set.nodes]
    values = label_column(tx, key)
    gpu = tx.snapshot.column(GPU)
    parts = [node_set.nodes[codes == code] for code in np.unique(codes[codes >= 0])]
    parts.sort(key=lambda nodes: float(tx.free[nodes, gpu].sum()))
    return [NodeSet(nodes, f"{key} {values[nodes[0]]}") for nodes in parts[:MAX_TRIES_PER_LEVEL]]


def _anti_affinity_passes(tx: Transaction, terms: Terms) -> Flags:
    passes = np.ones(len(tx.snapshot.node_names), dtype=np.bool_)
    for term in terms:
        counts = _matching(tx, ("one", term), _selected_by(term))
        passes &= ~(_per_domain(tx, term.topology_key, counts) > 0)
    return passes


def _selected_by(term: PodAffinityTerm) -> Callable[[PodState], bool]:
    return lambda pod: term.matches(pod.namespace, pod.labels)


def _selected_by_all(terms: Terms) -> Callable[[PodState], bool]:
    return lambda pod: all(t.matches(pod.namespace, pod.labels) for t in terms)


def _in_tallied_domains(tx: Transaction, tally: DomainTally) -> Flags:
    inside = np.zeros(len(tx.snapshot.node_names), dtype=np.bool_)
    for (key, code), count in tally.items():
        if count > 0:
            inside |= _domains(tx, key)[0] == code
    return inside


# ------------------------------------------------------------------ preferred


def _preference(tx: Transaction, pod: PodState) -> Counts | None:
    """Each node's preferred score for the pod; None when no preferred term applies."""
    _, favour = _effects(tx, pod)
    terms = pod.pod_affinity
    own = [
        *((t, 1.0) for t in (terms.preferred_affinity if terms else ())),
        *((t, -1.0) for t in (terms.preferred_anti_affinity if terms else ())),
    ]
    if not own and not any(favour.values()):
        return None
    score = np.zeros(len(tx.snapshot.node_names), dtype=np.float64)
    for term, sign in own:
        counts = _matching(tx, ("one", term), _selected_by(term))
        score += sign * term.weight * _per_domain(tx, term.topology_key, counts)
    for (key, code), weight in favour.items():
        score[_domains(tx, key)[0] == code] += weight
    return score


# ------------------------------------------------------------------ existing pods


def _matching(tx: Transaction, key: Hashable, matches: Callable[[PodState], bool]) -> Counts:
    """Per node, the existing pods `matches` selects (`key` names the predicate). The
    array is kept up to date in place: read it before the transaction changes again."""

    def step(counts: Counts, change: Change) -> None:
        pod, node, sign = change
        if matches(pod):
            counts[node] += sign

    def start() -> LogFold[Counts]:
        counts = np.zeros(len(tx.snapshot.node_names), dtype=np.float64)
        for pod, node in _bound(tx):
            step(counts, (pod, node, 1))
        return LogFold(counts, step)

    return tx.memo.get(MATCHES, key, start).catch_up(tx)


def _effects(tx: Transaction, pod: PodState) -> Effects:
    """What the existing pods' own terms say of `pod`: the domains their required
    anti-affinity keeps it out of (counted), and the score their other terms give it.
    Kept up to date in place, as `_matching` is."""

    def step(effects: Effects, change: Change) -> None:
        holder, node, sign = change
        if holder.pod_affinity is not None:
            _tally(tx, holder, node, pod, sign, effects)

    def start() -> LogFold[Effects]:
        effects: Effects = (Counter(), Counter())
        for holder, node in _bound(tx):
            step(effects, (holder, node, 1))
        return LogFold(effects, step)

    key = (pod.namespace, tuple(sorted(pod.labels.items())))
    return tx.memo.get(EFFECTS, key, start).catch_up(tx)


def _tally(
    tx: Transaction,
    holder: PodState,
    node: int,
    pod: PodState,
    sign: int,
    into: Effects,
) -> None:
    """Add (sign 1) or take away (-1) what `holder`, on `node`, says of `pod`."""
    terms = holder.pod_affinity
    if terms is None:
        return
    excluded, favour = into
    weighted = (
        *((t, 1, excluded) for t in terms.anti_affinity),
        *((t, HARD_AFFINITY_WEIGHT, favour) for t in terms.affinity),
        *((t, t.weight, favour) for t in terms.preferred_affinity),
        *((t, -t.weight, favour) for t in terms.preferred_anti_affinity),
    )
    for term, weight, tally in weighted:
        code = int(_domains(tx, term.topology_key)[0][node])
        if code >= 0 and term.matches(pod.namespace, pod.labels):
            tally[(term.topology_key, code)] += sign * weight


def _bound(tx: Transaction) -> tuple[tuple[PodState, int], ...]:
    """The snapshot's pods that hold a known node, with its row."""

    def build() -> tuple[tuple[PodState, int], ...]:
        index = tx.snapshot.node_index
        return tuple(
            (pod, index[pod.node])
            for pod in tx.snapshot.pods.values()
            if pod.node is not None and pod.node in index and not pod.terminal
        )

    return tx.memo.get(BOUND, None, build)


# ------------------------------------------------------------------ domains


def _domains(tx: Transaction, key: str) -> tuple[Indices, int]:
    """Per node, a code for its value of the label `key` (-1 without it), and how many values."""

    def build() -> tuple[Indices, int]:
        values = label_column(tx, key)
        present = np.array([v is not None for v in values], dtype=np.bool_)
        codes = np.full(len(values), -1, dtype=np.intp)
        if present.any():
            _, inverse = np.unique(values[present].astype(str), return_inverse=True)
            codes[present] = inverse
        codes.setflags(write=False)
        return codes, int(codes.max(initial=-1)) + 1

    return tx.memo.get(DOMAINS, key, build)


def _per_domain(tx: Transaction, key: str, amounts: Counts) -> Counts:
    """Per node, the sum of `amounts` over the nodes of its domain of `key` (0 without it)."""
    codes, count = _domains(tx, key)
    inside = codes >= 0
    sums = np.bincount(codes[inside], weights=amounts[inside], minlength=count)
    result: Counts = np.where(inside, sums[np.maximum(codes, 0)] if count else 0.0, 0.0)
    return result
