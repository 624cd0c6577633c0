"""`kai-ray explain --report out/report.json --at TIME NAME`: one job of a simulation at one time.

Reads only the simulator's report (docs/simulator.md, Output): the job's state at
`TIME` (not submitted yet, waiting, running, finished), its gang (minMember and
the pods bound at that time, with their nodes), the reason the simulator
recorded, its queue and each ancestor at that time (the latest sample: allocated,
requested, fair share), the jobs of its queue still waiting ahead of it, the
other queues with waiting jobs, and what evicted its pods so far. The report
keeps no quota, no topology and only the last reason of a job that still waits
(a job that started has none): what it does not hold is said, not guessed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from kai_ray.tools.explain import KINDS, NotFoundError
from kai_ray.values.config import duration_seconds
from kai_ray.values.errors import UnavailableError
from kai_ray.values.resources import GPU

Obj = Mapping[str, Any]


def explain_report(
    report_file: Path, at: str, name: str, namespace: str | None, console: Console | None = None
) -> int:
    report = _read(report_file)
    t = _time(at)
    job = find_job(report, name, namespace)
    (console or Console()).print(render_at(report, job, t))
    return 0


def _read(path: Path) -> Obj:
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise UnavailableError(f"explain: cannot read the report {path}: {err}") from None
    if not isinstance(report, Mapping) or "jobs" not in report:
        raise UnavailableError(f"explain: {path} is not a report of kai-ray simulate")
    return report


def _time(text: str) -> float:
    """Seconds from the start: a number of seconds or a duration (2h, 90m)."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return duration_seconds(text)
    except ValueError:
        raise UnavailableError(
            f"explain: --at {text!r} is neither seconds nor a duration such as 2h"
        ) from None


def find_job(report: Obj, name: str, namespace: str | None) -> Obj:
    """The job named `name`: its PodGroup's name, `kind/workload`, or `namespace/name`."""
    if "/" in name and name.split("/", 1)[0].lower() in KINDS:
        kind, _, bare = name.partition("/")
        wanted = {f"{KINDS[kind.lower()].lower()}-{bare}", bare}
    elif "/" in name:
        namespace, _, bare = name.partition("/")
        wanted = {bare}
    else:
        wanted = {name, *(f"{k.lower()}-{name}" for k in ("RayCluster", "RayJob", "Job", "Pod"))}
    found = [
        j for j in report["jobs"] if j["name"] in wanted and namespace in (None, j["namespace"])
    ]
    if not found:
        where = f" in namespace {namespace!r}" if namespace else ""
        raise NotFoundError(f"explain: no job named {name!r}{where} in the report")
    if len(found) > 1:
        names = ", ".join(f"{j['namespace']}/{j['name']}" for j in found)
        raise NotFoundError(f"explain: {name!r} names several jobs ({names}); say which")
    job: Obj = found[0]
    return job


def _state(job: Obj, t: float) -> str:
    submitted, started, finished = job["submitted_s"], job.get("started_s"), job.get("finished_s")
    if t < submitted:
        return f"not submitted yet (arrives at {_clock(submitted)})"
    if finished is not None and t >= finished:
        return f"finished at {_clock(finished)} (ran from {_clock(started)})"
    if started is not None and t >= started:
        return f"running since {_clock(started)} (waited {_span(started - submitted)})"
    return f"waiting since {_clock(submitted)} ({_span(t - submitted)} so far)"


def _waiting_at(job: Obj, t: float) -> bool:
    started = job.get("started_s")
    return job["submitted_s"] <= t and (started is None or started > t)


def render_at(report: Obj, job: Obj, t: float) -> Panel:
    key = f"{job['namespace']}/{job['name']}"
    pods = [p for p in report.get("pods") or () if p["job"] == key]
    held = [
        p
        for p in pods
        if p["bound_s"] <= t and (p.get("released_s") is None or p["released_s"] > t)
    ]
    parts: list[RenderableType] = [
        Text(f"At {_clock(t)}: {_state(job, t)} · queue {job['queue']}", style="bold"),
        _reason(job, t),
        Text(
            f"\nGang: minMember {job['min_member']}, {len(held)} pods bound"
            + (f" on {', '.join(sorted({p['node'] for p in held}))}" if held else "")
        ),
    ]
    evicted = [
        p
        for p in pods
        if p.get("released_s") is not None
        and p["released_s"] <= t
        and p.get("release_reason") != "completed"
    ]
    if evicted:
        reasons = ", ".join(
            f"{p['name']} ({p['release_reason']} at {_clock(p['released_s'])})" for p in evicted
        )
        parts.append(Text(f"Released before then: {reasons}"))
    parts.append(_queues(report, job["queue"], t))
    parts.append(_ahead(report, job, t))
    kind = "" if job["kind"] == "PodGroup" else f"{job['kind']} → "
    title = f"{kind}PodGroup {key} in the report (it holds no quotas, no topology)"
    return Panel(Group(*parts), title=title, title_align="left", expand=False)


def _reason(job: Obj, t: float) -> Text:
    if not _waiting_at(job, t):
        return Text("Last cycle: it does not wait then")
    if job.get("started_s") is not None:
        started = _clock(job["started_s"])
        return Text(
            f"Last cycle: the report keeps no reason for a job that started later ({started})"
        )
    reason = job.get("reason") or "none recorded"
    return Text(f"Last cycle (the last reason recorded, at the end of the run): {reason}")


def _queues(report: Obj, leaf: str, t: float) -> Table:
    parents = {q["name"]: q.get("parent") for q in report.get("queues") or ()}
    samples = {q["name"]: q.get("samples") or [] for q in report.get("queues") or ()}
    table = Table(
        title=f"Queue path at {_clock(t)} (GPUs; the report holds no quotas)", title_justify="left"
    )
    for column in ("queue", "fair share", "allocated", "requested"):
        table.add_column(column, justify="left" if column == "queue" else "right")
    name: str | None = leaf
    while name is not None and name in parents:
        sample = _sample_at(samples[name], t)
        table.add_row(
            name, *(_gpus(sample, field) for field in ("fair_share", "allocated", "requested"))
        )
        name = parents[name]
    return table


def _sample_at(samples: Sequence[Obj], t: float) -> Obj | None:
    before = [s for s in samples if s["t_s"] <= t]
    return before[-1] if before else None


def _gpus(sample: Obj | None, field: str) -> str:
    if sample is None:
        return "-"
    return f"{float((sample.get(field) or {}).get(GPU, 0)):g}"


def _ahead(report: Obj, job: Obj, t: float) -> Text:
    waiting = [j for j in report["jobs"] if _waiting_at(j, t)]
    mine = (job["submitted_s"], job["namespace"], job["name"])
    ahead = [
        j
        for j in waiting
        if j["queue"] == job["queue"] and (j["submitted_s"], j["namespace"], j["name"]) < mine
    ]
    text = Text("Waiting ahead of it in its queue (submitted before it): ")
    text.append(", ".join(f"{j['namespace']}/{j['name']}" for j in ahead) or "nothing")
    per_queue: dict[str, int] = {}
    for other in waiting:
        per_queue[other["queue"]] = per_queue.get(other["queue"], 0) + 1
    listed = ", ".join(f"{q} ({n})" for q, n in sorted(per_queue.items()))
    text.append(f"\nQueues with waiting jobs then: {listed or 'none'}")
    return text


def _clock(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    return _span(seconds) if seconds < 60 else f"{_span(seconds)} ({seconds:g} s)"


def _span(seconds: float) -> str:
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{round(seconds, 3):g}s"
