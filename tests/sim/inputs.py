"""Input documents the simulator tests share."""

from __future__ import annotations

from typing import Any

from kai_ray.values.resources import GPU


def gpu_pool_and_config(count: int = 8, cycle_period: str = "10s") -> list[dict[str, Any]]:
    """A NodePool of `count` 8-GPU nodes and a SchedulerConfig with the given period."""
    pool = {
        "apiVersion": "sim.kai-ray.io/v1alpha1",
        "kind": "NodePool",
        "metadata": {"name": "gpu"},
        "spec": {
            "count": count,
            "namePrefix": "gpu",
            "capacity": {"cpu": "64", "memory": "512Gi", GPU: 8, "pods": 110},
        },
    }
    config = {
        "apiVersion": "config.kai-ray.io/v1alpha1",
        "kind": "SchedulerConfig",
        "metadata": {"name": "default"},
        "spec": {"cyclePeriod": cycle_period},
    }
    return [pool, config]
