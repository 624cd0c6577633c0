"""Mutated inputs: the simulator runs them or refuses them in one line, as pinned here.

Each scalar and each container in the quick-start example is replaced, one at a
time, by a value of the wrong type or sign. A mutation listed in ACCEPTED must
run (status 0): the value is one Kubernetes takes too, or null for a field that
may be left out. Every other mutation must be refused with status 2 and one
line naming the file, the object and the field changed (or a field inside it).
So a check that stops refusing, or starts refusing, fails a case by name; a
change to the example changes the ids, and a stale entry of ACCEPTED fails too.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kai_ray.tools.cli import main
from kai_ray.values.validation import field_path
from tests.builders import patched

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "quickstart"
WRONG_VALUES: list[Any] = [-3, "not-a-value", [], {}, None, 1.5]

UNSET = "null is the field left out"
NO_REQUESTS = "a container may request nothing"
GPU_REQUESTS_ALONE = "GPUs requested without a limit, as the scenarios write them"
SIM_SCHEDULER = "unset: the simulator's controllers create the pods for kai-ray"

#: Where the pod templates of the example's Ray workloads are, to keep the ids below short.
RC_HEAD = "RayCluster llm-pretrain spec.headGroupSpec.template.spec"
RC_WORKER = "RayCluster llm-pretrain spec.workerGroupSpecs[0].template.spec"
RJ = "RayJob eval-sweep spec.rayClusterSpec"
RJ_WORKER = f"{RJ}.workerGroupSpecs[0].template.spec"

#: Mutation id -> why the simulator is right to run it.
ACCEPTED: dict[str, str] = {
    "NodePool h100 spec.labels[nvidia.com/gpu.product] = 'not-a-value'": "a label value",
    "Topology datacenter spec.levels[0].nodeLabel = 'not-a-value'": "a label no node has yet",
    "Topology datacenter spec.levels[2].nodeLabel = 'not-a-value'": "a label no node has yet",
    "RayCluster llm-pretrain metadata.namespace = None": UNSET,
    "RayCluster llm-pretrain spec.rayVersion = None": UNSET,
    f"{RC_HEAD}.containers[0].image = 'not-a-value'": "an image name",
    f"{RC_HEAD}.containers[0].resources.requests = {{}}": NO_REQUESTS,
    f"{RC_HEAD}.containers[0].resources.requests.memory = 1.5": "a quantity written as a number",
    "RayCluster llm-pretrain spec.workerGroupSpecs[0].minReplicas = None": UNSET,
    f"{RC_WORKER}.schedulerName = None": SIM_SCHEDULER,
    f"{RC_WORKER}.containers[0].name = 'not-a-value'": "a container name",
    f"{RC_WORKER}.containers[0].resources = {{}}": NO_REQUESTS,
    f"{RC_WORKER}.containers[0].resources.requests = None": NO_REQUESTS,
    f"{RC_WORKER}.containers[0].resources.requests.cpu = 1.5": "one and a half CPUs",
    "RayJob eval-sweep metadata.namespace = None": UNSET,
    f"{RJ}.headGroupSpec.rayStartParams = {{}}": "no parameters",
    f"{RJ}.headGroupSpec.template.spec.containers[0].image = None": UNSET,
    f"{RJ}.workerGroupSpecs[0].rayStartParams = {{}}": "no parameters",
    f"{RJ_WORKER}.containers[0].image = None": UNSET,
    f"{RJ_WORKER}.containers[0].resources.limits = None": GPU_REQUESTS_ALONE,
    "Job finetune metadata.namespace = None": UNSET,
    "Job finetune spec.template.spec.schedulerName = None": SIM_SCHEDULER,
    "Job finetune spec.template.spec.containers[0].resources = None": NO_REQUESTS,
    "Job finetune spec.template.spec.containers[0].resources.limits = {}": GPU_REQUESTS_ALONE,
    "Pod notebook metadata.namespace = None": UNSET,
    "Pod notebook spec.containers[0].image = None": UNSET,
    "Job hparam-sweep metadata.namespace = None": UNSET,
    "Job hparam-sweep spec.template.spec.schedulerName = None": SIM_SCHEDULER,
    "Job hparam-sweep spec.template.spec.containers[0].resources = None": NO_REQUESTS,
    "Job hparam-sweep spec.template.spec.containers[0].resources.limits = {}": GPU_REQUESTS_ALONE,
}


def paths(node: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield (*prefix, key)
            yield from paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield (*prefix, i)
            yield from paths(value, (*prefix, i))


def cases() -> Iterator[Any]:
    docs = [d for f in sorted(EXAMPLE.glob("*.yaml")) for d in yaml.safe_load_all(f.read_text())]
    for index, doc in enumerate(docs):
        for number, path in enumerate(paths(doc)):
            value = WRONG_VALUES[number % len(WRONG_VALUES)]
            field = field_path(path)
            label = f"{doc['kind']} {doc['metadata']['name']} {field} = {value!r}"
            yield pytest.param(docs, index, field, value, id=label)


CASES = list(cases())


def refused_field(field: str) -> str:
    """The field a refusal names: the one changed, but the kind is told with its apiVersion."""
    return "apiVersion/kind" if field in ("apiVersion", "kind") else field


def names_field(line: str, field: str) -> bool:
    """`line` names `field` or a field inside it, in either notation (`a[0].b`, `a.0.b`)."""
    flat = re.sub(r"\[([^\]]+)\]", r".\1", line)
    wanted = re.sub(r"\[([^\]]+)\]", r".\1", field)
    return re.search(rf"(?:^|\s){re.escape(wanted)}[.:]", flat) is not None


@pytest.mark.parametrize(("docs", "index", "field", "value"), CASES)
def test_mutation_runs_or_is_refused_in_one_line_as_pinned(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    request: pytest.FixtureRequest,
    docs: list[dict[str, Any]],
    index: int,
    field: str,
    value: Any,
) -> None:
    changed = [patched(d, field, value) if i == index else d for i, d in enumerate(docs)]
    (tmp_path / "input.yaml").write_text(yaml.safe_dump_all(changed))
    status = main(["simulate", str(tmp_path / "input.yaml"), "--quiet", "--until", "1h"])
    err = capsys.readouterr().err
    if request.node.callspec.id in ACCEPTED:
        assert status == 0, err
        return
    lines = err.strip().splitlines()
    assert status == 2 and len(lines) == 1, f"status {status}, expected a refusal: {err}"
    assert "input.yaml" in lines[0]
    if field not in ("metadata", "metadata.name"):
        assert re.search(rf"[ /]{re.escape(docs[index]['metadata']['name'])}: ", lines[0])
    assert names_field(lines[0], refused_field(field)), lines[0]


def test_every_accepted_mutation_is_one_of_the_cases() -> None:
    ids = [case.id for case in CASES]
    assert len(set(ids)) == len(ids) == 244
    assert set(ACCEPTED) - set(ids) == set()
