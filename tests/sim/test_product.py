"""The simulator as a product: invariants, overrides, sweeps, traces, snapshots, events."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from kai_ray.decisions.cycle import CycleResult, run_cycle
from kai_ray.decisions.plan import Bind
from kai_ray.sim import run as sim_run
from kai_ray.sim.engine import Simulation
from kai_ray.tools.cli import EXIT_INVALID_INPUT, EXIT_INVARIANT_BROKEN, main

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart"
EXAMPLES = ROOT / "examples"


def simulate(tmp_path: Path, *args: str, name: str = "report.json") -> dict[str, Any]:
    report = tmp_path / name
    assert main(["simulate", *args, "--report", str(report), "--quiet"]) == 0
    return json.loads(report.read_text())  # type: ignore[no-any-return]


def refused(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["simulate", *args, "--quiet"]) == EXIT_INVALID_INPUT
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    return err


# ------------------------------------------------------------------ invariants


def _overcommitting_cycle(*args: Any) -> CycleResult:
    """The real cycle, plus a bind of every pending pod onto the first node."""
    result = run_cycle(*args)
    snapshot = args[0]
    node = snapshot.node_names[0]
    for pod in snapshot.pending_pods:
        result.plan.binds.append(Bind(pod.key, f"{pod.namespace}/{pod.pod_group}", node))
    return result


def test_a_broken_invariant_exits_3_with_cycle_object_and_rule(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(
        sim_run, "Simulation", functools.partial(Simulation, cycle=_overcommitting_cycle)
    )
    status = main(["simulate", str(QUICKSTART), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert status == EXIT_INVARIANT_BROKEN
    assert len(err.splitlines()) == 1
    assert "cycle 1" in err and "Node h100-0" in err and "overcommitted" in err


# ------------------------------------------------------------- --set, --sweep

BAD_OVERRIDES = [
    pytest.param(
        ["--set", "SchedulerConfig.spec.timeBasedFairness.k=-1"],
        "timeBasedFairness.k",
        id="set a negative k",
    ),
    pytest.param(
        ["--set", "SchedulerConfig.spec.nosuch=1"], "nosuch", id="set an unknown config field"
    ),
    pytest.param(
        ["--set", "Queue/ghost.spec.priority=3"], "ghost", id="set on a queue that does not exist"
    ),
    pytest.param(
        ["--set", "Queue/team-b.spec.resources.gpu.overQuotaWeight=lots"],
        "overQuotaWeight",
        id="set a weight that is not a number",
    ),
    pytest.param(
        ["--set", "Node/h100-0.spec=1"], "Node/h100-0", id="set on a kind that cannot be set"
    ),
    pytest.param(["--set", "SchedulerConfig"], "SchedulerConfig", id="set without a value"),
    pytest.param(
        ["--sweep", "Queue/team-a.spec.priority=1,x"],
        "spec.priority",
        id="sweep with one bad value",
    ),
]


@pytest.mark.parametrize(("args", "named"), BAD_OVERRIDES)
def test_a_bad_override_exits_2_naming_the_path(
    capsys: pytest.CaptureFixture[str], args: list[str], named: str
) -> None:
    err = refused(capsys, str(QUICKSTART), *args, "--no-ray")
    assert named in err and ("--set" in err or "--sweep" in err)


def test_set_changes_a_queue_weight(tmp_path: Path) -> None:
    fairness = str(EXAMPLES / "fairness")
    plain = simulate(tmp_path, fairness, "--until", "8h", name="a.json")
    weight = "Queue/team-b.spec.resources.gpu.overQuotaWeight=3"
    weighted = simulate(tmp_path, fairness, "--until", "8h", "--set", weight, name="b.json")
    share = {
        q["name"]: q["samples"][-1]["fair_share"]["nvidia.com/gpu"] for q in weighted["queues"]
    }
    assert plain["queues"] != weighted["queues"] and share["team-b"] > share["team-a"]


def test_a_sweep_writes_one_report_per_variant_and_ray_gives_the_same(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    sweep = [
        "--sweep",
        "SchedulerConfig.spec.timeBasedFairness.k=0,1",
        "--sweep",
        "Queue/team-b.spec.priority=100,200",
    ]
    args = [str(EXAMPLES / "fairness"), *sweep, "--until", "8h", "--quiet"]
    assert main(["simulate", *args, "--no-ray", "--report", str(tmp_path / "seq" / "r.json")]) == 0
    assert main(["simulate", *args, "--report", str(tmp_path / "ray" / "r.json")]) == 0
    names = sorted(p.name for p in (tmp_path / "seq").iterdir())
    assert names == [f"r.k-{k}_priority-{p}.json" for k in (0, 1) for p in (100, 200)]
    for name in names:
        assert (tmp_path / "seq" / name).read_text() == (tmp_path / "ray" / name).read_text()


# ---------------------------------------------------------------------- traces

TRACE_HEADER = "submit,duration,queue,pods,gpus_per_pod,gpu_fraction,topology\n"
BAD_ROWS = [
    pytest.param("x,1h,team-a,1,8,,\n", "column submit", id="submit time is not a time"),
    pytest.param("0,1h,team-a,0,8,,\n", "column pods", id="a gang of no pods"),
    pytest.param("0,1h,team-a,1,-8,,\n", "column gpus_per_pod", id="negative GPUs"),
    pytest.param("0,1h,team-a,1,0,1.5,\n", "column gpu_fraction", id="fraction above one"),
    pytest.param("0,1h,,1,8,,\n", "column queue", id="no queue"),
    pytest.param("0,-5,team-a,1,8,,\n", "column duration", id="negative duration"),
    pytest.param("0,1h,team-a,1,8,,nosuch/rack\n", "'nosuch'", id="topology that does not exist"),
]


@pytest.mark.parametrize(("row", "named"), BAD_ROWS)
def test_a_bad_trace_row_exits_2_naming_file_line_and_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], row: str, named: str
) -> None:
    trace = tmp_path / "jobs.csv"
    trace.write_text(TRACE_HEADER + "0,1h,team-a,1,8,,\n" + row)
    err = refused(capsys, str(QUICKSTART), "--trace", str(trace))
    assert "jobs.csv" in err and named in err
    if "column" in named:
        assert "line 3" in err


def test_a_trace_replays_gangs_fractions_and_topology(tmp_path: Path) -> None:
    trace = tmp_path / "jobs.csv"
    trace.write_text(
        TRACE_HEADER + "0,1h,team-a,4,8,,block\n60,30m,team-b,1,0,0.5,\n120,,team-b,2,4,,\n"
    )
    report = simulate(
        tmp_path,
        str(QUICKSTART / "cluster.yaml"),
        str(QUICKSTART / "queues.yaml"),
        "--trace",
        str(trace),
    )
    jobs = {j["name"]: j for j in report["jobs"]}
    assert jobs["job-trace-000002"]["min_member"] == 4
    assert jobs["job-trace-000002"]["finished_s"] == 3600
    nodes = {p["node"] for p in report["pods"] if p["job"] == "default/job-trace-000002"}
    assert len(nodes) == 4
    half = [p for p in report["pods"] if p["job"] == "default/job-trace-000003"]
    assert half[0]["requests"]["nvidia.com/gpu"] == 0.5


# ------------------------------------------------------------------- snapshots


@pytest.mark.parametrize("example", ["quickstart", "reclaim", "three-teams"])
def test_a_snapshot_runs_to_the_same_report(tmp_path: Path, example: str) -> None:
    snapshot = tmp_path / "snapshot.yaml"
    assert main(["snapshot", str(EXAMPLES / example), "-o", str(snapshot)]) == 0
    kinds = {d["kind"] for d in yaml.safe_load_all(snapshot.read_text())}
    assert "NodePool" not in kinds and "Node" in kinds
    assert simulate(tmp_path, str(EXAMPLES / example), name="a.json") == simulate(
        tmp_path, str(snapshot), name="b.json"
    )


# ------------------------------------------------------------- cluster events

EVENT = "apiVersion: sim.kai-ray.io/v1alpha1\nkind: ClusterEvent\n"


def with_event(tmp_path: Path, spec: str) -> str:
    path = tmp_path / "event.yaml"
    path.write_text(EVENT + f"metadata: {{name: e}}\nspec: {spec}\n")
    return str(path)


def test_a_node_going_down_fails_its_pods_and_they_run_again_elsewhere(tmp_path: Path) -> None:
    event = with_event(tmp_path, "{at: 30m, action: NodeDown, node: h100-0}")
    report = simulate(tmp_path, str(QUICKSTART), event)
    down = [p for p in report["pods"] if p["release_reason"] == "node-down"]
    assert down and all(p["node"] == "h100-0" and p["released_s"] == 1800 for p in down)
    later = [p for p in report["pods"] if p["bound_s"] >= 1800]
    assert all(p["node"] != "h100-0" for p in later)
    assert all(j["finished_s"] is not None for j in report["jobs"])


def test_a_pod_failure_is_released_as_failed(tmp_path: Path) -> None:
    event = with_event(
        tmp_path, "{at: 30m, action: PodFailure, job: team-a/raycluster-llm-pretrain}"
    )
    report = simulate(tmp_path, str(QUICKSTART), event)
    failed = [p for p in report["pods"] if p["release_reason"] == "failed"]
    assert len(failed) == 5 and {p["job"] for p in failed} == {"team-a/raycluster-llm-pretrain"}


def test_a_queue_update_changes_fair_shares_from_its_time(tmp_path: Path) -> None:
    patch = "{spec: {resources: {gpu: {overQuotaWeight: 3}}}}"
    event = with_event(tmp_path, f"{{at: 7h, action: QueueUpdate, queue: team-b, patch: {patch}}}")
    fairness = str(EXAMPLES / "fairness")
    plain = simulate(tmp_path, fairness, "--until", "8h", name="a.json")
    changed = simulate(tmp_path, fairness, event, "--until", "8h", name="b.json")

    def share_at(report: dict[str, Any], t: float) -> float:
        samples = next(q["samples"] for q in report["queues"] if q["name"] == "team-b")
        return float([s for s in samples if s["t_s"] <= t][-1]["fair_share"]["nvidia.com/gpu"])

    assert share_at(plain, 6.9 * 3600) == share_at(changed, 6.9 * 3600) == 32
    assert share_at(changed, 7.5 * 3600) == 40 > share_at(plain, 7.5 * 3600)  # 16 + 32 * 3/4


BAD_EVENTS = [
    pytest.param(
        "{at: soon, action: NodeDown, node: h100-0}", "spec.at", id="time is not a duration"
    ),
    pytest.param("{at: 1h, action: Reboot, node: h100-0}", "spec.action", id="unknown action"),
    pytest.param("{at: 1h, action: NodeDown}", "spec", id="node down without a node"),
    pytest.param(
        "{at: 1h, action: NodeDown, node: ghost}", "spec.nodes", id="node that does not exist"
    ),
    pytest.param(
        "{at: 1h, action: NodeUp, selector: {rack: none}}",
        "spec.selector",
        id="selector that selects nothing",
    ),
    pytest.param(
        "{at: 1h, action: QueueUpdate, queue: ghost, patch: {spec: {priority: 1}}}",
        "spec.queue",
        id="update of a queue that does not exist",
    ),
    pytest.param(
        "{at: 1h, action: QueueUpdate, queue: team-b, patch: {spec: {priority: -1}}}",
        "spec.patch",
        id="update that makes a queue invalid",
    ),
]


@pytest.mark.parametrize(("spec", "field"), BAD_EVENTS)
def test_a_bad_cluster_event_exits_2_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], spec: str, field: str
) -> None:
    err = refused(capsys, str(QUICKSTART), with_event(tmp_path, spec))
    assert "event.yaml" in err and "ClusterEvent e" in err and field in err


# -------------------------------------------------------------------- examples


@pytest.mark.parametrize("example", ["quickstart", "three-teams", "fairness", "reclaim"])
def test_every_example_prints_the_table_and_draws_the_plot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], example: str
) -> None:
    plot = tmp_path / "plot.png"
    assert main(["simulate", str(EXAMPLES / example), "--plot", str(plot)]) == 0
    out = capsys.readouterr().out
    assert "Queues" in out and "GPU utilisation" in out
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_reclaim_example_gives_the_starved_team_its_quota(tmp_path: Path) -> None:
    report = simulate(tmp_path, str(EXAMPLES / "reclaim"))
    team_a = [j for j in report["jobs"] if j["queue"] == "team-a"]
    assert all(j["started_s"] is not None for j in team_a)
    assert report["summary"]["evictions_by_reason"].get("reclaim", 0) > 0


# ------------------------------------------------------ the incremental cluster cache

SCENARIOS = sorted((ROOT / "tests" / "scenarios").rglob("*.yaml"))


def _scenario_inputs() -> list[Any]:
    quickstart = [
        d for f in sorted(QUICKSTART.glob("*.yaml")) for d in yaml.safe_load_all(f.read_text())
    ]
    params = [pytest.param(quickstart, None, id="examples/quickstart")]
    for file in SCENARIOS:
        scenario = yaml.safe_load(file.read_text())
        refused = "rejected" in (scenario.get("expect") or {})  # nothing is simulated
        if "objects" in scenario and not refused:
            name = str(file.relative_to(ROOT / "tests" / "scenarios"))
            params.append(pytest.param(scenario["objects"], scenario.get("until"), id=name))
    return params


def _report_with(builder: str, objects: list[Any], until: str | None, tmp_path: Path) -> Any:
    from kai_ray.sim.loader import load
    from kai_ray.sim.report import build_report
    from kai_ray.state.snapshot import build_snapshot

    path = tmp_path / "objects.yaml"
    path.write_text(yaml.safe_dump_all(objects, sort_keys=False))
    sim = Simulation(load([path]), until=sim_run.parse_until(until))
    if builder == "state":
        cache = sim.cache

        def fresh_build() -> Any:
            cache._expire_assumed()
            return build_snapshot(cache.objects(), scheduler_name=cache.scheduler_name)

        cache.snapshot = fresh_build  # type: ignore[method-assign]
    sim.run()
    return build_report(sim)


@pytest.mark.parametrize(("objects", "until"), _scenario_inputs())
def test_the_incremental_cache_gives_the_reports_of_a_fresh_build(
    objects: list[Any], until: str | None, tmp_path: Path
) -> None:
    cached = _report_with("cached", objects, until, tmp_path)
    assert cached == _report_with("state", objects, until, tmp_path)
