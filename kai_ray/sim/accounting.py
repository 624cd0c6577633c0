"""What every queue holds and asks for, kept up to date job by job, sampled per cycle.

The engine tells `QueueAccounting` a job's totals whenever the job changes (it is
submitted, pods bind or are released, it finishes); the accounting adds the
difference to the job's leaf queue, so a cycle's sample costs one pass over the
queues, not over every pod. Amounts are plain per-resource floats, rounded when
sampled so that adding and taking away the same shares leaves no dust. No I/O.
"""

from __future__ import annotations

from collections.abc import Mapping

from kai_ray.sim.records import QueueSample
from kai_ray.values.resources import Resources

Amounts = dict[str, float]
DIGITS = 9


def add_into(total: Amounts, amounts: Mapping[str, float], sign: float = 1.0) -> None:
    for name, amount in amounts.items():
        total[name] = total.get(name, 0.0) + sign * amount


def queue_path(parents: Mapping[str, str | None], leaf: str) -> list[str]:
    """The leaf and its ancestors, leaf first."""
    path = [leaf]
    while (parent := parents.get(path[-1])) is not None and parent not in path:
        path.append(parent)
    return path


class QueueAccounting:
    """Allocated and requested amounts per leaf queue, and the sample series per queue."""

    def __init__(self, parents: Mapping[str, str | None]) -> None:
        self.parents = dict(parents)
        self.samples: dict[str, list[QueueSample]] = {name: [] for name in parents}
        self._jobs: dict[str, tuple[str, Amounts, Amounts]] = {}
        self._allocated: dict[str, Amounts] = {}
        self._requested: dict[str, Amounts] = {}

    def set_job(self, key: str, queue: str, allocated: Amounts, requested: Amounts) -> None:
        """The job now holds `allocated` and asks for `requested` (bound pods included)."""
        self.remove_job(key)
        self._jobs[key] = (queue, allocated, requested)
        add_into(self._allocated.setdefault(queue, {}), allocated)
        add_into(self._requested.setdefault(queue, {}), requested)

    def remove_job(self, key: str) -> None:
        old = self._jobs.pop(key, None)
        if old is not None:
            queue, allocated, requested = old
            add_into(self._allocated[queue], allocated, -1.0)
            add_into(self._requested[queue], requested, -1.0)

    def sample(self, now: float, fair_shares: Mapping[str, Resources]) -> None:
        """Append a sample to each queue whose values changed since its last one."""
        allocated = self._rolled_up(self._allocated)
        requested = self._rolled_up(self._requested)
        for name, series in self.samples.items():
            sample = QueueSample(
                t_s=now,
                allocated=allocated.get(name, Resources()),
                requested=requested.get(name, Resources()),
                fair_share=fair_shares.get(name, Resources()),
            )
            if not series or not series[-1].same_values(sample):
                series.append(sample)

    def _rolled_up(self, per_leaf: Mapping[str, Amounts]) -> dict[str, Resources]:
        totals: dict[str, Amounts] = {}
        for leaf, amounts in per_leaf.items():
            for queue in queue_path(self.parents, leaf):
                add_into(totals.setdefault(queue, {}), amounts)
        return {
            queue: Resources({k: round(v, DIGITS) for k, v in amounts.items()})
            for queue, amounts in totals.items()
        }
