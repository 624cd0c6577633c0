"""kai-ray's operator as a real process against the e2e control plane.

The e2e tests run `python -m kai_ray operator` (what `kai-ray operator` and the
image's entrypoint run) as a subprocess in its own process group, with
`$KUBECONFIG` pointing at the control plane of `e2e/cluster.sh`, free ports for
metrics, health and the admission webhook, and a SchedulerConfig file with a
short cycle period. Its output goes to `<run dir>/operator/<identity>.log`; the
fixtures in conftest.py attach the part written during a failed test to the
test's report.

`Operators` owns every replica of a session. All of them share one Lease
(unique to the session), so a second replica started with `replica()` stands by
while the first leads; `leader()` reads the Lease's holder. The primary replica
is restarted with the same identity, so after a SIGKILL it takes its own Lease
back at once instead of waiting for it to expire.

Not named `operator.py`: that is a standard-library module's name.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from kubernetes import client
from kubernetes.client.rest import ApiException

from .polling import eventually

REPO = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 90
LEASE_NAMESPACE = "kube-system"
#: The DeviceClass of tests/e2e/test_dra_scheduling.py: its devices count as GPUs.
DRA_GPU_CLASS = "gpu.e2e.kai-ray.io"
#: The settings the e2e operators run with: a short cycle keeps the tests short.
CONFIG = f"""\
apiVersion: config.kai-ray.io/v1alpha1
kind: SchedulerConfig
metadata:
  name: e2e
spec:
  cyclePeriod: 500ms
  dra:
    deviceClasses:
      {DRA_GPU_CLASS}: gpu
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class OperatorProcess:
    """One replica: its command line, its log and its process (when started)."""

    identity: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    health_port: int
    process: subprocess.Popen[bytes] | None = None
    #: Set when a test stopped it on purpose (a crash is anything else).
    stopped_on_purpose: bool = False
    _log: IO[bytes] | None = field(default=None, repr=False)

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        self._log.write(f"\n=== started {time.strftime('%H:%M:%S')}: {self.argv}\n".encode())
        self._log.flush()
        self.process = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=self.env,
            cwd=REPO,
            start_new_session=True,  # its own process group, killed as one
        )
        self.stopped_on_purpose = False

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        """Until /readyz answers 200 (its caches are synced); fail if it exits first."""
        deadline = time.monotonic() + timeout
        while self.probe("/readyz") != 200:
            if not self.running():
                raise AssertionError(
                    f"kai-ray operator {self.identity} exited with {self.returncode()} "
                    f"before it was ready; its log:\n{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"kai-ray operator {self.identity} not ready after {timeout}s "
                    f"(/healthz: {self.probe('/healthz')}); its log:\n{self.log_tail()}"
                )
            time.sleep(0.2)

    def kill(self) -> None:
        """SIGKILL the whole process group, as a node failure or an OOM kill would."""
        self._signal(signal.SIGKILL)
        self._reap(10)
        self.stopped_on_purpose = True

    def stop(self, grace_s: float = 15) -> None:
        """SIGTERM, then SIGKILL what is left after `grace_s`."""
        if self.running():
            self._signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._reap(grace_s)
        if self.running():
            self._signal(signal.SIGKILL)
            self._reap(10)
        self.stopped_on_purpose = True

    def restart(self) -> None:
        """SIGKILL and start again with the same identity and ports; wait until ready."""
        self.kill()
        self.start()
        self.wait_ready()

    def _signal(self, sig: signal.Signals) -> None:
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, sig)

    def _reap(self, timeout: float) -> None:
        if self.process is not None:
            self.process.wait(timeout=timeout)
        if self._log is not None and not self.running():
            self._log.write(
                f"=== exited {time.strftime('%H:%M:%S')}: {self.returncode()}\n".encode()
            )
            self._log.close()
            self._log = None

    # --------------------------------------------------------------- looking

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def returncode(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def probe(self, path: str) -> int | None:
        """The HTTP status of a health endpoint, None when nothing answers."""
        url = f"http://127.0.0.1:{self.health_port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                return int(answer.status)
        except urllib.error.HTTPError as err:
            return int(err.code)
        except (OSError, ValueError):
            return None

    def log_size(self) -> int:
        return self.log_path.stat().st_size if self.log_path.exists() else 0

    def log_text(self, since: int = 0) -> str:
        if not self.log_path.exists():
            return ""
        with self.log_path.open("rb") as f:
            f.seek(since)
            return f.read().decode(errors="replace")

    def log_tail(self, lines: int = 80, since: int = 0) -> str:
        return "\n".join(self.log_text(since).splitlines()[-lines:])


class Operators:
    """Every replica of one e2e session, sharing one Lease."""

    def __init__(self, kubeconfig: Path, run_dir: Path, api: client.ApiClient) -> None:
        self.kubeconfig = kubeconfig
        self.run_dir = run_dir / "operator"
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.config_file = self.run_dir / "scheduler-config.yaml"
        self.config_file.write_text(CONFIG)
        session = uuid.uuid4().hex[:6]
        self.lease_name = f"kai-ray-e2e-{session}"
        self.coordination = client.CoordinationV1Api(api)
        self.webhook = os.environ.get("KAI_RAY_E2E_WEBHOOK", "1") != "0"
        self.primary = self._replica(f"e2e-{session}-0", webhook=self.webhook)
        self.replicas: list[OperatorProcess] = [self.primary]

    def _replica(self, identity: str, webhook: bool) -> OperatorProcess:
        health = free_port()
        argv = [
            sys.executable,
            "-m",
            "kai_ray",
            "operator",
            "--config",
            str(self.config_file),
            "--metrics-port",
            str(free_port()),
            "--health-port",
            str(health),
            "--lease-namespace",
            LEASE_NAMESPACE,
            "--lease-name",
            self.lease_name,
            "--identity",
            identity,
        ]
        if webhook:
            argv += ["--webhook-host", "127.0.0.1", "--webhook-port", str(free_port())]
        else:
            argv += ["--no-webhook"]
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), "PYTHONUNBUFFERED": "1"}
        log = self.run_dir / f"{identity}.log"
        return OperatorProcess(identity, argv, env, log, health)

    def ensure_primary(self) -> OperatorProcess:
        """The primary replica, started (again) if it is not running, and ready."""
        if not self.primary.running():
            self.primary.start()
        self.primary.wait_ready()
        return self.primary

    def replica(self, name: str) -> OperatorProcess:
        """Start one more replica on the same Lease and wait until it is ready.

        It serves no webhook: one API server cannot call two webhooks of one
        registration on one host, and standing by is what is tested."""
        replica = self._replica(f"{self.primary.identity}-{name}", webhook=False)
        self.replicas.append(replica)
        replica.start()
        replica.wait_ready()
        return replica

    def leader(self) -> str | None:
        """The identity holding the session's Lease (None before anyone took it)."""
        try:
            lease = self.coordination.read_namespaced_lease(self.lease_name, LEASE_NAMESPACE)
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        return lease.spec.holder_identity if lease.spec else None

    def wait_leader(self, identity: str, timeout: float) -> float:
        """Seconds until `identity` holds the Lease."""
        started = time.monotonic()
        eventually(
            lambda: self.leader() == identity,
            timeout=timeout,
            what=f"{identity} to hold the Lease {self.lease_name}",
            interval=0.1,
        )
        return time.monotonic() - started

    def stop_all(self) -> None:
        for replica in reversed(self.replicas):
            replica.stop()
