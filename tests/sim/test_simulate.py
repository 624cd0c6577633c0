"""`kai-ray simulate` end to end: the report contract, gangs bound together, determinism."""

from __future__ import annotations

import json
from pathlib import Path
from textwrap import dedent
from typing import Any

import pytest

from kai_ray.tools.cli import main
from tests.builders import make_job

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart"

JOB_FIELDS = {
    "name",
    "namespace",
    "kind",
    "queue",
    "min_member",
    "submitted_s",
    "admitted_s",
    "started_s",
    "finished_s",
    "reason",
}
POD_FIELDS = {
    "name",
    "namespace",
    "job",
    "node",
    "requests",
    "gpu_devices",
    "bound_s",
    "released_s",
    "release_reason",
    "claims",
}
SAMPLE_FIELDS = {"t_s", "allocated", "requested", "fair_share"}
RESOURCE_NAMES = {"cpu", "memory", "nvidia.com/gpu"}


def simulate(tmp_path: Path, *inputs: Path, extra: tuple[str, ...] = ()) -> dict:  # type: ignore[type-arg]
    report = tmp_path / "report.json"
    status = main(["simulate", *map(str, inputs), "--report", str(report), "--quiet", *extra])
    assert status == 0
    return json.loads(report.read_text())  # type: ignore[no-any-return]


def test_quickstart_report_has_every_field_of_the_contract(tmp_path: Path) -> None:
    report = simulate(tmp_path, QUICKSTART)
    assert report["version"] == 1
    assert set(report) == {"version", "summary", "jobs", "pods", "queues", "quota_over_committed"}
    assert report["quota_over_committed"] == []  # the quickstart's quotas fit the cluster
    assert report["jobs"] and report["pods"] and report["queues"]
    for job in report["jobs"]:
        assert set(job) == JOB_FIELDS
    for pod in report["pods"]:
        assert set(pod) == POD_FIELDS
        assert set(pod["requests"]) >= RESOURCE_NAMES
    for queue in report["queues"]:
        assert set(queue) == {"name", "parent", "samples"}
        for sample in queue["samples"]:
            assert set(sample) == SAMPLE_FIELDS
            for key in ("allocated", "requested", "fair_share"):
                assert set(sample[key]) >= RESOURCE_NAMES
    summary = report["summary"]
    for key in ("jobs", "gpu_utilisation", "wait_s", "evictions"):
        assert key in summary
    assert set(summary["wait_s"]) == {"mean", "p50", "p95", "max"}


def test_quickstart_team_b_reclaims_team_a_extras_and_starts_when_they_are_gone(
    tmp_path: Path,
) -> None:
    report = simulate(tmp_path, QUICKSTART)
    jobs = {j["name"]: j for j in report["jobs"]}
    finetune = jobs["job-finetune"]
    # Renewed for issue 13: the reclaimed pods take their termination grace (30 s by
    # default) to go; the job is bound onto their room then (it started at once before).
    assert finetune["started_s"] == finetune["submitted_s"] + 30
    reclaimed = [p for p in report["pods"] if p["release_reason"] == "reclaim"]
    assert reclaimed and {p["job"] for p in reclaimed} == {"team-a/job-hparam-sweep"}
    assert all(j["finished_s"] is not None for j in jobs.values())
    notebook = [p for p in report["pods"] if p["job"] == "team-a/pod-notebook"]
    assert notebook[0]["requests"]["nvidia.com/gpu"] == 0.5
    assert len(notebook[0]["gpu_devices"]) == 1


def test_quickstart_is_deterministic(tmp_path: Path) -> None:
    first = simulate(tmp_path, QUICKSTART)
    second = simulate(tmp_path, QUICKSTART)
    assert first == second


CLUSTER = """\
apiVersion: sim.kai-ray.io/v1alpha1
kind: NodePool
metadata: {name: pool}
spec:
  count: {count}
  namePrefix: gpu
  capacity: {cpu: "64", memory: 512Gi, nvidia.com/gpu: 8}
---
apiVersion: scheduling.kai-ray.io/v1alpha1
kind: Queue
metadata: {name: team}
"""

RAYCLUSTER = """\
apiVersion: ray.io/v1
kind: RayCluster
metadata:
  name: rc
  namespace: ml
  labels: {kai-ray.io/queue: team}
spec:
  headGroupSpec:
    rayStartParams: {}
    template: {spec: {containers: [{name: head, resources: {requests: {cpu: "2"}}}]}}
  workerGroupSpecs:
    - groupName: a
      minReplicas: 2
      replicas: 2
      numOfHosts: 2
      rayStartParams: {}
      template:
        spec:
          containers: [{name: w, resources: {requests: {cpu: "4", nvidia.com/gpu: 4}}}]
    - groupName: b
      minReplicas: 0
      replicas: 3
      numOfHosts: 1
      rayStartParams: {}
      template:
        spec:
          containers: [{name: w, resources: {requests: {cpu: "4", nvidia.com/gpu: 4}}}]
"""


@pytest.mark.parametrize(
    ("nodes", "bound"),
    [
        pytest.param(4, 8, id="fits: all 8 pods of the RayCluster bound at the same virtual time"),
        pytest.param(3, 0, id="28 GPUs needed, 24 free: none of its pods is bound"),
    ],
)
def test_raycluster_gang_binds_together_or_not_at_all(
    tmp_path: Path, nodes: int, bound: int
) -> None:
    (tmp_path / "cluster.yaml").write_text(CLUSTER.replace("{count}", str(nodes)))
    (tmp_path / "rc.yaml").write_text(dedent(RAYCLUSTER))
    report = simulate(tmp_path, tmp_path)
    job = report["jobs"][0]
    assert job["min_member"] == 8
    pods = [p for p in report["pods"] if p["job"] == "ml/raycluster-rc"]
    assert len(pods) == bound
    assert len({p["bound_s"] for p in pods}) <= 1
    if bound == 0:
        assert job["started_s"] is None and "gang of 8" in job["reason"]


def test_plot_is_written(tmp_path: Path) -> None:
    plot = tmp_path / "queues.png"
    simulate(tmp_path, QUICKSTART, extra=("--plot", str(plot)))
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_until_stops_the_clock(tmp_path: Path) -> None:
    report = simulate(tmp_path, QUICKSTART, extra=("--until", "30m"))
    assert report["summary"]["end_s"] <= 1800
    assert any(j["finished_s"] is None for j in report["jobs"])


def test_invariants_catch_a_gang_straddling_its_required_rack() -> None:
    from kai_ray.sim.invariants import InvariantViolation, check_invariants
    from kai_ray.state.snapshot import ClusterObjects, build_snapshot
    from tests.builders import make_node, make_pod, make_pod_group, make_queue, make_topology

    nodes = [make_node(f"n{i}").gpus(8).label("rack", f"r{i}").build() for i in range(2)]
    pods = [
        make_pod(f"p{i}").gpus(8).scheduler("kai-ray").group("g").on(f"n{i}").build()
        for i in range(2)
    ]
    group = make_pod_group("g").queue("q").min_member(2).topology("t", required="rack").build()
    snapshot = build_snapshot(
        ClusterObjects(
            nodes=nodes,
            pods=pods,
            pod_groups=[group],
            queues=[make_queue("q").build()],
            topologies=[make_topology("t", "rack").build()],
        )
    )
    with pytest.raises(InvariantViolation, match="straddle"):
        check_invariants(snapshot, 7, {})


def test_invariants_catch_an_overcommitted_node() -> None:
    from kai_ray.sim.invariants import InvariantViolation, check_invariants
    from kai_ray.state.snapshot import ClusterObjects, build_snapshot
    from tests.builders import make_node, make_pod

    pods = [make_pod(f"p{i}").gpus(8).on("n0").build() for i in range(2)]
    snapshot = build_snapshot(ClusterObjects(nodes=[make_node("n0").gpus(8).build()], pods=pods))
    with pytest.raises(InvariantViolation, match="Node n0"):
        check_invariants(snapshot, 3, {})


def test_a_cycle_can_ask_to_run_again_at_a_time(tmp_path: Path) -> None:
    from kai_ray.decisions.cycle import run_cycle
    from kai_ray.sim.engine import Simulation
    from kai_ray.sim.loader import load
    from kai_ray.values.clock import SIM_EPOCH_S

    calls: list[float] = []

    def timed_cycle(*args: Any) -> Any:
        result = run_cycle(*args)
        calls.append(args[3] - SIM_EPOCH_S)
        if len(calls) < 3:
            result.plan.wake_no_later_than(args[3] + 600)
        return result

    (tmp_path / "cluster.yaml").write_text(CLUSTER.replace("{count}", "1"))
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "labels": {"kai-ray.io/queue": "team"}},
        "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]},
    }
    (tmp_path / "pod.yaml").write_text(json.dumps(pod))
    simulation = Simulation(load([tmp_path]), cycle=timed_cycle)
    simulation.run()
    # 0: the pod binds, so one period later (1 s) the cycle runs again and asks for 601 s;
    # the third cycle asks for nothing, and with no other event the run ends.
    assert calls == [0.0, 1.0, 601.0]


def test_a_job_finished_within_its_evicted_pods_grace_asks_for_nothing_after(
    tmp_path: Path,
) -> None:
    """A pod evicted 10 s before its job finishes keeps its node for the 30 s grace;
    when it is gone, the finished job is not followed again (it asked for its pods
    once more, in the queue's requests, until the end of the run)."""
    from kai_ray.decisions.cycle import run_cycle
    from kai_ray.decisions.plan import Evict
    from kai_ray.sim.engine import Simulation
    from kai_ray.sim.loader import load
    from kai_ray.values.clock import SIM_EPOCH_S

    def evicting_cycle(*args: Any) -> Any:
        result = run_cycle(*args)
        snapshot, now = args[0], args[3] - SIM_EPOCH_S
        if now == 90.0:
            bound = [p for p in snapshot.pods.values() if p.node is not None]
            evicted = (Evict(p.key, f"{p.namespace}/{p.pod_group}", "reclaim") for p in bound)
            result.plan.evictions.extend(evicted)
        elif now < 90.0:
            result.plan.wake_no_later_than(SIM_EPOCH_S + 90.0)
        return result

    (tmp_path / "cluster.yaml").write_text(CLUSTER.replace("{count}", "1"))
    job = make_job("train", "default").queue("team").gpus(1).runs_for("100s").build()
    (tmp_path / "job.yaml").write_text(json.dumps(job))
    simulation = Simulation(load([tmp_path]), cycle=evicting_cycle)
    simulation.run()
    (record,) = [j.record for j in simulation.jobs.values()]
    assert record.finished_s == 100.0
    assert simulation.end_time() >= 120.0  # the evicted pod was gone after its job finished
    requested = simulation.samples["team"][-1].requested
    assert requested["nvidia.com/gpu"] == 0.0, requested
