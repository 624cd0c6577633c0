"""`--plot`: each queue's GPUs against its fair share over time, and cluster utilisation.

One panel per queue (parents first, then their children, as the report lists
them): allocated GPUs filled, fair share dashed, requested dotted, quota as a
thin line when known. The last panel is the cluster's GPU utilisation in per
cent. Time is in hours, or days for runs longer than three days. Headless
matplotlib (Agg). Writes one PNG; nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
import numpy.typing as npt

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes

from kai_ray.values.resources import GPU

DAY_THRESHOLD_S = 3 * 86400


def _steps(
    samples: Sequence[Mapping[str, Any]], key: str, end: float, unit: float
) -> tuple[list[float], list[float]]:
    times = [s["t_s"] / unit for s in samples] + [end / unit]
    values = [float(s[key][GPU]) for s in samples]
    return times, values + values[-1:]


def _queue_panel(
    ax: Axes, queue: Mapping[str, Any], quota: float | None, end: float, unit: float
) -> None:
    samples = queue["samples"]
    t, allocated = _steps(samples, "allocated", end, unit)
    _, fair = _steps(samples, "fair_share", end, unit)
    _, requested = _steps(samples, "requested", end, unit)
    ax.fill_between(t, allocated, step="post", alpha=0.35, color="tab:blue")
    ax.step(t, allocated, where="post", color="tab:blue", linewidth=1.8, label="allocated")
    ax.step(
        t, fair, where="post", color="tab:orange", linestyle="--", linewidth=1.6, label="fair share"
    )
    ax.step(
        t,
        requested,
        where="post",
        color="tab:gray",
        linestyle=":",
        linewidth=1.2,
        label="requested",
    )
    if quota is not None:
        ax.axhline(quota, color="tab:green", linewidth=1.0, alpha=0.8, label=f"quota ({quota:g})")
    parent = f"  (in {queue['parent']})" if queue["parent"] else ""
    ax.set_title(f"queue {queue['name']}{parent}", loc="left", fontsize="medium", fontweight="bold")
    ax.set_ylabel("GPUs")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small", frameon=False)


def _utilisation_panel(ax: Axes, report: Mapping[str, Any], end: float, unit: float) -> None:
    gpus = float(report["summary"]["gpus"]) or 1.0
    roots = [q for q in report["queues"] if q["parent"] is None and q["samples"]]
    times = np.array(sorted({s["t_s"] for q in roots for s in q["samples"]}), dtype=np.float64)
    total = np.zeros_like(times)
    for queue in roots:
        total += _in_force(queue["samples"], times)
    values = list(100 * total / gpus)
    t = [float(x) / unit for x in times] + [end / unit]
    values = values + values[-1:]
    t = t if len(times) else [0.0, end / unit]
    values = values if len(times) else [0.0, 0.0]
    ax.fill_between(t, values, step="post", alpha=0.35, color="tab:purple")
    ax.step(t, values, where="post", color="tab:purple", linewidth=1.5, label="GPUs allocated")
    ax.set_ylim(0, 105)
    ax.set_ylabel("% of GPUs")
    ax.set_title(
        f"cluster utilisation ({gpus:g} GPUs)", loc="left", fontsize="medium", fontweight="bold"
    )
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small", frameon=False)


def _in_force(
    samples: Sequence[Mapping[str, Any]], times: npt.NDArray[np.float64]
) -> npt.NDArray[np.float64]:
    """The allocated GPUs in force at each of `times` (0 before the first sample)."""
    sample_times = np.array([s["t_s"] for s in samples], dtype=np.float64)
    allocated = np.array([0.0, *(float(s["allocated"][GPU]) for s in samples)])
    return allocated[np.searchsorted(sample_times, times, side="right")]


def plot_report(
    report: Mapping[str, Any], path: Path, quotas: Mapping[str, float | None] | None = None
) -> None:
    queues = [q for q in report["queues"] if q["samples"]]
    end = max(float(report["summary"]["end_s"]), 1.0)
    unit, unit_name = (86400.0, "days") if end > DAY_THRESHOLD_S else (3600.0, "hours")
    panels = len(queues) + 1
    fig, axes = plt.subplots(
        panels, 1, figsize=(11, 2.1 * panels + 1.2), sharex=True, squeeze=False
    )
    for ax, queue in zip(axes[:-1, 0], queues, strict=True):
        _queue_panel(ax, queue, (quotas or {}).get(queue["name"]), end, unit)
    _utilisation_panel(axes[-1, 0], report, end, unit)
    axes[-1, 0].set_xlabel(f"virtual time ({unit_name})")
    axes[-1, 0].set_xlim(0, end / unit)
    summary = report["summary"]
    fig.suptitle(
        f"kai-ray simulation: {summary['jobs']} jobs on {summary['gpus']:g} GPUs, "
        f"utilisation {summary['gpu_utilisation']:.0%}, evictions {summary['evictions']}",
        fontsize="large",
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
