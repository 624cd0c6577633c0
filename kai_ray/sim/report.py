"""The simulator's report: the JSON of docs/architecture.md section 5, and its summary.

Builds plain dicts from the engine's records; writing the file is left to the
caller. Pure: no I/O.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from kai_ray.sim.engine import Simulation
from kai_ray.sim.records import BindingRecord, JobRecord
from kai_ray.values.resources import GPU, Resources

REPORT_VERSION = 1


def _percentiles(values: Sequence[float]) -> dict[str, float | None]:
    if not values:
        return {"mean": None, "p50": None, "p95": None, "max": None}
    data = np.asarray(values, dtype=np.float64)
    return {
        "mean": float(data.mean()),
        "p50": float(np.percentile(data, 50)),
        "p95": float(np.percentile(data, 95)),
        "max": float(data.max()),
    }


def all_bindings(sim: Simulation) -> list[BindingRecord]:
    return sorted(
        [*sim.released, *sim.bindings.values()], key=lambda b: (b.bound_s, b.namespace, b.name)
    )


def gpu_seconds(bindings: Sequence[BindingRecord], end: float) -> float:
    total = 0.0
    for binding in bindings:
        gpus = binding.requests[GPU]
        released = binding.released_s if binding.released_s is not None else end
        total += float(gpus) * (released - binding.bound_s)
    return total


def cluster_gpus(sim: Simulation) -> float:
    total = 0.0
    for node in sim.sim.nodes:
        status = node.get("status") or {}
        amounts = Resources.parse(status.get("allocatable") or status.get("capacity"), "status")
        total += amounts[GPU]
    # DRA devices of classes counted as GPUs (SchedulerConfig spec.dra) offer GPUs too.
    return total + sum(r[GPU] for r in sim.cache.dra_view().node_resources.values())


def summary(
    sim: Simulation, jobs: Sequence[JobRecord], bindings: Sequence[BindingRecord]
) -> dict[str, Any]:
    end = sim.end_time()
    waits = [j.started_s - j.submitted_s for j in jobs if j.started_s is not None]
    capacity = cluster_gpus(sim)
    used = gpu_seconds(bindings, end)
    reasons = Counter(
        b.release_reason for b in bindings if b.release_reason not in (None, "completed")
    )
    return {
        "jobs": len(jobs),
        "jobs_started": sum(1 for j in jobs if j.started_s is not None),
        "jobs_finished": sum(1 for j in jobs if j.finished_s is not None),
        "jobs_waiting": sum(1 for j in jobs if j.started_s is None),
        "pods_bound": len(bindings),
        "nodes": len(sim.sim.nodes),
        "gpus": capacity,
        "cycles": sim.cycles,
        "end_s": end,
        "gpu_utilisation": used / (capacity * end) if capacity > 0 and end > 0 else 0.0,
        "wait_s": _percentiles(waits),
        "evictions": sum(reasons.values()),
        "evictions_by_reason": dict(sorted(reasons.items())),
    }


def build_report(sim: Simulation) -> dict[str, Any]:
    jobs = sorted(
        (j.record for j in sim.jobs.values()), key=lambda r: (r.submitted_s, r.namespace, r.name)
    )
    bindings = all_bindings(sim)
    parents = {q.metadata.name: q.spec.parentQueue for q in sim.sim.queues}
    return {
        "version": REPORT_VERSION,
        "summary": summary(sim, jobs, bindings),
        "jobs": [j.to_json() for j in jobs],
        "pods": [b.to_json() for b in bindings],
        "queues": [
            {"name": name, "parent": parents[name], "samples": [s.to_json() for s in samples]}
            for name, samples in sim.samples.items()
        ],
        "quota_over_committed": [
            {
                "parent": found.parent,
                "queues": list(found.children),
                "resource": found.resource,
                "quotas": found.quotas,
                "available": found.available,
                "first_s": first_s,
            }
            for found, first_s in sim.over_committed.items()
        ],
    }
