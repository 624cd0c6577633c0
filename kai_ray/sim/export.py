"""`kai-ray snapshot`: the whole input the simulator would run, as one YAML file.

Normalised: NodePools are expanded to the Nodes they stand for (and the
ResourceSlices and DeviceClass their `spec.dra` publishes); Topologies,
Queues, the SchedulerConfig and ClusterEvents follow; workloads, PodGroups and
their pods come last, as given (trace rows as the Jobs they become). Reading the
file back gives the same run. Later the operator will write the same format from
a live cluster. Pure: builds text, writes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import yaml

from kai_ray.sim.loader import Document
from kai_ray.sim.nodepool import (
    SIM_API_VERSION,
    NodePool,
    device_classes,
    expand,
    resource_slices,
)
from kai_ray.values.validation import parse_model

#: Kinds written first, in this order; everything else follows in input order.
LEADING_KINDS = (
    "Node",
    "DeviceClass",
    "ResourceSlice",
    "Topology",
    "Queue",
    "SchedulerConfig",
    "ClusterEvent",
)


def normalised(documents: Sequence[Document]) -> list[dict[str, Any]]:
    objects: list[dict[str, Any]] = []
    for doc in documents:
        if (doc.raw.get("apiVersion"), doc.raw.get("kind")) == (SIM_API_VERSION, "NodePool"):
            pool = parse_model(NodePool, doc.raw, doc.source)
            objects.extend(expand(pool))
            objects.extend(resource_slices(pool))
            # A DeviceClass two pools publish alike is written once.
            objects.extend(c for c in device_classes(pool) if c not in objects)
        else:
            objects.append(dict(doc.raw))
    rank = {kind: i for i, kind in enumerate(LEADING_KINDS)}
    return sorted(objects, key=lambda o: rank.get(str(o.get("kind")), len(rank)))


def snapshot_yaml(documents: Sequence[Document]) -> str:
    header = "# kai-ray snapshot: the whole simulator input, NodePools expanded.\n"
    return header + yaml.safe_dump_all(normalised(documents), sort_keys=False)
