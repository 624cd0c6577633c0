"""The terminal summary (rich): jobs, queues, totals, and a sweep's comparison table.

Prints what `kai_ray.sim.summary` computes; decides nothing. Output only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from kai_ray.sim.summary import queue_rows
from kai_ray.sim.sweep import VariantResult

JOB_ROWS = 20


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value >= 3600:
        return f"{value / 3600:,.1f}h"
    return f"{value / 60:,.1f}m" if value >= 60 else f"{value:,.0f}s"


def _gpus(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def jobs_table(report: Mapping[str, Any]) -> Table:
    table = Table(title="Jobs", title_justify="left")
    for column in ("job", "kind", "queue", "gang", "submitted", "waited", "ran", "reason"):
        table.add_column(column, overflow="fold")
    for job in report["jobs"][:JOB_ROWS]:
        started, finished = job["started_s"], job["finished_s"]
        waited = None if started is None else started - job["submitted_s"]
        ran = None if started is None or finished is None else finished - started
        table.add_row(
            f"{job['namespace']}/{job['name']}",
            job["kind"],
            job["queue"],
            str(job["min_member"]),
            _seconds(job["submitted_s"]),
            _seconds(waited),
            _seconds(ran),
            job["reason"] or "",
        )
    if len(report["jobs"]) > JOB_ROWS:
        table.caption = f"first {JOB_ROWS} of {len(report['jobs'])} jobs; the report has all"
    return table


def queues_table(report: Mapping[str, Any], quotas: Mapping[str, float | None]) -> Table:
    table = Table(title="Queues (GPUs; means over the run)", title_justify="left")
    columns = (
        "queue",
        "quota",
        "fair share",
        "allocated",
        "GPU-hours",
        "jobs done",
        "wait p50",
        "wait p95",
    )
    for column in columns:
        table.add_column(column, justify="left" if column == "queue" else "right")
    for row in queue_rows(report, quotas):
        name = row.name if row.parent is None else f"  {row.name} ({row.parent})"
        table.add_row(
            name,
            _gpus(row.quota),
            _gpus(row.fair_share),
            _gpus(row.allocated),
            f"{row.gpu_hours:,.0f}",
            f"{row.jobs_done}/{row.jobs}",
            _seconds(row.wait_p50),
            _seconds(row.wait_p95),
        )
    return table


def totals_line(summary: Mapping[str, Any]) -> str:
    by_reason = ", ".join(f"{reason} {n}" for reason, n in summary["evictions_by_reason"].items())
    return (
        f"[bold]{summary['jobs']}[/] jobs ({summary['jobs_finished']} done, "
        f"{summary['jobs_waiting']} never started) on {summary['nodes']} nodes / "
        f"{summary['gpus']:g} GPUs over {_seconds(summary['end_s'])} virtual, "
        f"{summary['cycles']} cycles. GPU utilisation [bold]{summary['gpu_utilisation']:.1%}[/]; "
        f"evictions {summary['evictions']}" + (f" ({by_reason})" if by_reason else "")
    )


def print_summary(
    report: Mapping[str, Any], quotas: Mapping[str, float | None], console: Console
) -> None:
    console.print(jobs_table(report))
    console.print(queues_table(report, quotas))
    console.print(totals_line(report["summary"]))
    for warning in report.get("quota_over_committed", ()):
        console.print(over_commitment_line(warning))


def over_commitment_line(warning: Mapping[str, Any]) -> str:
    """The Queue's QuotaOverCommitted warning, as the simulator saw it first."""
    where = "the cluster has" if warning["parent"] is None else f"{warning['parent']}'s quota is"
    return (
        f"[yellow]warning[/]: from {_seconds(warning['first_s'])} the quotas of "
        f"{', '.join(warning['queues'])} add up to {warning['quotas']:g} {warning['resource']}, "
        f"more than {where} {warning['available']:g}: each still gets its quota "
        "(up to what it asks for), so some may wait for theirs"
    )


def print_sweep(
    results: Sequence[VariantResult], quotas: Mapping[str, float | None], console: Console
) -> None:
    """One row per variant: totals, then each leaf queue's mean allocation."""
    leaves = _leaves(results[0].report) if results else []
    table = Table(title="Sweep (GPU means over the run)", title_justify="left")
    for column in ("variant", "utilisation", "jobs done", "wait p50", "wait p95", "evictions"):
        table.add_column(column, justify="left" if column == "variant" else "right")
    for leaf in leaves:
        table.add_column(f"{leaf}\nGPUs / wait p50", justify="right")
    for result in results:
        summary = result.report["summary"]
        rows = {r.name: r for r in queue_rows(result.report, quotas)}
        table.add_row(
            result.name,
            f"{summary['gpu_utilisation']:.1%}",
            f"{summary['jobs_finished']}/{summary['jobs']}",
            _seconds(summary["wait_s"]["p50"]),
            _seconds(summary["wait_s"]["p95"]),
            str(summary["evictions"]),
            *(
                f"{_gpus(rows[leaf].allocated)} / {_seconds(rows[leaf].wait_p50)}"
                for leaf in leaves
            ),
        )
    console.print(table)


def _leaves(report: Mapping[str, Any]) -> list[str]:
    parents = {q["parent"] for q in report["queues"]}
    return [q["name"] for q in report["queues"] if q["name"] not in parents]
