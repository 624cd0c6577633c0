"""Mutated inputs never crash the simulator: every run ends with status 0 or 2, one line.

Each scalar and each container in the quick-start example is replaced, one at a
time, by values of the wrong type or sign; the simulator must either run or refuse
with one line naming the object, never with a traceback.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kai_ray.tools.cli import main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "quickstart"
WRONG_VALUES: list[Any] = [-3, "not-a-value", [], {}, None, 1.5]


def paths(node: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield (*prefix, key)
            yield from paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield (*prefix, i)
            yield from paths(value, (*prefix, i))


def mutated(doc: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    target = out
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return out


def cases() -> Iterator[Any]:
    docs = [d for f in sorted(EXAMPLE.glob("*.yaml")) for d in yaml.safe_load_all(f.read_text())]
    for index, doc in enumerate(docs):
        for number, path in enumerate(paths(doc)):
            value = WRONG_VALUES[number % len(WRONG_VALUES)]
            label = f"{doc['kind']} {'.'.join(map(str, path))} = {value!r}"
            yield pytest.param(docs, index, path, value, id=label)


@pytest.mark.parametrize(("docs", "index", "path", "value"), list(cases()))
def test_mutation_runs_or_is_refused_in_one_line(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    docs: list[dict[str, Any]],
    index: int,
    path: tuple[Any, ...],
    value: Any,
) -> None:
    changed = [mutated(d, path, value) if i == index else d for i, d in enumerate(docs)]
    (tmp_path / "input.yaml").write_text(yaml.safe_dump_all(changed))
    status = main(["simulate", str(tmp_path / "input.yaml"), "--quiet", "--until", "1h"])
    err = capsys.readouterr().err
    assert status in (0, 2)
    if status == 2:
        assert len(err.strip().splitlines()) == 1 and "input.yaml" in err
