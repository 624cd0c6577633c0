"""Which waiting job goes next: queue order across the tree, job order inside a queue.

Queue order (docs/architecture.md section 2, KAI's proportion plugin), compared between
siblings at every level of the tree, each sibling judged with the job it would
send next added to what it holds:
1. queues not over their fair share (in any resource) first;
2. then queues that stay within their quota with the job added;
3. then higher queue priority;
4. then the smaller dominant-resource share with the job added, the share of a
   resource being allocated / min(max(quota, fair share), limit); a resource
   the queue may not use at all (that denominator is 0) weighs 1000 times;
5. then the older queue, then its name.
Walking down from the roots, the best child at each level leads to a leaf,
whose first job is the one to try. Inside a leaf: higher job priority, then,
for elastic extras, a job still at its minimum before one already above it,
then the older job. The walk is redone after every admitted job, since what each queue
holds has changed. Pure: no I/O.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass

from kai_ray.decisions.fairness import limit_of as limit_of
from kai_ray.decisions.fairness import quota_of as quota_of
from kai_ray.decisions.ledger import QueueLedger
from kai_ray.decisions.transaction import Transaction
from kai_ray.state.groups import PodGroupState
from kai_ray.values.resources import EPSILON, NO_RESOURCES, Resources

#: The weight of a resource a queue has no allocatable share of (KAI's penalty).
NO_SHARE_PENALTY = 1000.0

#: Values of well-known PriorityClass names: KAI's defaults (its chart installs them
#: as PriorityClasses) and Kubernetes' two system classes. As in KAI, the class the
#: group names decides: a group naming one of these has its value whatever its pods
#: resolved (a pod without a class resolves to 0, so the pods cannot be asked first).
WELL_KNOWN_PRIORITIES: Mapping[str, int] = {
    "train": 50,
    "build-preemptible": 75,
    "interactive-preemptible": 75,
    "build": 100,
    "inference": 125,
    "system-cluster-critical": 2_000_000_000,
    "system-node-critical": 2_000_001_000,
}


def group_priority(group: PodGroupState) -> int:
    """A well-known priorityClassName's value, else the highest priority the API
    server resolved onto the group's pods, else 0 (the Kubernetes default)."""
    known = WELL_KNOWN_PRIORITIES.get(group.spec.priorityClassName or "")
    if known is not None:
        return known
    return group.pod_priority


@dataclass(frozen=True)
class Candidate:
    """One job waiting in a leaf queue, with what the next attempt asks for."""

    group: PodGroupState
    request: Resources
    priority: int
    #: An elastic job asking for another extra while it already holds one or more:
    #: served after jobs still at their minimum (`job_key`).
    above_minimum: bool = False

    @property
    def queue(self) -> str:
        return self.group.queue


def candidate_for(group: PodGroupState) -> Candidate:
    """The group asking for its missing minimum (`PodGroupState.missing_requests`,
    summed once per group state)."""
    return Candidate(group, group.missing_requests, group_priority(group))


def waits(group: PodGroupState, tx: Transaction) -> bool:
    """A waiting gang (`PodGroupState.waiting`) none of whose pending pods an action
    placed this cycle, and none of whose members is still being deleted: the one
    rule of what every action makes room for."""
    placed = tx.placed_pending(group.key)
    return group.waiting and not placed and not releasing_members(group)


def releasing_members(group: PodGroupState) -> bool:
    """Some bound member is being deleted: until it is gone the group's pending pods
    wait (counted with it, the gang would be placed short of its minimum)."""
    return any(pod.releasing for pod in group.bound)


def waiting_gangs(groups: Iterable[PodGroupState], tx: Transaction) -> list[PodGroupState]:
    """The groups that wait (`waits`); callers pass `Snapshot.waiting_groups`, the
    groups whose minimum is missing, kept by the cache: reading them costs what
    waits, not every group."""
    return [group for group in groups if waits(group, tx)]


def job_key(candidate: Candidate) -> tuple[int, bool, str, str]:
    """Inside a queue: higher priority first, then a job at its minimum before one
    already above it (KAI's elastic order: extras spread), then the older job."""
    group = candidate.group
    return (-candidate.priority, candidate.above_minimum, group.creation_timestamp, group.key)


def over_fair_share(ledger: QueueLedger, name: str) -> bool:
    share = ledger.fair_share.get(name, NO_RESOURCES)
    return any(amount > share[r] + EPSILON for r, amount in ledger.held(name).items())


def within_quota(ledger: QueueLedger, name: str, request: Resources) -> bool:
    after = ledger.held(name) + request
    return all(amount <= quota_of(ledger.tree, name, r) + EPSILON for r, amount in after.items())


def dominant_share(ledger: QueueLedger, name: str, request: Resources) -> float:
    """max over resources of held / allocatable share, with the request added."""
    after = ledger.held(name) + request
    share = ledger.fair_share.get(name, NO_RESOURCES)
    tree, worst = ledger.tree, 0.0
    for resource, amount in after.items():
        quota, limit = quota_of(tree, name, resource), limit_of(tree, name, resource)
        allocatable = min(max(quota, share[resource]), limit)
        ratio = amount / allocatable if allocatable > EPSILON else amount * NO_SHARE_PENALTY
        worst = max(worst, ratio)
    return worst


def queue_key(ledger: QueueLedger, name: str, request: Resources) -> tuple[object, ...]:
    """The sort key of one queue about to take `request` (smaller goes first)."""
    node = ledger.tree[name]
    return (
        over_fair_share(ledger, name),
        not within_quota(ledger, name, request),
        -node.spec.priority,
        dominant_share(ledger, name, request),
        node.creation_timestamp,
        name,
    )


class WaitingJobs:
    """Candidates per leaf queue, each queue's kept best-first (by `job_key`), so
    that finding and taking a queue's next job stays cheap with many jobs."""

    def __init__(self, candidates: Iterable[Candidate] = ()) -> None:
        self._by_queue: dict[str, list[Candidate]] = {}
        #: Per queue: the holdings its keys were worked out from, and its keys.
        self._keys: dict[str, _QueueKeys] = {}
        for candidate in candidates:
            self._by_queue.setdefault(candidate.queue, []).append(candidate)
        for jobs in self._by_queue.values():
            jobs.sort(key=job_key)  # stable: as `add` one by one would leave them
        #: Queues with a job left, and a new number for every `add`.
        self._queues_left = len(self._by_queue)
        self._adds = 0
        #: The last job taken by `take_next` (its queue and request), with the ledger
        #: version and the number of adds it was taken at (`again`).
        self._last: tuple[str, Resources, int, int] | None = None
        #: Per queue: the job the walk below it found and that queue's key with it
        #: (`best_below`), valid at `_best_at` (ledger version, adds) less the queues
        #: on the path of a job taken since.
        self._best: dict[str, tuple[Candidate | None, tuple[object, ...] | None]] = {}
        self._best_at: tuple[int, int] | None = None
        self._ancestors: dict[str, tuple[str, ...]] = {}

    @classmethod
    def of_sorted(cls, by_queue: Mapping[str, Iterable[Candidate]]) -> WaitingJobs:
        """The jobs of each queue given already in `job_key` order (copied: taking
        jobs out leaves `by_queue` as it was)."""
        waiting = cls()
        waiting._by_queue = {queue: list(jobs) for queue, jobs in by_queue.items()}
        waiting._queues_left = sum(1 for jobs in waiting._by_queue.values() if jobs)
        return waiting

    def key_of(self, ledger: QueueLedger, name: str, request: Resources) -> tuple[object, ...]:
        """`queue_key`, worked out again only when the queue's holdings changed or it
        is asked with a request it was not asked with since."""
        held, kept = ledger.allocated.get(name), self._keys.get(name)
        if held is None:
            return queue_key(ledger, name, request)
        if kept is None or kept.held is not held:
            kept = self._keys[name] = _QueueKeys(held)
        return kept.key(ledger, name, request)

    def add(self, candidate: Candidate) -> None:
        jobs = self._by_queue.setdefault(candidate.queue, [])
        self._queues_left += not jobs
        self._adds += 1
        bisect.insort(jobs, candidate, key=job_key)

    def remaining(self, queues: Collection[str] | None = None) -> Iterator[Candidate]:
        """Every job left, queue by queue, each queue's in its order; only those of
        `queues` when given."""
        for queue, jobs in self._by_queue.items():
            if queues is None or queue in queues:
                yield from jobs

    def first(self, queue: str) -> Candidate | None:
        jobs = self._by_queue.get(queue)
        return jobs[0] if jobs else None

    def take(self, candidate: Candidate) -> None:
        jobs = self._by_queue[candidate.queue]
        jobs.remove(candidate)
        self._queues_left -= not jobs
        self._changed(candidate.queue)

    def _changed(self, leaf: str) -> None:
        """The leaf's first job changed: what the walk found on its path is stale."""
        best = self._best
        if best and best.pop(leaf, None) is not None:
            for name in self._ancestors.get(leaf, ()):
                best.pop(name, None)

    def best_below(
        self, ledger: QueueLedger, name: str
    ) -> tuple[Candidate | None, tuple[object, ...] | None]:
        """The job the walk down from `name` finds (`_best_in`) and `name`'s key with
        it. Kept while the ledger and the jobs are as they were, but for the queues
        on the path of a job taken since: every other queue's first job and
        holdings, so its key, are as they were (a failed attempt changes neither
        the ledger nor the jobs, so a backlog is walked at the cost of one path per
        job, not of every queue)."""
        self._valid_at(ledger)
        found = self._best.get(name)
        if found is None:
            candidate = _best_in(ledger, name, self)
            key = None if candidate is None else self.key_of(ledger, name, candidate.request)
            found = self._best[name] = (candidate, key)
        return found

    def pick(self, ledger: QueueLedger, names: Iterable[str]) -> Candidate | None:
        """The job the walk finds below the sibling queues `names`: the one whose
        queue's key is the smallest (the first of equals), each from `best_below`."""
        self._valid_at(ledger)
        best, chosen, chosen_key = self._best, None, None
        for name in names:
            found = best.get(name)
            candidate, key = self.best_below(ledger, name) if found is None else found
            if candidate is None or key is None:
                continue
            if chosen_key is None or key < chosen_key:
                chosen, chosen_key = candidate, key
        return chosen

    def _valid_at(self, ledger: QueueLedger) -> None:
        """What `best_below` kept holds at the ledger's version and the jobs added."""
        at = (ledger.version, self._adds)
        if self._best_at != at:
            self._best.clear()
            self._best_at = at
            self._ancestors = {leaf: ledger.tree.ancestors(leaf) for leaf in self._by_queue}

    def again(self, ledger: QueueLedger) -> Candidate | None:
        """The job `next_candidate` would pick, known without ordering the queues
        again when the last job was taken from a queue that is now the only one with
        jobs, or when nothing changed since (the same ledger version, no job added)
        and the queue's next job asks what the last one did: every queue's key is
        then as it was at that pick, so the same queue wins at every level (deep
        backlogs are long runs of equal jobs, each refused or placed in turn). None
        when it is not known."""
        last = self._last
        if last is None:
            return None
        queue, request, version, adds = last
        jobs = self._by_queue.get(queue)
        if not jobs:
            return None
        following = jobs[0]
        if self._queues_left == 1:
            return following  # the only queue left wins whatever its key
        if version != ledger.version or adds != self._adds:
            return None
        if following.request is request or following.request == request:
            return following
        return None

    def take_alike(
        self, ledger: QueueLedger, refused: Callable[[Candidate], str | None]
    ) -> list[tuple[Candidate, str]]:
        """The jobs `take_next` would take one after another from here, each with why
        it is refused (`refused`), for as long as each is: taken out together. A job
        refused at admission changes neither the ledger nor the jobs, so while the
        next ones are refused too, `again` keeps answering the same queue's next job
        (any job when it is the only queue left, else one asking what the last did)
        and no queue need be ordered or taken from one job at a time. Stops before
        the first job `refused` lets through, which `take_next` then takes."""
        last = self._last
        if last is None:
            return []
        queue, request, version, adds = last
        jobs = self._by_queue.get(queue)
        only = self._queues_left == 1
        if not jobs or not (only or (version == ledger.version and adds == self._adds)):
            return []
        alike: list[tuple[Candidate, str]] = []
        for job in jobs:
            if not only and job.request is not request and job.request != request:
                break
            reason = refused(job)
            if reason is None:
                break
            alike.append((job, reason))
        if alike:
            del jobs[: len(alike)]
            self._queues_left -= not jobs
            self._changed(queue)
            self.taken(ledger, alike[-1][0])
        return alike

    def taken(self, ledger: QueueLedger, candidate: Candidate) -> None:
        """Notes the job `take_next` took, for `again`."""
        self._last = (candidate.queue, candidate.request, ledger.version, self._adds)

    def empty(self) -> bool:
        """True when no queue has a job left to try."""
        return not any(self._by_queue.values())


class _QueueKeys:
    """One queue's `queue_key` per request asked, while it holds `held`.

    Ledger holdings are immutable vectors, replaced when they change, so the same
    object means the same keys (the fair shares and the tree do not change within
    a cycle). Keys are kept by the request's value (jobs of one shape ask equal
    requests); the last request asked is also kept by identity, since a queue
    whose first job did not change is asked with the same object at every pick,
    and hashing a request costs a frozenset of it."""

    def __init__(self, held: Resources) -> None:
        self.held = held
        self._by_value: dict[Resources, tuple[object, ...]] = {}
        self._last: tuple[Resources, tuple[object, ...]] | None = None

    def key(self, ledger: QueueLedger, name: str, request: Resources) -> tuple[object, ...]:
        last = self._last
        if last is not None and last[0] is request:
            return last[1]
        key = self._by_value.get(request)
        if key is None:
            key = self._by_value[request] = queue_key(ledger, name, request)
        self._last = (request, key)
        return key


def next_candidate(ledger: QueueLedger, waiting: WaitingJobs) -> Candidate | None:
    """The job to try next: down from the roots, best sibling at each level."""
    return waiting.pick(ledger, ledger.tree.roots)


def take_next(ledger: QueueLedger, waiting: WaitingJobs) -> Candidate | None:
    """`next_candidate`, taken out of `waiting` (`WaitingJobs.again` when it knows)."""
    candidate = waiting.again(ledger) or next_candidate(ledger, waiting)
    if candidate is not None:
        waiting.take(candidate)
        waiting.taken(ledger, candidate)
    return candidate


def _best_in(ledger: QueueLedger, name: str, waiting: WaitingJobs) -> Candidate | None:
    node = ledger.tree[name]
    if node.is_leaf:
        return waiting.first(name)
    return waiting.pick(ledger, node.children)
