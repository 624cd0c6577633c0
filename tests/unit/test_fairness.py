"""Fair share arithmetic: deserved first, then the surplus by priority and weight."""

from __future__ import annotations

import math

import pytest

from kai_ray.decisions.fairness import Claim, fair_shares, split
from kai_ray.state.snapshot import ClusterObjects, build_snapshot
from kai_ray.values.resources import GPU, Resources


def claim(
    name: str,
    quota: float = 0,
    cap: float = math.inf,
    weight: float = 1,
    priority: int = 100,
    usage: float = 0.0,
) -> Claim:
    return Claim(name, min(quota, cap), cap, weight, priority, usage)


@pytest.mark.parametrize(
    ("claims", "total", "expected"),
    [
        pytest.param(
            [claim("a", 4, 20), claim("b", 4, 20), claim("c", 0, 3, weight=2)],
            17,
            {"a": 7, "b": 7, "c": 3},
            id="surplus split by weight, c capped by request",
        ),
        pytest.param(
            [claim("a", 0, 20), claim("b", 0, 20, weight=2)],
            10,
            {"a": 4, "b": 6},
            id="weights 1:2 of 10 GPUs, leftover unit to the older queue",
        ),
        pytest.param(
            [claim("a", 0, 20, priority=200), claim("b", 2, 20, weight=2)],
            10,
            {"a": 8, "b": 2},
            id="higher priority bucket takes the surplus first",
        ),
        pytest.param(
            [claim("a", 8, 2), claim("b", 8, 20)],
            16,
            {"a": 2, "b": 14},
            id="idle quota is not held back",
        ),
        pytest.param(
            [claim("a", 0, 20, weight=0), claim("b", 0, 20)],
            10,
            {"a": 0, "b": 10},
            id="weight 0 never goes over quota",
        ),
        pytest.param(
            [claim("a", 10, 10), claim("b", 10, 10)],
            10,
            {"a": 5, "b": 5},
            id="oversubscribed quotas are scaled down in proportion",
        ),
        pytest.param(
            [claim("a", 0, 0.5), claim("b", 0, 20)],
            3,
            {"a": 0.5, "b": 2.5},
            id="fractional requests are met exactly",
        ),
    ],
)
def test_split(claims: list[Claim], total: float, expected: dict[str, float]) -> None:
    assert split(claims, total, 1.0) == pytest.approx(expected)


def test_time_based_fairness_moves_surplus_away_from_the_heavy_user() -> None:
    heavy, light = claim("heavy", 0, 100, usage=0.9), claim("light", 0, 100, usage=0.1)
    plain = split([heavy, light], 10, 1.0, k=0.0)
    shifted = split([heavy, light], 10, 1.0, k=1.0)
    assert plain == {"heavy": 5, "light": 5}
    assert shifted["light"] > shifted["heavy"]
    assert sum(shifted.values()) == 10


def _queue(name: str, parent: str | None, quota: int, weight: float = 1) -> dict:  # type: ignore[type-arg]
    spec = {"resources": {"gpu": {"quota": quota, "overQuotaWeight": weight}}}
    if parent:
        spec["parentQueue"] = parent
    return {
        "apiVersion": "scheduling.kai-ray.io/v1alpha1",
        "kind": "Queue",
        "metadata": {"name": name},
        "spec": spec,
    }


def test_three_level_tree_top_down() -> None:
    queues = [
        _queue("root", None, 0),
        _queue("dept-1", "root", 24),
        _queue("dept-2", "root", 8),
        _queue("a", "dept-1", 16),
        _queue("b", "dept-1", 0),
        _queue("c", "dept-2", 8),
    ]
    tree = build_snapshot(ClusterObjects(queues=queues)).queues
    demand = {"a": Resources({GPU: 40}), "b": Resources({GPU: 40}), "c": Resources({GPU: 4})}
    shares = fair_shares(tree, demand, Resources({GPU: 64}))
    assert shares["root"][GPU] == 64
    assert shares["c"][GPU] == 4 and shares["dept-2"][GPU] == 4
    assert shares["dept-1"][GPU] == 60
    assert shares["a"][GPU] == 38 and shares["b"][GPU] == 22
