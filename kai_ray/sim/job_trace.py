"""Job traces: a CSV list of jobs turned into the workloads the simulator runs.

Published cluster traces (Philly, Helios, Alibaba PAI) are lists of jobs with a
submit time, a duration, a team and a size. `trace_documents` reads such a list
(one job per row) and returns one batch `Job` document per row, a gang of all
its pods, annotated with `sim.kai-ray.io/submit-at` and `duration`, so that the
loader checks it like any other input. Columns (header row required, any order):

| column | meaning |
|---|---|
| `submit` | submit time: seconds (`3600`) or a duration (`1h`) |
| `duration` | run time once the gang runs, same forms; empty means forever |
| `queue` | leaf queue |
| `pods` | pods in the gang (>= 1) |
| `gpus_per_pod` | whole GPUs per pod (>= 0) |
| `gpu_fraction` | optional: a fraction of one GPU per pod instead (0 < f < 1) |
| `topology` | optional: `level` or `topology/level` all pods must share |
| `name`, `namespace`, `cpu_per_pod`, `memory_per_pod` | optional |

A bad row raises `InvalidObjectError` naming the file, the line and the column.
Reading the file is the only I/O.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from kai_ray.sim.loader import Document
from kai_ray.values.config import duration_seconds
from kai_ray.values.errors import InvalidObjectError, ObjectRef, Problem
from kai_ray.values.names import (
    GPU_FRACTION_ANNOTATION,
    MIN_MEMBER_ANNOTATION,
    QUEUE_LABEL,
    SIM_DURATION,
    SIM_SUBMIT_AT,
    TOPOLOGY_ANNOTATION,
    TOPOLOGY_REQUIRED_ANNOTATION,
)

REQUIRED_COLUMNS = ("submit", "duration", "queue", "pods", "gpus_per_pod")


class _RowError(ValueError):
    def __init__(self, column: str, message: str) -> None:
        super().__init__(message)
        self.column = column


def trace_documents(path: Path, default_topology: str | None = None) -> Iterator[Document]:
    """One batch Job document per row of the CSV at `path`."""
    ref = ObjectRef("Trace", path.name, source=str(path))
    try:
        with path.open(newline="") as handle:
            rows = list(csv.DictReader(handle))
            header = rows[0].keys() if rows else []
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise InvalidObjectError([Problem(ref, "(file)", f"cannot read: {err}")]) from None
    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    if missing:
        raise InvalidObjectError([Problem(ref, "line 1", f"missing columns: {', '.join(missing)}")])
    for number, row in enumerate(rows, start=2):
        try:
            yield Document(job_document(row, number, default_topology), str(path))
        except _RowError as err:
            where = f"line {number}, column {err.column}"
            raise InvalidObjectError([Problem(ref, where, str(err))]) from None


def job_document(row: Mapping[str, str | None], line: int, topology: str | None) -> dict[str, Any]:
    """The batch Job of one trace row (`line` names it when the row has no name)."""
    pods = _count(row, "pods", minimum=1)
    annotations = {
        MIN_MEMBER_ANNOTATION: str(pods),
        SIM_SUBMIT_AT: f"{_seconds(row, 'submit', required=True):g}s",
    }
    if (duration := _seconds(row, "duration", required=False)) is not None:
        annotations[SIM_DURATION] = f"{duration:g}s"
    annotations.update(_topology_annotations(row, topology))
    queue = _text(row, "queue")
    name = _cell(row, "name") or f"trace-{line:06d}"
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": _cell(row, "namespace") or "default",
            "labels": {QUEUE_LABEL: queue},
            "annotations": annotations,
        },
        "spec": {"parallelism": pods, "completions": pods, "template": _template(row)},
    }


def _template(row: Mapping[str, str | None]) -> dict[str, Any]:
    requests: dict[str, Any] = {
        "cpu": _cell(row, "cpu_per_pod") or "1",
        "memory": _cell(row, "memory_per_pod") or "4Gi",
    }
    metadata: dict[str, Any] = {}
    fraction = _fraction(row)
    gpus = _count(row, "gpus_per_pod", minimum=0)
    if fraction is not None:
        metadata["annotations"] = {GPU_FRACTION_ANNOTATION: f"{fraction:g}"}
    elif gpus:
        requests["nvidia.com/gpu"] = gpus
    container = {"name": "main", "image": "trace/job", "resources": {"requests": requests}}
    spec = {"schedulerName": "kai-ray", "restartPolicy": "Never", "containers": [container]}
    return {"metadata": metadata, "spec": spec}


def _topology_annotations(row: Mapping[str, str | None], default: str | None) -> dict[str, str]:
    value = _cell(row, "topology")
    if not value:
        return {}
    topology, _, level = value.rpartition("/")
    topology = topology or default or ""
    if not topology or not level:
        raise _RowError("topology", f"{value!r}: name the Topology as topology/level")
    return {TOPOLOGY_ANNOTATION: topology, TOPOLOGY_REQUIRED_ANNOTATION: level}


def _cell(row: Mapping[str, str | None], column: str) -> str:
    return (row.get(column) or "").strip()


def _text(row: Mapping[str, str | None], column: str) -> str:
    value = _cell(row, column)
    if not value:
        raise _RowError(column, "is empty")
    return value


def _count(row: Mapping[str, str | None], column: str, minimum: int) -> int:
    value = _text(row, column)
    if not value.isdigit() or int(value) < minimum:
        raise _RowError(column, f"{value!r} is not a whole number >= {minimum}")
    return int(value)


def _fraction(row: Mapping[str, str | None]) -> float | None:
    value = _cell(row, "gpu_fraction")
    if not value:
        return None
    try:
        fraction = float(value)
    except ValueError:
        fraction = -1.0
    if not 0 < fraction < 1:
        raise _RowError("gpu_fraction", f"{value!r} is not a number between 0 and 1")
    return fraction


def _seconds(row: Mapping[str, str | None], column: str, required: bool) -> float | None:
    value = _text(row, column) if required else _cell(row, column)
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = duration_seconds(value)
        except ValueError as err:
            raise _RowError(column, str(err)) from None
    if not math.isfinite(seconds) or seconds < 0:
        raise _RowError(column, f"{value!r} is not a finite time >= 0")
    return seconds
