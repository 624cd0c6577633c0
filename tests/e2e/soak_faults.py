"""The faults the soak injects, each recorded as a `Fault` with when and what.

- `kill-leader`: SIGKILL of the replica holding the Lease, started again after
  a pause; a long pause lets the standby replica take the Lease over;
- `kill-mid-gang`: the same, the moment a gang has some pods bound and others
  not yet (armed on the soak's pod watch, fired on the first bind it sees);
- `restart-apiserver`: `e2e/cluster.sh restart-apiserver` (the informers'
  resume versions are then older than the new watch cache: `410 Gone`);
- `compact-etcd`: etcd compacted to its current revision through its HTTP
  gateway (`/v3/kv/range` for the revision, `/v3/kv/compaction`), so that
  nothing older can be watched from etcd;
- `delete-node-mid-bind`: the node a gang was just bound to is deleted while
  the gang's other pods are still being bound; a node with its labels and a
  new name replaces it later (a node that was repaired and joined again);
- `cordon-node`: a node made unschedulable for a while;
- `delete-pods-mid-gang`: pods of a gang deleted by hand while it is being
  bound, or while it runs.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from . import soak_oracle as oracle
from .operator_process import OperatorProcess
from .soak_observer import Observer

LOG = logging.getLogger("soak.faults")
REPO = Path(__file__).resolve().parents[2]
KINDS = (
    "kill-leader",
    "kill-mid-gang",
    "restart-apiserver",
    "compact-etcd",
    "delete-node-mid-bind",
    "cordon-node",
    "delete-pods-mid-gang",
)
ARMED_TIMEOUT_S = 30.0


@dataclass
class Fault:
    kind: str
    #: time.monotonic() and time.time() when it was injected.
    at: float
    wall: float
    detail: str = ""
    #: When the injection itself was over (the API server ready again, ...).
    done: float = 0.0
    #: For a kill or a deletion between the binds of one gang: that gang.
    gang: str = ""
    #: A node it touched, and until when (wall time) it was cordoned.
    node: str = ""
    until_wall: float = 0.0
    #: For a kill: how long the replica stayed down (long enough, the standby leads).
    pause_s: float = 0.0


@dataclass
class Injector:
    """Injects faults into one soak's cluster; see the module docstring."""

    env: Mapping[str, str]
    replicas: list[OperatorProcess]
    observer: Observer
    core: client.CoreV1Api
    rng: random.Random
    #: Creates a gang now, so that an armed fault has binds to land between.
    burst: Callable[[], None]
    #: The identity the last look at the Lease found leading.
    leader: Callable[[], str]
    #: Set while the API server is restarted.
    api_down: threading.Event
    faults: list[Fault] = field(default_factory=list)
    _timers: list[tuple[threading.Thread, bool]] = field(default_factory=list)
    _replaced: int = 0
    _leader_kills: int = 0

    def inject(self, kind: str) -> Fault:
        self.settle()
        fault = getattr(self, kind.replace("-", "_"))()
        fault.done = fault.done or time.monotonic()
        self.faults.append(fault)
        LOG.info("fault %s: %s", fault.kind, fault.detail)
        return fault

    def settle(self, everything: bool = False) -> None:
        """Wait until the replicas killed earlier run again (and, with `everything`,
        until every repair is done: nodes back, cordons lifted)."""
        for thread, restart in list(self._timers):
            if restart or everything:
                thread.join()
                self._timers.remove((thread, restart))

    def _later(self, delay: float, action: Callable[[], None], restart: bool = False) -> None:
        def run() -> None:
            time.sleep(delay)
            try:
                action()
            except Exception:
                LOG.exception("a delayed repair failed")

        thread = threading.Thread(target=run, name="soak-repair", daemon=True)
        thread.start()
        self._timers.append((thread, restart))

    # ------------------------------------------------------------ operator

    def leading_replica(self) -> OperatorProcess:
        for replica in self.replicas:
            if replica.identity == self.leader() and replica.running():
                return replica
        return next((r for r in self.replicas if r.running()), self.replicas[0])

    def _kill(self, kind: str, pause: float, gang: str = "") -> Fault:
        victim = self.leading_replica()
        now, wall = time.monotonic(), time.time()
        victim.kill()
        self._later(pause, lambda: _start(victim), restart=True)
        detail = f"SIGKILL {victim.identity}, started again {pause:.1f}s later"
        return Fault(kind, now, wall, detail, gang=gang, pause_s=pause)

    def kill_leader(self) -> Fault:
        """Every other time down long enough (past the Lease's 10 s) for the standby
        to take over; otherwise back at once, taking its own Lease back."""
        self._leader_kills += 1
        long = self._leader_kills % 2 == 1
        pause = self.rng.uniform(12.0, 15.0) if long else self.rng.uniform(0.5, 3.0)
        return self._kill("kill-leader", pause)

    def kill_mid_gang(self) -> Fault:
        pause = self.rng.uniform(0.5, 3.0)
        return self._armed(
            "kill-mid-gang", lambda pod, node: self._kill("kill-mid-gang", pause, pod.gang)
        )

    # --------------------------------------------------------- API and etcd

    def restart_apiserver(self) -> Fault:
        fault = Fault("restart-apiserver", time.monotonic(), time.time())
        self.api_down.set()
        try:
            env = {**self.env, "KAI_RAY_E2E_AUDIT": "1"}
            subprocess.run(
                [str(REPO / "e2e" / "cluster.sh"), "restart-apiserver"],
                env=env,
                check=True,
                capture_output=True,
                timeout=180,
            )
        finally:
            self.api_down.clear()
        fault.done = time.monotonic()
        fault.detail = f"kube-apiserver back after {fault.done - fault.at:.1f}s"
        return fault

    def compact_etcd(self) -> Fault:
        fault = Fault("compact-etcd", time.monotonic(), time.time())
        revision = compact(int(self.env.get("KAI_RAY_E2E_PORT_BASE", "26400")) + 1)
        fault.detail = f"etcd compacted at revision {revision}"
        return fault

    # --------------------------------------------------------------- nodes

    def delete_node_mid_bind(self) -> Fault:
        def delete(pod: oracle.PodView, node: str) -> Fault:
            fault = Fault("delete-node-mid-bind", time.monotonic(), time.time(), gang=pod.gang)
            obj = next((n for n in self.observer.nodes.values() if _name(n) == node), None)
            with contextlib.suppress(ApiException):
                self.core.delete_node(node)
            fault.node, fault.detail = node, f"node {node} deleted as {pod.key} was bound to it"
            if obj is not None:
                self._later(self.rng.uniform(30, 45), lambda: self._replace(obj))
            return fault

        return self._armed("delete-node-mid-bind", delete)

    def _replace(self, node: Mapping[str, Any]) -> None:
        meta = node["metadata"]
        self._replaced += 1
        name = f"{meta['name'].rsplit('-x', 1)[0]}-x{self._replaced}"
        labels = {**meta.get("labels", {}), "kubernetes.io/hostname": name}
        status = {k: node["status"][k] for k in ("capacity", "allocatable")}
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": labels, "annotations": meta.get("annotations")},
            "spec": {},
            "status": status,
        }
        self.core.create_node(body)
        LOG.info("node %s replaces %s", name, meta["name"])

    def cordon_node(self) -> Fault:
        pods, nodes_now = self.observer.view()
        busy = sorted({str(p.node) for p in pods if p.holds and p.node in nodes_now})
        nodes = busy or sorted(nodes_now)
        node = self.rng.choice(nodes)
        hold = self.rng.uniform(20, 40)
        fault = Fault("cordon-node", time.monotonic(), time.time(), node=node)
        self.core.patch_node(node, {"spec": {"unschedulable": True}})
        fault.until_wall = time.time() + hold + 3600  # until uncordoned, set below

        def uncordon() -> None:
            fault.until_wall = time.time()
            with contextlib.suppress(ApiException):
                self.core.patch_node(node, {"spec": {"unschedulable": False}})

        self._later(hold, uncordon)
        fault.detail = f"node {node} cordoned for {hold:.0f}s"
        return fault

    # ---------------------------------------------------------------- pods

    def delete_pods_mid_gang(self) -> Fault:
        if self.rng.random() < 0.5:
            return self._delete_running_gang_pods()

        def delete(pod: oracle.PodView, node: str) -> Fault:
            fault = Fault("delete-pods-mid-gang", time.monotonic(), time.time(), gang=pod.gang)
            pods, _ = self.observer.view()
            pending = [p for p in pods if p.gang == pod.gang and p.pending]
            doomed = [pod, *pending[:1]]
            for victim in doomed:
                self._delete_pod(victim.key)
            fault.detail = f"deleted {[p.key for p in doomed]} while {pod.gang} was being bound"
            return fault

        return self._armed("delete-pods-mid-gang", delete)

    def _delete_running_gang_pods(self) -> Fault:
        pods, nodes = self.observer.view()
        gangs = oracle.by_gang(pods)
        running = sorted(
            k for k, members in gangs.items() if oracle.alive_bound(members, nodes) >= 2
        )
        fault = Fault("delete-pods-mid-gang", time.monotonic(), time.time())
        if not running:
            fault.detail = "no gang of two or more running: nothing deleted"
            return fault
        gang = self.rng.choice(running)
        bound = [p for p in gangs[gang] if p.holds and not p.deleting]
        doomed = self.rng.sample(bound, self.rng.randint(1, len(bound) - 1))
        for victim in doomed:
            self._delete_pod(victim.key)
        fault.gang, fault.detail = gang, f"deleted {[p.key for p in doomed]} of running {gang}"
        return fault

    def _delete_pod(self, key: str) -> None:
        namespace, _, name = key.partition("/")
        with contextlib.suppress(ApiException):
            self.core.delete_namespaced_pod(name, namespace)

    # ------------------------------------------------------------- arming

    def _armed(self, kind: str, act: Callable[[oracle.PodView, str], Fault]) -> Fault:
        """Wait for a bind of a gang with members still pending, then act; act
        anyway (with no gang) if none comes within ARMED_TIMEOUT_S."""
        fired: list[Fault] = []
        done = threading.Event()

        def trigger(pod: oracle.PodView, node: str, members: list[oracle.PodView]) -> bool:
            pending = sum(1 for m in members if m.pending and m.key != pod.key)
            if done.is_set() or not pending:
                return False
            done.set()
            fault = act(pod, node)
            fault.detail += f" ({pod.gang}: {pending} of {len(members)} pods not bound yet)"
            fired.append(fault)
            return True

        self.observer.triggers.append(trigger)
        self.burst()
        if not done.wait(ARMED_TIMEOUT_S) and not done.is_set():
            done.set()
            with contextlib.suppress(ValueError):
                self.observer.triggers.remove(trigger)
            LOG.info("%s: no gang was being bound within %.0fs", kind, ARMED_TIMEOUT_S)
        deadline = time.monotonic() + 5
        while not fired and time.monotonic() < deadline:  # set by the watch thread
            time.sleep(0.01)
        if fired:
            return fired[0]
        fault = Fault(kind, time.monotonic(), time.time(), "no gang was being bound: not injected")
        return fault


def _start(replica: OperatorProcess) -> None:
    if not replica.running():
        replica.start()
        replica.wait_ready()


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name"))


def compact(etcd_port: int) -> int:
    """Compact etcd to its current revision through the HTTP gateway; the revision."""
    base = f"http://127.0.0.1:{etcd_port}/v3/kv"
    answer = _post(f"{base}/range", {"key": "AA==", "limit": 1, "keys_only": True})
    revision = int(answer["header"]["revision"])
    _post(f"{base}/compaction", {"revision": str(revision), "physical": True})
    return revision


def _post(url: str, body: Mapping[str, Any]) -> Any:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read())
