"""Malformed simulator input: exit status 2 and one line naming file, object and field."""

from __future__ import annotations

from pathlib import Path
from textwrap import dedent

import pytest

from kai_ray.tools.cli import EXIT_INVALID_INPUT, main

BASE = """\
apiVersion: v1
kind: Node
metadata: {name: n1}
status: {capacity: {cpu: "8", memory: 64Gi, nvidia.com/gpu: 8}}
---
apiVersion: scheduling.kai-ray.io/v1alpha1
kind: Queue
metadata: {name: org}
---
apiVersion: scheduling.kai-ray.io/v1alpha1
kind: Queue
metadata: {name: team}
spec: {parentQueue: org, namespaces: [ml]}
---
apiVersion: scheduling.kai-ray.io/v1alpha1
kind: Topology
metadata: {name: dc}
spec:
  levels:
    - {nodeLabel: kai-ray.io/rack, alias: rack}
    - {nodeLabel: kubernetes.io/hostname, alias: node}
"""

QUEUE = "apiVersion: scheduling.kai-ray.io/v1alpha1\nkind: Queue\n"
PG = "apiVersion: scheduling.kai-ray.io/v1alpha1\nkind: PodGroup\n"
TOPO = "apiVersion: scheduling.kai-ray.io/v1alpha1\nkind: Topology\n"
POOL = "apiVersion: sim.kai-ray.io/v1alpha1\nkind: NodePool\n"
CONFIG = "apiVersion: config.kai-ray.io/v1alpha1\nkind: SchedulerConfig\n"
NODE = "apiVersion: v1\nkind: Node\n"
POD_SPEC = (
    "spec: {schedulerName: kai-ray, containers: [{name: c, resources: {requests: {cpu: '1'}}}]}"
)
JOB_TEMPLATE = (
    "  template: {spec: {schedulerName: kai-ray, restartPolicy: Never, "
    "containers: [{name: c, resources: {requests: {cpu: '1'}}}]}}\n"
)


def pod(meta: str, spec: str = POD_SPEC) -> str:
    return f"apiVersion: v1\nkind: Pod\nmetadata: {meta}\n{spec}\n"


def job(meta: str, spec: str = "  parallelism: 2\n") -> str:
    return f"apiVersion: batch/v1\nkind: Job\nmetadata: {meta}\nspec:\n{spec}{JOB_TEMPLATE}"


RAY_HEAD = (
    "  headGroupSpec: {rayStartParams: {}, template: {spec: {containers: "
    "[{name: h, resources: {requests: {cpu: '1'}}}]}}}\n"
)
RAY_WORKER_TEMPLATE = (
    "template: {spec: {containers: [{name: w, resources: {requests: {cpu: '1'}}}]}}"
)


def raycluster(
    workers: str, meta: str = "{name: rc, namespace: ml, labels: {kai-ray.io/queue: team}}"
) -> str:
    return f"apiVersion: ray.io/v1\nkind: RayCluster\nmetadata: {meta}\nspec:\n{RAY_HEAD}{workers}"


def worker(fields: str) -> str:
    return f"  workerGroupSpecs:\n    - {{{fields}, {RAY_WORKER_TEMPLATE}}}\n"


CASES = [
    # ---- queues
    pytest.param(
        QUEUE + "metadata: {name: q1}\nspec: {resources: {gpu: {quota: 8, limit: 4}}}",
        "Queue q1",
        "spec.resources.gpu",
        id="queue quota above its limit",
    ),
    pytest.param(
        QUEUE + "metadata: {name: q1}\nspec: {resources: {gpu: {quota: -1}}}",
        "Queue q1",
        "spec.resources.gpu.quota",
        id="queue negative quota",
    ),
    pytest.param(
        QUEUE + "metadata: {name: q1}\nspec: {resources: {cpu: {limit: lots}}}",
        "Queue q1",
        "spec.resources.cpu.limit",
        id="queue limit not a quantity",
    ),
    pytest.param(
        QUEUE + "metadata: {name: q1}\nspec: {resources: {gpu: {quota: 0.5}}}",
        "Queue q1",
        "spec.resources.gpu.quota",
        id="queue fractional quota not quoted",
    ),
    pytest.param(
        QUEUE + "metadata: {name: q1}\nspec: {resources: {gpu: {overQuotaWeight: -2}}}",
        "Queue q1",
        "spec.resources.gpu.overQuotaWeight",
        id="queue negative weight",
    ),
    pytest.param(
        QUEUE + "metadata: {name: q1}\nspec: {priority: high}",
        "Queue q1",
        "spec.priority",
        id="queue priority not a number",
    ),
    pytest.param(
        QUEUE + "metadata: {name: q1}\nspec: {parentQueue: nowhere}",
        "Queue q1",
        "spec.parentQueue",
        id="queue parent missing",
    ),
    pytest.param(
        QUEUE
        + "metadata: {name: q1}\nspec: {parentQueue: q2}\n---\n"
        + QUEUE
        + "metadata: {name: q2}\nspec: {parentQueue: q1}",
        "Queue q1",
        "spec.parentQueue",
        id="queue parents form a cycle",
    ),
    pytest.param(
        QUEUE + "metadata: {name: q1}\nspec: {preemptMinRuntime: soon}",
        "Queue q1",
        "spec.preemptMinRuntime",
        id="queue min runtime not a duration",
    ),
    pytest.param(
        QUEUE + "metadata: {name: q1}\nspec: {quota: 3}",
        "Queue q1",
        "spec.quota",
        id="queue unknown field",
    ),
    pytest.param(
        QUEUE + "metadata: {name: org}", "Queue org", "metadata.name", id="queue name used twice"
    ),
    pytest.param(
        QUEUE + "metadata: {}\nspec: {}",
        "Queue (no name)",
        "metadata.name",
        id="queue without a name",
    ),
    # ---- podgroups
    pytest.param(
        PG + "metadata: {name: g, namespace: ml}\nspec: {queue: team, minMember: -1}",
        "PodGroup ml/g",
        "spec.minMember",
        id="podgroup negative minMember",
    ),
    pytest.param(
        PG + "metadata: {name: g, namespace: ml}\nspec: {minMember: 1}",
        "PodGroup ml/g",
        "spec.queue",
        id="podgroup without a queue",
    ),
    pytest.param(
        PG + "metadata: {name: g, namespace: ml}\nspec: {queue: ghost}",
        "PodGroup ml/g",
        "spec.queue",
        id="podgroup queue missing",
    ),
    pytest.param(
        PG + "metadata: {name: g, namespace: ml}\nspec: {queue: org}",
        "PodGroup ml/g",
        "spec.queue",
        id="podgroup queue not a leaf",
    ),
    pytest.param(
        PG + "metadata: {name: g, namespace: other}\nspec: {queue: team}",
        "PodGroup other/g",
        "spec.queue",
        id="podgroup namespace not admitted by queue",
    ),
    pytest.param(
        PG + "metadata: {name: g, namespace: ml}\nspec: {queue: team, subGroups: "
        "[{name: a}, {name: a}]}",
        "PodGroup ml/g",
        "spec.subGroups[1].name",
        id="podgroup duplicate subgroup names",
    ),
    pytest.param(
        PG + "metadata: {name: g, namespace: ml}\nspec: {queue: team, subGroups: "
        "[{name: a, parent: b}]}",
        "PodGroup ml/g",
        "spec.subGroups[0].parent",
        id="podgroup subgroup parent missing",
    ),
    pytest.param(
        PG + "metadata: {name: g, namespace: ml}\nspec: {queue: team, minSubGroup: 2, "
        "subGroups: [{name: a}]}",
        "PodGroup ml/g",
        "spec.minSubGroup",
        id="podgroup minSubGroup above subgroup count",
    ),
    pytest.param(
        PG + "metadata: {name: g, namespace: ml}\nspec: {queue: team, "
        "topologyConstraint: {topology: nope, requiredLevel: rack}}",
        "PodGroup ml/g",
        "spec.topologyConstraint.topology",
        id="podgroup topology missing",
    ),
    pytest.param(
        PG + "metadata: {name: g, namespace: ml}\nspec: {queue: team, "
        "topologyConstraint: {topology: dc, requiredLevel: zone}}",
        "PodGroup ml/g",
        "spec.topologyConstraint.requiredLevel",
        id="podgroup topology level missing",
    ),
    pytest.param(
        PG + "metadata: {name: g, namespace: ml, annotations: "
        "{sim.kai-ray.io/submit-at: yesterday}}\nspec: {queue: team}",
        "PodGroup ml/g",
        "metadata.annotations[sim.kai-ray.io/submit-at]",
        id="podgroup submit-at not a duration",
    ),
    pytest.param(
        pod("{name: p, namespace: ml, annotations: {kai-ray.io/pod-group: ghost}}"),
        "Pod ml/p",
        "metadata.annotations[kai-ray.io/pod-group]",
        id="pod names a podgroup that does not exist",
    ),
    # ---- topologies
    pytest.param(
        TOPO + "metadata: {name: t}\nspec: {levels: [{nodeLabel: a}, {nodeLabel: a}]}",
        "Topology t",
        "spec.levels[1]",
        id="topology duplicate level",
    ),
    pytest.param(
        TOPO + "metadata: {name: t}\nspec: {levels: []}",
        "Topology t",
        "spec.levels",
        id="topology without levels",
    ),
    pytest.param(
        TOPO + "metadata: {name: t}\nspec: {levels: [{alias: rack}]}",
        "Topology t",
        "spec.levels[0].nodeLabel",
        id="topology level without label",
    ),
    # ---- workloads
    pytest.param(
        pod("{name: p, namespace: ml}"),
        "Pod ml/p",
        "kai-ray.io/queue",
        id="bare pod without a queue label",
    ),
    pytest.param(
        pod("{name: p, namespace: ml, labels: {kai-ray.io/queue: ghost}}"),
        "Pod ml/p",
        "kai-ray.io/queue",
        id="bare pod queue missing",
    ),
    pytest.param(
        pod(
            "{name: p, namespace: ml, labels: {kai-ray.io/queue: team}}",
            "spec: {containers: [{name: c, resources: {requests: {cpu: '-2'}}}]}",
        ),
        "Pod ml/p",
        "cpu",
        id="bare pod negative cpu",
    ),
    pytest.param(
        pod(
            "{name: p, namespace: ml, labels: {kai-ray.io/queue: team}, annotations: "
            "{sim.kai-ray.io/duration: forever}}"
        ),
        "Pod ml/p",
        "sim.kai-ray.io/duration",
        id="pod duration not a duration",
    ),
    pytest.param(
        pod(
            "{name: p, namespace: ml, labels: {kai-ray.io/queue: team}, annotations: "
            "{kai-ray.io/gpu-fraction: '1.5'}}"
        ),
        "Pod ml/p",
        "kai-ray.io/gpu-fraction",
        id="pod gpu fraction above one",
    ),
    pytest.param(
        job(
            "{name: j, namespace: ml, labels: {kai-ray.io/queue: team}, annotations: "
            "{kai-ray.io/min-member: many}}"
        ),
        "Job ml/j",
        "kai-ray.io/min-member",
        id="job min-member not an integer",
    ),
    pytest.param(
        job(
            "{name: j, namespace: ml, labels: {kai-ray.io/queue: team}, annotations: "
            "{kai-ray.io/min-member: '5'}}"
        ),
        "Job ml/j",
        "kai-ray.io/min-member",
        id="job min-member above parallelism",
    ),
    pytest.param(
        job("{name: j, namespace: ml, labels: {kai-ray.io/queue: team}}", "  parallelism: -1\n"),
        "Job ml/j",
        "spec.parallelism",
        id="job negative parallelism",
    ),
    pytest.param(
        job(
            "{name: j, namespace: ml, labels: {kai-ray.io/queue: team}, annotations: "
            "{kai-ray.io/topology-required: rack}}"
        ),
        "Job ml/j",
        "kai-ray.io/topology",
        id="job level without topology",
    ),
    pytest.param(
        raycluster(worker("groupName: w, replicas: 2, minReplicas: -1")),
        "RayCluster ml/rc",
        "spec.workerGroupSpecs[0].minReplicas",
        id="raycluster negative minReplicas",
    ),
    pytest.param(
        raycluster(worker("groupName: w, replicas: 1, numOfHosts: 0")),
        "RayCluster ml/rc",
        "spec.workerGroupSpecs[0].numOfHosts",
        id="raycluster zero numOfHosts",
    ),
    pytest.param(
        raycluster(worker("replicas: 1")),
        "RayCluster ml/rc",
        "spec.workerGroupSpecs[0].groupName",
        id="raycluster worker without groupName",
    ),
    pytest.param(
        raycluster(worker("groupName: w, minReplicas: 4, maxReplicas: 2")),
        "RayCluster ml/rc",
        "spec.workerGroupSpecs[0]",
        id="raycluster minReplicas above maxReplicas",
    ),
    pytest.param(
        raycluster(worker("groupName: w, replicas: 1"), "{name: rc, namespace: ml}"),
        "RayCluster ml/rc",
        "kai-ray.io/queue",
        id="raycluster without a queue label",
    ),
    pytest.param(
        "apiVersion: ray.io/v1\nkind: RayJob\nmetadata: {name: rj, namespace: ml, "
        "labels: {kai-ray.io/queue: team}}\nspec: {entrypoint: x, clusterSelector: "
        "{ray.io/cluster: c}}",
        "RayJob ml/rj",
        "spec.rayClusterSpec",
        id="rayjob without rayClusterSpec",
    ),
    # ---- nodes and node pools
    pytest.param(
        NODE + "metadata: {name: n2}\nstatus: {capacity: {cpu: many}}",
        "Node n2",
        "status.capacity.cpu",
        id="node capacity not a quantity",
    ),
    pytest.param(
        NODE + "metadata: {name: n2}\nstatus: {}",
        "Node n2",
        "status.capacity",
        id="node without capacity",
    ),
    pytest.param(
        NODE + "metadata: {name: n1}\nstatus: {capacity: {cpu: '1'}}",
        "Node n1",
        "metadata.name",
        id="node name used twice",
    ),
    pytest.param(
        POOL + "metadata: {name: p}\nspec: {count: 0, namePrefix: g, capacity: {cpu: 1}}",
        "NodePool p",
        "spec.count",
        id="nodepool zero count",
    ),
    pytest.param(
        POOL + "metadata: {name: p}\nspec: {count: 2, namePrefix: G_1, capacity: {cpu: 1}}",
        "NodePool p",
        "spec.namePrefix",
        id="nodepool bad name prefix",
    ),
    pytest.param(
        POOL + "metadata: {name: p}\nspec: {count: 2, namePrefix: g}",
        "NodePool p",
        "spec.capacity",
        id="nodepool without capacity",
    ),
    pytest.param(
        POOL + "metadata: {name: p}\nspec: {count: 2, namePrefix: g, capacity: "
        "{nvidia.com/gpu: -8}}",
        "NodePool p",
        "spec.capacity[nvidia.com/gpu]",
        id="nodepool negative gpus",
    ),
    pytest.param(
        POOL + "metadata: {name: p}\nspec: {count: 2, namePrefix: g, capacity: {cpu: 1}, "
        "topology: [{label: rack, domains: 4}]}",
        "NodePool p",
        "spec.topology",
        id="nodepool more domains than nodes",
    ),
    pytest.param(
        POOL + "metadata: {name: p}\nspec: {count: 4, namePrefix: g, capacity: {cpu: 1}, "
        "topology: [{label: rack, domains: 2}, {label: rack, domains: 2}]}",
        "NodePool p",
        "spec.topology[1].label",
        id="nodepool level used twice",
    ),
    pytest.param(
        POOL + "metadata: {name: p}\nspec: {count: 2, namePrefix: g, capacity: {cpu: 1}, "
        "taints: [{key: k, effect: Sometimes}]}",
        "NodePool p",
        "spec.taints[0].effect",
        id="nodepool taint effect unknown",
    ),
    # ---- config and documents
    pytest.param(
        CONFIG + "metadata: {name: c}\nspec: {cyclePeriod: often}",
        "SchedulerConfig c",
        "spec.cyclePeriod",
        id="config cycle period not a duration",
    ),
    pytest.param(
        CONFIG + "metadata: {name: c}\nspec: {placementStrategy: random}",
        "SchedulerConfig c",
        "spec.placementStrategy",
        id="config unknown strategy",
    ),
    pytest.param(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}",
        "Deployment d",
        "apiVersion/kind",
        id="unsupported kind",
    ),
    pytest.param("- just\n- a list\n", "File", "document 1", id="document not a mapping"),
    pytest.param(
        "kind: Queue\nmetadata: {name: [unclosed\n", "File", "line", id="yaml syntax error"
    ),
]


@pytest.mark.parametrize(("document", "obj", "field"), CASES)
def test_invalid_input_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], document: str, obj: str, field: str
) -> None:
    (tmp_path / "base.yaml").write_text(BASE)
    bad = tmp_path / "bad.yaml"
    bad.write_text(dedent(document))
    status = main(["simulate", str(tmp_path), "--quiet"])
    err = capsys.readouterr().err
    assert status == EXIT_INVALID_INPUT
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert str(bad) in lines[0] or "base.yaml" in lines[0]
    assert obj in lines[0], lines[0]
    assert field in lines[0], lines[0]


def test_there_are_at_least_forty_malformed_inputs() -> None:
    assert len(CASES) >= 40


def test_missing_input_path(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "/nonexistent/input.yaml", "--quiet"]) == EXIT_INVALID_INPUT
    assert "/nonexistent/input.yaml" in capsys.readouterr().err
