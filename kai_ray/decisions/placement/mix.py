"""The workload mix: which kinds of pods the cluster sees, and how often, lately.

Fragmentation-aware placement (`stranding.py`) asks "which pods could still use
what this node has left?", so it needs the pods it should expect. A pod kind
(a *class*) is a pod's requests, GPU share and node filters (selector, required
affinity, tolerations: a GPU-model constraint is a selector). `WorkloadMix`
keeps a weight per class, added to as pods are observed and decayed by their
age with a half-life, so the mix follows the workload as it drifts. Weights are
kept relative to the first observation (an observation `h` seconds later weighs
twice as much), so observing is O(1) and nothing is rescaled until the
exponent grows large.

The cycle's mix is made once per transaction from the snapshot: every live pod
(bound or pending, any scheduler's) weighed by its creation time. The pods are
counted by class in `ClassCounts`, which a caller keeps from cycle to cycle
(`run_cycle`'s `GroupTotals`) and which follows each snapshot by the pods that
changed; the mix depends on the counts alone, so kept and fresh counts give the
same mix. Only the heaviest classes are scored (`MixArrays`: those that cover
`coverage` of the weight, at most `max_classes`), laid out as arrays over the
snapshot's nodes. Pure: no I/O.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from kai_ray.decisions.placement.filters import static_mask
from kai_ray.decisions.placement.node_kept import node_static
from kai_ray.decisions.placement.shapes import shape_of
from kai_ray.decisions.transaction import MemoKey, Transaction
from kai_ray.state.pod_states import PodState
from kai_ray.state.snapshot import Changed, differences
from kai_ray.values.clock import unix_seconds
from kai_ray.values.config import FragmentationScoring, duration_seconds

Matrix = npt.NDArray[np.float64]
Flags = npt.NDArray[np.bool_]
#: Past this exponent the relative weights are brought back near 1 (2**60 is far from overflow).
_RESCALE_EXPONENT = 60.0


def class_key(pod: PodState) -> Hashable:
    """What makes two pods the same kind for the mix."""
    return (pod.requests, pod.gpu_share, pod.node_selector, pod.node_affinity, pod.tolerations)


class WorkloadMix:
    """Decayed weights of the pod classes observed; the heaviest classes on demand."""

    def __init__(self, half_life_s: float, coverage: float = 0.95, max_classes: int = 24) -> None:
        self.half_life_s = half_life_s
        self.coverage = coverage
        self.max_classes = max_classes
        self._weights: dict[Hashable, float] = {}
        self._examples: dict[Hashable, PodState] = {}
        self._origin: float | None = None
        self._heaviest: list[tuple[PodState, float]] | None = None

    @classmethod
    def of_weights(
        cls,
        weights: dict[Hashable, float],
        examples: dict[Hashable, PodState],
        settings: FragmentationScoring,
    ) -> WorkloadMix:
        """A mix of classes already weighed (in the order given: ties keep it)."""
        mix = cls(duration_seconds(settings.halfLife), settings.coverage, settings.maxClasses)
        mix._weights, mix._examples = weights, examples
        return mix

    def observe(self, pod: PodState, at: float, count: float = 1.0) -> None:
        """`count` pods like `pod` seen at `at` (seconds, any fixed origin)."""
        if self._origin is None:
            self._origin = at
        exponent = (at - self._origin) / self.half_life_s if self.half_life_s > 0 else 0.0
        if exponent > _RESCALE_EXPONENT:
            self._rescale(at)
            exponent = 0.0
        key = class_key(pod)
        self._examples.setdefault(key, pod)
        self._weights[key] = self._weights.get(key, 0.0) + count * 2.0**exponent
        self._heaviest = None

    def _rescale(self, at: float) -> None:
        assert self._origin is not None
        factor = 2.0 ** (-(at - self._origin) / self.half_life_s)
        self._weights = {k: w * factor for k, w in self._weights.items()}
        self._origin = at

    def heaviest(self) -> list[tuple[PodState, float]]:
        """The classes that cover `coverage` of the weight (at most `max_classes`), with
        their probabilities renormalised over them; heaviest first."""
        if self._heaviest is None:
            self._heaviest = self._rank()
        return self._heaviest

    def _rank(self) -> list[tuple[PodState, float]]:
        ranked = sorted(self._weights.items(), key=lambda item: -item[1])[: self.max_classes]
        total = sum(self._weights.values())
        kept: list[tuple[Hashable, float]] = []
        covered = 0.0
        for key, weight in ranked:
            kept.append((key, weight))
            covered += weight
            if covered >= self.coverage * total:
                break
        return [(self._examples[key], weight / covered) for key, weight in kept]


@dataclass(frozen=True)
class MixArrays:
    """The scored classes laid out over all nodes of a snapshot (K classes, N nodes, R columns)."""

    #: (K,) probability of each class.
    probability: Matrix
    #: (K, R) requests, whole GPUs in the GPU column, shares not.
    need: Matrix
    #: `need` with -inf where the class asks nothing (so no free amount is short of it).
    asked: Matrix
    #: (K,) whole GPUs per pod.
    whole: npt.NDArray[np.int64]
    #: (K,) the class asks for a GPU share.
    shares: Flags
    #: (K, N) the share as a fraction of a device on each node (0 for other classes).
    fraction: Matrix
    #: (K, N) nodes the class's filters allow.
    allowed: Flags
    #: The classes' keys, to tell when the layout can be kept.
    keys: tuple[Hashable, ...]


def lay_out(tx: Transaction, classes: Iterable[tuple[PodState, float]]) -> MixArrays:
    """Arrays for the given classes on the transaction's snapshot."""
    pods, weights = zip(*classes, strict=True) if classes else ((), ())
    shapes = [shape_of(tx, pod) for pod in pods]
    nodes, columns = len(tx.snapshot.node_names), len(tx.snapshot.resource_names)
    need = np.array([s.need for s in shapes], dtype=np.float64).reshape(-1, columns)
    return MixArrays(
        probability=np.array(weights, dtype=np.float64),
        need=need,
        asked=np.where(need > 0, need, -np.inf),
        whole=np.array([s.whole_gpus for s in shapes], dtype=np.int64),
        shares=np.array([s.shares_gpu for s in shapes], dtype=np.bool_),
        fraction=np.array([s.fraction for s in shapes], dtype=np.float64).reshape(-1, nodes),
        allowed=np.array([static_mask(tx, pod) for pod in pods], dtype=np.bool_).reshape(-1, nodes),
        keys=tuple(class_key(pod) for pod in pods),
    )


@dataclass
class TransactionMix:
    """The mix a transaction scores with, and its layout (made on first use and kept
    for the transaction; its arrays are the same object while the classes and their
    probabilities stay, so scores kept for them stay right)."""

    mix: WorkloadMix
    _arrays: MixArrays | None = None

    def arrays(self, tx: Transaction) -> MixArrays:
        """The mix laid out over the transaction's nodes: once, on first use (the mix
        does not change while the transaction lasts; placement asks for every pod)."""
        if self._arrays is None:
            classes = self.mix.heaviest()
            keys = tuple(class_key(pod) for pod, _ in classes)
            probability = np.array([p for _, p in classes], dtype=np.float64)
            arrays = _laid_out(tx, classes, keys)
            if not np.array_equal(probability, arrays.probability):
                arrays = _with_probability(arrays, probability)
            self._arrays = arrays
        return self._arrays


#: The classes laid out over the nodes, by their keys (probabilities aside).
LAYOUT = MemoKey[MixArrays]("workload mix layout")


def _laid_out(
    tx: Transaction, classes: list[tuple[PodState, float]], keys: tuple[Hashable, ...]
) -> MixArrays:
    """`lay_out`, kept from cycle to cycle while the nodes' static facts are the same
    (`node_kept.node_static`; its probabilities may be another cycle's)."""
    if any(pod.claim_entries for pod, _ in classes):  # their filters read more than the nodes
        return lay_out(tx, classes)
    return node_static(tx, LAYOUT, keys, lambda: lay_out(tx, classes))


def _with_probability(arrays: MixArrays, probability: Matrix) -> MixArrays:
    return MixArrays(
        probability,
        arrays.need,
        arrays.asked,
        arrays.whole,
        arrays.shares,
        arrays.fraction,
        arrays.allowed,
        arrays.keys,
    )


#: The transaction's mix, built from its snapshot on first use.
MIX = MemoKey[TransactionMix]("workload mix")
#: The live pods counted by class, kept across cycles by a caller (`run_cycle`'s totals).
CLASS_COUNTS = MemoKey["ClassCounts"]("live pods by class")


def mix_of(tx: Transaction, settings: FragmentationScoring) -> TransactionMix:
    """The workload mix of the transaction's snapshot (built once per transaction)."""
    return tx.memo.get(MIX, None, lambda: TransactionMix(snapshot_mix(tx, settings)))


def snapshot_mix(tx: Transaction, settings: FragmentationScoring) -> WorkloadMix:
    """Every live pod of the snapshot observed at its creation time: from the class
    counts kept for the transaction when there are some, else counted afresh."""
    counts = tx.memo.get(CLASS_COUNTS, None, ClassCounts)
    return counts.follow(tx.snapshot.pods, tx.snapshot.pods_changed).mix(settings)


class ClassCounts:
    """The live pods (bound or pending, any scheduler's) counted by class and creation
    time, following the snapshots it is given by the pods that are not the very
    objects of the last one (the cache keeps a pod's state while it is unchanged).

    The mix made from the counts depends on the counts alone, never on the order
    or history they were made in: classes in one canonical order, each class's
    weight a sum over its creation times in time order, relative to the newest
    pod. So counts kept from cycle to cycle and counts made afresh give the same
    mix to the last bit, and a cycle pays for the pods that changed, plus one pass
    comparing identities, instead of counting every pod again. Each class keeps its
    times in that order as pods come and go (`_Times`), and its weight while its
    times and the newest pod's stay the same."""

    def __init__(self) -> None:
        self._pods: Mapping[str, PodState] | None = None
        #: Per live pod key: its class and creation time.
        self._counted: dict[str, tuple[Hashable, _Time]] = {}
        self._counts: dict[Hashable, _Times] = {}
        self._examples: dict[Hashable, PodState] = {}
        self._order: dict[Hashable, str] = {}
        #: Per class: (times, counts) in time order, unreadable times NaN; its newest time.
        self._laid: dict[Hashable, tuple[Matrix, Matrix, float | None]] = {}
        #: Per class: its weight, with the newest time and the half-life it was
        #: worked out at (the same again while its layout stays).
        self._weighed: dict[Hashable, tuple[float, float, float]] = {}

    def follow(self, pods: Mapping[str, PodState], changed: Changed | None = None) -> ClassCounts:
        """Follow `pods`; `changed` (the snapshot's `pods_changed`), when it spans the
        last mapping and this one, names the only keys to look at."""
        if pods is self._pods:
            return self
        gone, replaced = differences(self._pods, pods, changed)
        for key in gone:
            self._forget(key)
        times: dict[str, _Time] = {}
        for key, pod in replaced:
            self._forget(key)
            if not pod.terminal:
                created = pod.creation_timestamp
                time = times.get(created) or times.setdefault(created, _time(created))
                self._count(key, pod, time)
        self._pods = pods
        return self

    def _count(self, key: str, pod: PodState, created: _Time) -> None:
        kind = class_key(pod)
        self._counted[key] = (kind, created)
        if kind not in self._counts:
            self._counts[kind] = _Times()
            self._examples[kind] = pod
            self._order[kind] = _canonical(pod)
        self._counts[kind].add(created)
        self._laid.pop(kind, None)
        self._weighed.pop(kind, None)

    def _forget(self, key: str) -> None:
        counted = self._counted.pop(key, None)
        if counted is None:
            return
        kind, created = counted
        times = self._counts[kind]
        times.remove(created)
        self._laid.pop(kind, None)
        self._weighed.pop(kind, None)
        if not times.keys:
            del self._counts[kind], self._examples[kind], self._order[kind]

    def mix(self, settings: FragmentationScoring) -> WorkloadMix:
        """The mix of the pods counted, each weighed `2^(-age / halfLife)` by its
        creation time against the newest (a pod without a readable creation time has
        just been made, as far as anyone knows)."""
        half_life = duration_seconds(settings.halfLife)
        kinds = sorted(self._counts, key=self._order.__getitem__)
        laid = [self._layout(kind) for kind in kinds]
        newest = max((last for _, _, last in laid if last is not None), default=0.0)
        weights: dict[Hashable, float] = {}
        for kind, (times, counts, _) in zip(kinds, laid, strict=True):
            found = self._weighed.get(kind)
            if found is not None and found[0] == newest and found[1] == half_life:
                weights[kind] = found[2]
                continue
            if half_life > 0:
                age = newest - np.where(np.isnan(times), newest, times)
                weights[kind] = float(np.dot(counts, np.exp2(-age / half_life)))
            else:
                weights[kind] = float(counts.sum())
            self._weighed[kind] = (newest, half_life, weights[kind])
        examples = {kind: self._examples[kind] for kind in kinds}
        return WorkloadMix.of_weights(weights, examples, settings)

    def _layout(self, kind: Hashable) -> tuple[Matrix, Matrix, float | None]:
        """The class's creation times (NaN where unreadable) and counts in time order,
        with its newest readable time (None when none is): laid out again only when
        its counts changed (from `_Times`, kept in that order)."""
        laid = self._laid.get(kind)
        if laid is None:
            times = self._counts[kind]
            # Readable times sort first, in time order: the newest is the last of them.
            readable = bisect.bisect_left(times.keys, _UNREADABLE)
            newest = times.seconds[readable - 1] if readable else None
            seconds = np.array(times.seconds, dtype=np.float64)
            laid = (seconds, np.array(times.counts, dtype=np.float64), newest)
            self._laid[kind] = laid
        return laid


@dataclass
class _Times:
    """One class's creation times in the order they sort (`_Time`), each with its Unix
    seconds (NaN where unreadable) and how many of the pods counted have it: kept in
    order as pods come and go, so laying a class out reads them as they are instead of
    sorting every time it has (thousands, in a deep backlog) when one pod changed."""

    keys: list[_Time] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)

    def add(self, time: _Time) -> None:
        at = bisect.bisect_left(self.keys, time)
        if at < len(self.keys) and self.keys[at] == time:
            self.counts[at] += 1
            return
        self.keys.insert(at, time)
        self.seconds.insert(at, math.nan if time[0] else time[1])
        self.counts.insert(at, 1)

    def remove(self, time: _Time) -> None:
        at = bisect.bisect_left(self.keys, time)
        self.counts[at] -= 1
        if not self.counts[at]:
            del self.keys[at], self.seconds[at], self.counts[at]


#: A creation time as the counts sort it: (unreadable, Unix seconds or 0, the text).
_Time = tuple[bool, float, str]


#: Sorts before every unreadable time and after every readable one.
_UNREADABLE: _Time = (True, -math.inf, "")


def _time(created: str) -> _Time:
    seconds = unix_seconds(created)
    return (seconds is None, seconds or 0.0, created)


def _canonical(pod: PodState) -> str:
    """A class's place in the canonical order: its key written out (every part of it
    is a plain value with a stable repr)."""
    requests = sorted(pod.requests.items())
    return repr((requests, pod.gpu_share, pod.node_selector, pod.node_affinity, pod.tolerations))
