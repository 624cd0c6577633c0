"""A Queue's `Valid` condition among the other Queues: the parent exists, no cycle.

The queue tree is the one judge (`kai_ray.state.queues.unreachable_queues`): a
Queue the scheduler leaves out of its tree is exactly one marked invalid here.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from kai_ray.effects.reporting import INVALID_PARENT, INVALID_SPEC, queue_validity_condition
from kai_ray.state.queues import build_queue_tree
from tests.builders import make_queue

NOW = "2026-12-02T10:00:00.000000Z"


def queues(*objects: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {obj["metadata"]["name"]: obj for obj in objects}


ROOT = make_queue("dept").build()
CASES = [
    pytest.param(
        make_queue("team").parent("dept").build(),
        queues(ROOT),
        None,
        id="a parent that exists: valid",
    ),
    pytest.param(make_queue("dept").build(), queues(), None, id="a root: valid"),
    pytest.param(
        make_queue("team").parent("research").build(),
        queues(ROOT),
        "spec.parentQueue: parent queue 'research' does not exist",
        id="a parent that does not exist",
    ),
    pytest.param(
        make_queue("a").parent("b").build(),
        queues(make_queue("b").parent("a").build()),
        "spec.parentQueue: parent queues form a cycle (a -> b -> a)",
        id="two queues each other's parent",
    ),
    pytest.param(
        make_queue("a").parent("a").build(),
        queues(),
        "spec.parentQueue: parent queues form a cycle (a -> a)",
        id="a queue its own parent",
    ),
    pytest.param(
        make_queue("team").parent("dept").build(),
        queues(make_queue("dept").parent("org").build()),
        "spec.parentQueue: parent queue 'dept' is left out of the tree, so is this queue",
        id="a grandparent that does not exist",
    ),
    pytest.param(
        make_queue("team").parent("dept").build(),
        queues(make_queue("dept").gpu(quota=8, limit=4).build()),
        "spec.parentQueue: parent queue 'dept' is not valid (see its Valid condition)",
        id="a parent that exists but is not valid",
    ),
    pytest.param(
        make_queue("team").parent("dept").build(),
        queues(ROOT, make_queue("team").parent("gone").build()),
        None,
        id="the body given wins over an older copy in the map",
    ),
]


@pytest.mark.parametrize(("body", "others", "message"), CASES)
def test_queue_validity(body: dict[str, Any], others: dict[str, Any], message: str | None) -> None:
    condition = queue_validity_condition(body, others, NOW)
    if message is None:
        assert (condition["status"], condition["reason"]) == ("True", "SpecValid")
    else:
        assert (condition["status"], condition["reason"]) == ("False", INVALID_PARENT)
        assert condition["message"].startswith(message), condition["message"]


def test_a_bad_spec_is_reported_before_the_parent() -> None:
    body = make_queue("team").parent("gone").gpu(quota=8, limit=4).build()
    condition = queue_validity_condition(body, queues(), NOW)
    assert condition["reason"] == INVALID_SPEC
    assert "parentQueue" not in condition["message"]


def _random_queues(rng: random.Random) -> list[dict[str, Any]]:
    names = [f"q{i}" for i in range(rng.randint(1, 7))]
    objects = []
    for name in names:
        queue = make_queue(name)
        parent = rng.choice([None, None, "missing", *names])
        if parent is not None:
            queue = queue.parent(parent)
        if rng.random() < 0.15:
            queue = queue.gpu(quota=8, limit=4)
        objects.append(queue.build())
    return objects


@pytest.mark.parametrize("seed", range(200))
def test_invalid_here_exactly_when_the_queue_tree_leaves_it_out(seed: int) -> None:
    objects = _random_queues(random.Random(seed))
    tree, _ = build_queue_tree(objects, {})
    by_name = queues(*objects)
    for obj in objects:
        name = obj["metadata"]["name"]
        condition = queue_validity_condition(obj, by_name, NOW)
        assert (condition["status"] == "True") == (name in tree), (name, condition)
