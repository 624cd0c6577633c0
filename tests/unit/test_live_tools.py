"""`kai-ray explain` and `kai-ray snapshot --kubeconfig` on a cluster given as listed objects.

The cluster: three 4-GPU nodes in two racks; team-a's gang `a1` bound on n0;
team-b's gang `wide` of two 4-GPU pods that must share a rack, which no rack
has room for; a Job `train` of team-a whose PodGroup the operator has not made
yet; a pod of the default scheduler holding 2 CPUs on n2. The live tests of
the same commands are tests/e2e/test_explain.py.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from kai_ray.decisions.cycle import run_cycle
from kai_ray.effects.live_view import LiveCluster, live_cluster
from kai_ray.sim.engine import Simulation
from kai_ray.sim.loader import HELD_ANNOTATION, Document, load_documents
from kai_ray.sim.report import build_report
from kai_ray.tools.cli import main
from kai_ray.tools.explain import NotFoundError, explain
from kai_ray.tools.explain_report import render_at
from kai_ray.tools.explain_view import render
from kai_ray.tools.explain_whatif import Closeness
from kai_ray.tools.live_snapshot import live_snapshot
from kai_ray.values.config import SchedulerConfig
from kai_ray.values.errors import InvalidObjectError
from kai_ray.values.names import ADMISSION_GATE, MIN_MEMBER_ANNOTATION, QUEUE_LABEL
from tests.builders import make_job, make_node, make_pod, make_pod_group, make_queue, make_topology
from tests.unit.workload_builders import container, raycluster, template, worker

RACK = "kai-ray.io/rack"
LIMIT_TEAM_A_AT_4 = "Queue/team-a.spec.resources.gpu.limit=4"
WIDE_REASON = "gang of 2 does not fit: needs 2 pods with 4 GPUs each inside one rack"


def _cluster() -> dict[str, list[dict[str, Any]]]:
    nodes = [
        make_node(name).gpus(4).label(RACK, rack).build()
        for name, rack in (("n0", "r0"), ("n1", "r0"), ("n2", "r1"))
    ]
    team_a = make_queue("team-a").parent("dept").gpu(quota=4, limit=8).build()
    team_a["status"] = {"allocated": {"gpu": 4}, "fairShare": {"gpu": 4}, "requested": {"gpu": 6}}
    team_b = make_queue("team-b").parent("dept").gpu(quota=4, limit=8).build()
    team_b["status"] = {"allocated": {"gpu": 0}, "fairShare": {"gpu": 4}, "pendingWorkloads": 1}
    a1 = make_pod_group("a1").queue("team-a").min_member(2).created(1).build()
    a1["status"] = {"phase": "Running", "bound": 2}
    wide = make_pod_group("wide").queue("team-b").min_member(2).topology("dc", "rack")
    wide_obj = wide.created(2).build()
    wide_obj["status"] = {
        "phase": "Pending",
        "reason": f"{WIDE_REASON}; the best rack has room for 1",
        "conditions": [{"type": "Scheduled", "status": "False", "reason": "Unschedulable"}],
    }
    train = make_job("train").label(QUEUE_LABEL, "team-a").annotate(MIN_MEMBER_ANNOTATION, "2")
    train = train.parallelism(2).gpus(1).created(3)
    train_obj = train.build()
    train_obj["metadata"]["uid"] = "uid-train"
    pods = [
        *(
            make_pod(f"a1-{i}").gpus(2).group("a1").on("n0").phase("Running").build()
            for i in (0, 1)
        ),
        *(make_pod(f"wide-{i}").gpus(4).group("wide").build() for i in (0, 1)),
        *(
            make_pod(f"train-{i}")
            .gpus(1)
            .label("job-name", "train")
            .controlled_by("Job", "train")
            .build()
            for i in (0, 1)
        ),
        make_pod("system").scheduler("default-scheduler").cpu(2).on("n2").build(),
    ]
    return {
        "Node": nodes,
        "Queue": [make_queue("dept").gpu(quota=8, limit=8).build(), team_a, team_b],
        "Topology": [make_topology("dc").level(RACK, "rack").hostname().build()],
        "PodGroup": [a1, wide_obj],
        "Job": [train_obj],
        "Pod": pods,
    }


@pytest.fixture
def view() -> LiveCluster:
    return live_cluster(_cluster(), "kai-ray")


def _no_events(namespace: str, kind: str, name: str) -> list[dict[str, Any]]:
    return [{"lastTimestamp": "t1", "reason": "Unschedulable", "message": f"{kind} {name} waits"}]


def _text(found: Any) -> str:
    out = io.StringIO()
    Console(file=out, width=400).print(render(found))
    return out.getvalue()


# --------------------------------------------------------------------- explain


def test_a_gang_that_fits_no_rack_shows_its_queue_reason_and_the_best_rack(
    view: LiveCluster,
) -> None:
    found = explain(view, SchedulerConfig(), "default", "podgroup/wide", _no_events)
    assert (found.group, found.phase, found.pictured) == ("default/wide", "Pending", False)
    assert found.last_reason.startswith(WIDE_REASON)
    assert [q.name for q in found.queues] == ["team-b", "dept"]
    team_b = found.queues[0]
    assert (team_b.quota, team_b.limit, team_b.fair_share, team_b.allocated) == (4, 8, "4", "0")
    gang = found.gang
    assert gang is not None
    assert (gang.min_member, gang.bound, gang.pending, gang.missing) == (2, 0, 2, 2)
    assert gang.fits_one_by_one == 2, "n1 and n2 each have room for one 4-GPU pod"
    assert not gang.fits_whole and "inside one rack" in gang.not_now
    # narrowest level first; a tie goes to the domain listed first, as placement breaks it
    assert found.topology == [
        Closeness("host", "r0/n1", 1, 2, "4 GPUs", required=False),
        Closeness("rack", "r0", 1, 2, "4 GPUs", required=True),
    ]
    waiting = {q.name: q for q in found.waiting_queues}
    assert set(waiting) == {"team-a", "team-b"} and not waiting["team-b"].over_fair_share
    text = _text(found)
    assert "PodGroup default/wide" in text and "Unschedulable: PodGroup wide waits" in text
    assert re.search(r"rack \(required\)\s*│\s*r[01]\s*│\s*1\s*│\s*2", text), text


def test_a_pod_of_a_bound_gang_is_explained_through_its_gang(view: LiveCluster) -> None:
    found = explain(view, SchedulerConfig(), "default", "a1-0", _no_events)
    assert (found.asked, found.group, found.phase) == ("Pod default/a1-0", "default/a1", "Running")
    assert found.gang is not None and (found.gang.bound, found.gang.missing) == (2, 0)
    assert found.ahead_in_queue == [] and found.topology is None


def test_a_workload_without_its_podgroup_yet_is_explained_as_the_operator_will_make_it(
    view: LiveCluster,
) -> None:
    found = explain(view, SchedulerConfig(), "default", "job/train", _no_events)
    assert (found.group, found.pictured) == ("default/job-train", True)
    assert found.gang is not None and (found.gang.missing, found.gang.fits_whole) == (2, True)
    assert "PodGroup not created yet" in _text(found)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        pytest.param(
            "ghost", "no pod, PodGroup, RayCluster, RayJob or Job named 'ghost'", id="unknown name"
        ),
        pytest.param("rayjob/train", "no RayJob named 'train'", id="a kind it is not"),
        pytest.param("system", "Pod default/system is not kai-ray's", id="another scheduler's pod"),
        pytest.param(
            "deployment/x", "unknown kind 'deployment'", id="a kind explain does not know"
        ),
    ],
)
def test_what_cannot_be_explained_is_said_in_one_line(
    view: LiveCluster, name: str, message: str
) -> None:
    with pytest.raises(NotFoundError, match=re.escape(message)) as caught:
        explain(view, SchedulerConfig(), "default", name, _no_events)
    assert "\n" not in str(caught.value)


def test_a_rayjobs_cluster_is_explained_through_the_rayjobs_gang() -> None:
    objects = _cluster()
    rayjob = {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "rj"}}
    rayjob["metadata"].update(namespace="default", labels={QUEUE_LABEL: "team-a"})
    cluster = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "rj-x1"}}
    cluster["metadata"].update(
        namespace="default", ownerReferences=[{"kind": "RayJob", "name": "rj", "controller": True}]
    )
    group = make_pod_group("rayjob-rj").queue("team-a").build()
    objects.update(RayJob=[rayjob], RayCluster=[cluster], PodGroup=[*objects["PodGroup"], group])
    view = live_cluster(objects, "kai-ray")
    found = explain(view, SchedulerConfig(), "default", "raycluster/rj-x1", _no_events)
    assert (found.asked, found.group) == ("RayCluster default/rj-x1", "default/rayjob-rj")


def test_a_podgroup_the_operator_leaves_out_shows_the_field_at_fault() -> None:
    objects = _cluster()
    objects["PodGroup"].append(make_pod_group("lost").queue("no-such-queue").build())
    found = explain(
        live_cluster(objects, "kai-ray"), SchedulerConfig(), "default", "lost", _no_events
    )
    assert found.gang is None and len(found.problems) == 1 and "no-such-queue" in found.problems[0]
    assert "Left out by the operator: spec.queue" in _text(found)


def test_a_pod_naming_a_podgroup_that_does_not_exist_says_so() -> None:
    objects = _cluster()
    objects["Pod"].append(make_pod("stray").gpus(1).group("gone").build())
    found = explain(
        live_cluster(objects, "kai-ray"), SchedulerConfig(), "default", "stray", _no_events
    )
    assert (found.group, found.problems) == ("default/gone", ["there is no PodGroup default/gone"])


def test_an_unreachable_cluster_is_one_line_and_status_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:9'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )
    assert main(["explain", "x", "--kubeconfig", str(kubeconfig)]) == 1
    err = capsys.readouterr().err
    assert (
        err.startswith("kai-ray: cannot reach the API server https://127.0.0.1:9")
        and err.count("\n") == 1
    )
    assert (
        main(["snapshot", "--kubeconfig", str(tmp_path / "none"), "-o", str(tmp_path / "o")]) == 1
    )
    assert "cannot load the kubeconfig" in capsys.readouterr().err
    assert main(["snapshot", "-o", str(tmp_path / "o")]) == 1
    assert capsys.readouterr().err == (
        "kai-ray: snapshot: give input files, or --kubeconfig to read a cluster\n"
    )


# --------------------------------------------------------------------- snapshot


def test_the_snapshot_loads_in_the_simulator_whose_first_cycle_binds_what_the_cycle_binds(
    view: LiveCluster,
) -> None:
    taken = live_snapshot(view, SchedulerConfig())
    sim_input = load_documents([Document(doc, "snapshot") for doc in taken.documents])
    kinds = [doc["kind"] for doc in taken.documents]
    assert kinds[:3] == ["Node", "Node", "Node"] and "Job" not in kinds
    groups = [doc["metadata"]["name"] for doc in taken.documents if doc["kind"] == "PodGroup"]
    assert groups == ["a1", "wide", "job-train"], "oldest first, the Job's gang pictured"
    (held,) = [
        doc
        for doc in taken.documents
        if doc["kind"] == "Pod" and doc["metadata"]["name"] == "system"
    ]
    assert held["metadata"]["annotations"] == {HELD_ANNOTATION: "true"}
    assert held["spec"]["nodeName"] == "n2"

    expected = run_cycle(view.cache.snapshot(), SchedulerConfig(), 1, 0.0, None).plan.binds
    sim = Simulation(sim_input)
    sim.run()
    report = build_report(sim)
    first = min(pod["bound_s"] for pod in report["pods"])
    simulated = {
        (p["namespace"] + "/" + p["name"], p["node"])
        for p in report["pods"]
        if p["bound_s"] == first
    }
    assert simulated == {(b.pod, b.node) for b in expected}
    assert {pod for pod, _ in simulated} == {"default/train-0", "default/train-1"}


def _first_cycle_binds(objects: dict[str, list[dict[str, Any]]]) -> tuple[set[Any], set[Any]]:
    """What the simulator's first cycle on the snapshot binds, and what the cycle on
    the live cache binds, as (pod, node) pairs."""
    view = live_cluster(objects, "kai-ray")
    live = run_cycle(view.cache.snapshot(), SchedulerConfig(), 1, 0.0, None).plan.binds
    taken = live_snapshot(view, SchedulerConfig())
    sim = Simulation(load_documents([Document(doc, "snapshot") for doc in taken.documents]))
    sim.run()
    pods = build_report(sim)["pods"]
    first = min(pod["bound_s"] for pod in pods)
    simulated = {
        (f"{p['namespace']}/{p['name']}", p["node"]) for p in pods if p["bound_s"] == first
    }
    return simulated, {(b.pod, b.node) for b in live}


def test_gated_pods_and_a_suspended_rayclusters_gang_are_bound_as_the_cycle_places_them() -> None:
    objects = _cluster()
    objects["Pod"] = [
        make_pod(p["metadata"]["name"])
        .gpus(1)
        .label("job-name", "train")
        .gate(ADMISSION_GATE)
        .controlled_by("Job", "train")
        .build()
        if p["metadata"]["name"].startswith("train")
        else p
        for p in objects["Pod"]
    ]
    gpu = template(schedulerName="kai-ray", containers=[container(**{"nvidia.com/gpu": "1"})])
    held = raycluster(
        worker("gpu", replicas=2, minReplicas=2, template=gpu),
        head=template(schedulerName="kai-ray"),
    )
    held["spec"]["suspend"] = True
    objects["RayCluster"] = [held]
    simulated, live = _first_cycle_binds(objects)
    assert simulated == live
    placed = {pod for pod, _ in simulated}
    assert {"default/train-0", "default/train-1"} <= placed
    assert len([pod for pod in placed if pod.startswith("ns/rc-")]) == 3, placed


def test_a_member_above_the_minimum_of_a_gang_bound_before_the_snapshot_joins_it(
    view: LiveCluster,
) -> None:
    objects = _cluster()
    objects["Pod"].append(make_pod("a1-2").gpus(1).group("a1").build())
    taken = live_snapshot(live_cluster(objects, "kai-ray"), SchedulerConfig())
    sim = Simulation(load_documents([Document(doc, "snapshot") for doc in taken.documents]))
    sim.run()  # the gang's two bound members count: no "partial gang" for the third
    bound = {p["name"]: p["node"] for p in build_report(sim)["pods"]}
    assert bound["a1-2"] in ("n0", "n1", "n2")


def test_pods_bound_to_a_node_that_is_not_there_are_left_out_and_counted() -> None:
    objects = _cluster()
    objects["Pod"] += [
        make_pod("orphan").scheduler("default-scheduler").cpu(1).on("gone").build(),
        make_pod("a1-9").gpus(1).group("a1").on("gone").build(),
    ]
    taken = live_snapshot(live_cluster(objects, "kai-ray"), SchedulerConfig())
    load_documents([Document(doc, "snapshot") for doc in taken.documents])
    names = {doc["metadata"]["name"] for doc in taken.documents if doc["kind"] == "Pod"}
    assert not names & {"orphan", "a1-9"}
    assert taken.left_out == {"pod(s) bound to a node that is not there": 2}


def test_a_podgroup_the_simulator_would_refuse_is_left_out_with_its_pods() -> None:
    objects = _cluster()
    lost = make_pod_group("lost").queue("team-b").min_member(1).topology("no-such-dc", "rack")
    objects["PodGroup"].append(lost.build())
    objects["Pod"].append(make_pod("lost-0").gpus(1).group("lost").build())
    taken = live_snapshot(live_cluster(objects, "kai-ray"), SchedulerConfig())
    names = {doc["metadata"]["name"] for doc in taken.documents}
    assert not names & {"lost", "lost-0"} and {"wide", "wide-0"} <= names
    assert taken.left_out == {"PodGroup(s) the simulator refuses": 1}


def test_a_node_the_simulator_refuses_is_left_out_with_the_pods_bound_there() -> None:
    objects = _cluster()
    broken = make_node("n3").build()
    broken["status"]["capacity"] = {"cpu": "lots"}
    objects["Node"].append(broken)
    objects["Pod"].append(make_pod("on-n3").scheduler("default-scheduler").on("n3").build())
    taken = live_snapshot(live_cluster(objects, "kai-ray"), SchedulerConfig())
    assert not {"n3", "on-n3"} & {doc["metadata"]["name"] for doc in taken.documents}
    assert taken.left_out == {
        "Node(s) the simulator refuses": 1,
        "Pod(s) the simulator refuses": 1,
    }


def test_a_what_if_on_the_snapshot_file_changes_what_binds(
    view: LiveCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    snapshot = tmp_path / "prod.yaml"
    snapshot.write_text(live_snapshot(view, SchedulerConfig()).yaml("test"))
    bound = {}
    for variant, sets in (("as is", []), ("team-a capped", ["--set", LIMIT_TEAM_A_AT_4])):
        report = tmp_path / f"{variant}.json"
        assert main(["simulate", str(snapshot), "--report", str(report), "--quiet", *sets]) == 0
        bound[variant] = {p["name"] for p in json.loads(report.read_text())["pods"]}
    assert bound == {"as is": {"train-0", "train-1"}, "team-a capped": set()}, capsys.readouterr()


# --------------------------------------------------------------- explain --report


def test_explain_at_a_time_of_a_report_says_where_the_job_stood_then(view: LiveCluster) -> None:
    taken = live_snapshot(view, SchedulerConfig())
    sim = Simulation(load_documents([Document(doc, "snapshot") for doc in taken.documents]))
    sim.run()
    report = build_report(sim)
    out = io.StringIO()
    (wide,) = [j for j in report["jobs"] if j["name"] == "wide"]
    Console(file=out, width=400).print(render_at(report, wide, 5.0))
    text = out.getvalue()
    assert "At 5s: waiting since 0s (5s so far) · queue team-b" in text
    # once job-train holds 2 more GPUs of the department, its limit is what stops it
    assert (
        wide["reason"] == "queue dept is at its limit of 8 GPUs: it holds 6 and the job asks for 8"
    )
    assert f"the last reason recorded, at the end of the run): {wide['reason']}" in text
    assert re.search(r"team-b\s*│\s*4\s*│\s*0\s*│\s*8", text), text
    assert "Queues with waiting jobs then: team-a (1), team-b (1)" in text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(["wide"], "--report needs --at TIME", id="no time"),
        pytest.param(
            ["--at", "soon", "wide"], "--at 'soon' is neither seconds nor a duration", id="bad time"
        ),
        pytest.param(
            ["--at", "1h", "ghost"], "no job named 'ghost' in the report", id="unknown job"
        ),
        pytest.param(
            ["--at", "1h", "-n", "other", "wide"],
            "no job named 'wide' in namespace 'other'",
            id="other namespace",
        ),
    ],
)
def test_explain_of_a_report_says_what_it_cannot_find_in_one_line(
    view: LiveCluster,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    message: str,
) -> None:
    taken = live_snapshot(view, SchedulerConfig())
    sim = Simulation(load_documents([Document(doc, "snapshot") for doc in taken.documents]))
    sim.run()
    report = tmp_path / "report.json"
    report.write_text(json.dumps(build_report(sim)))
    assert main(["explain", "--report", str(report), *args]) == 1
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert main(["explain", "--report", str(report), "--at", "1h", "podgroup/wide"]) == 0
    assert "PodGroup default/wide in the report" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("node", "message"),
    [
        pytest.param(None, "spec.nodeName: a pod with sim.kai-ray.io/held is bound", id="unbound"),
        pytest.param("n9", "spec.nodeName: no Node named 'n9'", id="on a node that is not there"),
    ],
)
def test_a_held_pod_must_be_bound_to_a_node_of_the_input(node: str | None, message: str) -> None:
    held = (
        make_pod("system").scheduler("default-scheduler").cpu(2).annotate(HELD_ANNOTATION, "true")
    )
    pod = held.on(node).build() if node else held.build()
    nodes = [Document(make_node("n0").gpus(4).build(), "in.yaml")]
    with pytest.raises(InvalidObjectError, match=re.escape(f"Pod default/system: {message}")):
        load_documents([*nodes, Document(pod, "in.yaml")])
