"""What the terminal shows, as plain rows: per queue, per variant, and overall.

Per queue: GPU quota, mean fair share, mean allocation, GPU-hours, jobs done and
the wait before a job's gang started (p50, p95); a parent queue adds up its
children's jobs. Built from the report (and the queues' quotas), so a report
read back from a file gives the same rows. Pure: no I/O, no printing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kai_ray.sim.accounting import queue_path
from kai_ray.values.api import Queue
from kai_ray.values.resources import GPU

Report = Mapping[str, Any]


@dataclass(frozen=True)
class QueueRow:
    name: str
    parent: str | None
    quota: float | None
    fair_share: float
    allocated: float
    gpu_hours: float
    jobs_done: int
    jobs: int
    wait_p50: float | None
    wait_p95: float | None


def time_mean(samples: Sequence[Mapping[str, Any]], key: str, end: float) -> float:
    """The time-weighted mean of a sampled GPU amount from 0 to `end`."""
    if not samples or end <= 0:
        return 0.0
    total = 0.0
    for sample, following in zip(samples, [*samples[1:], None], strict=True):
        until = following["t_s"] if following is not None else end
        total += sample[key][GPU] * max(until - sample["t_s"], 0.0)
    return total / end


def gpu_quotas(queues: Sequence[Queue]) -> dict[str, float | None]:
    """Each queue's GPU quota (None when it sets none)."""
    quotas: dict[str, float | None] = {}
    for queue in queues:
        entry = queue.spec.resources.get("gpu") or queue.spec.resources.get(GPU)
        quotas[queue.metadata.name] = (
            float(entry.quota) if entry is not None and entry.quota is not None else None
        )
    return quotas


def percentile(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if values else None


def queue_rows(report: Report, quotas: Mapping[str, float | None]) -> list[QueueRow]:
    end = float(report["summary"]["end_s"])
    parents = {q["name"]: q["parent"] for q in report["queues"]}
    jobs_of: dict[str, list[Mapping[str, Any]]] = {name: [] for name in parents}
    for job in report["jobs"]:
        for queue in queue_path(parents, job["queue"]):
            jobs_of.setdefault(queue, []).append(job)
    return [
        _row(q, quotas.get(q["name"]), jobs_of.get(q["name"], []), end) for q in report["queues"]
    ]


def _row(
    queue: Mapping[str, Any], quota: float | None, jobs: Sequence[Mapping[str, Any]], end: float
) -> QueueRow:
    samples = queue["samples"]
    allocated = time_mean(samples, "allocated", end)
    waits = [j["started_s"] - j["submitted_s"] for j in jobs if j["started_s"] is not None]
    return QueueRow(
        name=queue["name"],
        parent=queue["parent"],
        quota=quota,
        fair_share=time_mean(samples, "fair_share", end),
        allocated=allocated,
        gpu_hours=allocated * end / 3600,
        jobs_done=sum(1 for j in jobs if j["finished_s"] is not None),
        jobs=len(jobs),
        wait_p50=percentile(waits, 50),
        wait_p95=percentile(waits, 95),
    )
