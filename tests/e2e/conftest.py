"""pytest plumbing for the e2e tests: one real control plane per session.

The session fixture ``control_plane`` runs ``e2e/build.sh`` (seconds when the
binaries are cached), then ``e2e/cluster.sh up``; at the end of the session it
runs ``e2e/cluster.sh down`` and checks that none of the processes it started
is left. Set ``KAI_RAY_E2E_KEEP=1`` to leave the cluster running after the
session (a later session then reuses it, since ``up`` is idempotent).

The operator: ``kai_ray_crds`` applies crds/ once per session; ``operators``
holds the session's kai-ray replicas (tests/e2e/operator_process.py), and
``operator`` hands a test the primary one, started and ready, restarted first if
an earlier test stopped it. A test that fails gets the operator's log of its
own run attached to its report; an operator that exited during a test without
the test stopping it is an error of that test. ``sandbox`` gives a test its own
namespace, node pool and cluster-scoped names (tests/e2e/sandbox.py).
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import time
import uuid
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from .nodes import GpuNodeSpec, create_gpu_nodes, delete_gpu_nodes
from .operator_process import OperatorProcess, Operators
from .polling import eventually
from .sandbox import Sandbox

REPO = Path(__file__).resolve().parents[2]
E2E = REPO / "e2e"
BUILD_TIMEOUT = 75 * 60
UP_TIMEOUT = 5 * 60


@dataclass(frozen=True)
class ControlPlane:
    kubeconfig: Path
    user_kubeconfig: Path
    kubectl_bin: Path
    helm: Path | None
    kuberay: bool
    env: dict[str, str]

    def kubectl(
        self, *args: str, user: bool = False, input: str | None = None, check: bool = False
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl as the admin (or the plain user) and capture its output."""
        kc = self.user_kubeconfig if user else self.kubeconfig
        return subprocess.run(
            [str(self.kubectl_bin), "--kubeconfig", str(kc), *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=120,
            check=check,
        )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "e2e: runs against a real kube-apiserver built by e2e/ (slow to start)"
    )


def _run(cmd: list[str], timeout: float, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)
    if proc.returncode != 0:
        raise RuntimeError(
            f"{' '.join(cmd)} exited {proc.returncode}\n--- stdout\n{proc.stdout}"
            f"\n--- stderr\n{proc.stderr}"
        )
    return proc.stdout


def _bin_dir(component: str) -> Path:
    return Path(_run([str(E2E / "build.sh"), "--print-dir", component], 60).strip())


def _recorded_pids(env: dict[str, str]) -> list[int]:
    run = Path(env.get("KAI_RAY_E2E_RUN", "/tmp/kai-ray-e2e"))
    pids = []
    for f in (run / "pids").glob("*.pid"):
        with contextlib.suppress(OSError, ValueError):
            pids.append(int(f.read_text().strip()))
    return pids


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    env = dict(os.environ)
    # build what is missing; a component that fails is reported, and the rest
    # can still run (KubeRay and helm are optional for the control plane)
    build = subprocess.run(
        [str(E2E / "build.sh")], capture_output=True, text=True, timeout=BUILD_TIMEOUT, cwd=REPO
    )
    if build.returncode != 0:
        print(f"e2e/build.sh failed:\n{build.stdout}\n{build.stderr}")
    for needed in ("kubernetes", "etcd", "kwok"):
        if not (_bin_dir(needed) / ".stamp").exists():
            pytest.fail(f"e2e/build.sh could not build {needed}:\n{build.stderr}", pytrace=False)
    kuberay = (_bin_dir("kuberay") / "ray-operator").exists()
    if not kuberay:
        env["KAI_RAY_E2E_KUBERAY"] = "0"
    helm = _bin_dir("helm") / "helm"

    started = time.monotonic()
    try:
        _run([str(E2E / "cluster.sh"), "up"], UP_TIMEOUT, env)
    except BaseException:
        subprocess.run([str(E2E / "cluster.sh"), "down"], env=env, timeout=120, check=False)
        raise
    print(f"control plane up in {time.monotonic() - started:.1f}s")
    exports = dict(
        re.findall(r"^export (\w+)=(.*)$", _run([str(E2E / "cluster.sh"), "env"], 60, env), re.M)
    )
    plane = ControlPlane(
        kubeconfig=Path(exports["KUBECONFIG"]),
        user_kubeconfig=Path(exports["KAI_RAY_E2E_USER_KUBECONFIG"]),
        kubectl_bin=Path(exports["KAI_RAY_E2E_KUBECTL"]),
        helm=helm if helm.exists() else None,
        kuberay=kuberay,
        env=env,
    )
    try:
        yield plane
    finally:
        if env.get("KAI_RAY_E2E_KEEP") != "1":
            pids = _recorded_pids(env)
            _run([str(E2E / "cluster.sh"), "down"], 120, env)
            left = [p for p in pids if _group_alive(p)]
            assert not left, f"processes left after e2e/cluster.sh down: {left}"


@pytest.fixture(scope="session")
def admin_api(control_plane: ControlPlane) -> client.ApiClient:
    return config.new_client_from_config(config_file=str(control_plane.kubeconfig))


@pytest.fixture(scope="session")
def user_api(control_plane: ControlPlane) -> client.ApiClient:
    """A client for "e2e-user": authenticated, but bound to no RBAC role."""
    return config.new_client_from_config(config_file=str(control_plane.user_kubeconfig))


@pytest.fixture(scope="session")
def core(admin_api: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(admin_api)


@pytest.fixture
def namespace(request: pytest.FixtureRequest, core: client.CoreV1Api) -> Iterator[str]:
    """A fresh namespace for one test, deleted (asynchronously) afterwards."""
    base = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    # The suffix is the sandbox's tag, a label value too: it starts with a letter, so
    # that YAML never reads it as a number ("959e32" is a float to kubectl).
    name = f"{base}-k{uuid.uuid4().hex[:5]}"
    core.create_namespace({"metadata": {"name": name, "labels": {"kai-ray.io/e2e": "true"}}})
    # pods need the namespace's default ServiceAccount, made by the controller-manager
    deadline = time.monotonic() + 30
    while True:
        try:
            core.read_namespaced_service_account("default", name)
            break
        except ApiException as e:
            if e.status != 404 or time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    yield name
    try:
        core.delete_namespace(name)
    except ApiException as e:
        if e.status != 404:
            raise


@pytest.fixture
def gpu_nodes(core: client.CoreV1Api) -> Iterator[Callable[..., list[str]]]:
    """Factory: ``gpu_nodes(count, **GpuNodeSpec fields)`` makes Ready fake GPU
    nodes with names unique to the test; they are deleted afterwards."""
    made: list[str] = []

    def make(count: int, **kwargs: object) -> list[str]:
        kwargs.setdefault("prefix", f"gpu-{uuid.uuid4().hex[:6]}")
        names = create_gpu_nodes(core, GpuNodeSpec(count=count, **kwargs))  # type: ignore[arg-type]
        made.extend(names)
        return names

    yield make
    delete_gpu_nodes(core, made)


@pytest.fixture(scope="session")
def kai_ray_crds(control_plane: ControlPlane) -> ControlPlane:
    """kai-ray's CRDs from crds/, and the tests' stand-in for Grove's PodGang
    (tests/e2e/crds), applied and established before any operator starts."""
    applied = control_plane.kubectl(
        "apply",
        "--server-side",
        "--force-conflicts",
        "-f",
        str(REPO / "crds"),
        "-f",
        str(Path(__file__).parent / "crds"),
    )
    assert applied.returncode == 0, applied.stderr
    names = [line.split()[0] for line in applied.stdout.splitlines() if line.strip()]
    waited = control_plane.kubectl("wait", "--for=condition=Established", "--timeout=60s", *names)
    assert waited.returncode == 0, waited.stderr
    # Established is set before every API server handler serves the new resource:
    # the first POST can still get 404. Wait until each one lists.
    for plural in (name.split("/")[-1] for name in names):
        eventually(
            lambda p=plural: control_plane.kubectl("get", p, "-A").returncode == 0,
            60,
            f"{plural} served",
        )
    return control_plane


@pytest.fixture(scope="session")
def operators(kai_ray_crds: ControlPlane, admin_api: client.ApiClient) -> Iterator[Operators]:
    run = Path(kai_ray_crds.env.get("KAI_RAY_E2E_RUN", "/tmp/kai-ray-e2e"))
    fleet = Operators(kai_ray_crds.kubeconfig, run, admin_api)
    yield fleet
    fleet.stop_all()


@pytest.fixture
def operator(operators: Operators, request: pytest.FixtureRequest) -> Iterator[OperatorProcess]:
    """The session's primary kai-ray operator, running and ready."""
    primary = operators.ensure_primary()
    offsets = {replica.identity: replica.log_size() for replica in operators.replicas}
    request.node.stash[OPERATOR_LOGS] = (operators, offsets)
    yield primary
    crashed = [
        r for r in operators.replicas if r.process and not r.running() and not r.stopped_on_purpose
    ]
    for replica in crashed:
        replica.stopped_on_purpose = True  # reported once; the next test starts it again
    if crashed:
        pytest.fail(
            "".join(
                f"kai-ray operator {r.identity} exited with {r.returncode()} during the test:\n"
                f"{r.log_tail()}\n"
                for r in crashed
            ),
            pytrace=False,
        )


#: The operators a test ran with, and where each one's log stood when it began.
OPERATOR_LOGS = pytest.StashKey[tuple[Operators, dict[str, int]]]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed test's report carries what each operator logged while it ran
    (without the webhook server's access lines)."""
    report = yield
    if report.failed and call.when == "call" and OPERATOR_LOGS in item.stash:
        fleet, offsets = item.stash[OPERATOR_LOGS]
        for replica in fleet.replicas:
            text = replica.log_text(since=offsets.get(replica.identity, 0))
            lines = [line for line in text.splitlines() if "aiohttp.access" not in line]
            section = "\n".join(lines[-150:]) or "(empty)"
            report.sections.append((f"kai-ray operator {replica.identity} log", section))
    return report


@pytest.fixture
def sandbox(
    kai_ray_crds: ControlPlane, admin_api: client.ApiClient, namespace: str
) -> Iterator[Sandbox]:
    """This test's namespace, node pool and cluster-scoped names (kai-ray's CRDs in
    place: a test that applies Queues first must not depend on another having run)."""
    box = Sandbox(namespace, namespace.rsplit("-", 1)[-1], kai_ray_crds, admin_api)
    yield box
    box.cleanup()
