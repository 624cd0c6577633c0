r"""Job traces: a CSV list of jobs turned into the workloads the simulator runs.

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
| `gpu_fraction` | optional: part of one GPU per pod (0 < f <= 1); `gpus_per_pod` 0 or 1 |
| `topology` | optional: `level` or `topology/level` all pods must share |
| `node_selector` | optional: `key=value` pairs separated by `;` |
| `gpu_model` | optional: GPU models (`nvidia.com/gpu.product`) allowed, separated by `\|` |
| `priority` | optional: a whole number (the pods' priority) or a PriorityClass name |
| `name`, `namespace`, `cpu_per_pod`, `memory_per_pod` | optional |

Times are written to the Job as plain seconds (`1000000s`), never in exponent
form, and checked here, so any time the CSV holds either works or is refused
naming its column.

A bad row raises `InvalidObjectError` naming the file, the line and the column.
Reading the file is the only I/O.
"""

from __future__ import annotations

import csv
import math
import re
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
from kai_ray.values.resources import GPU_PRODUCT_LABEL

REQUIRED_COLUMNS = ("submit", "duration", "queue", "pods", "gpus_per_pod")
#: A PriorityClass name: a DNS subdomain.
_PRIORITY_CLASS = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")


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
        SIM_SUBMIT_AT: _duration_text(_seconds(row, "submit", required=True), "submit"),
    }
    if (duration := _seconds(row, "duration", required=False)) is not None:
        annotations[SIM_DURATION] = _duration_text(duration, "duration")
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
        if gpus > 1:
            raise _RowError(
                "gpu_fraction",
                f"{fraction:g} with gpus_per_pod {gpus}: a fraction is part of one GPU; "
                "give gpus_per_pod 0 or 1 with it, or whole GPUs alone",
            )
        metadata["annotations"] = {GPU_FRACTION_ANNOTATION: f"{fraction:g}"}
    elif gpus:
        requests["nvidia.com/gpu"] = gpus
    container = {"name": "main", "image": "trace/job", "resources": {"requests": requests}}
    spec: dict[str, Any] = {
        "schedulerName": "kai-ray",
        "restartPolicy": "Never",
        "containers": [container],
    }
    spec.update(_placement_fields(row))
    return {"metadata": metadata, "spec": spec}


def _placement_fields(row: Mapping[str, str | None]) -> dict[str, Any]:
    """nodeSelector, GPU model affinity and priority of the pods, from optional columns."""
    fields: dict[str, Any] = {}
    if selector := _node_selector(row):
        fields["nodeSelector"] = selector
    if models := _gpu_models(row):
        requirement = {"key": GPU_PRODUCT_LABEL, "operator": "In", "values": models}
        terms = [{"matchExpressions": [requirement]}]
        fields["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}
            }
        }
    fields.update(_priority(row))
    return fields


def _node_selector(row: Mapping[str, str | None]) -> dict[str, str]:
    selector: dict[str, str] = {}
    for pair in _cell(row, "node_selector").replace(";", " ").split():
        key, equals, value = pair.partition("=")
        if not equals or not key:
            raise _RowError("node_selector", f"{pair!r} is not key=value")
        selector[key] = value
    return selector


def _gpu_models(row: Mapping[str, str | None]) -> list[str]:
    value = _cell(row, "gpu_model")
    models = [m.strip() for m in value.split("|")] if value else []
    if any(not m for m in models):
        raise _RowError("gpu_model", f"{value!r}: name GPU models separated by |")
    return sorted(set(models))


def _priority(row: Mapping[str, str | None]) -> dict[str, Any]:
    value = _cell(row, "priority")
    if not value:
        return {}
    if value.lstrip("-").isdigit():
        return {"priority": int(value)}
    if not _PRIORITY_CLASS.fullmatch(value):
        raise _RowError("priority", f"{value!r} is neither a whole number nor a PriorityClass name")
    return {"priorityClassName": value}


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
    if not 0 < fraction <= 1:
        raise _RowError("gpu_fraction", f"{value!r} is not a number in (0, 1]")
    return fraction


def _duration_text(seconds: float | None, column: str) -> str:
    """Seconds as the annotation takes them, never in exponent form (`1000000s`, `0.25s`)."""
    assert seconds is not None
    text = f"{seconds:.6f}".rstrip("0").rstrip(".") + "s"
    try:
        duration_seconds(text)
    except ValueError as err:
        raise _RowError(column, str(err)) from None
    return text


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
