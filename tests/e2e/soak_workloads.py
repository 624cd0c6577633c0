"""The soak's stream of workloads: what three teams submit, drawn from one seed.

Every workload is a list of manifests (created in order) and a lifetime after
which the soak deletes it, as a user whose job ended would. The mix is the one
issue 15 names: RayClusters with an elastic worker group, RayJobs, batch Jobs,
gangs of plain pods held to one rack or block by a Topology, and pods asking
for a share of one GPU. Sizes are drawn so that the three teams together ask
for more than the pool holds, which makes kai-ray reclaim between them.

Pure: builds dictionaries, talks to no cluster.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from tests.builders import make_pod_group

from .workloads import Workers, in_one, job, pod, ray_cluster, ray_job

#: Kinds of workload and how often each is drawn.
MIX = {"raycluster": 25, "rayjob": 15, "job": 20, "gang": 25, "fraction": 15}


@dataclass(frozen=True)
class Team:
    """One tenant: its leaf queue and its namespace."""

    queue: str
    namespace: str


@dataclass(frozen=True)
class Pool:
    """Where the soak's pods may go: the node selector of its nodes, its Topology."""

    selector: dict[str, str]
    topology: str
    gpus_per_node: int


@dataclass(frozen=True)
class Workload:
    kind: str
    name: str
    team: Team
    #: Manifests to create, in order (a PodGroup before its pods).
    objects: tuple[dict[str, Any], ...]
    lifetime_s: float
    #: GPUs its pods ask for in all (a share counts as its fraction).
    gpus: float

    @property
    def namespace(self) -> str:
        return self.team.namespace


def draw_workload(rng: random.Random, index: int, team: Team, pool: Pool) -> Workload:
    """The `index`-th workload of the soak, submitted by `team`."""
    kind = rng.choices(list(MIX), weights=list(MIX.values()))[0]
    name = f"{kind}-{index}"
    lifetime = rng.uniform(20, 90)
    objects, gpus = _DRAW[kind](rng, name, team, pool)
    return Workload(kind, name, team, tuple(objects), lifetime, gpus)


Drawn = tuple[list[dict[str, Any]], float]


def _ray_cluster(rng: random.Random, name: str, team: Team, pool: Pool) -> Drawn:
    """A head and one elastic GPU worker group: at least `min` workers, up to `replicas`."""
    gpus = rng.choice([1, 2, 4, 8])
    replicas = rng.randint(1, 3 if gpus == 8 else 4)
    workers = Workers("gpu", replicas, gpus=gpus, min_replicas=rng.randint(1, replicas))
    return [ray_cluster(name, team.queue, [workers], pool.selector)], float(gpus * replicas)


def _ray_job(rng: random.Random, name: str, team: Team, pool: Pool) -> Drawn:
    gpus = rng.choice([1, 2, 4])
    replicas = rng.randint(1, 3)
    workers = Workers("gpu", replicas, gpus=gpus)
    annotations = in_one("block", pool.topology) if rng.random() < 0.3 else None
    obj = ray_job(name, team.queue, [workers], pool.selector, annotations=annotations)
    return [obj], float(gpus * replicas)


def _job(rng: random.Random, name: str, team: Team, pool: Pool) -> Drawn:
    parallelism = rng.choice([1, 2, 4])
    gpus = rng.choice([1, 2, 4, 8])
    obj = job(
        name, team.queue, pool.selector, parallelism=parallelism, gpus=gpus, min_member=parallelism
    )
    return [obj], float(parallelism * gpus)


def _gang(rng: random.Random, name: str, team: Team, pool: Pool) -> Drawn:
    """An explicit PodGroup of plain pods that must share one rack (or one block)."""
    level = rng.choice(["rack", "rack", "block"])
    size = rng.choice([2, 4, 8])
    room = pool.gpus_per_node * (4 if level == "rack" else 8)
    gpus = rng.choice([g for g in (1, 2, 4, 8) if g * size <= room // 2])
    group = (
        make_pod_group(name)
        .queue(team.queue)
        .min_member(size)
        .topology(pool.topology, required=level)
        .build()
    )
    pods = [pod(f"{name}-{i}", None, pool.selector, gpus=gpus, group=name) for i in range(size)]
    return [group, *pods], float(size * gpus)


def _fraction(rng: random.Random, name: str, team: Team, pool: Pool) -> Drawn:
    """One to four pods, each asking for a quarter or a half of one GPU."""
    shares = [rng.choice(["0.25", "0.5"]) for _ in range(rng.randint(1, 4))]
    pods = [
        pod(f"{name}-{i}", team.queue, pool.selector, fraction=share)
        for i, share in enumerate(shares)
    ]
    return pods, sum(float(s) for s in shares)


_DRAW = {
    "raycluster": _ray_cluster,
    "rayjob": _ray_job,
    "job": _job,
    "gang": _gang,
    "fraction": _fraction,
}
