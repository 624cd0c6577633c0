"""`--plot`: each queue's GPU allocation against its fair share over time.

Headless matplotlib (Agg). Writes one PNG; nothing else.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from kai_ray.values.resources import GPU


def _steps(samples: list[dict[str, Any]], key: str, end: float) -> tuple[list[float], list[float]]:
    times = [s["t_s"] / 3600 for s in samples] + [end / 3600]
    values = [s[key][GPU] for s in samples]
    return times, values + values[-1:]


def plot_report(report: dict[str, Any], path: Path) -> None:
    leaves = [q for q in report["queues"] if q["samples"]]
    end = max(report["summary"]["end_s"], 1.0)
    fig, axes = plt.subplots(
        max(len(leaves), 1),
        1,
        figsize=(10, 2.2 * max(len(leaves), 1) + 1),
        sharex=True,
        squeeze=False,
    )
    for ax, queue in zip(axes[:, 0], leaves, strict=False):
        t, alloc = _steps(queue["samples"], "allocated", end)
        _, fair = _steps(queue["samples"], "fair_share", end)
        ax.step(t, alloc, where="post", label="allocated GPUs", linewidth=2)
        ax.step(t, fair, where="post", label="fair share (GPUs)", linestyle="--")
        ax.set_title(
            f"queue {queue['name']}" + (f" (parent {queue['parent']})" if queue["parent"] else ""),
            loc="left",
        )
        ax.set_ylabel("GPUs")
        ax.grid(alpha=0.3)
        ax.legend(loc="upper right", fontsize="small")
    axes[-1, 0].set_xlabel("virtual time (hours)")
    fig.suptitle(
        f"kai-ray simulation: {report['summary']['gpus']:g} GPUs, "
        f"utilisation {report['summary']['gpu_utilisation']:.0%}"
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
