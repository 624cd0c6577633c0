"""The soak with faults (issue 15): a stream of workloads, faults at seeded moments, a verdict.

Fifty kwok GPU nodes with a zone/block/rack topology; three teams under one
department queue submit a seeded stream of RayClusters (elastic), RayJobs,
Jobs, topology gangs and GPU shares (`soak_workloads`), each deleted when its
lifetime ends; meanwhile the faults of `soak_faults` are injected at moments
the seed chooses, with two kai-ray replicas on one Lease. `soak_observer`
watches and samples the cluster throughout; `soak_checker` counts what went
wrong and works out the figures (docs/reliability.md).

By hand, against the cluster of `e2e/cluster.sh` (started if it is not up,
with the audit log on; left up afterwards):

    export KAI_RAY_E2E_PORT_BASE=30400 KAI_RAY_E2E_RUN=/tmp/kai-ray-e2e-soak \\
        KAI_RAY_E2E_ETCD_DATA=/dev/shm/kai-ray-e2e-soak-etcd
    .venv/bin/python -m tests.e2e.soak --seed 7 --minutes 30

It exits 0 when every count is zero, 1 otherwise, and writes the full report
as JSON (`--report`, default `$KAI_RAY_E2E_RUN/soak-<seed>.json`).
tests/e2e/test_soak.py runs a short version in the e2e session.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import random
import re
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from kai_ray.values.config import SchedulerConfig, duration_seconds
from tests.builders import make_queue

from . import soak_checker as checker
from . import soak_oracle as oracle
from .nodes import (
    BLOCK_LABEL,
    HOSTNAME_LABEL,
    RACK_LABEL,
    ZONE_LABEL,
    GpuNodeSpec,
    create_gpu_nodes,
    delete_gpu_nodes,
)
from .operator_process import LEASE_NAMESPACE, OperatorProcess, Operators
from .soak_faults import KINDS, Fault, Injector
from .soak_observer import SAMPLE_S, Observer
from .soak_workloads import Pool, Team, Workload, draw_workload
from .workloads import job, topology

LOG = logging.getLogger("soak")
REPO = Path(__file__).resolve().parents[2]
POOL_LABEL = "kai-ray.io/e2e-pool"
LEVELS = {"zone": ZONE_LABEL, "block": BLOCK_LABEL, "rack": RACK_LABEL, "host": HOSTNAME_LABEL}
#: How often each fault is drawn in a long run (kills are at least a third).
WEIGHTS = {
    "kill-leader": 22,
    "kill-mid-gang": 18,
    "restart-apiserver": 8,
    "compact-etcd": 8,
    "delete-node-mid-bind": 14,
    "cordon-node": 12,
    "delete-pods-mid-gang": 18,
}


@dataclass
class SoakOptions:
    seed: int
    minutes: float
    nodes: int = 50
    gpus_per_node: int = 8
    #: Faults in this order (one of each kind, say); None draws them by WEIGHTS.
    faults: Sequence[str] | None = None
    #: Seconds between two faults, drawn uniformly.
    fault_gap_s: tuple[float, float] = (15.0, 35.0)
    #: The stream asks for this many times the pool's GPUs, on average.
    demand: float = 1.3
    warmup_s: float = 15.0
    #: After the stream: how long to wait for pending work that fits to be bound.
    settle_s: float = 45.0
    #: Leave the namespaces, queues and nodes for a look afterwards.
    keep: bool = False


@dataclass
class SoakResult:
    options: SoakOptions
    counts: checker.Counts
    figures: dict[str, Any] = field(default_factory=dict)

    def report(self) -> dict[str, Any]:
        return {
            "seed": self.options.seed,
            "minutes": self.options.minutes,
            "counts": self.counts.totals(),
            "details": {k: v for k, v in vars(self.counts).items() if v},
            "figures": self.figures,
        }


class Soak:
    """One run: set-up, the stream and the faults, the verdict, clean-up."""

    def __init__(
        self,
        env: Mapping[str, str],
        replicas: list[OperatorProcess],
        lease: str,
        api: client.ApiClient,
        scheduler_config: SchedulerConfig,
        options: SoakOptions,
    ) -> None:
        self.env, self.replicas, self.lease, self.api = env, replicas, lease, api
        self.options = options
        self.rng = random.Random(options.seed)
        self.tag = f"soak{options.seed}-{uuid.uuid4().hex[:4]}"
        self.period_s = duration_seconds(scheduler_config.spec.cyclePeriod)
        self.grace_s = duration_seconds(scheduler_config.spec.staleGangGracePeriod)
        self.core = client.CoreV1Api(api)
        self.batch = client.BatchV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.coordination = client.CoordinationV1Api(api)
        self.teams = [Team(f"{self.tag}-{t}", f"{self.tag}-{t}") for t in ("a", "b", "c")]
        self.pool = Pool({POOL_LABEL: self.tag}, f"{self.tag}-dc", options.gpus_per_node)
        self.queues = self._queue_views()
        self.workloads: list[Workload] = []
        self.errors: list[str] = []
        self._cycle_seen: dict[str, tuple[float, float, float]] = {}
        self._cycle_s = 0.1
        self.patience_seen: list[float] = []
        self.leader = ""
        self.api_down = threading.Event()
        self._pending: list[Workload] = []

    # ----------------------------------------------------------------- set-up

    def _queue_views(self) -> dict[str, oracle.QueueView]:
        total = self.options.nodes * self.options.gpus_per_node
        department = f"{self.tag}-dept"
        views = {department: oracle.QueueView(department, None, total, None)}
        shares = [0.4, 0.35, 0.25]
        limits = [None, None, 0.6 * total]
        for team, share, limit in zip(self.teams, shares, limits, strict=True):
            views[team.queue] = oracle.QueueView(
                team.queue, department, float(int(share * total)), limit
            )
        return views

    def set_up(self) -> None:
        for view in self.queues.values():
            builder = make_queue(view.name).gpu(
                quota=int(view.quota),
                limit=None if view.limit is None else int(view.limit),
                over_quota_weight=1,
            )
            if view.parent:
                builder.parent(view.parent)
            self.custom.create_cluster_custom_object(
                "scheduling.kai-ray.io", "v1alpha1", "queues", builder.build()
            )
        self.custom.create_cluster_custom_object(
            "scheduling.kai-ray.io", "v1alpha1", "topologies", topology(self.pool.topology)
        )
        for team in self.teams:
            self.core.create_namespace({"metadata": {"name": team.namespace}})
        spec = GpuNodeSpec(
            count=self.options.nodes,
            prefix=f"{self.tag}-n",
            gpus_per_node=self.options.gpus_per_node,
            zone_prefix=f"{self.tag}-zone",
            extra_labels={POOL_LABEL: self.tag},
        )
        create_gpu_nodes(self.core, spec)
        for team in self.teams:
            _wait_service_account(self.core, team.namespace)

    def clean_up(self) -> None:
        for team in self.teams:
            with contextlib.suppress(ApiException):
                self.core.delete_namespace(team.namespace)
        nodes = self.core.list_node(label_selector=f"{POOL_LABEL}={self.tag}").items
        delete_gpu_nodes(self.core, [n.metadata.name for n in nodes])
        for plural, name in [
            ("topologies", self.pool.topology),
            *(("queues", q) for q in self.queues),
        ]:
            with contextlib.suppress(ApiException):
                self.custom.delete_cluster_custom_object(
                    "scheduling.kai-ray.io", "v1alpha1", plural, name
                )

    # -------------------------------------------------------- the scheduler

    def available(self) -> bool:
        """A replica holds the Lease, runs and is ready; the API server answers."""
        if self.api_down.is_set():
            return False
        try:
            lease = self.coordination.read_namespaced_lease(self.lease, LEASE_NAMESPACE)
        except Exception:
            return False
        holder = lease.spec.holder_identity if lease.spec else None
        self.leader = holder or ""
        leader = next((r for r in self.replicas if r.identity == holder), None)
        if leader is None or not leader.running() or leader.probe("/readyz") != 200:
            return False
        self._read_cycle_time(leader)
        return True

    def _read_cycle_time(self, leader: OperatorProcess) -> None:
        """The leader's mean cycle time over the last few seconds, from its metrics."""
        port = leader.argv[leader.argv.index("--metrics-port") + 1]
        try:
            text = _get(f"http://127.0.0.1:{port}/metrics")
        except OSError:
            return
        total = _metric(text, "kai_ray_cycle_duration_seconds_sum")
        count = _metric(text, "kai_ray_cycle_duration_seconds_count")
        now = time.monotonic()
        seen = self._cycle_seen.get(leader.identity)
        if seen is None or count < seen[2]:
            self._cycle_seen[leader.identity] = (now, total, count)
        elif count > seen[2] and now - seen[0] > 5:
            self._cycle_s = (total - seen[1]) / (count - seen[2])
            self._cycle_seen[leader.identity] = (now, total, count)

    def cycle_s(self) -> float:
        """One cycle: the loop starts a cycle at the first period boundary after
        something changed, so cycles are at most two periods and the time a
        cycle takes apart."""
        return 2 * self.period_s + self._cycle_s

    def patience_s(self) -> float:
        """Three cycles, and one sample. The loop starts a cycle at the first period
        boundary after something changed, so cycles are at most two periods and the
        time a cycle takes apart."""
        patience = 3 * self.cycle_s() + SAMPLE_S
        self.patience_seen.append(patience)
        return patience

    # ------------------------------------------------------------ the stream

    def submit(self, workload: Workload) -> bool:
        """Create its objects; False when the API server could not take them now."""
        for obj in workload.objects:
            try:
                self._create(workload.namespace, obj)
            except ApiException as err:
                if err.status == 409:
                    continue  # created by an earlier try
                if err.status is None or err.status >= 500 or err.status == 429:
                    return False
                self.errors.append(f"{workload.name}: {err.status} {err.reason}: {err.body}")
                return True
            except Exception:
                return False
        return True

    def _create(self, namespace: str, obj: dict[str, Any]) -> None:
        kind = obj["kind"]
        obj = {**obj, "metadata": {**obj["metadata"], "namespace": namespace}}
        if kind == "Pod":
            self.core.create_namespaced_pod(namespace, obj)
        elif kind == "Job":
            self.batch.create_namespaced_job(namespace, obj)
        else:
            group, version = obj["apiVersion"].split("/")
            plural = {"PodGroup": "podgroups", "RayCluster": "rayclusters", "RayJob": "rayjobs"}
            self.custom.create_namespaced_custom_object(
                group, version, namespace, plural[kind], obj
            )

    def delete(self, workload: Workload) -> bool:
        """The workload's objects deleted; its gangs are the soak's doing from the
        first delete the API server answered (not before: a delete that fails, the
        API server down, leaves the workload running, and it is tried again)."""
        background = client.V1DeleteOptions(propagation_policy="Background")
        try:
            for obj in workload.objects:
                name, kind = obj["metadata"]["name"], obj["kind"]
                with contextlib.suppress(ApiException):
                    if kind == "Pod":
                        self.core.delete_namespaced_pod(name, workload.namespace)
                    elif kind == "Job":
                        self.batch.delete_namespaced_job(name, workload.namespace, body=background)
                    else:
                        group, version = obj["apiVersion"].split("/")
                        plural = kind.lower() + "s"
                        self.custom.delete_namespaced_custom_object(
                            group, version, workload.namespace, plural, name, body=background
                        )
                self.observer.deleted.update(_gangs_of(workload))
        except Exception:
            return False
        return True

    def burst(self) -> None:
        """A gang of eight one-GPU pods now, for a fault that waits for binds."""
        team = self.rng.choice(self.teams)
        name = f"burst-{len(self.workloads)}"
        obj = job(name, team.queue, self.pool.selector, parallelism=8, gpus=1, min_member=8)
        burst = Workload("job", name, team, (obj,), 30.0, 8.0)
        self.workloads.append(burst)
        self._pending.append(burst)

    # --------------------------------------------------------------- the run

    def run(self) -> SoakResult:
        options = self.options
        self.set_up()
        self.observer = Observer(
            self.api,
            frozenset(t.namespace for t in self.teams),
            (POOL_LABEL, self.tag),
            {t.namespace: t.queue for t in self.teams},
            self.queues,
            LEVELS,
            self.available,
            self.patience_s,
            self.cycle_s,
        )
        self.injector = Injector(
            self.env,
            self.replicas,
            self.observer,
            self.core,
            random.Random(options.seed + 1),
            self.burst,
            lambda: self.leader,
            self.api_down,
        )
        self.observer.start()
        started_wall = time.time()
        try:
            self._stream_and_faults()
            self._settle()
        finally:
            self.observer.close()
        result = self.verdict(started_wall)
        if not options.keep:
            self.clean_up()
        return result

    def _stream_and_faults(self) -> None:
        options = self.options
        started = self.started = time.monotonic()
        end = started + 60 * options.minutes
        kinds = list(options.faults) if options.faults is not None else None
        faults = threading.Thread(
            target=self._inject_all, args=(started + options.warmup_s, end, kinds), daemon=True
        )
        faults.start()
        rate = self._arrival_rate()
        next_arrival = started
        weights = [1.0, 1.0, 1.0]
        next_phase = started
        alive: list[tuple[float, Workload]] = []
        while time.monotonic() < end or faults.is_alive():
            now = time.monotonic()
            if now >= next_phase:  # one team at a time floods the department
                weights = [self.rng.choice([0.5, 1.0, 3.0]) for _ in self.teams]
                next_phase = now + 60
            if now >= next_arrival and now < end:
                team = self.rng.choices(self.teams, weights=weights)[0]
                workload = draw_workload(self.rng, len(self.workloads), team, self.pool)
                self.workloads.append(workload)
                self._pending.append(workload)
                next_arrival = now + self.rng.expovariate(rate)
            self._pending = [w for w in self._pending if not self._submitted(w, alive)]
            for due, workload in [a for a in alive if a[0] <= now]:
                if self.delete(workload):
                    alive.remove((due, workload))
            time.sleep(0.1)

    def _submitted(self, workload: Workload, alive: list[tuple[float, Workload]]) -> bool:
        if not self.submit(workload):
            return False
        alive.append((time.monotonic() + workload.lifetime_s, workload))
        return True

    def _arrival_rate(self) -> float:
        """Workloads per second for the demand asked (from 2,000 draws of the mix)."""
        probe = random.Random(0)
        draws = [draw_workload(probe, i, self.teams[0], self.pool) for i in range(2000)]
        mean_gpu_seconds = sum(w.gpus * w.lifetime_s for w in draws) / len(draws)
        capacity = self.options.nodes * self.options.gpus_per_node
        return self.options.demand * capacity / mean_gpu_seconds

    def _inject_all(self, begin: float, end: float, kinds: list[str] | None) -> None:
        when = begin
        while True:
            if kinds is not None and not kinds:
                break
            kind = kinds.pop(0) if kinds is not None else self._draw_fault()
            delay = when - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            if kinds is None and time.monotonic() > end:
                break
            try:
                self.injector.inject(kind)
            except Exception as err:
                LOG.exception("fault %s could not be injected", kind)
                self.errors.append(f"fault {kind}: {err}")
            when = time.monotonic() + self.rng.uniform(*self.options.fault_gap_s)
        self.injector.settle(everything=True)

    def _draw_fault(self) -> str:
        return self.rng.choices(list(WEIGHTS), weights=list(WEIGHTS.values()))[0]

    def _settle(self) -> None:
        """Until nothing that fits waits any more (or `settle_s` is over)."""
        deadline = time.monotonic() + self.options.settle_s
        while time.monotonic() < deadline:
            recent = self.observer.samples[-4:]
            patience = self.patience_s()
            if len(recent) == 4 and all(s.available and s.oldest_fit_s <= patience for s in recent):
                return
            time.sleep(SAMPLE_S)

    # ----------------------------------------------------------- the verdict

    def verdict(self, started_wall: float) -> SoakResult:
        observer, faults = self.observer, self.injector.faults
        run = Path(self.env.get("KAI_RAY_E2E_RUN", "/tmp/kai-ray-e2e"))
        namespaces = [t.namespace for t in self.teams]
        audit = checker.read_audit(run / "logs" / "audit.log", started_wall, namespaces)
        patience = max(self.patience_seen or [3 * self.period_s])
        episodes = list(observer.all_episodes())
        pods, nodes = self._final_state()
        counts = checker.Counts()
        counts.double_binds = checker.double_binds(audit)
        counts.overcommitted_nodes = oracle.overcommitted(
            nodes.values(), oracle.node_usage(nodes.values(), pods)
        )
        counts.overcommitted_during_run = [
            f"{line} (first seen at +{at - self.started:.1f}s, held by: {'; '.join(held)})"
            for line, (at, held) in sorted(observer.overcommit_seen.items())
        ]
        origin = self.started
        counts.partial_gangs_past_grace = checker.long_episodes(
            episodes, "partial", 3, origin, self.grace_s
        )
        counts.pending_with_fit = checker.long_episodes(episodes, "fit", 3, origin)
        counts.bad_evictions = checker.bad_evictions(
            observer.evictions,
            self.queues,
            checker.episodes_by_gang(episodes, "partial"),
            observer.gang_of_pod,
            self.grace_s,
            patience,
            audit,
            observer.gpus_of_pod,
        )
        counts.binds_to_cordoned, counts.binds_to_deleted_nodes = checker.binds_onto(
            audit, faults, patience
        )
        figures = self.figures(audit, faults, patience)
        return SoakResult(self.options, counts, figures)

    def _final_state(self) -> tuple[list[oracle.PodView], dict[str, oracle.NodeView]]:
        """Pods and nodes as a fresh list reads them now (not the soak's watches)."""
        raw = json.loads(self.core.list_pod_for_all_namespaces(_preload_content=False).data)
        ours = {t.namespace for t in self.teams}
        owners = self.observer.rayjob_of()
        pods = [
            oracle.read_pod(p, owners) for p in raw["items"] if p["metadata"]["namespace"] in ours
        ]
        listed = json.loads(
            self.core.list_node(
                label_selector=f"{POOL_LABEL}={self.tag}", _preload_content=False
            ).data
        )
        nodes = {n.name: n for n in map(oracle.read_node, listed["items"])}
        return pods, nodes

    def figures(
        self, audit: list[checker.AuditEntry], faults: list[Fault], patience: float
    ) -> dict[str, Any]:
        binds = checker.accepted(audit, "binding")
        evictions = checker.accepted(audit, "eviction")
        reasons = Counter(e.reason.lower() for e in self.observer.evictions)
        recovery = checker.recovery_times(faults, self.observer.samples, patience)
        kills = [f for f in faults if f.kind.startswith("kill")]
        return {
            "nodes": self.options.nodes,
            "gpus": self.options.nodes * self.options.gpus_per_node,
            "workloads": dict(Counter(w.kind for w in self.workloads)),
            "pods_seen": len(self.observer.gang_of_pod),
            "binds": len(binds),
            "bind_conflicts": sum(1 for e in audit if e.subresource == "binding" and e.code == 409),
            "evictions": len(evictions),
            "evictions_by_reason": dict(reasons),
            "faults": dict(Counter(f.kind for f in faults)),
            "faults_not_injected": [
                f"{f.kind}: {f.detail}" for f in faults if "not injected" in f.detail
            ],
            "kills": len(kills),
            "kills_between_binds_of_a_gang": checker.kills_between_binds(
                kills, audit, self.observer.gang_of_pod
            ),
            "kills_with_standby_takeover": sum(1 for f in kills if f.pause_s > 10),
            "recovery": {kind: checker.summary(times) for kind, times in sorted(recovery.items())},
            "three_cycles_s": {"min": round(min(self.patience_seen), 2), "max": round(patience, 2)},
            "mirror_relists": {m.name: m.lists for m in self.observer.mirrors()},
            "fit_only_on_held_room": [
                f"+{first - self.started:6.1f}s for {last - first:4.1f}s {gang} "
                f"(held: {', '.join(nodes)})"
                for gang, (first, last, nodes) in sorted(
                    self.observer.fit_only_on_held.items(), key=lambda item: item[1][0]
                )
            ],
            "errors": self.errors,
            "timeline": [
                f"+{s.at - self.started:6.1f}s available={int(s.available)} fit={s.fit_pending} "
                f"oldest_fit={s.oldest_fit_s:.1f} partial={s.partial} "
                f"oldest_partial={s.oldest_partial_s:.1f}"
                for s in self.observer.samples[::4]
            ],
            "fault_log": [f"+{f.at - self.started:6.1f}s {f.kind}: {f.detail}" for f in faults],
        }


def _gangs_of(workload: Workload) -> set[str]:
    namespace = workload.namespace
    if workload.kind == "fraction":
        return {f"{namespace}/pod-{o['metadata']['name']}" for o in workload.objects}
    if workload.kind == "gang":
        return {f"{namespace}/{workload.name}"}
    return {f"{namespace}/{workload.kind}-{workload.name}"}


def _wait_service_account(core: client.CoreV1Api, namespace: str) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            core.read_namespaced_service_account("default", namespace)
            return
        except ApiException as err:
            if err.status != 404 or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _get(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=2) as answer:
        return str(answer.read().decode())


def _metric(text: str, name: str) -> float:
    match = re.search(rf"^{name} ([0-9.e+-]+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


def read_scheduler_config(path: Path) -> SchedulerConfig:
    return SchedulerConfig.model_validate(yaml.safe_load(path.read_text()))


def run_soak(
    env: Mapping[str, str],
    replicas: list[OperatorProcess],
    lease: str,
    api: client.ApiClient,
    scheduler_config: SchedulerConfig,
    options: SoakOptions,
) -> SoakResult:
    ensure_audit(env)
    return Soak(env, replicas, lease, api, scheduler_config, options).run()


def ensure_audit(env: Mapping[str, str]) -> None:
    """The API server writes the audit log the checker reads: restarted with it if not."""
    run = Path(env.get("KAI_RAY_E2E_RUN", "/tmp/kai-ray-e2e"))
    pid = (run / "pids" / "kube-apiserver.pid").read_text().strip()
    with contextlib.suppress(OSError):
        if b"--audit-log-path" in Path(f"/proc/{pid}/cmdline").read_bytes():
            return
    subprocess.run(
        [str(REPO / "e2e" / "cluster.sh"), "restart-apiserver"],
        env={**env, "KAI_RAY_E2E_AUDIT": "1"},
        check=True,
        capture_output=True,
        timeout=180,
    )


# ------------------------------------------------------------ by hand


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--minutes", type=float, required=True)
    parser.add_argument("--nodes", type=int, default=50)
    parser.add_argument("--report", type=Path)
    parser.add_argument("--faults", help="comma-separated kinds in order (default: drawn)")
    parser.add_argument("--keep", action="store_true", help="leave the soak's objects behind")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("urllib3").setLevel(logging.ERROR)
    env = {**os.environ, "KAI_RAY_E2E_AUDIT": "1"}
    subprocess.run([str(REPO / "e2e" / "cluster.sh"), "up"], env=env, check=True, timeout=600)
    exports = subprocess.run(
        [str(REPO / "e2e" / "cluster.sh"), "env"],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    kubeconfig = Path(re.findall(r"^export KUBECONFIG=(.*)$", exports, re.M)[0])
    kubectl = re.findall(r"^export KAI_RAY_E2E_KUBECTL=(.*)$", exports, re.M)[0]
    subprocess.run(
        [
            kubectl,
            "--kubeconfig",
            str(kubeconfig),
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            str(REPO / "crds"),
        ],
        check=True,
        capture_output=True,
    )
    api = config.new_client_from_config(config_file=str(kubeconfig))
    run = Path(env.get("KAI_RAY_E2E_RUN", "/tmp/kai-ray-e2e"))
    fleet = Operators(kubeconfig, run, api)
    options = SoakOptions(seed=args.seed, minutes=args.minutes, nodes=args.nodes, keep=args.keep)
    if args.faults:
        kinds = args.faults.split(",")
        unknown = set(kinds) - set(KINDS)
        parser.error(f"unknown faults {sorted(unknown)}") if unknown else None
        options.faults = kinds
    try:
        fleet.ensure_primary()
        fleet.replica("standby")
        result = run_soak(
            env,
            fleet.replicas,
            fleet.lease_name,
            api,
            read_scheduler_config(fleet.config_file),
            options,
        )
    finally:
        fleet.stop_all()
    report = result.report()
    path = args.report or run / f"soak-{args.seed}.json"
    path.write_text(json.dumps(report, indent=2))
    for line in checker.lines(result.counts):
        print(line)
    print(json.dumps(report["figures"], indent=2))
    print(f"report: {path}")
    return 0 if result.counts.clean() else 1


if __name__ == "__main__":
    sys.exit(main())
