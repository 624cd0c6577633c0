"""`kai-ray migrate` never raises anything but InvalidObjectError on malformed KAI input.

Every field of the KAI manifests in tests/fixtures/kai (and of a SchedulingShard,
a scheduler configuration file and workloads that use every setting and key the
converter reads) is replaced in turn by values of the wrong shape; `migrate` either converts the
result or refuses it with problems that name an object and a field. A traceback
of any other kind is a bug.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kai_ray.tools.migrate import Document, migrate
from kai_ray.values.errors import InvalidObjectError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kai"
SETTINGS = """
apiVersion: kai.scheduler/v1
kind: SchedulingShard
metadata: {name: default}
spec:
  kValue: 0.5
  placementStrategy: {gpu: binpack, cpu: binpack}
  usageDBConfig:
    clientType: prometheus
    usageParams: {halfLifePeriod: 10m, windowSize: 1w, windowType: sliding, cronString: ""}
  plugins:
    proportion: {arguments: {kValue: "2"}}
    minruntime: {arguments: {defaultPreemptMinRuntime: 1m}}
    nodeplacement: {arguments: {gpu: binpack, cpu: binpack}}
  actions: {reclaim: {enabled: true, priority: 600}}
  minRuntime: {preemptMinRuntime: 1m}
  args: {schedule-period: 2s, max-consolidation-preemptees: "4"}
---
apiVersion: kai.scheduler/v1
kind: Config
metadata: {name: kai-config}
spec: {global: {schedulerName: kai-scheduler, queueLabelKey: kai.scheduler/queue}}
---
actions: "allocate, reclaim"
tiers:
- plugins:
  - name: proportion
    arguments: {kValue: "1"}
usageDBConfig: {clientType: prometheus, usageParams: {windowSize: 2d}}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: scheduler-config}
data:
  config.yaml: |
    actions: "allocate"
---
apiVersion: ray.io/v1
kind: RayJob
metadata: {name: rj, labels: {kai.scheduler/queue: team-a, priorityClassName: train}}
spec:
  rayClusterSpec:
    headGroupSpec: {template: {spec: {containers: [{name: head, image: ray}]}}}
    workerGroupSpecs:
      - groupName: w
        template:
          metadata: {annotations: {gpu-fraction: "0.5", gpu-memory: "1000"}}
          spec: {containers: [{name: w, image: ray}]}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: serve}
spec:
  template:
    metadata: {labels: {kai.scheduler/queue: team-a, kai.scheduler/task-priority: "1"}}
    spec: {schedulerName: kai-scheduler, containers: [{name: c, image: c}]}
"""
BAD_VALUES = [None, 5, -3, 0.5, True, "x", "", [], [1], {}, {"a": 1}]


def documents() -> list[dict[str, Any]]:
    docs = []
    for path in sorted(FIXTURES.glob("*.yaml")):
        docs.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    docs.extend(d for d in yaml.safe_load_all(SETTINGS) if d)
    return docs


def paths(node: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every field path in a document, parents before children."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield (*prefix, key)
            yield from paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield (*prefix, i)
            yield from paths(value, (*prefix, i))


def replaced(doc: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    target: Any = out
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return out


CASES = [
    pytest.param(i, path, id=f"{doc.get('kind', 'file')}-{'.'.join(map(str, path))}")
    for i, doc in enumerate(documents())
    for path in paths(doc)
]


@pytest.mark.parametrize(("index", "path"), CASES)
def test_any_field_of_the_wrong_shape_is_converted_or_refused_by_name(
    index: int, path: tuple[Any, ...]
) -> None:
    doc = documents()[index]
    for value in BAD_VALUES:
        try:
            migrate([Document("kai.yaml", replaced(doc, path, value))])
        except InvalidObjectError as err:
            assert err.problems and all(p.field for p in err.problems), (value, err)
