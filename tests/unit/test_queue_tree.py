"""The queue tree: shape, order, and queues left out for a missing parent or a cycle."""

from __future__ import annotations

from typing import Any

import pytest

from kai_ray.state.queues import QueueTree, build_queue_tree
from kai_ray.values.errors import Problem
from tests.builders import make_queue


def tree_of(*queues: dict[str, Any], usage: dict[str, dict[str, float]] | None = None) -> QueueTree:
    tree, problems = build_queue_tree(queues, usage or {})
    assert problems == []
    return tree


def test_shape_of_a_three_level_tree() -> None:
    tree = tree_of(
        make_queue("root").build(),
        make_queue("research").parent("root").build(),
        make_queue("team-a").parent("research").gpu(quota=8, limit=16).build(),
        make_queue("prod").parent("root").build(),
    )
    assert tree.roots == ("root",)
    assert tree["research"].children == ("team-a",)
    assert tree["team-a"].depth == 2 and tree["root"].depth == 0
    assert tree["team-a"].is_leaf and not tree["research"].is_leaf
    assert tree["team-a"].parent == "research"
    assert tree["team-a"].spec.resources["gpu"].limit_amount == 16
    assert tree.ancestors("team-a") == ("research", "root")
    assert tree.ancestors("root") == ()
    assert [node.name for node in tree.top_down()] == ["root", "prod", "research", "team-a"]
    assert tree.leaves() == ("prod", "team-a")


def test_children_are_ordered_by_creation_time_then_name() -> None:
    tree = tree_of(
        make_queue("root").build(),
        make_queue("zeta").parent("root").created(1).build(),
        make_queue("beta").parent("root").created(2).build(),
        make_queue("alpha").parent("root").created(2).build(),
    )
    assert tree["root"].children == ("zeta", "alpha", "beta")


def test_several_roots_are_allowed() -> None:
    tree = tree_of(make_queue("b").build(), make_queue("a").build())
    assert tree.roots == ("a", "b")


@pytest.mark.parametrize(
    ("queues", "removed", "kept", "message"),
    [
        pytest.param(
            [make_queue("root").build(), make_queue("a").parent("nowhere").build()],
            {"a"},
            {"root"},
            "parent queue 'nowhere' does not exist",
            id="a queue whose parent does not exist is left out",
        ),
        pytest.param(
            [
                make_queue("root").build(),
                make_queue("a").parent("nowhere").build(),
                make_queue("a-child").parent("a").build(),
            ],
            {"a", "a-child"},
            {"root"},
            "is left out of the tree",
            id="the children of a queue left out are left out too",
        ),
        pytest.param(
            [
                make_queue("root").build(),
                make_queue("x").parent("y").build(),
                make_queue("y").parent("x").build(),
                make_queue("ok").parent("root").build(),
            ],
            {"x", "y"},
            {"root", "ok"},
            "cycle (x -> y -> x)",
            id="two queues naming each other as parent are left out, the rest stays",
        ),
        pytest.param(
            [make_queue("self").parent("self").build()],
            {"self"},
            set(),
            "cycle (self -> self)",
            id="a queue that is its own parent is left out",
        ),
        pytest.param(
            [
                make_queue("below").parent("c1").build(),
                make_queue("c1").parent("c2").build(),
                make_queue("c2").parent("c1").build(),
            ],
            {"below", "c1", "c2"},
            set(),
            "cycle (c1 -> c2 -> c1)",
            id="a queue hanging below a cycle is left out with it",
        ),
    ],
)
def test_broken_parents_are_removed_and_reported(
    queues: list[dict[str, Any]], removed: set[str], kept: set[str], message: str
) -> None:
    tree, problems = build_queue_tree(queues, {})
    assert set(tree.nodes) == kept
    assert {p.obj.name for p in problems} == removed
    assert all(p.field == "spec.parentQueue" and p.obj.kind == "Queue" for p in problems)
    assert any(message in p.message for p in problems)


def test_an_invalid_queue_is_reported_with_its_field_path() -> None:
    bad = make_queue("bad").gpu(quota=16, limit=8).build()
    tree, problems = build_queue_tree([bad, make_queue("ok").build()], {})
    assert set(tree.nodes) == {"ok"}
    assert [(p.obj.name, p.field) for p in problems] == [("bad", "spec.resources.gpu")]
    assert "above limit" in problems[0].message


def test_a_queue_listed_twice_keeps_the_first() -> None:
    first = make_queue("a").priority(7).build()
    tree, problems = build_queue_tree([first, make_queue("a").build()], {})
    assert tree["a"].spec.priority == 7
    assert [p.field for p in problems] == ["metadata.name"]


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        pytest.param({}, {"nvidia.com/gpu": 0.25}, id="usage persisted in the status is read back"),
        pytest.param(
            {"a": {"gpu": 0.5, "cpu": 0.1}},
            {"nvidia.com/gpu": 0.5, "cpu": 0.1},
            id="usage handed in this cycle wins over the status",
        ),
    ],
)
def test_usage(usage: dict[str, dict[str, float]], expected: dict[str, float]) -> None:
    tree = tree_of(make_queue("a").usage(gpu="0.25").build(), usage=usage)
    assert dict(tree["a"].usage) == expected


def test_problems_read_as_sentences() -> None:
    _, problems = build_queue_tree([make_queue("a").parent("b").build()], {})
    assert problems == [
        Problem(
            problems[0].obj,
            "spec.parentQueue",
            "parent queue 'b' does not exist; left out of the tree",
        )
    ]
    assert str(problems[0]).startswith("Queue a: spec.parentQueue: parent queue 'b'")
