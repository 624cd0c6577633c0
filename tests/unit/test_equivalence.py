"""The cycle's shortcuts are exact: the same plan as the plain path, on random clusters.

The shortcuts are held to the plain path here, on clusters hypothesis draws
(nodes of a few sizes in racks, a topology, team queues with quotas, running
jobs of several priorities, some preemptible, and a backlog of waiting gangs
drawn from a small palette of shapes so that equivalent gangs abound):
- `placement/equivalence.py`: a gang equivalent to one that failed at the same
  transaction version is not searched again, nor (`placement/carried.py`) one
  equivalent to a gang no node had room for while every node it may use fails
  for the same first reason (plain: every gang is searched);
- `eviction.running_units` over the per-queue index of victim groups, whose
  members a tally follows (`eviction.GIVERS`) (plain: every group of the
  snapshot looked at for every waiting job);
- `WaitingJobs.key_of`, a queue's order key kept per request while its holdings
  are the same object (plain: `queue_key` worked out at every pick), and
  `WaitingJobs.again`: the next job known without ordering the queues when its
  queue is the only one left, or when nothing changed since the last pick and it
  asks what the last job did (plain: the queues ordered at every pick);
- `eviction.Refusals`: reclaim and preempt answer a job equal to one they were
  refused for at the same transaction and ledger versions without a second
  search (plain: every job is tried);
- `eviction.no_domain_could_hold`: the victim search is not made for a gang that
  no domain of its required topology level (without one: the cluster) could hold
  even were every victim the budget allows on its own gone (plain: the search is
  made, and fails), nor
  (`eviction.domain_could_hold_in_total`) hold the room its members ask for added
  up, with each victim queue giving up no more than `Budget.most_taken` lets a
  take free (plain: the same); and, inside the search, a set of victims is not
  evicted and the gang not placed when no such domain could hold it with those
  victims gone (`eviction.could_fit_without`; plain: evicted, placed, rolled back);
- `FairShareBudget.refuses_every`: the victim search gives up at once when the
  budget refuses each possible victim on its own (plain: every node weighed and
  every option offered to the budget);
- `FairShareBudget.judged_key`: a budget refuses what it refused since it last
  took without judging it again (`FairShareBudget.take_each`: nor a unit alike
  to one it refused since, when it offers every unit one by one), and
  `FairShareBudget.takes_alone` keeps its answers per victim queue and amounts
  (plain: judged every time; a fresh budget per unit), and `FairShareBudget.shared`
  keeps the units it takes alone, laid out, for the run's budgets of one reclaimer
  at one ledger version (plain: worked out for every search);
- `consolidate.total_free`, the free room added up once per transaction version,
  and `consolidate.fits_in_total`, a request judged against it once per version
  (plain: added up and judged for every waiting gang);
- `consolidate.movable_gangs`, worked out once per transaction version and
  evictions planned (plain: for every waiting gang), only the first of them
  sorted whole (`consolidate.first_movable`; plain: every gang sorted), and
  `consolidate.NO_MOVE`:
  a gang equivalent to one no move helped at the same state is not tried again
  (plain: every gang is tried); and `consolidate.domain_could_hold`: no move is
  tried for a gang that no domain of its required level (without one: the
  cluster) could hold even were every gang within the bound moved away (plain:
  the moves are tried);
  `consolidate.could_pack`: a move is not tried when the target's members and the
  moved pods outnumber, for some resource and size, what the nodes' room could
  hold counted node by node (plain: the move is tried, and fails), and
  `consolidate.moves_counted_out`: the first of those counts, for GPUs, worked
  out for every number of gangs moved at once (plain: `could_pack` is asked);
- `preempt.victims_below_anyone`, `reclaim.anyone_within_share`,
  `consolidate.some_could_be_tried`: an action is skipped whole when every attempt
  would stop at its first test at the state it starts from (no possible victim of
  lower priority in any waiting gang's queue; no queue within its fair share with
  its gang added; no gang that passes admission and fits the free room added up)
  (plain: every waiting gang tried).
- the stale-gang action looks only at the groups touched this cycle and those a
  tally follows as unsettled (`stale.UNSETTLED`) (plain: the tally made by a walk
  over every group).
The plain path is the same cycle with the shortcut switched off; the two plans
must be equal field by field, statuses and reasons included.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kai_ray.decisions import (
    alike,
    allocate,
    consolidate,
    eviction,
    ordering,
    preempt,
    reclaim,
    stale,
)
from kai_ray.decisions.admission import Freed, freed_in_queues, is_preemptible
from kai_ray.decisions.context import CycleContext
from kai_ray.decisions.cycle import run_cycle
from kai_ray.decisions.ledger import QueueLedger
from kai_ray.decisions.ordering import Candidate, WaitingJobs, group_priority, queue_key
from kai_ray.decisions.placement import gang, gang_tree
from kai_ray.decisions.plan import Plan
from kai_ray.decisions.reclaim import FairShareBudget
from kai_ray.decisions.runtime import Protection
from kai_ray.decisions.totals import GroupTotals
from kai_ray.decisions.victims import Budget, VictimUnit
from kai_ray.state.cache import NODE, POD, POD_GROUP, QUEUE, TOPOLOGY, ClusterCache
from kai_ray.state.groups import PodGroupState
from kai_ray.state.snapshot import ClusterObjects, build_snapshot
from kai_ray.values.clock import unix_seconds
from kai_ray.values.config import SchedulerConfig
from kai_ray.values.resources import EPSILON, GPU
from tests.builders import (
    make_node,
    make_pod,
    make_pod_group,
    make_queue,
    make_topology,
    timestamp,
)

TEAMS = ("team-a", "team-b", "team-c")
#: The cycles' time: 100 s after the origin of the objects' timestamps.
NOW = float(unix_seconds(timestamp(100)) or 0.0)
#: (pods, GPUs each, rack required, node selector) of a waiting gang.
SHAPES = (
    (1, 1, False, False),
    (1, 4, False, False),
    (1, 8, False, True),
    (2, 8, False, False),
    (2, 8, True, False),
    (2, 4, True, False),
    (3, 8, True, False),
    (3, 8, False, False),
    (4, 2, True, True),
)


@st.composite
def clusters(
    draw: st.DrawFn,
    full: bool = False,
    movable: bool = False,
    mixed: bool = False,
    departments: bool = False,
) -> ClusterObjects:
    """A random cluster; `full`: every node runs preemptible 4-GPU jobs of the first
    two teams, so that waiting gangs are placed only by taking room back; `movable`:
    the running jobs are preemptible Jobs' pods (their controller makes them again),
    so consolidation may move them to make room for a waiting gang; `mixed` (with
    `full`): the running jobs are of 1, 2 or 4 GPUs; `departments`: the first two
    teams share one department queue and the others another, each with a quota
    drawn (two teams' paths then meet below the root or at it)."""
    node_count = draw(st.integers(2, 10))
    nodes, sizes = [], []
    for i in range(node_count):
        sizes.append(draw(st.sampled_from((4, 8))))
        node = make_node(f"n{i}").gpus(sizes[-1]).in_domains(rack=f"r{i % 3}")
        nodes.append(node.label("pool", "a" if i % 2 else "b").build())
    root = make_queue("root")
    # Min runtimes protect some running gangs (started at 0-20 s) at the cycle's time
    # (100 s): evicting actions then ask to be woken when the protection ends.
    for field in ("reclaimMinRuntime", "preemptMinRuntime"):
        runtime = draw(st.sampled_from((None, "90s", "110s")))
        if runtime is not None:
            root = root.set(f"spec.{field}", runtime)
    queues = [root.build()]
    parents = {team: "root" for team in TEAMS}
    if departments:
        for index, dept in enumerate(("dept-x", "dept-y")):
            quota = draw(st.integers(0, 24))
            queues.append(make_queue(dept).parent("root").gpu(quota=quota).build())
            for team in (TEAMS[:2], TEAMS[2:])[index]:
                parents[team] = dept
    for team in TEAMS:
        quota = draw(st.integers(0, 16))
        queues.append(make_queue(team).parent(parents[team]).gpu(quota=quota).build())
    pods: list[dict[str, Any]] = []
    groups: list[dict[str, Any]] = []
    if full:
        _fill(draw, nodes, sizes, pods, groups, mixed)
    for j in range(0 if full else draw(st.integers(0, 2 * node_count))):
        name, node = f"run-{j}", nodes[draw(st.integers(0, node_count - 1))]["metadata"]["name"]
        group = make_pod_group(name).queue(draw(st.sampled_from(TEAMS))).min_member(1)
        if not movable and draw(st.booleans()):
            group = group.priority_class("build")  # not preemptible
        groups.append(group.created(j).build())
        pod = make_pod(f"{name}-0").gpus(draw(st.sampled_from((1, 2, 4)))).group(name)
        pod = pod.created(draw(st.integers(0, 20)))
        if movable:
            pod = pod.controlled_by("Job", name)
        pods.append(pod.priority(draw(st.sampled_from((0, 10)))).on(node).build())
    for j in range(draw(st.integers(0, 25))):
        size, gpus, rack, selector = draw(st.sampled_from(SHAPES))
        name, priority = f"wait-{j}", draw(st.sampled_from((0, 10, 20)))
        group = make_pod_group(name).queue(draw(st.sampled_from(TEAMS))).min_member(size)
        if rack:
            group = group.topology("dc", required="rack")
        groups.append(group.created(100 + draw(st.integers(0, 5))).build())
        for k in range(size):
            pod = make_pod(f"{name}-{k}").gpus(gpus).group(name).priority(priority)
            if selector:
                pod = pod.set("spec.nodeSelector", {"pool": "a"})
            pods.append(pod.build())
    topology = make_topology("dc", "rack").hostname().build()
    return ClusterObjects(
        nodes=nodes, pods=pods, pod_groups=groups, queues=queues, topologies=[topology]
    )


@st.composite
def fragmented_clusters(draw: st.DrawFn) -> ClusterObjects:
    """Nodes of 8 GPUs, each partly used by preemptible Jobs' pods of 1, 2 or 4
    GPUs (their controller makes them again), and a backlog of gangs of 4- and
    8-GPU pods that fit the free GPUs added up but seldom on the nodes as they
    are: consolidation moves running pods, often several times in one cycle. Some
    queues have a limit and some gangs are not preemptible, so that some (at
    times every) waiting gang stops at admission."""
    node_count = draw(st.integers(3, 10))
    nodes = [
        make_node(f"n{i}").gpus(8).in_domains(rack=f"r{i % 2}").build() for i in range(node_count)
    ]
    queues = [make_queue("root").build()]
    for team in TEAMS:
        # Some queues at or near a limit: their gangs stop at admission.
        quota = draw(st.integers(4, 24))
        limit = draw(st.one_of(st.none(), st.integers(quota, quota + 8)))
        queues.append(make_queue(team).parent("root").gpu(quota=quota, limit=limit).build())
    pods: list[dict[str, Any]] = []
    groups: list[dict[str, Any]] = []
    for i, node in enumerate(nodes):
        used = 0
        for k in range(draw(st.integers(0, 4))):
            gpus = draw(st.sampled_from((1, 2, 4)))
            if used + gpus > 7:
                break
            used += gpus
            name = f"run-{i}-{k}"
            team = draw(st.sampled_from(TEAMS))
            groups.append(make_pod_group(name).queue(team).min_member(1).created(i).build())
            pod = make_pod(f"{name}-0").gpus(gpus).group(name).controlled_by("Job", name)
            pods.append(pod.on(node["metadata"]["name"]).build())
    for j in range(draw(st.integers(1, 12))):
        size, gpus = draw(st.sampled_from(((1, 4), (1, 8), (2, 4), (2, 8), (1, 6))))
        name = f"wait-{j}"
        group = make_pod_group(name).queue(draw(st.sampled_from(TEAMS))).min_member(size)
        if draw(st.booleans()):
            group = group.topology("dc", required="rack")
        if draw(st.integers(0, 3)) == 0:
            group = group.priority_class("build")  # not preemptible: only within quota
        groups.append(group.created(100 + draw(st.integers(0, 3))).build())
        for k in range(size):
            pods.append(make_pod(f"{name}-{k}").gpus(gpus).group(name).build())
    topology = make_topology("dc", "rack").hostname().build()
    return ClusterObjects(
        nodes=nodes, pods=pods, pod_groups=groups, queues=queues, topologies=[topology]
    )


def _fill(
    draw: st.DrawFn,
    nodes: list[dict[str, Any]],
    sizes: list[int],
    pods: list[dict[str, Any]],
    groups: list[dict[str, Any]],
    mixed: bool = False,
) -> None:
    """Every node full of preemptible jobs of team-a or team-b, each its own gang: of
    4 GPUs, or (`mixed`) of 1, 2 or 4."""
    for i, (node, size) in enumerate(zip(nodes, sizes, strict=True)):
        left, k = size, 0
        while left:
            gpus = draw(st.sampled_from([g for g in (1, 2, 4) if g <= left])) if mixed else 4
            name, left, k = f"run-{i}-{k}", left - gpus, k + 1
            team = draw(st.sampled_from(TEAMS[:2]))
            groups.append(make_pod_group(name).queue(team).min_member(1).created(i).build())
            pod = make_pod(f"{name}-0").gpus(gpus).group(name).created(draw(st.integers(0, 20)))
            pods.append(
                pod.priority(draw(st.sampled_from((0, 10)))).on(node["metadata"]["name"]).build()
            )


def plain_running_units(
    ctx: CycleContext,
    may_take: Callable[[str], bool],
    protection: Protection,
    below: int | None = None,
) -> list[VictimUnit]:
    """Every group of the snapshot looked at, as before the per-queue index."""
    units: list[VictimUnit] = []
    for group in ctx.snapshot.pod_groups.values():
        priority = group_priority(group)
        if not is_preemptible(group, priority) or not may_take(group.queue):
            continue
        if below is not None and priority >= below:
            continue
        if any(p.scheduler != ctx.config.schedulerName for p in group.live_pods()):
            continue
        if not group.seen_whole:
            continue
        for unit in eviction._units_of(ctx.transaction, group, priority):
            untouched = not any(p.key in ctx.transaction.removed for p in unit.pods)
            if untouched and not protection.protects(unit):
                units.append(unit)
    return units


def _always(*_: object) -> bool:
    return True


#: Each shortcut as (where it is looked up, its name, what the plain path does instead).
def _walked_afresh(
    waiting: WaitingJobs, ledger: QueueLedger, name: str
) -> tuple[Candidate | None, tuple[object, ...] | None]:
    """`WaitingJobs.best_below` with nothing kept: the walk down from `name` again."""
    found = ordering._best_in(ledger, name, waiting)
    return found, None if found is None else queue_key(ledger, name, found.request)


def _in_turn_sorted(ctx: CycleContext) -> list[PodGroupState]:
    """`consolidate.in_turn` sorted afresh from the waiting gangs."""
    waiting = ordering.waiting_gangs(ctx.snapshot.waiting_groups, ctx.transaction)
    return sorted(waiting, key=lambda g: (-group_priority(g), g.creation_timestamp, g.key))


def _freed_afresh(ctx: CycleContext, victims: Iterable[VictimUnit]) -> Freed:
    """What the victims free in each queue, summed for every question."""
    return freed_in_queues(ctx.ledger, ((unit.queue, unit.requests) for unit in victims))


def _members_afresh(
    memo: object,
    slot: object,
    groups: Mapping[str, PodGroupState],
    value: Callable[[PodGroupState], str | None],
) -> dict[str, str]:
    """`totals.kept_members` as a walk over every group."""
    return {key: found for key, group in groups.items() if (found := value(group)) is not None}


def _fits_afresh(ctx: Any, request: Any) -> bool:
    """`consolidate.fits_in_total` judged afresh, against the room added up afresh."""
    free = consolidate.summed_free(ctx.transaction)
    return bool(np.all(ctx.snapshot.vector(request) <= free + EPSILON))


def _movable_sorted(ctx: Any, gangs: Sequence[PodGroupState], count: int) -> list[PodGroupState]:
    """`consolidate.first_movable` as a sort of every gang by the whole order."""
    free_gpus = ctx.transaction.free[:, ctx.snapshot.column(GPU)]
    index = ctx.snapshot.node_index

    def order(gang: PodGroupState) -> tuple[object, ...]:
        emptiest = max(float(free_gpus[index[pod.node or ""]]) for pod in gang.bound)
        return consolidate.movable_order(gang, emptiest)

    return sorted(gangs, key=order)[:count]


SHORTCUTS: tuple[tuple[object, str, object], ...] = (
    (gang_tree, "signature", lambda tx, group: None),
    (gang_tree, "carried_failure", lambda tx, key, group: None),
    (gang, "_counted_failure", lambda ctx, pods, node_set, cache: None),
    (preempt, "running_units", plain_running_units),
    (reclaim, "running_units", plain_running_units),
    (
        WaitingJobs,
        "key_of",
        lambda waiting, ledger, name, request: queue_key(ledger, name, request),
    ),
    (WaitingJobs, "again", lambda waiting, ledger: None),
    (WaitingJobs, "best_below", _walked_afresh),
    (WaitingJobs, "take_alike", lambda waiting, ledger, refused: []),
    (eviction, "refusal_kinds", lambda ctx: lambda candidate: None),
    (eviction.Refusals, "judge", lambda refusals, ctx, jobs, attempt: None),
    (FairShareBudget, "refuses_every", lambda budget, units: False),
    (consolidate, "total_free", consolidate.summed_free),
    (consolidate, "fits_in_total", _fits_afresh),
    (preempt, "victims_below_anyone", _always),
    (reclaim, "anyone_within_share", _always),
    (reclaim, "queues_within_share", lambda ctx: None),
    (consolidate, "some_could_be_tried", _always),
    (consolidate, "_movable_memo", consolidate._movable_gangs),
    (consolidate, "first_movable", _movable_sorted),
    (consolidate, "_attempt_key", lambda ctx, group: None),
    (consolidate, "alike_keys", lambda ctx: lambda group: None),
    (consolidate, "in_turn", _in_turn_sorted),
    (allocate, "alike_keys", lambda ctx: lambda group: None),
    (allocate, "with_kinds", lambda ctx, jobs: ((job, None) for job in jobs)),
    (eviction, "with_kinds", lambda ctx, jobs: ((job, None) for job in jobs)),
    (allocate._Allocation, "rest_wait", lambda allocation, waiting, known: False),
    (alike, "_this_cycle", lambda ctx: {}),
    (eviction, "_unit_kinds", lambda tx, units: (list(units), np.arange(len(units)))),
    (eviction, "_freed", _freed_afresh),
    (consolidate, "kept_members", _members_afresh),
    (eviction, "kept_members", _members_afresh),
    (stale, "kept_members", _members_afresh),
    (eviction, "no_domain_could_hold", lambda ctx, group, units, new_budget: False),
    (eviction, "could_fit_without", lambda tx, group, victims: True),
    (eviction, "domain_could_hold_in_total", lambda tx, group, domains, units, pods, budget: True),
    (consolidate, "domain_could_hold", lambda tx, group, domains, freed: True),
    (consolidate, "domain_could_hold_moved", lambda tx, group, domains, moved: True),
    (consolidate, "could_pack", lambda tx, target, moved: True),
    (consolidate, "moves_counted_out", lambda tx, target, moved: [False] * len(moved)),
    (FairShareBudget, "judged_key", lambda budget, taking: None),
    (FairShareBudget, "shared", lambda budget, anchor, build: build()),
    (FairShareBudget, "take_each", Budget.take_each),
    (
        FairShareBudget,
        "takes_alone",
        lambda budget, unit: FairShareBudget(
            budget.ledger, budget.contested, budget.leaf, budget.job
        ).take([unit]),
    ),
)


@pytest.fixture
def plain_path(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[bool], None]]:
    """Switches the shortcuts off (True) or back on (False). Allocate judges the kinds
    left after the first repeat (the small backlogs here seldom reach the cycle's
    run of repeats; the answer does not depend on when)."""
    monkeypatch.setattr(allocate, "JUDGE_AFTER", 1)
    originals = [getattr(where, name) for where, name, _ in SHORTCUTS]

    def switch(plain: bool) -> None:
        for (where, name, instead), original in zip(SHORTCUTS, originals, strict=True):
            monkeypatch.setattr(where, name, instead if plain else original)

    yield switch


def _plan(objects: ClusterObjects) -> Plan:
    return run_cycle(build_snapshot(objects), SchedulerConfig(), 1, NOW).plan


def _fields(plan: Plan) -> tuple[object, ...]:
    # Each group's status (the order groups were first stated in is not the plan's
    # meaning: allocate states a backlog's rest at once, not in turn).
    statuses = {status.group: status for status in plan.statuses}
    return (plan.binds, plan.evictions, plan.nominations, statuses, plan.wake_at)


def drawn(examples: int) -> Any:
    """Hypothesis settings of these tests: `examples` clusters, no deadline, and the
    fixtures (the plain-path switch, monkeypatch) shared across examples."""
    return settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


@drawn(150)
@given(objects=clusters())
def test_a_cycle_with_its_shortcuts_plans_what_the_plain_path_plans(
    plain_path: Callable[[bool], None], objects: ClusterObjects
) -> None:
    plain_path(True)
    plain = _plan(objects)
    plain_path(False)
    assert _fields(_plan(objects)) == _fields(plain)


@drawn(100)
@given(objects=st.one_of(clusters(full=True), clusters(full=True, mixed=True)))
def test_on_a_full_cluster_the_shortcuts_plan_what_the_plain_path_plans(
    plain_path: Callable[[bool], None], objects: ClusterObjects
) -> None:
    """Reclaim and preempt at work: room is made only by evicting."""
    plain_path(True)
    plain = _plan(objects)
    plain_path(False)
    assert _fields(_plan(objects)) == _fields(plain)


@drawn(100)
@given(objects=fragmented_clusters())
def test_with_movable_jobs_the_shortcuts_plan_what_the_plain_path_plans(
    plain_path: Callable[[bool], None], objects: ClusterObjects
) -> None:
    """Consolidation at work: running Jobs' pods moved so that a waiting gang fits."""
    plain_path(True)
    plain = _plan(objects)
    plain_path(False)
    assert _fields(_plan(objects)) == _fields(plain)


#: `FairShareBudget.take` and `.takes_alone` as the module defines them (the test
#: below wraps them).
TAKE, TAKES_ALONE = FairShareBudget.take, FairShareBudget.takes_alone


@drawn(150)
@given(
    objects=st.one_of(
        clusters(full=True),
        clusters(full=True, mixed=True),
        clusters(full=True, mixed=True, departments=True),
    )
)
def test_a_fair_share_budget_answers_as_one_judging_afresh(
    monkeypatch: pytest.MonkeyPatch, objects: ClusterObjects
) -> None:
    """Every `take` of reclaim's budgets in a cycle, against a budget in the same
    state (what it took so far) that keeps no refusals; every `takes_alone`
    against a fresh budget's `take` of the one unit (the budgets of a run share
    those answers across reclaimers: with departments, two reclaimers meet a victim
    queue at different queues)."""
    differ: list[tuple[str, ...]] = []
    #: Per budget (by id, the budget kept alive with its probe so that its id is
    #: never another's): the probe.
    probes: dict[int, tuple[FairShareBudget, FairShareBudget]] = {}

    def checked(budget: FairShareBudget, units: list[VictimUnit]) -> bool:
        # Each unit offered is also asked of one budget that never takes, per budget
        # (its answers kept across many units of one queue): as a fresh `take`.
        probe = probes.setdefault(id(budget), (budget, _afresh(budget)))[1]
        for unit in units:
            if TAKES_ALONE(probe, unit) != TAKE(_afresh(budget), [unit]):
                differ.append(("probe", unit.label()))
        fresh = _afresh(budget)
        fresh.taken = copy.deepcopy(budget.taken)
        fresh.judged_key = lambda taking: None  # type: ignore[method-assign]
        expected = TAKE(fresh, units)
        answer = TAKE(budget, units)
        if answer != expected:
            differ.append(tuple(u.label() for u in units))
        return answer

    def checked_alone(budget: FairShareBudget, unit: VictimUnit) -> bool:
        answer = TAKES_ALONE(budget, unit)
        if answer != TAKE(_afresh(budget), [unit]):
            differ.append(("alone", unit.label()))
        return answer

    monkeypatch.setattr(FairShareBudget, "take", checked)
    monkeypatch.setattr(FairShareBudget, "takes_alone", checked_alone)
    _plan(objects)
    assert not differ


def _afresh(budget: FairShareBudget) -> FairShareBudget:
    return FairShareBudget(budget.ledger, budget.contested, budget.leaf, budget.job)


@drawn(150)
@given(objects=st.one_of(clusters(full=True), clusters(full=True, mixed=True)))
def test_most_taken_bounds_what_any_take_of_a_fresh_budget_lets_go(
    monkeypatch: pytest.MonkeyPatch, objects: ClusterObjects
) -> None:
    """`FairShareBudget.most_taken`, the bound reclaim's count in total relies on:
    whatever set one take accepts (of a budget that took nothing), the units of
    each leaf queue in it ask, together, for no more of each resource than the
    bound. Checked on every take of a cycle, and on the set of every unit it
    offers each take (what `_everything` offers at most)."""
    over: list[str] = []
    takes = 0

    def checked(budget: FairShareBudget, units: list[VictimUnit]) -> bool:
        nonlocal takes
        for offered in (units, [u for u in units if TAKE(_afresh(budget), [u])]):
            fresh = _afresh(budget)
            if not offered or not TAKE(fresh, offered):
                continue
            takes += 1
            caps = _afresh(budget)
            for leaf in {unit.queue for unit in offered}:
                bounds = caps.most_taken(leaf)
                for resource, most in bounds.items():
                    asked = sum(u.requests[resource] for u in offered if u.queue == leaf)
                    if asked > most + 1e-9:
                        over.append(f"{leaf} {resource}: {asked} > {most}")
        return TAKE(budget, units)

    monkeypatch.setattr(FairShareBudget, "take", checked)
    _plan(objects)
    assert not over


@st.composite
def elastic_runs(draw: st.DrawFn) -> tuple[ClusterCache, list[list[tuple[str, str]]]]:
    """A cluster cache whose nodes are full of preemptible gangs of team-a and team-b
    (quota 0) of one to four 4-GPU pods, some above their minimum (so a gang is cut
    into several victim units, of one pod or of its minimum core), with team-c
    (quota 64) waiting; and, for each cycle after the first, the running pods
    deleted before it (their gangs change)."""
    node_count = draw(st.integers(2, 6))
    cache = ClusterCache()
    cache.upsert(make_queue("root").build(), QUEUE)
    for team, quota in zip(TEAMS, (0, 0, 64), strict=True):
        cache.upsert(make_queue(team).parent("root").gpu(quota=quota).build(), QUEUE)
    topology = make_topology("dc", "rack").hostname().build()
    cache.upsert(topology, TOPOLOGY)
    slots = [f"n{i}" for i in range(node_count) for _ in range(2)]
    for name in dict.fromkeys(slots):
        node = make_node(name).gpus(8).in_domains(rack=f"r{int(name[1:]) % 2}").build()
        cache.upsert(node, NODE)
    slots = draw(st.permutations(slots))
    running: list[tuple[str, str]] = []
    while slots:
        size = draw(st.integers(1, min(4, len(slots))))
        name, (on, slots) = f"run-{len(running)}", (slots[:size], slots[size:])
        group = make_pod_group(name).queue(draw(st.sampled_from(TEAMS[:2])))
        cache.upsert(group.min_member(draw(st.integers(1, size))).created(0).build(), POD_GROUP)
        for k, node_name in enumerate(on):
            pod = make_pod(f"{name}-{k}").gpus(4).group(name).created(draw(st.integers(0, 20)))
            cache.upsert(pod.on(node_name).phase("Running").build(), POD)
            running.append((name, f"default/{name}-{k}"))
    for j in range(draw(st.integers(1, 6))):
        size, gpus = draw(st.sampled_from(((1, 4), (2, 4), (2, 8), (3, 4))))
        rack = draw(st.booleans())
        group = make_pod_group(f"wait-{j}").queue("team-c").min_member(size)
        cache.upsert((group.topology("dc", required="rack") if rack else group).build(), POD_GROUP)
        for k in range(size):
            cache.upsert(make_pod(f"wait-{j}-{k}").gpus(gpus).group(f"wait-{j}").build(), POD)
    gone = [
        draw(st.lists(st.sampled_from([pod for _, pod in running]), max_size=2, unique=True))
        for _ in range(2)
    ]
    return cache, gone


def test_victim_pods_laid_out_from_kept_layouts_are_those_laid_out_afresh(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every list of victim units whose pods a count reads (`eviction.unit_pods`: cut
    from the untouched units' layout, joined from each group's layout kept from
    cycle to cycle) has the layout `eviction.lay_out` makes pod by pod: the same
    units, nodes and holdings in the same order. Three cycles on one cache and one
    `GroupTotals`, running pods deleted between them (their gangs change); reclaim's
    evictions in a cycle leave gangs partly untouched."""
    compared: list[int] = []
    differ: list[str] = []
    original = eviction.unit_pods

    def checked(tx: Any, units: Sequence[VictimUnit]) -> eviction.UnitPods:
        laid = original(tx, units)
        fresh = eviction.lay_out(tx, units)
        compared.append(len(units))
        for field in ("unit", "node", "held"):
            if not np.array_equal(getattr(laid, field), getattr(fresh, field)):
                differ.append(f"{field} of {[unit.label() for unit in units]}")
        return laid

    monkeypatch.setattr(eviction, "unit_pods", checked)

    @drawn(80)
    @given(run=elastic_runs())
    def cycles(run: tuple[ClusterCache, list[list[str]]]) -> None:
        cache, gone = run
        kept = GroupTotals()
        for cycle, deleted in enumerate([[], *gone], start=1):
            for pod in deleted:
                cache.delete(POD, pod)
            run_cycle(cache.snapshot(), SchedulerConfig(), cycle, NOW, totals=kept)

    cycles()
    assert not differ
    assert any(compared), "no count read a layout: the check compared nothing"


def test_untouched_units_kept_across_cycles_are_those_listed_afresh(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The untouched units an evicting action meets (`eviction._untouched_units`),
    listed again from last cycle's list when the groups that may give victims are
    the very same (`_Listed.holds_for`), are those listed afresh from the groups:
    the same units in the same order, queues, protections as of the cycle's time,
    and parts. Three or more cycles on one cache and one `GroupTotals` at times
    that cross the end of a min-runtime (running pods started at 0-20 s), the
    min-runtime set before the first or the second, running pods deleted between
    some of them; the list is taken again at least once (a cycle with nothing
    deleted)."""
    differ: list[str] = []
    met, listed_again = [0], [0]
    original = eviction._untouched_units
    holds_for = eviction._Listed.holds_for

    def counted(self: Any, entries: Any, protection: Protection) -> bool:
        holds = holds_for(self, entries, protection)
        listed_again[0] += holds
        return holds

    def checked(ctx: CycleContext, protection: Protection, below: int | None) -> Any:
        found = original(ctx, protection, below)
        groups = eviction.victim_groups(ctx)
        entries = [e for e in groups.in_order if below is None or e[1] < below]
        fresh = eviction._Listed.of(ctx.transaction, entries, protection).at(protection.now)
        met[0] += 1
        same = (
            found.queues == fresh.queues
            and len(found.units) == len(fresh.units)
            and all(a is b for a, b in zip(found.units, fresh.units, strict=True))
            and np.array_equal(found.queue_of, fresh.queue_of)
            and np.array_equal(found.ends, fresh.ends, equal_nan=True)
            and [(g.key, p, n, k) for g, p, n, k in found.parts]
            == [(g.key, p, n, k) for g, p, n, k in fresh.parts]
            and all(a[0] is b[0] for a, b in zip(found.parts, fresh.parts, strict=True))
        )
        if not same:
            differ.append(f"at {protection.now}: {[u.label() for u in found.units]}")
        return found

    monkeypatch.setattr(eviction, "_untouched_units", checked)
    monkeypatch.setattr(eviction._Listed, "holds_for", counted)

    @drawn(80)
    @given(run=elastic_runs(), protect_at=st.sampled_from((0, 1, 2)), step=st.integers(0, 20))
    def cycles(run: tuple[ClusterCache, list[list[str]]], protect_at: int, step: int) -> None:
        cache, gone = run
        kept = GroupTotals()
        start = float(unix_seconds(timestamp(20)) or 0.0)
        for cycle, deleted in enumerate([[], [], *gone], start=1):
            if cycle == protect_at:  # a min-runtime from this cycle on (0: none)
                root = make_queue("root").set("spec.reclaimMinRuntime", "30s").build()
                cache.upsert(root, QUEUE)
            for pod in deleted:
                cache.delete(POD, pod)
            now = start + step * (cycle - 1)
            run_cycle(cache.snapshot(), SchedulerConfig(), cycle, now, totals=kept)

    cycles()
    assert not differ
    assert met[0], "no evicting action listed untouched units: the check compared nothing"
    assert listed_again[0], "no list was taken again: the kept path was not met"


@pytest.mark.parametrize(
    ("busy_cpu", "counted"),
    [
        pytest.param("1", True, id="whole amounts: known by counting"),
        pytest.param("100m", False, id="a fraction of a core on the nodes: placed one by one"),
    ],
)
def test_a_gang_that_fits_part_way_waits_alike_counted_or_placed(
    plain_path: Callable[[bool], None],
    monkeypatch: pytest.MonkeyPatch,
    busy_cpu: str,
    counted: bool,
) -> None:
    """Room for one of three alike 8-GPU pods (n1 free, n0 busy): the pods are
    placed one by one and rolled back, or, when every amount is whole, the
    failure is known by counting; the gang waits with the same reason."""
    nodes = [make_node(name).gpus(8).cpu(64).build() for name in ("n0", "n1")]
    busy = make_pod("busy").gpus(8).cpu(busy_cpu).on("n0").phase("Running").build()
    gang_pods = [make_pod(f"g-{i}").group("g").gpus(8).cpu(4).build() for i in range(3)]
    objects = ClusterObjects(
        nodes=nodes,
        pods=[busy, *gang_pods],
        pod_groups=[make_pod_group("g").queue("team").min_member(3).build()],
        queues=[make_queue("team").build()],
    )
    plain_path(False)
    answers: list[object] = []
    counting = gang._counted_failure

    def spy(*args: Any) -> object:
        answers.append(counting(*args))
        return answers[-1]

    monkeypatch.setattr(gang, "_counted_failure", spy)
    shortcut = _plan(objects)
    plain_path(True)
    plain = _plan(objects)
    assert _fields(shortcut) == _fields(plain)
    reason = next(s.reason for s in shortcut.statuses if s.group == "default/g")
    assert reason.endswith("needs 3 pods with 8 GPUs each; the cluster has room for 1")
    assert any(answer is not None for answer in answers) is counted
