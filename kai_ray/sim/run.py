"""`kai-ray simulate`: load, run, report, print, plot.

This is the simulator's only module that writes files and prints; the engine
and the report builder are pure.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from kai_ray.sim.engine import Simulation
from kai_ray.sim.loader import load
from kai_ray.sim.report import build_report
from kai_ray.values.config import duration_seconds
from kai_ray.values.errors import InvalidObjectError, ObjectRef, Problem
from kai_ray.values.resources import GPU


def parse_until(text: str | None) -> float | None:
    """`--until` as seconds; days (`7d`) are accepted besides Go-style durations."""
    if text is None:
        return None
    try:
        if text.endswith("d") and text[:-1].replace(".", "", 1).isdigit():
            return float(text[:-1]) * 86400
        return duration_seconds(text)
    except ValueError as err:
        raise InvalidObjectError(
            [Problem(ObjectRef("Option", "--until"), "value", str(err))]
        ) from None


def run_simulation(
    inputs: Sequence[Path],
    report: Path | None = None,
    plot: Path | None = None,
    until: str | None = None,
    quiet: bool = False,
) -> int:
    limit = parse_until(until)
    sim = Simulation(load(inputs), until=limit)
    sim.run()
    result = build_report(sim)
    if report is not None:
        report.parent.mkdir(parents=True, exist_ok=True)
        report.write_text(json.dumps(result, indent=2) + "\n")
    if not quiet:
        print_summary(result, Console(width=None if sys.stdout.isatty() else 150))
    if plot is not None:
        from kai_ray.sim.plot import plot_report

        plot_report(result, plot)
    return 0


def time_mean(samples: list[dict[str, Any]], key: str, end: float) -> float:
    """The time-weighted mean of a sampled GPU amount from 0 to `end`."""
    if not samples or end <= 0:
        return 0.0
    total = 0.0
    for sample, following in zip(samples, [*samples[1:], None], strict=True):
        until = following["t_s"] if following is not None else end
        total += sample[key][GPU] * max(until - sample["t_s"], 0.0)
    return total / end


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}s"


def print_summary(report: dict[str, Any], console: Console) -> None:
    summary = report["summary"]
    jobs = Table(title="Jobs", show_lines=False)
    for column in ("job", "kind", "queue", "min", "submitted", "started", "finished", "reason"):
        jobs.add_column(column)
    for job in report["jobs"][:50]:
        jobs.add_row(
            f"{job['namespace']}/{job['name']}",
            job["kind"],
            job["queue"],
            str(job["min_member"]),
            _seconds(job["submitted_s"]),
            _seconds(job["started_s"]),
            _seconds(job["finished_s"]),
            job["reason"] or "",
        )
    if len(report["jobs"]) > 50:
        jobs.caption = f"first 50 of {len(report['jobs'])} jobs; the report has all"
    console.print(jobs)
    queues = Table(title="Queues (GPUs)")
    for column in (
        "queue",
        "parent",
        "mean allocated",
        "peak allocated",
        "mean fair share",
        "peak requested",
    ):
        queues.add_column(column, justify="left" if column in ("queue", "parent") else "right")
    end = summary["end_s"]
    for queue in report["queues"]:
        samples = queue["samples"]
        queues.add_row(
            queue["name"],
            queue["parent"] or "",
            f"{time_mean(samples, 'allocated', end):.1f}",
            f"{max((s['allocated'][GPU] for s in samples), default=0):g}",
            f"{time_mean(samples, 'fair_share', end):.1f}",
            f"{max((s['requested'][GPU] for s in samples), default=0):g}",
        )
    console.print(queues)
    wait = summary["wait_s"]
    console.print(
        f"[bold]{summary['jobs']}[/] jobs: {summary['jobs_started']} started, "
        f"{summary['jobs_finished']} finished, {summary['jobs_waiting']} waiting; "
        f"{summary['pods_bound']} pods bound on {summary['nodes']} nodes "
        f"({summary['gpus']:g} GPUs) over {summary['end_s']:,.0f}s virtual; "
        f"GPU utilisation {summary['gpu_utilisation']:.1%}; wait p50 {_seconds(wait['p50'])}, "
        f"p95 {_seconds(wait['p95'])}, max {_seconds(wait['max'])}; "
        f"{summary['evictions']} evictions"
    )
