"""A live cluster as the operator sees it, read once, for the commands that only look.

`read_live_cluster` lists every kind the operator watches (`kube.read_cluster`);
`live_cluster` feeds those objects into a `ClusterCache` the way the scheduling
loop does: pods of this scheduler are read with the gang the admission webhook
would name (`with_membership`), and every workload that needs a PodGroup and has
none yet gets the one the loop would create (owned by the workload, created when
the workload was). `kai-ray explain` and `kai-ray snapshot --kubeconfig` build on
it. Writes nothing, to the API or anywhere else.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kai_ray.effects.kube import WATCHED, read_cluster
from kai_ray.effects.scheduling_loop import WORKLOAD_KINDS, derived_group_key, pod_group_body
from kai_ray.state.cache import (
    CLAIM_TEMPLATE,
    DEVICE_CLASS,
    NODE,
    POD,
    POD_GROUP,
    QUEUE,
    RESOURCE_CLAIM,
    RESOURCE_SLICE,
    TOPOLOGY,
    ClusterCache,
    object_key,
)
from kai_ray.values.dra import DraSettings
from kai_ray.values.errors import InvalidObjectError
from kai_ray.workloads.grouping import derive_groups
from kai_ray.workloads.membership import (
    as_written,
    needs_derived_group,
    owner_of_kind,
    with_membership,
    with_owner_queue,
)

Obj = Mapping[str, Any]
#: The order the cache is fed in: workloads before pods, so a RayJob's pods find it;
#: DRA's kinds before pods too, so a pod's claims are there when it is read.
FEED_ORDER = (
    NODE,
    QUEUE,
    TOPOLOGY,
    POD_GROUP,
    "Job",
    "RayCluster",
    "RayJob",
    "PodGang",
    DEVICE_CLASS,
    RESOURCE_SLICE,
    CLAIM_TEMPLATE,
    RESOURCE_CLAIM,
    POD,
)


@dataclass(frozen=True)
class LiveCluster:
    """The objects as listed, by kind, and the cache the operator would hold."""

    objects: Mapping[str, Sequence[Obj]]
    scheduler: str
    cache: ClusterCache
    #: Keys of the PodGroups pictured here that the API does not have yet.
    pictured: frozenset[str]


def read_live_cluster(
    kubeconfig: str | None, scheduler: str, dra: DraSettings | None = None
) -> LiveCluster:
    """Read the cluster once (raises `kube.ClusterReadError` when it cannot)."""
    return live_cluster(read_cluster(kubeconfig, WATCHED), scheduler, dra)


def live_cluster(
    objects: Mapping[str, Sequence[Obj]], scheduler: str, dra: DraSettings | None = None
) -> LiveCluster:
    """The cache of `objects` (as `read_cluster` returns them), with the operator's
    DRA settings (`SchedulerConfig.spec.dra`). Pure."""
    cache = ClusterCache(scheduler, dra=dra)
    for kind in FEED_ORDER:
        listed = objects.get(kind, [])
        if kind == POD:
            listed = [_member(cache, pod, scheduler) for pod in listed]
        cache.replace_all(kind, listed)
    pictured = _picture_pod_groups(cache, scheduler)
    return LiveCluster(objects, scheduler, cache, frozenset(pictured))


def _member(cache: ClusterCache, pod: Obj, scheduler: str) -> Obj:
    if (pod.get("spec") or {}).get("schedulerName") != scheduler:
        return pod

    def rayjob_of(namespace: str, cluster: str) -> str | None:
        obj = cache.get("RayCluster", f"{namespace}/{cluster}")
        return owner_of_kind(obj, ("RayJob",)) if obj is not None else None

    return with_membership(pod, rayjob_of)


def _picture_pod_groups(cache: ClusterCache, scheduler: str) -> list[str]:
    """The PodGroups the loop would create for workloads without one; their keys."""
    existing = {key for key, _ in cache.items(POD_GROUP)}
    pictured: list[str] = []
    for kind in WORKLOAD_KINDS:
        for key, obj in list(cache.items(kind)):
            if derived_group_key(kind, key) in existing or not needs_derived_group(obj, scheduler):
                continue
            try:
                groups = derive_groups(with_owner_queue(as_written(obj), cache.get))
            except InvalidObjectError:
                continue  # the operator reports it on the workload; nothing to schedule
            for derived in groups:
                body = pod_group_body(derived.pod_group.model_dump(mode="json"), obj)
                created = (obj.get("metadata") or {}).get("creationTimestamp")
                body["metadata"]["creationTimestamp"] = created
                body["kind"] = POD_GROUP
                group_key = object_key(body, POD_GROUP)
                if group_key not in existing:
                    cache.upsert(body, POD_GROUP)
                    existing.add(group_key)
                    pictured.append(group_key)
    return pictured
