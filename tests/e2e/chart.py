"""The Helm chart on the e2e control plane: helm, releases, service-account
identities, and the operator run as a process under such an identity.

Used by tests/e2e/test_chart.py (the chart from the checkout) and
tests/e2e/test_image.py (the operator from the image's root filesystem).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import socket
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from .conftest import REPO, ControlPlane

CHART = REPO / "helm" / "kai-ray"


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


@dataclass
class Helm:
    """The helm that e2e/build.sh builds, with its own cache and config folders."""

    binary: Path
    kubeconfig: Path
    home: Path

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            "HELM_CACHE_HOME": str(self.home / "cache"),
            "HELM_CONFIG_HOME": str(self.home / "config"),
            "HELM_DATA_HOME": str(self.home / "data"),
        }
        done = subprocess.run(
            [str(self.binary), *args], env=env, capture_output=True, text=True, timeout=180
        )
        if check and done.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} exited {done.returncode}:\n{done.stderr}")
        return done

    def template(self, release: str, namespace: str, *sets: str) -> list[dict[str, Any]]:
        args = ["template", release, str(CHART), "--namespace", namespace]
        for item in sets:
            args += ["--set", item]
        rendered = self.run(*args).stdout
        return [doc for doc in yaml.safe_load_all(rendered) if doc]


@dataclass
class Release:
    """One installation of the chart, its names as the chart derives them."""

    name: str
    namespace: str
    scheduler: str
    queues: tuple[str, str]

    @property
    def fullname(self) -> str:
        return self.name if "kai-ray" in self.name else f"{self.name}-kai-ray"

    @property
    def cluster_name(self) -> str:
        return f"{self.fullname}-{self.namespace}"

    @property
    def webhook_config(self) -> str:
        return f"{self.cluster_name}.kai-ray.io"

    @property
    def webhook_service(self) -> str:
        return f"{self.fullname}-webhook"

    def values(self) -> list[str]:
        """--set values: this release's scheduler name and its own default queues."""
        parent, team = self.queues
        return [
            f"schedulerConfig.schedulerName={self.scheduler}",
            f"defaultQueues.queues[0].name={parent}",
            f"defaultQueues.queues[1].name={team}",
            f"defaultQueues.queues[1].spec.parentQueue={parent}",
        ]

    def install(self, helm: Helm, *extra: str) -> None:
        args = ["install", self.name, str(CHART), "--namespace", self.namespace]
        for item in [*self.values(), *extra]:
            args += ["--set", item]
        helm.run(*args)


def new_release(prefix: str) -> Release:
    tag = uuid.uuid4().hex[:6]
    return Release(
        name=f"{prefix}-{tag}",
        namespace=f"{prefix}-{tag}",
        scheduler=f"kai-ray-{prefix}-{tag}",
        queues=(f"{prefix}-{tag}-dept", f"{prefix}-{tag}-team"),
    )


# ------------------------------------------------------------ identities


def _cluster_of(kubeconfig: Path) -> dict[str, Any]:
    config = yaml.safe_load(kubeconfig.read_text())
    cluster: dict[str, Any] = dict(config["clusters"][0]["cluster"])
    if "certificate-authority" in cluster:
        ca = Path(cluster.pop("certificate-authority")).read_bytes()
        cluster["certificate-authority-data"] = base64.b64encode(ca).decode()
    return cluster


def service_account_kubeconfig(
    plane: ControlPlane, core: client.CoreV1Api, namespace: str, name: str, path: Path
) -> Path:
    """A kubeconfig (CA embedded) with a token for the ServiceAccount, from the
    TokenRequest API: the identity a pod of the Deployment would have."""
    request = {"spec": {"expirationSeconds": 3600}}
    answer = core.create_namespaced_service_account_token(name, namespace, request)
    user = f"system:serviceaccount:{namespace}:{name}"
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "e2e", "cluster": _cluster_of(plane.kubeconfig)}],
        "users": [{"name": user, "user": {"token": answer.status.token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "e2e", "user": user}}],
        "current-context": "sa",
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o644)  # the image's user (65532) reads it too
    return path


# ------------------------------------------------------------ the operator


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class OperatorProcess:
    """`kai-ray operator` as a child process, its output in a file."""

    command: Sequence[str]
    log: Path
    env: dict[str, str]
    health_port: int
    metrics_port: int
    process: subprocess.Popen[bytes] | None = field(default=None, init=False)

    def start(self) -> OperatorProcess:
        out = self.log.open("wb")
        self.process = subprocess.Popen(
            list(self.command), stdout=out, stderr=subprocess.STDOUT, env=self.env
        )
        return self

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def get(self, port: int, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as reply:
                return reply.status, reply.read().decode()
        except OSError as err:
            code = getattr(err, "code", 0)
            return int(code or 0), str(err)

    def wait_ready(self, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise AssertionError(f"the operator exited early:\n{self.output()[-4000:]}")
            if self.get(self.health_port, "/readyz")[0] == 200:
                return
            time.sleep(0.5)
        raise AssertionError(f"the operator was not ready in {timeout}s:\n{self.output()[-4000:]}")

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)


def operator_args(
    release: Release, config_file: str, kubeconfig: str, health: int, metrics: int, webhook: int
) -> list[str]:
    """The arguments the chart's Deployment passes, except that the webhook is
    reached by URL on 127.0.0.1 (the e2e API server reaches no pod or Service)."""
    return [
        "operator",
        f"--config={config_file}",
        f"--kubeconfig={kubeconfig}",
        f"--metrics-port={metrics}",
        f"--health-port={health}",
        "--bind-address=127.0.0.1",
        f"--lease-namespace={release.namespace}",
        f"--lease-name={release.fullname}",
        "--webhook-host=127.0.0.1",
        f"--webhook-port={webhook}",
        f"--webhook-config-name={release.webhook_config}",
    ]


@contextlib.contextmanager
def running(operator: OperatorProcess) -> Iterator[OperatorProcess]:
    operator.start()
    try:
        operator.wait_ready()
        yield operator
    finally:
        operator.stop()


def scheduler_config(core: client.CoreV1Api, release: Release, path: Path) -> Path:
    """The SchedulerConfig the chart installed (its ConfigMap), as a file."""
    config_map = core.read_namespaced_config_map(f"{release.fullname}-config", release.namespace)
    path.write_text(config_map.data["scheduler-config.yaml"])
    path.chmod(0o644)
    return path


def forbidden_lines(output: str) -> list[str]:
    """Lines of an operator's log that report a request RBAC refused."""
    # (not "403" alone: log time stamps have milliseconds)
    markers = ("Forbidden", "forbidden")
    return [line for line in output.splitlines() if any(m in line for m in markers)]


def dump(obj: Any) -> str:
    return json.dumps(obj, indent=1, default=str)[:3000]
