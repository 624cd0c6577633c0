"""`kai-ray snapshot`: the whole input the simulator would run, as one YAML file.

Normalised: NodePools are expanded to the Nodes they stand for; Topologies,
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
from kai_ray.sim.nodepool import SIM_API_VERSION, NodePool, expand
from kai_ray.values.validation import parse_model

#: Kinds written first, in this order; everything else follows in input order.
LEADING_KINDS = ("Node", "Topology", "Queue", "SchedulerConfig", "ClusterEvent")


def normalised(documents: Sequence[Document]) -> list[dict[str, Any]]:
    objects: list[dict[str, Any]] = []
    for doc in documents:
        if (doc.raw.get("apiVersion"), doc.raw.get("kind")) == (SIM_API_VERSION, "NodePool"):
            objects.extend(expand(parse_model(NodePool, doc.raw, doc.source)))
        else:
            objects.append(dict(doc.raw))
    rank = {kind: i for i, kind in enumerate(LEADING_KINDS)}
    return sorted(objects, key=lambda o: rank.get(str(o.get("kind")), len(rank)))


def snapshot_yaml(documents: Sequence[Document]) -> str:
    header = "# kai-ray snapshot: the whole simulator input, NodePools expanded.\n"
    return header + yaml.safe_dump_all(normalised(documents), sort_keys=False)
