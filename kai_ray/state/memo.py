"""What one snapshot build may hand to the next.

Between two cycles a handful of pods change, not the cluster. `SnapshotMemo`
keeps the parts of a build that depend only on inputs that did not change,
each checked against those inputs at every build, so a memo can never make a
snapshot differ from a fresh build:

- the node matrices, per set of resource columns, while the node readings are
  the same objects;
- each node's device accounting and used row, while the node holds the same
  `PodState` objects (readings are immutable, so identity is enough);
- Topology and PodGroup validations, while the object is equal to the copy
  that was validated (so an object changed in place is validated again);
- each topology's tree over the node labels, while nodes and spec stay (a tree
  holds no resources: pods that come and go leave it as it is);
- each `PodGroupState`, while its validated group and its members stay.

`build_snapshot` uses a fresh memo (one build, nothing kept); a caller that
builds every cycle (the simulator, or the operator's loop) keeps one. Pure: no I/O.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np
import numpy.typing as npt
import orjson

from kai_ray.state.devices import GpuDevices, NodeDevices
from kai_ray.state.groups import PodGroupState
from kai_ray.state.nodes import NodeFacts
from kai_ray.state.pod_states import PodState
from kai_ray.state.topology import TopologyTree

Matrix = npt.NDArray[np.float64]
Model = TypeVar("Model")


@dataclass
class NodeAccount:
    """One node's share of a build: its counted pods as read, and what came of them."""

    pods: tuple[PodState, ...]
    devices: NodeDevices
    used: Matrix


@dataclass
class ValidatedCache(Generic[Model]):
    """Validated models by key, each with a copy of the object it was validated from."""

    entries: dict[str, tuple[Mapping[str, Any], Model]] = field(default_factory=dict)

    def get(self, key: str, obj: Mapping[str, Any], validate: Callable[[Any], Model]) -> Model:
        """The model of `obj`; `validate` runs (and may raise) only when `obj` is new."""
        entry = self.entries.get(key)
        if entry is not None and entry[0] == obj:
            return entry[1]
        model = validate(obj)
        self.entries[key] = (json_copy(obj), model)
        return model

    def keep_only(self, keys: set[str]) -> None:
        if len(self.entries) > 2 * len(keys) + 64:
            self.entries = {k: v for k, v in self.entries.items() if k in keys}


def json_copy(obj: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy of an object as the API gives it: through JSON (orjson), seven
    times as fast as `copy.deepcopy`; deepcopy for what JSON would change (a
    YAML date, say), so the copy is always equal to the object."""
    try:
        copied: dict[str, Any] = orjson.loads(orjson.dumps(obj))
    except TypeError:
        return copy.deepcopy(dict(obj))
    return copied if copied == obj else copy.deepcopy(dict(obj))


class SnapshotMemo:
    """Caches kept from one build to the next; see the module's docstring."""

    def __init__(self) -> None:
        self._nodes: Sequence[NodeFacts] | None = None
        #: Every resource name the nodes offer.
        self.offered: set[str] | None = None
        self.matrices: dict[tuple[str, ...], tuple[Matrix, Matrix]] = {}
        #: Per node: its account (None until worked out), its devices, and the nodes
        #: whose accounts hold pods. With the used rows and device free fractions
        #: they are kept up to date in place, for one set of resource columns (each
        #: build hands out copies).
        self.accounts: list[NodeAccount | None] = []
        self.devices: list[GpuDevices] = []
        self.busy: set[int] = set()
        self.columns: tuple[str, ...] = ()
        self.used: Matrix = np.zeros((0, 0), dtype=np.float64)
        self.device_free: Matrix = np.zeros((0, 0), dtype=np.float64)
        #: Topology name -> (validated Topology, its tree over the nodes' labels).
        self.layouts: dict[str, tuple[Any, TopologyTree]] = {}
        self.topologies: ValidatedCache[Any] = ValidatedCache()
        self.pod_groups: ValidatedCache[Any] = ValidatedCache()
        self.group_states: dict[str, PodGroupState] = {}

    def use_nodes(self, nodes: Sequence[NodeFacts]) -> None:
        """Forget what was derived from other node readings than `nodes`."""
        if nodes is not self._nodes:
            self._nodes = nodes
            self.offered = None
            self.matrices.clear()
            self.columns = ()
            self.used = np.zeros((0, 0), dtype=np.float64)
            self.device_free = np.zeros((0, 0), dtype=np.float64)
            self.layouts.clear()
