"""`kai-ray explain` on a live cluster: read it, explain one object, print one screen.

`explain_live` reads the cluster once (`effects.live_view`) and the PodGroup's
Events, builds the `Explanation` (`explain.py`) and prints it with rich: a panel
with the gang and the last cycle's reason, the what-ifs of now, the best
topology domains, the queue path with its quota and fair share, what waits
ahead, and the latest Events. Writes nothing to the cluster.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from kai_ray.tools.explain import Explanation, explain
from kai_ray.tools.explain_whatif import Gang
from kai_ray.values.resources import GPU, short_name


def explain_live(
    kubeconfig: str | None,
    namespace: str,
    name: str,
    config_file: Path | None,
    console: Console | None = None,
) -> int:
    """`kai-ray explain NAME`; raises UnavailableError (one line) when it cannot."""
    from kai_ray.controller import read_config
    from kai_ray.effects.kube import object_events
    from kai_ray.effects.live_view import read_live_cluster

    config = read_config(config_file)
    view = read_live_cluster(kubeconfig, config.spec.schedulerName, config.spec.dra)

    def events_of(ns: str, kind: str, obj: str) -> Sequence[Mapping[str, Any]]:
        return object_events(kubeconfig, ns, kind, obj)

    found = explain(view, config, namespace, name, events_of)
    (console or Console()).print(render(found))
    return 0


def render(found: Explanation) -> Panel:
    parts: list[RenderableType] = [_headline(found)]
    if found.problems:
        parts.append(Text("Left out by the operator: " + "; ".join(found.problems), style="red"))
    if found.gang is not None:
        parts.append(_gang(found.gang))
    parts += _topology(found)
    if found.queues:
        parts.append(_queues(found))
    parts += _ahead(found)
    parts.append(_events(found))
    title = f"{found.asked}  →  PodGroup {found.group}"
    return Panel(Group(*parts), title=title, title_align="left", expand=False)


def _headline(found: Explanation) -> Text:
    text = Text()
    text.append(f"Phase {found.phase}", style="bold")
    if found.queues:
        path = " < ".join(q.name for q in found.queues)
        text.append(f" · queue {path}")
    if found.pictured:
        text.append(" · PodGroup not created yet (the operator makes it at its next cycle)")
    text.append("\nLast cycle: ")
    text.append(found.last_reason or "no reason written (it does not wait)", style="yellow")
    if found.scheduled is not None:
        condition = found.scheduled
        text.append(
            f"\nScheduled={condition.get('status')} {condition.get('reason') or ''} "
            f"since {condition.get('lastTransitionTime') or '?'}"
        )
    return text


def _gang(gang: Gang) -> Text:
    text = Text("\n")
    text.append("Gang", style="bold")
    text.append(
        f": minMember {gang.min_member}, bound {gang.bound}, pending {gang.pending}, "
        f"missing from the minimum {gang.missing}"
    )
    for name, minimum, bound, pending in gang.subgroups:
        text.append(f"\n  subgroup {name}: minMember {minimum}, bound {bound}, pending {pending}")
    if gang.missing:
        verdict = "yes" if gang.fits_whole else f"no: {gang.not_now}"
        text.append(f"\nIts missing minimum fits now as a gang: {verdict}")
        text.append(
            f"\nMissing members that fit one by one (no gang, no topology): "
            f"{gang.fits_one_by_one} of {gang.missing}"
        )
    return text


def _topology(found: Explanation) -> list[RenderableType]:
    parts: list[RenderableType] = []
    if isinstance(found.topology, str):
        parts.append(Text(f"\nTopology: {found.topology}", style="red"))
    elif found.topology:
        table = Table(title="Best topology domain per level", title_justify="left")
        for column in ("level", "domain", "room for", "needs", "pod"):
            table.add_column(column)
        for row in found.topology:
            level = f"{row.level} (required)" if row.required else row.level
            table.add_row(level, row.domain, str(row.room), str(row.needed), row.pod)
        parts.append(table)
    for level, domains in found.placed_in:
        parts.append(Text(f"Bound members are in {level} {', '.join(domains) or '-'}"))
    return parts


def _queues(found: Explanation) -> Table:
    unit = "GPUs" if found.resource == GPU else short_name(found.resource)
    table = Table(title=f"Queue path ({unit})", title_justify="left")
    columns = ("queue", "quota", "limit", "weight", "fair share", "allocated", "requested")
    for column in (*columns, "pending"):
        table.add_column(column, justify="left" if column == "queue" else "right")
    for q in found.queues:
        table.add_row(
            q.name,
            f"{q.quota:g}",
            "none" if math.isinf(q.limit) else f"{q.limit:g}",
            f"{q.weight:g}",
            q.fair_share or "-",
            q.allocated or "-",
            q.requested or "-",
            "-" if q.pending_workloads is None else str(q.pending_workloads),
        )
    return table


def _ahead(found: Explanation) -> list[RenderableType]:
    if found.gang is None or not found.gang.missing:
        return []
    text = Text("Ahead in its queue: ")
    text.append(", ".join(found.ahead_in_queue) or "nothing")
    if found.waiting_queues:
        queues = ", ".join(
            f"{q.name} ({q.allocated or 0} of fair share {q.fair_share or '?'}"
            f"{', over' if q.over_fair_share else ''}; {q.gangs} waiting)"
            for q in found.waiting_queues
        )
        text.append(f"\nQueues with waiting gangs, below their fair share first: {queues}")
    return [text]


def _events(found: Explanation) -> Text:
    text = Text("\n")
    text.append("Events", style="bold")
    if not found.events:
        text.append(": none")
    for when, reason, message in found.events:
        text.append(f"\n  {when}  {reason}: {message}")
    return text
