"""The soak's verdict: what went wrong, counted, and the run's figures.

Read after a run from three sources that kai-ray does not write through its
own code paths: the API server's audit log (every `pods/binding` and
`pods/eviction` create, with its answer), the soak's own watches and samples
(`soak_observer`), and the final state of the cluster. Every count must be 0:

- `double_binds`: a pod bound twice (two binds the API server accepted);
- `overcommitted_nodes`: in the final state (and, separately, at any sample),
  a node or a GPU device holding more than it has;
- `partial_gangs_past_grace`: a gang partly bound for longer than the
  stale-gang grace period and three cycles, counting only time in which the
  scheduler could act;
- `pending_with_fit`: a gang pending for longer than three cycles although its
  queue had room and it fit (`soak_oracle.fit_pending`), same counting;
- `bad_evictions`: kai-ray evictions that broke a rule: a reclaim taking its
  queue below its quota, by kai-ray's own count (written on the pod) or by
  the API server's (changes the cycle could not have seen yet, and binds it had
  made that the API server did not show yet, are forgiven), a preemption (the soak's workloads all share one priority, and
  equal priority never preempts), a stale-gang eviction of a gang not partly
  bound for its grace, a consolidation of a pod no controller will create again;
- `binds_to_cordoned`, `binds_to_deleted_nodes`: binds onto a node after it was
  cordoned (or deleted) and the scheduler had three cycles to see it.

Pure: reads files and values, writes nothing.
"""

from __future__ import annotations

import datetime as dt
import json
import statistics
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import soak_oracle as oracle
from .soak_faults import Fault
from .soak_observer import Episode, EvictionSeen, Sample

EPSILON = 1e-6


@dataclass(frozen=True)
class AuditEntry:
    """One `pods/binding` or `pods/eviction` create and its answer."""

    subresource: str
    pod: str
    wall: float
    code: int
    node: str


def read_audit(path: Path, since_wall: float, namespaces: Iterable[str]) -> list[AuditEntry]:
    wanted = set(namespaces)
    entries = []
    if not path.exists():
        return entries
    for line in path.read_text(errors="replace").splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        ref = event.get("objectRef") or {}
        if event.get("verb") != "create" or ref.get("namespace") not in wanted:
            continue
        if ref.get("subresource") not in ("binding", "eviction"):
            continue
        wall = _wall(event.get("requestReceivedTimestamp"))
        if wall < since_wall:
            continue
        target = ((event.get("requestObject") or {}).get("target") or {}).get("name") or ""
        code = int((event.get("responseStatus") or {}).get("code") or 0)
        pod = f"{ref['namespace']}/{ref.get('name')}"
        entries.append(AuditEntry(ref["subresource"], pod, wall, code, target))
    return entries


def _wall(stamp: str | None) -> float:
    if not stamp:
        return 0.0
    return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def accepted(entries: Iterable[AuditEntry], subresource: str) -> list[AuditEntry]:
    return [e for e in entries if e.subresource == subresource and 200 <= e.code < 300]


@dataclass
class Counts:
    """Each count with the lines that explain it."""

    double_binds: list[str] = field(default_factory=list)
    overcommitted_nodes: list[str] = field(default_factory=list)
    overcommitted_during_run: list[str] = field(default_factory=list)
    partial_gangs_past_grace: list[str] = field(default_factory=list)
    pending_with_fit: list[str] = field(default_factory=list)
    bad_evictions: list[str] = field(default_factory=list)
    binds_to_cordoned: list[str] = field(default_factory=list)
    binds_to_deleted_nodes: list[str] = field(default_factory=list)

    def totals(self) -> dict[str, int]:
        return {name: len(lines) for name, lines in vars(self).items()}

    def clean(self) -> bool:
        return not any(self.totals().values())


def double_binds(entries: Iterable[AuditEntry]) -> list[str]:
    binds = Counter(e.pod for e in accepted(entries, "binding"))
    return [f"{pod} bound {n} times" for pod, n in sorted(binds.items()) if n > 1]


def long_episodes(
    episodes: Iterable[Episode],
    state: str,
    allowed_cycles: float,
    origin: float = 0.0,
    grace_s: float = 0.0,
) -> list[str]:
    """Episodes that lasted more than `grace_s` and then more cycles than allowed,
    counting only time in which the scheduler could act; times from `origin`."""
    found = []
    for e in episodes:
        cycle_s = e.counted_s / e.cycles if e.cycles else 1.0
        beyond = e.cycles - grace_s / cycle_s
        if e.state == state and beyond > allowed_cycles:
            found.append(
                f"{e.gang}: {e.state} from +{e.started - origin:.1f}s for {e.counted_s:.1f}s "
                f"of scheduler time ({e.length_s:.1f}s in all), {beyond:.1f} cycles past "
                f"{grace_s:.0f}s (allowed {allowed_cycles:g}): {e.why}; then: {e.detail}"
            )
    return found


def in_flight_binds(
    eviction: EvictionSeen,
    binds: Iterable[AuditEntry],
    gpus_of_pod: Mapping[str, float],
    window_s: float,
) -> float:
    """GPUs of the victim's queue that the API server bound within `window_s` of the
    mark and that the observer had not counted then. The cycle counts its binds at
    once, and the binder makes them after the cycle's evictions (or in the back): a
    queue given a pod by allocate and reclaimed from in the same cycle holds that pod
    in the cycle's count before the API server has it, and the observer sees it only
    once its watch event comes. A bind by a later cycle inside the window is
    forgiven too: the window is the slack, as `recently_released`'s is."""
    namespace = eviction.pod.partition("/")[0]
    pods = {
        b.pod
        for b in binds
        if b.pod.partition("/")[0] == namespace
        and b.pod != eviction.pod
        and b.pod not in eviction.counted
        and abs(b.wall - eviction.wall) <= window_s
    }
    return sum(gpus_of_pod.get(pod, 0.0) for pod in pods)


def bad_evictions(
    seen: Iterable[EvictionSeen],
    queues: Mapping[str, oracle.QueueView],
    partial_since: Mapping[str, list[Episode]],
    gang_of_pod: Mapping[str, str],
    grace_s: float,
    slack_s: float,
    binds: Iterable[AuditEntry] = (),
    gpus_of_pod: Mapping[str, float] | None = None,
) -> list[str]:
    """A reclaim is judged twice: on the cycle's own count (`EvictionSeen.cycle_kept`,
    what kai-ray said the queue keeps) and on what the API server shows, less the
    changes the cycle could not see yet and plus the binds it had made already."""
    found = []
    bound = accepted(binds, "binding")
    for eviction in seen:
        reason = eviction.reason.lower()
        if reason == "reclaim":
            quota = queues[eviction.queue].quota if eviction.queue in queues else 0.0
            flying = in_flight_binds(eviction, bound, gpus_of_pod or {}, 3 * slack_s)
            left = eviction.queue_held - eviction.gpus + eviction.recently_released + flying
            kept = eviction.cycle_kept
            own_count_broken = kept is not None and eviction.gpus > 0 and kept < quota - EPSILON
            if own_count_broken or (eviction.gpus > 0 and left < quota - EPSILON):
                found.append(
                    f"reclaim of {eviction.pod} left {eviction.queue} with {left:g} GPUs "
                    f"({flying:g} of them bound close to the eviction), kai-ray said "
                    f"{'-' if kept is None else f'{kept:g}'}; "
                    f"its quota {quota:g} (it held {eviction.queue_held:g}, "
                    f"{eviction.queue_held_with_leaving:g} with pods on their way out; "
                    f"its status said allocated {eviction.status_allocated or '-'}, "
                    f"fair share {eviction.status_fair_share or '-'}; queues "
                    f"allocated/requested/fair share: {eviction.queues_then})"
                )
        elif reason == "preempt":
            found.append(f"preemption of {eviction.pod} among workloads of equal priority")
        elif reason == "stalegang":
            gang = gang_of_pod.get(eviction.pod, "")
            stale = [
                e
                for e in partial_since.get(gang, ())
                if e.started - slack_s <= eviction.at - grace_s and e.last + slack_s >= eviction.at
            ]
            if not stale:
                found.append(
                    f"stale-gang eviction of {eviction.pod}: its gang {gang} was not seen "
                    f"partly bound for the {grace_s:.0f}s grace"
                )
        elif reason == "consolidation" and not eviction.owned:
            found.append(f"consolidation moved {eviction.pod}, which nothing will create again")
    return found


def binds_onto(
    entries: Iterable[AuditEntry], faults: Iterable[Fault], patience_s: float
) -> tuple[list[str], list[str]]:
    """Binds onto a node while it was cordoned, or after it was deleted."""
    cordoned, deleted = [], []
    binds = accepted(entries, "binding")
    for fault in faults:
        if fault.kind == "cordon-node":
            start, end = fault.wall + patience_s, fault.until_wall
            cordoned += [
                f"{b.pod} bound to cordoned {b.node} {b.wall - fault.wall:.1f}s after the cordon"
                for b in binds
                if b.node == fault.node and start < b.wall < end
            ]
        elif fault.kind == "delete-node-mid-bind" and fault.node:
            deleted += [
                f"{b.pod} bound to {b.node} {b.wall - fault.wall:.1f}s after it was deleted"
                for b in binds
                if b.node == fault.node and b.wall > fault.wall + patience_s
            ]
    return cordoned, deleted


# ------------------------------------------------------------------- figures


def recovery_times(
    faults: Iterable[Fault], samples: list[Sample], patience_s: float
) -> dict[str, list[float | None]]:
    """Per fault kind: seconds from each fault until the first sample at which the
    scheduler could act and no gang had waited with a fit, or stayed partly
    bound, for longer than three cycles (None: not by the end of the run)."""
    times: dict[str, list[float | None]] = {}
    for fault in faults:
        healthy = next(
            (
                s
                for s in samples
                if s.at >= fault.done
                and s.available
                and s.oldest_fit_s <= patience_s
                and s.oldest_partial_s <= patience_s
            ),
            None,
        )
        times.setdefault(fault.kind, []).append(None if healthy is None else healthy.at - fault.at)
    return times


def summary(values: list[float | None]) -> dict[str, Any]:
    known = sorted(v for v in values if v is not None)
    return {
        "count": len(values),
        "p50_s": round(statistics.median(known), 1) if known else None,
        "max_s": round(known[-1], 1) if known else None,
        "not_recovered": len(values) - len(known),
    }


def kills_between_binds(
    faults: Iterable[Fault], entries: Iterable[AuditEntry], gang_of_pod: Mapping[str, str]
) -> list[str]:
    """Kills that landed between two accepted binds of one gang (from the audit)."""
    binds = accepted(entries, "binding")
    landed = []
    for fault in faults:
        if not fault.kind.startswith("kill") or not fault.gang:
            continue
        times = [b.wall for b in binds if gang_of_pod.get(b.pod) == fault.gang]
        before = [t for t in times if t <= fault.wall]
        after = [t for t in times if t > fault.wall]
        if before and after:
            landed.append(f"{fault.gang}: {len(before)} bound before, {len(after)} after")
    return landed


def episodes_by_gang(episodes: Iterable[Episode], state: str) -> dict[str, list[Episode]]:
    found: dict[str, list[Episode]] = {}
    for episode in episodes:
        if episode.state == state:
            found.setdefault(episode.gang, []).append(episode)
    return found


def lines(counts: Counts) -> Iterator[str]:
    for name, found in vars(counts).items():
        yield f"{name}: {len(found)}"
        for line in found[:20]:
            yield f"  {line}"
