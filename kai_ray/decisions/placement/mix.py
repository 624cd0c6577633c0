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

The cycle's mix is built once per transaction from the snapshot: every live pod
(bound or pending, any scheduler's) observed at its creation time. Only the
heaviest classes are scored (`MixArrays`: those that cover `coverage` of the
weight, at most `max_classes`), laid out as arrays over the snapshot's nodes.
Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kai_ray.decisions.placement.filters import static_mask
from kai_ray.decisions.placement.shapes import shape_of
from kai_ray.decisions.transaction import MemoKey, Transaction
from kai_ray.state.pod_states import PodState
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
    """The mix a transaction scores with, and its layout: the same object while the
    classes and their probabilities stay (scores kept for it stay right)."""

    mix: WorkloadMix
    _arrays: MixArrays | None = None

    def arrays(self, tx: Transaction) -> MixArrays:
        classes = self.mix.heaviest()
        keys = tuple(class_key(pod) for pod, _ in classes)
        if self._arrays is None or self._arrays.keys != keys:
            self._arrays = lay_out(tx, classes)
        else:
            probability = np.array([p for _, p in classes], dtype=np.float64)
            if not np.array_equal(probability, self._arrays.probability):
                self._arrays = _with_probability(self._arrays, probability)
        return self._arrays


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


def mix_of(tx: Transaction, settings: FragmentationScoring) -> TransactionMix:
    """The workload mix of the transaction's snapshot (built once per transaction)."""
    return tx.memo.get(MIX, None, lambda: TransactionMix(snapshot_mix(tx, settings)))


def snapshot_mix(tx: Transaction, settings: FragmentationScoring) -> WorkloadMix:
    """Every live pod of the snapshot observed at its creation time."""
    mix = WorkloadMix(duration_seconds(settings.halfLife), settings.coverage, settings.maxClasses)
    seen: dict[tuple[Hashable, str], tuple[PodState, int]] = {}
    for pod in tx.snapshot.pods.values():
        if not pod.terminal:
            key = (class_key(pod), pod.creation_timestamp)
            example, count = seen.get(key, (pod, 0))
            seen[key] = (example, count + 1)
    times = {created: unix_seconds(created) for _, created in seen}
    # A pod without a readable creation time has just been made, as far as anyone knows.
    newest = max((t for t in times.values() if t is not None), default=0.0)
    observations = [
        (_or(times[created], newest), pod, count) for (_, created), (pod, count) in seen.items()
    ]
    for at, pod, count in sorted(observations, key=lambda item: item[0]):
        mix.observe(pod, at, count)
    return mix


def _or(value: float | None, default: float) -> float:
    return default if value is None else value
