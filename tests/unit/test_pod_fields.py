"""What one pod asks for: requests by kube-scheduler's rules, GPU shares, identity."""

from __future__ import annotations

from typing import Any

import pytest

from kai_ray.values.errors import InvalidFieldError
from kai_ray.values.resources import GPU, Resources
from kai_ray.workloads.pod_fields import (
    GpuShare,
    check_gpu_request,
    format_device_list,
    gpu_share,
    pod_gpu_devices,
    pod_group_name,
    pod_is_pending_for,
    pod_is_terminal,
    pod_key,
    pod_node,
    pod_requests,
    pod_scheduler,
)
from tests.builders import make_pod

GI = 2.0**30


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        pytest.param(
            make_pod("p").cpu("500m").memory("1Gi").container({"cpu": "1"}).build(),
            Resources.of(cpu=1.5, memory=GI),
            id="requests of all containers add up",
        ),
        pytest.param(
            make_pod("p").limit("cpu", "2").limit("memory", "4Gi").build(),
            Resources.of(cpu=2, memory=4 * GI),
            id="limits stand in for requests that are absent",
        ),
        pytest.param(
            make_pod("p").cpu("1").limit("cpu", "4").build(),
            Resources.of(cpu=1),
            id="a request wins over the limit of the same resource",
        ),
        pytest.param(
            make_pod("p").gpus(2).build(),
            Resources.of(gpu=2),
            id="whole GPUs given as a limit count as requests",
        ),
        pytest.param(
            make_pod("p").cpu("1").memory("1Gi").init_container({"cpu": "4"}).build(),
            Resources.of(cpu=4, memory=GI),
            id="an init container larger than the containers sets the peak of that resource",
        ),
        pytest.param(
            make_pod("p").cpu("1").init_container({"cpu": "1"}, sidecar=True).build(),
            Resources.of(cpu=2),
            id="a sidecar init container runs beside the containers",
        ),
        pytest.param(
            make_pod("p")
            .cpu("1")
            .init_container({"cpu": "1"}, sidecar=True)
            .init_container({"cpu": "3"})
            .build(),
            Resources.of(cpu=4),
            id="an init container after a sidecar runs beside that sidecar",
        ),
        pytest.param(
            make_pod("p").cpu("1").overhead(cpu="250m", memory="64Mi").build(),
            Resources.of(cpu=1.25, memory=64 * 2**20),
            id="the runtime class overhead is added on top",
        ),
        pytest.param(
            make_pod("p").request("example.com/fpga", 2).build(),
            Resources({"example.com/fpga": 2}),
            id="extended resources are kept under their own name",
        ),
        pytest.param(
            make_pod("p").build(), Resources(), id="a pod without requests asks for nothing"
        ),
    ],
)
def test_pod_requests(pod: dict[str, Any], expected: Resources) -> None:
    assert pod_requests(pod) == expected


@pytest.mark.parametrize(
    ("pod", "field"),
    [
        pytest.param(
            make_pod("p").cpu("-1").build(),
            "spec.containers[0].resources.requests.cpu",
            id="a negative cpu request names the container's field",
        ),
        pytest.param(
            make_pod("p").limit("memory", "-1Gi").build(),
            "spec.containers[0].resources.limits.memory",
            id="a negative limit standing in for a request names the limit",
        ),
        pytest.param(
            make_pod("p").memory("lots").build(),
            "spec.containers[0].resources.requests.memory",
            id="an unparsable quantity names the field",
        ),
        pytest.param(
            make_pod("p").init_container({"cpu": "-2"}).build(),
            "spec.initContainers[0].resources.requests.cpu",
            id="a bad init container request names the init container",
        ),
        pytest.param(
            make_pod("p").overhead(memory="x").build(),
            "spec.overhead.memory",
            id="a bad overhead names spec.overhead",
        ),
        pytest.param(
            make_pod("p").request(GPU, "0.5").build(),
            f"spec.containers[0].resources.requests.{GPU}",
            id="half a whole GPU is refused: shares go through the annotations",
        ),
        pytest.param(
            make_pod("p").gpus("1.5").build(),
            f"spec.containers[0].resources.limits.{GPU}",
            id="half a whole GPU as a limit alone names the limit",
        ),
        pytest.param(
            make_pod("p").request(GPU, 2).limit(GPU, 1).build(),
            f"spec.containers[0].resources.limits.{GPU}",
            id="a GPU limit unlike the request is refused: devices are not overcommitted",
        ),
        pytest.param(
            make_pod("p")
            .set("spec.containers", [{"name": "c", "resources": {"requests": 4}}])
            .build(),
            "spec.containers[0].resources.requests",
            id="requests that are not a map are refused",
        ),
    ],
)
def test_pod_requests_errors_name_the_field(pod: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidFieldError) as raised:
        pod_requests(pod)
    assert raised.value.field == field


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        pytest.param(make_pod("p").gpus(1).build(), None, id="a whole-GPU pod shares nothing"),
        pytest.param(
            make_pod("p").gpu_fraction(0.5).build(),
            GpuShare(fraction=0.5),
            id="half a GPU by fraction",
        ),
        pytest.param(
            make_pod("p").gpu_fraction(1).build(),
            GpuShare(fraction=1.0),
            id="a fraction of 1 is accepted and fills one device",
        ),
        pytest.param(
            make_pod("p").gpu_memory("10Gi").build(),
            GpuShare(memory=10 * GI),
            id="GPU memory is kept in bytes until a node is known",
        ),
    ],
)
def test_gpu_share(pod: dict[str, Any], expected: GpuShare | None) -> None:
    assert gpu_share(pod) == expected


@pytest.mark.parametrize(
    ("pod", "annotation"),
    [
        pytest.param(make_pod("p").gpu_fraction(0).build(), "gpu-fraction", id="fraction 0"),
        pytest.param(make_pod("p").gpu_fraction(1.5).build(), "gpu-fraction", id="fraction 1.5"),
        pytest.param(
            make_pod("p").gpu_fraction("half").build(), "gpu-fraction", id="fraction 'half'"
        ),
        pytest.param(make_pod("p").gpu_fraction("nan").build(), "gpu-fraction", id="fraction nan"),
        pytest.param(make_pod("p").gpu_memory("0").build(), "gpu-memory", id="zero GPU memory"),
        pytest.param(make_pod("p").gpu_memory("-1Gi").build(), "gpu-memory", id="negative memory"),
        pytest.param(
            make_pod("p").gpu_fraction(0.5).gpu_memory("1Gi").build(),
            "gpu-memory",
            id="a fraction and an amount of memory together",
        ),
    ],
)
def test_gpu_share_errors_name_the_annotation(pod: dict[str, Any], annotation: str) -> None:
    with pytest.raises(InvalidFieldError) as raised:
        gpu_share(pod)
    assert raised.value.field == f"metadata.annotations[kai-ray.io/{annotation}]"


def test_a_pod_sharing_a_gpu_must_not_also_ask_for_whole_ones() -> None:
    with pytest.raises(InvalidFieldError, match="must not also request"):
        check_gpu_request(Resources.of(gpu=1), GpuShare(fraction=0.5))


@pytest.mark.parametrize(
    ("share", "device_mib", "expected"),
    [
        pytest.param(GpuShare(fraction=0.25), 0.0, 0.25, id="a fraction needs no device size"),
        pytest.param(GpuShare(memory=20 * GI), 81920.0, 0.25, id="20Gi of an 80Gi device is 1/4"),
        pytest.param(GpuShare(memory=GI), 0.0, None, id="memory without a device size is unknown"),
    ],
)
def test_share_as_fraction_of_a_device(share: GpuShare, device_mib: float, expected: float) -> None:
    assert share.fraction_of(device_mib) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("0,3", (0, 3), id="two devices"),
        pytest.param("2", (2,), id="one device"),
        pytest.param("x", None, id="not a number"),
        pytest.param("1,1", None, id="a device listed twice"),
        pytest.param("-1", None, id="a negative index"),
    ],
)
def test_recorded_devices(text: str, expected: tuple[int, ...] | None) -> None:
    pod = make_pod("p").devices(text).build()
    if expected is None:
        with pytest.raises(InvalidFieldError, match="gpu-devices"):
            pod_gpu_devices(pod)
    else:
        assert pod_gpu_devices(pod) == expected
        assert format_device_list(expected) == text


def test_identity_and_standing() -> None:
    waiting = make_pod("w", "team").group("g").build()
    bound = make_pod("b").on("n1").scheduler("default-scheduler").build()
    finished = make_pod("f").on("n1").phase("Succeeded").build()
    alias = make_pod("a").annotate("pod-group-name", "kai-style").build()
    assert pod_key(waiting) == "team/w"
    assert pod_group_name(waiting) == "g"
    assert pod_group_name(alias) == "kai-style"
    assert pod_is_pending_for(waiting, "kai-ray")
    assert not pod_is_pending_for(bound, "kai-ray")
    assert pod_node(bound) == "n1" and pod_scheduler(bound) == "default-scheduler"
    assert pod_is_terminal(finished) and not pod_is_terminal(bound)
    assert pod_scheduler({"spec": {}}) == "default-scheduler"
    assert pod_key({"metadata": {"name": "x"}}) == "default/x"
