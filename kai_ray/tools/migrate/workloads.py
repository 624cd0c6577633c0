"""KAI's labels, annotations and scheduler name on workloads, as kai-ray's.

Every `metadata` in a workload (its own and its pod templates') is rewritten:
KAI's keys become kai-ray's where the meaning is the same (the queue, the
PodGroup a pod joins, the topology constraint, a batch Job's gang minimum, a GPU
fraction; `gpu-memory` in MiB becomes a quantity), keys KAI writes itself are
dropped, and keys for features kai-ray lacks are kept and reported as changes.
Pod specs naming KAI's scheduler name kai-ray's. A workload of KAI's without a
queue label (and no PodGroup named) went to KAI's `default-queue`, and is
labelled so. Pure: no I/O.
"""

from __future__ import annotations

import copy
from typing import Any

from kai_ray.tools.migrate.findings import Findings
from kai_ray.tools.migrate.objects import mapping
from kai_ray.values.errors import InvalidFieldError
from kai_ray.values.names import (
    GPU_FRACTION_ANNOTATION,
    GPU_MEMORY_ANNOTATION,
    MIN_MEMBER_ANNOTATION,
    POD_GROUP_ANNOTATION,
    QUEUE_LABEL,
    TOPOLOGY_ANNOTATION,
    TOPOLOGY_PREFERRED_ANNOTATION,
    TOPOLOGY_REQUIRED_ANNOTATION,
)

KAI_DEFAULT_QUEUE = "default-queue"
RAY_PRIORITY_LABEL = "ray.io/priority-class-name"
LABEL_RENAMES = {"kai.scheduler/queue": QUEUE_LABEL, "runai/queue": QUEUE_LABEL}
ANNOTATION_RENAMES = {
    "pod-group-name": POD_GROUP_ANNOTATION,
    "kai.scheduler/topology": TOPOLOGY_ANNOTATION,
    "kai.scheduler/topology-required-placement": TOPOLOGY_REQUIRED_ANNOTATION,
    "kai.scheduler/topology-preferred-placement": TOPOLOGY_PREFERRED_ANNOTATION,
    "kai.scheduler/batch-min-member": MIN_MEMBER_ANNOTATION,
    "gpu-fraction": GPU_FRACTION_ANNOTATION,
}
#: Keys for what kai-ray does not do, with what happens instead.
UNSUPPORTED_LABELS = {
    "kai.scheduler/preemptibility": "set spec.preemptible on an explicit PodGroup; "
    "otherwise a priority below 100 is preemptible",
    "kai.scheduler/task-priority": "pods of a gang are placed in kai-ray's order",
    "kai.scheduler/node-pool": "kai-ray has no scheduling shards: every node is one pool",
    "kai.scheduler/subgroup-name": "kai-ray derives a pod's subgroup from its workload",
}
UNSUPPORTED_ANNOTATIONS = {
    "gpu-fraction-num-devices": "a share of several GPUs is not supported",
    "gpu-fraction-container-name": "the share is the pod's, not one container's",
    "mps": "kai-ray does not set up MPS",
    "kai.scheduler/segment-size": "segments are not supported; the gang is one",
    "kai.scheduler/segment-topology-required-placement": "segments are not supported",
    "kai.scheduler/segment-topology-preferred-placement": "segments are not supported",
    "kai.scheduler/preemption-delay": "kai-ray has no preemption delay",
    "kai.scheduler/staleness-grace-period": "set spec.staleGracePeriod on an explicit PodGroup",
}
KAI_WRITTEN_LABELS = ("runai-gpu-group",)
KAI_WRITTEN_ANNOTATIONS = (
    "runai/shared-gpu-configmap",
    "run.ai/reserve_for_gpu_index",
    "kai.scheduler/numa-placement-predicted",
    "kai.scheduler/numa-placement-observed",
    "kai.scheduler/top-owner-metadata",
)
#: Workloads kai-ray makes a PodGroup for (others need an explicit one).
GROUPED_KINDS = ("Pod", "Job", "RayCluster", "RayJob", "PodCliqueSet")


class WorkloadMigration:
    """One workload's conversion: KAI's scheduler name and kai-ray's."""

    def __init__(self, kai_scheduler: str, scheduler: str, findings: Findings) -> None:
        self.kai_scheduler = kai_scheduler
        self.scheduler = scheduler
        self.findings = findings
        self.uses_kai = False

    def convert(self, doc: dict[str, Any]) -> dict[str, Any]:
        out = copy.deepcopy(doc)
        meta = mapping(out.get("metadata"), "metadata")
        self._walk(out, "")
        labels = mapping(meta.get("labels"), "metadata.labels")
        self.uses_kai = self.uses_kai or QUEUE_LABEL in labels
        if self.uses_kai:
            self._whole_workload(out)
        return out

    def _walk(self, node: Any, path: str) -> None:
        if isinstance(node, list):
            for i, item in enumerate(node):
                self._walk(item, f"{path}[{i}]")
            return
        if not isinstance(node, dict):
            return
        for key, value in node.items():
            where = f"{path}.{key}" if path else key
            if key == "metadata" and isinstance(value, dict):
                self._metadata(value, where)
            elif key == "schedulerName" and value == self.kai_scheduler:
                self.uses_kai = True
                node[key] = self.scheduler
            else:
                self._walk(value, where)

    def _metadata(self, meta: dict[str, Any], path: str) -> None:
        labels = mapping(meta.get("labels"), f"{path}.labels")
        self._keys(labels, f"{path}.labels", LABEL_RENAMES, UNSUPPORTED_LABELS, KAI_WRITTEN_LABELS)
        annotations = mapping(meta.get("annotations"), f"{path}.annotations")
        self._gpu_memory(annotations, f"{path}.annotations")
        self._keys(
            annotations,
            f"{path}.annotations",
            ANNOTATION_RENAMES,
            UNSUPPORTED_ANNOTATIONS,
            KAI_WRITTEN_ANNOTATIONS,
        )

    def _keys(
        self,
        values: dict[str, Any],
        path: str,
        renames: dict[str, str],
        unsupported: dict[str, str],
        written: tuple[str, ...],
    ) -> None:
        for key in list(values):
            where = f"{path}[{key}]"
            if key in renames:
                self.uses_kai = True
                value = values.pop(key)
                if values.setdefault(renames[key], value) != value:
                    self.findings.change(where, f"{renames[key]} says otherwise; it is kept")
            elif key in unsupported:
                self.findings.change(where, unsupported[key])
            elif key in written:
                del values[key]
                self.findings.note(where, "written by KAI; dropped")

    def _gpu_memory(self, annotations: dict[str, Any], path: str) -> None:
        """KAI's `gpu-memory` is MiB as a bare number; kai-ray's is a quantity."""
        if "gpu-memory" not in annotations:
            return
        self.uses_kai = True
        value = annotations.pop("gpu-memory")
        where = f"{path}[gpu-memory]"
        if not isinstance(value, str) or not value.isdigit() or int(value) <= 0:
            raise InvalidFieldError(where, f"expected a whole number of MiB, got {value!r}")
        annotations[GPU_MEMORY_ANNOTATION] = f"{int(value)}Mi"

    def _whole_workload(self, out: dict[str, Any]) -> None:
        kind = str(out.get("kind") or "")
        meta = out["metadata"] = mapping(out.get("metadata"), "metadata")
        labels = mapping(meta.get("labels"), "metadata.labels")
        joins_a_group = _has_key(out, "annotations", POD_GROUP_ANNOTATION)
        queue_named = QUEUE_LABEL in labels or _has_key(out.get("spec"), "labels", QUEUE_LABEL)
        if not queue_named and not joins_a_group:
            labels = meta["labels"] = {**labels, QUEUE_LABEL: KAI_DEFAULT_QUEUE}
            self.findings.note(
                f"metadata.labels[{QUEUE_LABEL}]",
                f"no queue label: KAI put the workload in {KAI_DEFAULT_QUEUE}; labelled so",
            )
        if kind not in GROUPED_KINDS and not joins_a_group:
            self.findings.change(
                "kind",
                f"kai-ray makes no PodGroup for a {kind}: create one and annotate the pod "
                f"template with {POD_GROUP_ANNOTATION}",
            )
        self._priority_label(kind, labels)
        if kind in ("RayCluster", "RayJob"):
            self._ray_scheduler_name(out)

    def _priority_label(self, kind: str, labels: dict[str, Any]) -> None:
        if "priorityClassName" not in labels:
            return
        if kind in ("RayCluster", "RayJob") and RAY_PRIORITY_LABEL not in labels:
            labels[RAY_PRIORITY_LABEL] = labels.pop("priorityClassName")
            self.findings.note(
                "metadata.labels[priorityClassName]", f"kai-ray reads {RAY_PRIORITY_LABEL}; renamed"
            )
            return
        self.findings.change(
            "metadata.labels[priorityClassName]",
            "kai-ray reads the priority class from the pod template's spec.priorityClassName",
        )

    def _ray_scheduler_name(self, out: dict[str, Any]) -> None:
        """KubeRay's --batch-scheduler=kai-scheduler named KAI on the pods it made;
        without it the templates must name the scheduler."""
        spec = mapping(out.get("spec"), "spec")
        cluster, path = spec, "spec"
        if out.get("kind") == "RayJob":
            cluster, path = (
                mapping(spec.get("rayClusterSpec"), "spec.rayClusterSpec"),
                "spec.rayClusterSpec",
            )
        workers = cluster.get("workerGroupSpecs") or []
        if not isinstance(workers, list):
            raise InvalidFieldError(f"{path}.workerGroupSpecs", f"expected a list, got {workers!r}")
        groups = [(cluster.get("headGroupSpec"), f"{path}.headGroupSpec")]
        groups += [(w, f"{path}.workerGroupSpecs[{i}]") for i, w in enumerate(workers)]
        named = False
        for group, where in groups:
            template = mapping(mapping(group, where).get("template"), f"{where}.template")
            pod_spec = mapping(template.get("spec"), f"{where}.template.spec")
            if template and pod_spec and not pod_spec.get("schedulerName"):
                pod_spec["schedulerName"] = self.scheduler
                named = True
        if named:
            self.findings.note(
                "spec",
                f"pod templates name {self.scheduler} (KubeRay's "
                f"--batch-scheduler={self.kai_scheduler} named KAI on the pods; run KubeRay "
                "without it for kai-ray)",
            )


def _has_key(node: Any, section: str, key: str) -> bool:
    """Whether any `metadata.<section>` inside `node` holds `key`."""
    if isinstance(node, list):
        return any(_has_key(item, section, key) for item in node)
    if not isinstance(node, dict):
        return False
    meta = node.get("metadata")
    if isinstance(meta, dict) and key in (meta.get(section) or {}):
        return True
    return any(_has_key(value, section, key) for value in node.values())
