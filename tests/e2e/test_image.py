"""The operator image, run from its own root filesystem against the e2e control plane.

`operator/build-image.sh` (what `make image` runs) builds the OCI image, or
reuses the one cached outside the clone for the same sources; its layers are
unpacked with umoci into a folder, and the image's entrypoint runs there under
chroot, as the image's user and with the image's environment, as the chart's
ServiceAccount. It must start, become ready and schedule a gang. Building from
nothing takes about three minutes (the base layer: Debian packages and the
Python dependencies; cached until operator/*.lock change), a changed checkout
about half a minute (the kai-ray layer).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from .chart import (
    Helm,
    OperatorProcess,
    Release,
    forbidden_lines,
    free_port,
    new_release,
    operator_args,
    running,
    scheduler_config,
    service_account_kubeconfig,
)
from .conftest import REPO, ControlPlane
from .test_chart import schedule_a_gang

pytestmark = pytest.mark.e2e

BUILD_TIMEOUT = 20 * 60


def _layout() -> Path:
    if os.geteuid() != 0:
        pytest.skip("building and running the image needs root (mmdebstrap, chroot)")
    built = subprocess.run(
        [str(REPO / "operator" / "build-image.sh")],
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT,
        cwd=REPO,
    )
    assert built.returncode == 0, f"build-image.sh failed:\n{built.stderr[-4000:]}"
    return Path(built.stdout.strip().splitlines()[-1])


def _blob(layout: Path, digest: str) -> dict[str, Any]:
    algorithm, _, value = digest.partition(":")
    loaded: dict[str, Any] = json.loads((layout / "blobs" / algorithm / value).read_text())
    return loaded


def image_config(layout: Path, tag: str) -> dict[str, Any]:
    """The image's config (entrypoint, user, environment) by its tag."""
    index = json.loads((layout / "index.json").read_text())
    entry = next(
        m
        for m in index["manifests"]
        if m["annotations"]["org.opencontainers.image.ref.name"] == tag
    )
    manifest = _blob(layout, entry["digest"])
    return _blob(layout, manifest["config"]["digest"])


@pytest.fixture(scope="module")
def rootfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, Any]]]:
    import tomllib

    layout = _layout()
    tag = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    root = tmp_path_factory.mktemp("image") / "rootfs"
    unpacked = subprocess.run(
        ["umoci", "raw", "unpack", "--image", f"{layout}:{tag}", str(root)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert unpacked.returncode == 0, unpacked.stderr
    yield root, image_config(layout, tag)
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def image_release(
    control_plane: ControlPlane, core: client.CoreV1Api, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Release]:
    if control_plane.helm is None:
        pytest.skip("helm was not built (see e2e/build.sh output)")
    helm = Helm(control_plane.helm, control_plane.kubeconfig, tmp_path_factory.mktemp("helm"))
    rel = new_release("image")
    core.create_namespace({"metadata": {"name": rel.namespace}})
    rel.install(helm, "defaultQueues.keepOnUninstall=false")
    yield rel
    helm.run("uninstall", rel.name, "--namespace", rel.namespace, check=False)
    core.delete_namespace(rel.namespace)


def test_the_image_config_runs_the_operator_as_its_own_user(
    rootfs: tuple[Path, dict[str, Any]],
) -> None:
    root, config = rootfs
    assert config["config"]["Entrypoint"] == ["/usr/local/bin/kai-ray-operator"]
    assert config["config"]["User"] == "65532:65532"
    entrypoint = (root / "usr/local/bin/kai-ray-operator").read_text()
    assert "kai-ray operator" in entrypoint
    assert "kai-ray:x:65532:65532" in (root / "etc/passwd").read_text()


def test_the_operator_from_the_image_schedules_a_gang(
    control_plane: ControlPlane,
    core: client.CoreV1Api,
    rootfs: tuple[Path, dict[str, Any]],
    image_release: Release,
    namespace: str,
    gpu_nodes: Callable[..., list[str]],
) -> None:
    root, config = rootfs
    inside = root / "tmp" / "e2e"
    inside.mkdir(parents=True, exist_ok=True)
    inside.chmod(0o755)
    service_account_kubeconfig(
        control_plane, core, image_release.namespace, image_release.fullname, inside / "kubeconfig"
    )
    scheduler_config(core, image_release, inside / "scheduler-config.yaml")
    health, metrics, webhook = free_port(), free_port(), free_port()
    args = operator_args(
        image_release,
        "/tmp/e2e/scheduler-config.yaml",
        "/tmp/e2e/kubeconfig",
        health,
        metrics,
        webhook,
    )[1:]  # the entrypoint says `operator` itself
    args.append("--webhook-cert-dir=/tmp/e2e/webhook")
    user = config["config"]["User"]
    command = [
        "chroot", f"--userspec={user}", str(root),
        "/usr/bin/env", "-i", *config["config"]["Env"], "KUBECONFIG=/tmp/e2e/kubeconfig",
        *config["config"]["Entrypoint"], *args,
    ]  # fmt: skip
    # the image's user writes its webhook certificate in /tmp/e2e/webhook
    os.chown(inside, *(int(part) for part in user.split(":")))
    env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")}
    process = OperatorProcess(command, inside.parent / "operator.log", env, health, metrics)
    nodes = gpu_nodes(2, gpus_per_node=2)
    with running(process) as operator:
        placed = schedule_a_gang(control_plane, core, image_release, namespace, 3)
        assert set(placed.values()) <= set(nodes)
        assert operator.get(operator.metrics_port, "/metrics")[0] == 200
    refused = forbidden_lines(process.output())
    assert not refused, "requests refused by RBAC:\n" + "\n".join(refused[:20])
