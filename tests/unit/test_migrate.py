"""`kai-ray migrate`: KAI manifests, written from KAI's documented formats, converted.

Each case is a KAI object as its docs and CRDs describe it (Queue `scheduling.run.ai/v2`,
PodGroup `v2alpha2`, Topology and SchedulingShard of `kai.scheduler`, the scheduler's
configuration file, workloads with KAI's labels and annotations), and what kai-ray
gets: the converted object, held to kai-ray's own models by `migrate`, and the
findings that say what changes behaviour.
"""

from __future__ import annotations

from pathlib import Path
from textwrap import dedent
from typing import Any

import pytest
import yaml

from kai_ray.tools.cli import main
from kai_ray.tools.migrate import Document, Migration, migrate
from kai_ray.values.errors import InvalidObjectError


def run(text: str, scheduler_name: str = "kai-ray") -> Migration:
    docs = [Document("kai.yaml", d) for d in yaml.safe_load_all(dedent(text)) if d]
    return migrate(docs, scheduler_name)


def only(text: str) -> tuple[dict[str, Any], Migration]:
    migration = run(text)
    assert len(migration.documents) == 1
    return migration.documents[0], migration


def changes(migration: Migration) -> list[str]:
    return [f"{f.field}: {f.message}" for f in migration.findings if f.changes_behaviour]


def notes(migration: Migration) -> list[str]:
    return [f"{f.field}: {f.message}" for f in migration.findings if not f.changes_behaviour]


def kai_queue(resources: str, **spec: Any) -> str:
    """A KAI Queue `team-a` with these resource blocks (YAML) and spec fields."""
    body = {
        "apiVersion": "scheduling.run.ai/v2",
        "kind": "Queue",
        "metadata": {"name": "team-a"},
        "spec": {**spec, "resources": yaml.safe_load(dedent(resources))},
    }
    return yaml.safe_dump(body)


# ------------------------------------------------------------------------ Queue


def test_queue_of_kai_docs_keeps_units_and_the_limit_that_blocks() -> None:
    # KAI's "Basic Queue": CPU in millicores, no memory block (a limit of 0 in KAI).
    queue, migration = only(
        """
        apiVersion: scheduling.run.ai/v2
        kind: Queue
        metadata: {name: research-team}
        spec:
          displayName: Research Team
          resources:
            cpu: {quota: 1000, limit: 2000}
            gpu: {quota: 1, limit: 2}
        """
    )
    assert queue["apiVersion"] == "scheduling.kai-ray.io/v1alpha1"
    assert queue["spec"] == {
        "priority": 100,
        "resources": {
            "gpu": {"quota": 1, "limit": 2, "overQuotaWeight": 0},
            "cpu": {"quota": 1, "limit": 2, "overQuotaWeight": 0},
            "memory": {"limit": 0, "overQuotaWeight": 0},
        },
    }
    assert not migration.changes_behaviour
    assert any(n.startswith("spec.resources.memory.limit: unset") for n in notes(migration))
    assert any(n.startswith("spec.resources.gpu.overQuotaWeight: unset") for n in notes(migration))
    assert any(n.startswith("spec.displayName") for n in notes(migration))


@pytest.mark.parametrize(
    ("resources", "expected"),
    [
        pytest.param(
            "  memory: {quota: 4096, limit: 8192, overQuotaWeight: 1}",
            {"quota": "4096M", "limit": "8192M", "overQuotaWeight": 1},
            id="memory in megabytes of 10^6 bytes is M",
        ),
        pytest.param(
            "  cpu: {quota: 1500, limit: -1, overQuotaWeight: 2}",
            {"quota": "1.5", "overQuotaWeight": 2},
            id="millicores become cores and limit -1 is no limit",
        ),
        pytest.param(
            "  gpu: {quota: 0.5, limit: 2.5, overQuotaWeight: 0.5}",
            {"quota": "0.5", "limit": "2.5", "overQuotaWeight": 0.5},
            id="fractional GPUs are quoted quantities",
        ),
        pytest.param(
            "  gpu: {quota: -1, limit: 8, overQuotaWeight: 1}",
            {"quota": 8, "limit": 8, "overQuotaWeight": 1},
            id="quota -1 under a limit is that limit",
        ),
        pytest.param(
            "  gpu: {quota: 6, limit: 4, overQuotaWeight: 1}",
            {"quota": 4, "limit": 4, "overQuotaWeight": 1},
            id="a quota above the limit is the limit KAI never exceeds",
        ),
    ],
)
def test_queue_resource_blocks(resources: str, expected: dict[str, Any]) -> None:
    queue, migration = only(kai_queue(resources))
    name = resources.split(":")[0].strip()
    assert queue["spec"]["resources"][name] == expected
    assert not migration.changes_behaviour


def test_quota_minus_one_without_limit_is_a_change_said_once_per_queue() -> None:
    queue, migration = only(
        kai_queue(
            """
              gpu: {quota: -1, limit: -1, overQuotaWeight: 1}
              cpu: {quota: -1, limit: -1, overQuotaWeight: 1}
              memory: {quota: 0, limit: -1, overQuotaWeight: 1}
            """
        )
    )
    assert queue["spec"]["resources"]["gpu"] == {"overQuotaWeight": 1}
    assert queue["spec"]["resources"]["memory"] == {"overQuotaWeight": 1}
    assert migration.changes_behaviour
    (change,) = changes(migration)
    assert change.startswith("spec.resources.{gpu,cpu}.quota: -1 with limit -1")


def test_queue_priority_parent_and_min_runtimes() -> None:
    queue, migration = only(
        kai_queue(
            "  gpu: {quota: 2, limit: -1, overQuotaWeight: 1}",
            parentQueue="dept",
            priority=200,
            preemptMinRuntime="1h0m0s",
        )
    )
    spec = queue["spec"]
    assert (spec["parentQueue"], spec["priority"], spec["preemptMinRuntime"]) == ("dept", 200, "1h")
    assert not migration.changes_behaviour
    root, migration = only(kai_queue("  gpu: {limit: -1}", reclaimMinRuntime="90s"))
    assert root["spec"]["reclaimMinRuntime"] == "1m30s"
    assert not migration.changes_behaviour


def test_reclaim_min_runtime_below_the_root_is_a_change() -> None:
    # KAI reads it at the queue just below the lowest common ancestor; kai-ray at the
    # reclaimed job's queue: a team's own value protects it from other departments too.
    queue, migration = only(
        kai_queue("  gpu: {limit: -1}", parentQueue="dept", reclaimMinRuntime="10m")
    )
    assert queue["spec"]["reclaimMinRuntime"] == "10m"
    assert [c.split(":")[0] for c in changes(migration)] == ["spec.reclaimMinRuntime"]


def test_negative_priority_and_node_pool_label_change_behaviour() -> None:
    queue, migration = only(
        """
        apiVersion: scheduling.run.ai/v2
        kind: Queue
        metadata: {name: q, labels: {kai.scheduler/node-pool: pool-a}}
        spec: {priority: -5, resources: {gpu: {quota: 1, limit: 1}}}
        """
    )
    assert queue["spec"]["priority"] == 0
    fields = [c.split(":")[0] for c in changes(migration)]
    assert fields == ["metadata.labels[kai.scheduler/node-pool]", "spec.priority"]


@pytest.mark.parametrize(
    ("resources", "field", "message"),
    [
        pytest.param(
            "  gpu: {quota: two}", "spec.resources.gpu.quota", "expected a number", id="a word"
        ),
        pytest.param(
            "  cpu: {limit: -3}",
            "spec.resources.cpu.limit",
            "-1 (unlimited) or >= 0",
            id="a negative other than -1",
        ),
        pytest.param(
            "  gpu: {overQuotaWeight: -1}",
            "spec.resources.gpu.overQuotaWeight",
            "must not be negative",
            id="a negative weight",
        ),
        pytest.param("  gpu: 4", "spec.resources.gpu", "expected a mapping", id="not a block"),
    ],
)
def test_bad_queue_is_refused_naming_the_field(resources: str, field: str, message: str) -> None:
    with pytest.raises(InvalidObjectError) as caught:
        run(kai_queue(resources))
    (problem,) = caught.value.problems
    assert (problem.field, str(problem.obj)) == (field, "Queue team-a")
    assert message in problem.message


# --------------------------------------------------------------------- PodGroup


def test_pod_group_fields_renamed_and_defaults_written() -> None:
    group, migration = only(
        """
        apiVersion: scheduling.run.ai/v2alpha2
        kind: PodGroup
        metadata:
          name: train
          namespace: ml
          annotations: {kai.scheduler/last-start-timestamp: "2026-01-01T00:00:00Z"}
        spec:
          queue: team-a
          priorityClassName: train
          preemptibility: non-preemptible
          minSubGroup: 1
          topologyConstraint: {topology: dc, requiredTopologyLevel: block}
          subGroups:
            - {name: leaders, minMember: 1, topologyConstraint: {preferredTopologyLevel: rack}}
            - {name: workers}
          stalenessGracePeriod: 2m0s
          markUnschedulable: true
        """
    )
    assert group["metadata"] == {"name": "train", "namespace": "ml"}
    assert group["spec"] == {
        "queue": "team-a",
        "minMember": 1,
        "minSubGroup": 1,
        "priorityClassName": "train",
        "preemptible": False,
        "topologyConstraint": {"topology": "dc", "requiredLevel": "block"},
        "subGroups": [
            {"name": "leaders", "minMember": 1, "topologyConstraint": {"preferredLevel": "rack"}},
            {"name": "workers", "minMember": 1},
        ],
        "staleGracePeriod": "2m",
    }
    assert not migration.changes_behaviour
    assert len(notes(migration)) == 2  # the KAI-written annotation, markUnschedulable


def test_pod_group_features_kai_ray_lacks_are_changes() -> None:
    group, migration = only(
        """
        apiVersion: scheduling.run.ai/v2alpha2
        kind: PodGroup
        metadata: {name: g, namespace: ml}
        spec:
          queue: team-a
          minMember: 0
          preemptionDelay: 5m
          stalenessGracePeriod: -1s
          subGroups:
            - {name: mid, minSubGroup: 1}
            - {name: leaf, parent: mid, minMember: 2}
        """
    )
    assert group["spec"]["minMember"] == 0
    assert "staleGracePeriod" not in group["spec"]
    fields = sorted(c.split(":")[0] for c in changes(migration))
    assert fields == [
        "spec.preemptionDelay",
        "spec.stalenessGracePeriod",
        "spec.subGroups[0].minSubGroup",
    ]


def test_pod_group_without_queue_is_refused() -> None:
    with pytest.raises(InvalidObjectError) as caught:
        run("apiVersion: scheduling.run.ai/v2alpha2\nkind: PodGroup\nmetadata: {name: g}\nspec: {}")
    assert caught.value.problems[0].field == "spec.queue"


def test_topology_levels_and_aliases() -> None:
    topology, migration = only(
        """
        apiVersion: kai.scheduler/v1alpha1
        kind: Topology
        metadata: {name: dc}
        spec:
          levels:
            - {nodeLabel: cloud.example.com/block, alias: block}
            - {nodeLabel: cloud.example.com/rack}
            - {nodeLabel: kubernetes.io/hostname}
        """
    )
    assert topology["kind"] == "Topology"
    assert topology["spec"]["levels"] == [
        {"nodeLabel": "cloud.example.com/block", "alias": "block"},
        {"nodeLabel": "cloud.example.com/rack"},
        {"nodeLabel": "kubernetes.io/hostname"},
    ]
    assert not migration.findings


# ------------------------------------------------------------ scheduler settings


def test_shard_with_usage_database_turns_time_based_fairness_on() -> None:
    config, migration = only(
        """
        apiVersion: kai.scheduler/v1
        kind: SchedulingShard
        metadata: {name: default}
        spec:
          kValue: 0.5
          usageDBConfig:
            clientType: prometheus
            usageParams:
              windowSize: 1w
              windowType: tumbling
              tumblingWindowStartTime: "2026-01-05T00:00:00Z"
              halfLifePeriod: 10m
              fetchInterval: 30s
          actions:
            preempt: {enabled: false}
          args:
            max-consolidation-preemptees: "4"
            default-staleness-grace-period: 2m
        """
    )
    assert config["kind"] == "SchedulerConfig"
    spec = config["spec"]
    assert spec["schedulerName"] == "kai-ray"
    assert spec["actions"] == ["allocate", "consolidate", "reclaim", "stale-gang-eviction"]
    assert spec["timeBasedFairness"] == {
        "k": 0.5,
        "halfLife": "10m",
        "window": "168h",
        "windowType": "tumbling",
        "tumblingWindowStartTime": "2026-01-05T00:00:00Z",
    }
    assert (spec["consolidationMaxJobs"], spec["staleGangGracePeriod"]) == (4, "2m")
    assert not migration.changes_behaviour


def test_shard_defaults_are_kais_where_kai_rays_differ() -> None:
    config, migration = only(
        "apiVersion: kai.scheduler/v1\nkind: SchedulingShard\nmetadata: {name: default}\nspec: {}"
    )
    spec = config["spec"]
    assert spec["timeBasedFairness"] == {
        "k": 0,
        "halfLife": "0s",
        "window": "168h",
        "windowType": "sliding",
    }
    assert spec["consolidationMaxJobs"] == 16
    assert spec["actions"] == [
        "allocate",
        "consolidate",
        "reclaim",
        "preempt",
        "stale-gang-eviction",
    ]
    assert (spec["cyclePeriod"], spec["staleGangGracePeriod"]) == ("1s", "60s")
    assert spec["consolidationMinRuntime"] == "0s"  # KAI moves gangs of any age
    assert not migration.findings


def test_shard_plugin_arguments_replace_kvalue_and_spread_drops_consolidation() -> None:
    config, migration = only(
        """
        apiVersion: kai.scheduler/v1
        kind: SchedulingShard
        metadata: {name: default}
        spec:
          kValue: 0.5
          usageDBConfig: {clientType: prometheus}
          placementStrategy: {gpu: spread, cpu: spread}
          plugins:
            proportion: {arguments: {kValue: "2.0"}}
            actions: {}
          actions:
            reclaim: {priority: 600}
        """
    )
    spec = config["spec"]
    assert spec["timeBasedFairness"]["k"] == 2
    assert spec["placementStrategy"] == "spread"
    assert spec["actions"] == ["reclaim", "allocate", "preempt", "stale-gang-eviction"]
    assert not migration.changes_behaviour


def test_shard_settings_kai_ray_lacks_are_changes() -> None:
    _, migration = only(
        """
        apiVersion: kai.scheduler/v1
        kind: SchedulingShard
        metadata: {name: pool-a}
        spec:
          partitionLabelValue: pool-a
          placementStrategy: {gpu: binpack, cpu: spread}
          queueDepthPerAction: {reclaim: 10}
          minRuntime: {preemptMinRuntime: 5m}
          plugins:
            elastic: {enabled: false}
            proportion: {arguments: {relcaimerSaturationMultiplier: "1.5"}}
          actions:
            snapshotaction: {enabled: true}
          args:
            detailed-fit-errors: "true"
        """
    )
    fields = sorted(c.split(":")[0] for c in changes(migration))
    assert fields == [
        "spec.actions.snapshotaction",
        "spec.args.detailed-fit-errors",
        "spec.minRuntime.preemptMinRuntime",
        "spec.partitionLabelValue",
        "spec.placementStrategy",
        "spec.plugins.elastic.enabled",
        "spec.plugins.proportion.arguments.relcaimerSaturationMultiplier",
        "spec.queueDepthPerAction",
    ]


def test_kai_scheduler_configuration_file_in_its_config_map() -> None:
    config, migration = only(
        """
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: scheduler-config, namespace: kai-scheduler}
        data:
          config.yaml: |
            actions: "allocate, reclaim, preempt"
            tiers:
            - plugins:
              - name: predicates
              - name: proportion
                arguments: {kValue: "1.5"}
              - name: minruntime
                arguments: {defaultReclaimMinRuntime: 10m}
            usageDBConfig:
              clientType: prometheus
              usageParams: {windowSize: 2d, windowType: sliding}
        """
    )
    spec = config["spec"]
    assert spec["actions"] == ["allocate", "reclaim", "preempt"]
    assert spec["timeBasedFairness"]["k"] == 1.5
    assert spec["timeBasedFairness"]["window"] == "48h"
    assert [c.split(":")[0] for c in changes(migration)] == ["spec.minRuntime.reclaimMinRuntime"]


def test_node_placement_arguments_replace_the_placement_strategy() -> None:
    config, migration = only(
        """
        apiVersion: kai.scheduler/v1
        kind: SchedulingShard
        metadata: {name: default}
        spec:
          placementStrategy: {gpu: binpack, cpu: binpack}
          plugins:
            nodeplacement: {arguments: {gpu: spread, cpu: binpack}}
        """
    )
    assert config["spec"]["placementStrategy"] == "spread"
    assert [c.split(":")[0] for c in changes(migration)] == ["spec.plugins.nodeplacement.arguments"]
    file_config, file_migration = only(
        """
        actions: "allocate, reclaim"
        tiers:
        - plugins:
          - name: nodeplacement
            arguments: {gpu: spread, cpu: spread}
        """
    )
    assert file_config["spec"]["placementStrategy"] == "spread"
    assert file_config["spec"]["actions"] == ["allocate", "reclaim"]
    assert not file_migration.changes_behaviour


def test_bad_window_is_refused_naming_the_field() -> None:
    with pytest.raises(InvalidObjectError) as caught:
        run(
            """
            apiVersion: kai.scheduler/v1
            kind: SchedulingShard
            metadata: {name: default}
            spec: {usageDBConfig: {clientType: prometheus, usageParams: {windowSize: a week}}}
            """
        )
    assert caught.value.problems[0].field == "spec.usageDBConfig.usageParams.windowSize"


def test_shard_window_type_kai_ray_refuses_names_the_field() -> None:
    with pytest.raises(InvalidObjectError) as caught:
        run(
            """
            apiVersion: kai.scheduler/v1
            kind: SchedulingShard
            metadata: {name: default}
            spec: {usageDBConfig: {clientType: prometheus, usageParams: {windowType: hourly}}}
            """
        )
    assert caught.value.problems[0].field == "spec.timeBasedFairness.windowType"


# -------------------------------------------------------------------- workloads


def test_job_labels_annotations_and_scheduler_name() -> None:
    job, migration = only(
        """
        apiVersion: batch/v1
        kind: Job
        metadata:
          name: train
          labels: {kai.scheduler/queue: team-a}
          annotations:
            kai.scheduler/batch-min-member: "4"
            kai.scheduler/topology: dc
            kai.scheduler/topology-required-placement: rack
        spec:
          parallelism: 4
          template:
            metadata:
              annotations: {gpu-memory: "2000", runai/shared-gpu-configmap: x}
            spec:
              schedulerName: kai-scheduler
              restartPolicy: Never
              containers: [{name: c, image: busybox}]
        """
    )
    assert job["metadata"]["labels"] == {"kai-ray.io/queue": "team-a"}
    assert job["metadata"]["annotations"] == {
        "kai-ray.io/min-member": "4",
        "kai-ray.io/topology": "dc",
        "kai-ray.io/topology-required": "rack",
    }
    template = job["spec"]["template"]
    assert template["metadata"]["annotations"] == {"kai-ray.io/gpu-memory": "2000Mi"}
    assert template["spec"]["schedulerName"] == "kai-ray"
    assert not migration.changes_behaviour


def test_pod_without_queue_label_goes_to_kais_default_queue() -> None:
    pod, migration = only(
        """
        apiVersion: v1
        kind: Pod
        metadata: {name: p, annotations: {gpu-fraction: "0.5", mps: "true"}}
        spec: {schedulerName: kai-scheduler, containers: [{name: c, image: busybox}]}
        """
    )
    assert pod["metadata"]["labels"] == {"kai-ray.io/queue": "default-queue"}
    assert pod["metadata"]["annotations"] == {"kai-ray.io/gpu-fraction": "0.5", "mps": "true"}
    assert [c.split(":")[0] for c in changes(migration)] == ["metadata.annotations[mps]"]
    (missing,) = [f for f in migration.findings if f.obj == "Queue default-queue"]
    assert missing.message.startswith("1 converted workload(s) go to it, and it is not among")


def test_pod_joining_a_pod_group_takes_its_queue_from_the_group() -> None:
    pod, migration = only(
        """
        apiVersion: v1
        kind: Pod
        metadata: {name: p, annotations: {pod-group-name: infer}}
        spec: {schedulerName: kai-scheduler, containers: [{name: c, image: busybox}]}
        """
    )
    assert pod["metadata"] == {"name": "p", "annotations": {"kai-ray.io/pod-group": "infer"}}
    assert not migration.findings


def test_deployment_of_kai_needs_an_explicit_pod_group() -> None:
    _, migration = only(
        """
        apiVersion: apps/v1
        kind: Deployment
        metadata: {name: serve, labels: {kai.scheduler/queue: team-a}}
        spec:
          template:
            metadata: {labels: {kai.scheduler/preemptibility: non-preemptible}}
            spec: {schedulerName: kai-scheduler, containers: [{name: c, image: busybox}]}
        """
    )
    fields = [c.split(":")[0] for c in changes(migration)]
    assert fields == ["spec.template.metadata.labels[kai.scheduler/preemptibility]", "kind"]


def test_ray_cluster_templates_name_the_scheduler_and_priority_label_moves() -> None:
    cluster, migration = only(
        """
        apiVersion: ray.io/v1
        kind: RayCluster
        metadata: {name: rc, labels: {kai.scheduler/queue: team-a, priorityClassName: inference}}
        spec:
          headGroupSpec: {template: {spec: {containers: [{name: head, image: ray}]}}}
          workerGroupSpecs:
            - groupName: w
              replicas: 1
              template: {spec: {containers: [{name: w, image: ray}]}}
        """
    )
    assert cluster["metadata"]["labels"] == {
        "kai-ray.io/queue": "team-a",
        "ray.io/priority-class-name": "inference",
    }
    assert cluster["spec"]["headGroupSpec"]["template"]["spec"]["schedulerName"] == "kai-ray"
    worker = cluster["spec"]["workerGroupSpecs"][0]["template"]["spec"]
    assert worker["schedulerName"] == "kai-ray"
    assert not migration.changes_behaviour


def test_kai_config_names_the_scheduler_and_its_queue_label() -> None:
    migration = run(
        """
        apiVersion: kai.scheduler/v1
        kind: Config
        metadata: {name: kai-config}
        spec:
          global: {schedulerName: gpu-scheduler, queueLabelKey: team}
          prometheus: {enabled: true}
        ---
        apiVersion: v1
        kind: Pod
        metadata: {name: p, labels: {kai.scheduler/queue: team-a}}
        spec: {schedulerName: gpu-scheduler, containers: [{name: c, image: busybox}]}
        ---
        apiVersion: v1
        kind: Pod
        metadata: {name: other}
        spec: {schedulerName: kai-scheduler, containers: [{name: c, image: busybox}]}
        """,
        scheduler_name="kai-scheduler",
    )
    pod, other = migration.documents
    assert pod["spec"]["schedulerName"] == "kai-scheduler"
    assert other == {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "other"},
        "spec": {
            "schedulerName": "kai-scheduler",
            "containers": [{"name": "c", "image": "busybox"}],
        },
    }
    assert [c.split(":")[0] for c in changes(migration)] == ["spec.global.queueLabelKey"]


def test_objects_of_neither_pass_unchanged_and_bind_requests_go() -> None:
    migration = run(
        """
        apiVersion: scheduling.k8s.io/v1
        kind: PriorityClass
        metadata: {name: train}
        value: 50
        ---
        apiVersion: scheduling.run.ai/v1alpha2
        kind: BindRequest
        metadata: {name: b, namespace: ml}
        spec: {podName: p, selectedNode: n1}
        """
    )
    assert migration.documents == [
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": "train"},
            "value": 50,
        }
    ]
    assert not migration.changes_behaviour


# ------------------------------------------------------------------ the command


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(dedent(text))
    return path


def test_command_exit_statuses_and_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    exact = write(
        tmp_path, "exact.yaml", kai_queue("gpu: {quota: 2, limit: 4, overQuotaWeight: 1}")
    )
    output = tmp_path / "out.yaml"
    assert main(["migrate", str(exact), "-o", str(output)]) == 0
    (queue,) = yaml.safe_load_all(output.read_text())
    assert queue["spec"]["resources"]["gpu"] == {"quota": 2, "limit": 4, "overQuotaWeight": 1}
    assert "1 documents written, 0 changes of behaviour" in capsys.readouterr().err

    changed = write(tmp_path, "changed.yaml", kai_queue("gpu: {quota: -1, limit: -1}"))
    assert main(["migrate", str(changed)]) == 1
    captured = capsys.readouterr()
    assert "kind: Queue" in captured.out
    assert captured.err.startswith(
        f"kai-ray migrate: changes behaviour: {changed}: Queue team-a: spec.resources.{{gpu}}.quota"
    )

    broken = write(tmp_path, "broken.yaml", kai_queue("gpu: {quota: many}"))
    assert main(["migrate", str(broken), str(changed)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        f"kai-ray migrate: invalid input: {broken}: Queue team-a: spec.resources.gpu.quota: "
        "expected a number, got 'many'\n"
    )


def test_command_reads_folders_and_lists(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "kai"
    folder.mkdir()
    listed = {
        "apiVersion": "v1",
        "kind": "List",
        "items": [yaml.safe_load(kai_queue("gpu: {limit: -1}"))],
    }
    (folder / "queues.yml").write_text(yaml.safe_dump(listed))
    write(folder, "notes.txt", "not read")
    assert main(["migrate", str(folder)]) == 0
    (queue,) = yaml.safe_load_all(capsys.readouterr().out)
    assert queue["spec"]["resources"]["gpu"] == {"overQuotaWeight": 0}


def test_command_refuses_what_is_not_yaml(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = write(tmp_path, "bad.yaml", "kind: [unclosed\n")
    assert main(["migrate", str(bad)]) == 2
    assert capsys.readouterr().err.startswith(
        f"kai-ray migrate: invalid input: File {bad}: (file): "
    )


# ------------------------------------------------- KAI's key kai-ray reads as its own


def test_kais_gpu_fraction_is_read_and_a_bad_one_named() -> None:
    from kai_ray.values.errors import InvalidFieldError
    from kai_ray.workloads.pod_fields import gpu_share

    share = gpu_share({"metadata": {"annotations": {"gpu-fraction": "0.25"}}})
    assert share is not None and share.fraction == 0.25
    with pytest.raises(InvalidFieldError) as caught:
        gpu_share({"metadata": {"annotations": {"gpu-fraction": "half"}}})
    assert caught.value.field == "metadata.annotations[gpu-fraction]"


# ------------------------------------------------------------------------ units


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        pytest.param("1h0m0s", 3600.0, id="Go's own spelling of an hour"),
        pytest.param("1.5h", 5400.0, id="a fraction of an hour"),
        pytest.param("300ms", 0.3, id="milliseconds"),
        pytest.param("-1s", -1.0, id="negative: never"),
        pytest.param("0", 0.0, id="a bare zero"),
    ],
)
def test_go_durations(text: str, seconds: float) -> None:
    from kai_ray.tools.migrate.units import go_duration_seconds

    assert go_duration_seconds(text, "f") == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("text", "written"),
    [
        pytest.param("1w", "168h", id="a week"),
        pytest.param("1w2d", "216h", id="a week and two days"),
        pytest.param("90m", "1h30m", id="minutes"),
    ],
)
def test_prometheus_windows_in_kai_ray_spelling(text: str, written: str) -> None:
    from kai_ray.tools.migrate.units import duration_text, prometheus_duration_seconds

    assert duration_text(prometheus_duration_seconds(text, "f")) == written


@pytest.mark.parametrize("text", ["1 week", "5", "1d-2h", ""])
def test_bad_windows_name_the_field(text: str) -> None:
    from kai_ray.tools.migrate.units import prometheus_duration_seconds
    from kai_ray.values.errors import InvalidFieldError

    with pytest.raises(InvalidFieldError) as caught:
        prometheus_duration_seconds(text, "spec.usageDBConfig.usageParams.windowSize")
    assert caught.value.field == "spec.usageDBConfig.usageParams.windowSize"


def test_two_documents_that_become_one_object_are_refused() -> None:
    with pytest.raises(InvalidObjectError) as caught:
        migrate(
            [
                Document("a.yaml", yaml.safe_load(kai_queue("gpu: {quota: 1, limit: 1}"))),
                Document("b.yaml", yaml.safe_load(kai_queue("gpu: {quota: 2, limit: 2}"))),
            ]
        )
    (problem,) = caught.value.problems
    assert (
        str(problem)
        == "b.yaml: Queue team-a: metadata.name: written already, from a.yaml; keep one"
    )


def test_children_over_their_parents_quota_are_a_change_kai_ray_refuses() -> None:
    migration = run(
        """
        apiVersion: scheduling.run.ai/v2
        kind: Queue
        metadata: {name: dept}
        spec: {resources: {gpu: {quota: 8, limit: -1, overQuotaWeight: 1}}}
        ---
        apiVersion: scheduling.run.ai/v2
        kind: Queue
        metadata: {name: a}
        spec: {parentQueue: dept, resources: {gpu: {quota: 6, limit: -1, overQuotaWeight: 1}}}
        ---
        apiVersion: scheduling.run.ai/v2
        kind: Queue
        metadata: {name: b}
        spec: {parentQueue: dept, resources: {gpu: {quota: 4, limit: -1, overQuotaWeight: 1}}}
        """
    )
    over = [f for f in migration.findings if f.obj == "Queue dept" and f.changes_behaviour]
    assert [(f.field, f.message.split(":")[0]) for f in over] == [
        (
            "spec.resources.gpu.quota",
            "the quotas of its children (a, b) add up to 10 gpu, more than its quota of 8",
        )
    ]
