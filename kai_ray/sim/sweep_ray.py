"""Run sweep variants as Ray tasks: the only module of the simulator that imports Ray.

Ray is imported inside `run_on_ray`, never at module level. Without an address a
local cluster is started with one CPU per core (token auth and usage stats off
unless the environment says otherwise, so nothing is written to `$HOME`) and shut
down at the end; with `--ray-address` the sweep joins that cluster. The input
documents are put in the object store once; each task runs one variant with
`sweep.run_variant`, so Ray changes where variants run, never what they report.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from kai_ray.sim.loader import Document
from kai_ray.sim.overrides import Override
from kai_ray.sim.sweep import OnDone, Report, run_variant


def run_on_ray(
    documents: Sequence[Document],
    variants: Sequence[tuple[Override, ...]],
    until: float | None,
    address: str | None,
    names: Sequence[str],
    on_done: OnDone | None,
) -> list[Report]:
    import ray

    _start(ray, address)
    try:
        documents_ref: Any = ray.put(list(documents))
        task = ray.remote(num_cpus=1)(run_variant)
        refs = [task.remote(documents_ref, variant, until) for variant in variants]
        return _gather(ray, refs, names, on_done)
    finally:
        ray.shutdown()


def _start(ray: Any, address: str | None) -> None:
    if address is not None:
        ray.init(address=address, log_to_driver=False)
        return
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(
        address="local", num_cpus=os.cpu_count() or 1, include_dashboard=False, log_to_driver=False
    )


def _gather(
    ray: Any, refs: list[Any], names: Sequence[str], on_done: OnDone | None
) -> list[Report]:
    """Results in the order of `refs`, reporting each as it finishes."""
    index = {ref: i for i, ref in enumerate(refs)}
    waiting = list(refs)
    while waiting:
        done, waiting = ray.wait(waiting, num_returns=1)
        if on_done is not None:
            on_done(names[index[done[0]]])
    return [ray.get(ref) for ref in refs]
