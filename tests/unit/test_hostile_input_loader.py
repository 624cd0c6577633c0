"""Hostile input (issue 15) fed to the simulator's loader: every case is taken, or
refused with exit status 2 and one line naming the file, the object and the field;
never a traceback.

The cases are those tests/e2e/test_hostile_input.py applies to a cluster
(tests/hostile_input.py), each beside a node and a good queue, run through
`kai-ray snapshot` (which loads and checks the whole input, as `simulate` does
before it runs) and, for a sample, through a short `kai-ray simulate`.
"""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings

from kai_ray.tools.cli import EXIT_INVALID_INPUT, main
from tests.builders import make_node, make_pod_group, make_queue
from tests.hostile_input import Case, Queues, any_case

SELECTOR = {"kai-ray.io/e2e-pool": "hostile"}
CONTEXT = [
    make_node("n0").gpus(8).build(),
    make_queue("dept").gpu(quota=8).build(),
    make_queue("team").parent("dept").gpu(quota=8).build(),
]
QUEUES = Queues("team", "dept")
#: A field path as kai-ray writes it: `spec.x`, `metadata.annotations[...]`, `levels[0]`.
NAMES_A_FIELD = re.compile(
    r"(metadata|spec|status|levels|subGroups|annotations)[.\[]|: (spec|metadata)\b"
)
HOSTILE = settings(
    max_examples=300,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def run(*argv: str) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(list(argv))
    return code, err.getvalue()


def write_input(folder: Path, case: Case) -> Path:
    """The case as one YAML file beside the context; a parent deleted in the
    cluster case is simply absent here."""
    gone = {id(obj) for obj in case.deleted_after}
    objects = [obj for obj in case.objects if id(obj) not in gone]
    path = folder / "input.yaml"
    path.write_text(yaml.safe_dump_all([*CONTEXT, *objects], allow_unicode=True))
    return path


def assert_taken_or_refused_in_one_line(code: int, said: str, case: Case) -> None:
    assert code in (0, EXIT_INVALID_INPUT), f"exit {code} for {case.note}: {said}"
    assert "Traceback" not in said, said
    if code == EXIT_INVALID_INPUT:
        lines = said.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("kai-ray: invalid input:"), said
        assert NAMES_A_FIELD.search(said), f"no field named: {said}"
    else:
        assert not said.strip(), said


@HOSTILE
@given(case=any_case("h", QUEUES, SELECTOR))
def test_the_loader_takes_or_refuses_each_hostile_case_in_one_line(
    tmp_path_factory: object, case: Case
) -> None:
    folder = tmp_path_factory.mktemp("case")  # type: ignore[attr-defined]
    path = write_input(folder, case)
    code, said = run("snapshot", str(path), "-o", str(folder / "out.yaml"))
    assert_taken_or_refused_in_one_line(code, said, case)
    if case.bad_field is not None:
        assert code == EXIT_INVALID_INPUT, f"{case.note}: taken although {case.bad_field} is wrong"


@settings(HOSTILE, max_examples=40)
@given(case=any_case("h", QUEUES, SELECTOR))
def test_a_short_simulation_of_each_hostile_case_ends_or_refuses_it_in_one_line(
    tmp_path_factory: object, case: Case
) -> None:
    folder = tmp_path_factory.mktemp("case")  # type: ignore[attr-defined]
    path = write_input(folder, case)
    code, said = run("simulate", str(path), "--until", "10m", "--quiet", "--no-ray")
    assert_taken_or_refused_in_one_line(code, said, case)


@pytest.mark.parametrize(
    ("links", "loop"),
    [
        ({"a": "b", "b": "a"}, "a -> b -> a"),
        ({"a": "a"}, "a -> a"),
        ({"root": None, "a": "c", "b": "a", "c": "b"}, "a -> c -> b -> a"),
    ],
)
def test_subgroups_that_are_each_others_parents_are_refused(
    tmp_path: Path, links: dict[str, str | None], loop: str
) -> None:
    group = make_pod_group("g").queue("team").min_member(2)
    for name, parent in links.items():
        group.subgroup(name, parent=parent)
    path = tmp_path / "input.yaml"
    path.write_text(yaml.safe_dump_all([*CONTEXT, group.build()]))
    code, said = run("snapshot", str(path), "-o", str(tmp_path / "out.yaml"))
    assert code == EXIT_INVALID_INPUT, said
    assert "subGroups[" in said and loop in said, said
