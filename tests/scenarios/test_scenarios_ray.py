"""Every scenario gives the same report with the Ray placement backend as with the local one.

Each scenario of `tests/scenarios/` is simulated twice, `rayBackend.mode: never` and
`always` (a local Ray cluster of 2 CPUs, started once for the module: about 4 s),
and the two reports must be equal (every bind, eviction, time and queue sample);
the Ray run must also meet the scenario's `expect`, and Ray must never have been
lost on the way (a fallback would make the local backend answer, and the test
prove nothing). On 2 cores the module takes about 25 s, the scenarios' local runs
included. To run the whole scenario suite on Ray instead:
`KAI_RAY_SCENARIO_BACKEND=ray pytest tests/scenarios/test_scenarios.py`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from kai_ray.decisions.placement import ray_backend, ray_link
from kai_ray.decisions.placement.ray_link import RayLink
from kai_ray.values.errors import InvalidObjectError
from tests.scenarios.test_scenarios import (
    Outcome,
    Scenario,
    check,
    known_rules,
    read_scenario,
    scenario_files,
    simulate,
)

#: Scenarios in which the Ray backend answered room queries (topology gangs), by name.
ANSWERED_BY_RAY: set[str] = set()


@pytest.fixture(scope="module")
def ray_link_of_module() -> Iterator[RayLink]:
    """A fresh link for the module; the local Ray cluster it starts is stopped at the end."""
    for name, value in (
        ("RAY_AUTH_MODE", "disabled"),
        ("RAY_USAGE_STATS_ENABLED", "0"),
        ("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0"),
    ):
        os.environ.setdefault(name, value)
    link = RayLink()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ray_link, "RAY_LINK", link)
        yield link
    ray_backend.disconnect()


def _read_scenarios() -> list[Scenario]:
    rules = known_rules()
    return [read_scenario(path, rules) for path in scenario_files()]


def _scenarios() -> list[object]:
    return [pytest.param(scenario, id=scenario.name) for scenario in _read_scenarios()]


def _outcome(scenario: Scenario, folder: Path, backend: str) -> Outcome | str:
    """The run's outcome, or the simulator's refusal of the input."""
    folder.mkdir()
    try:
        return simulate(scenario, folder, backend)
    except InvalidObjectError as err:
        return f"refused: {err}".replace(str(folder), "<folder>")


@pytest.mark.parametrize("scenario", _scenarios())
def test_the_ray_backend_gives_the_local_report(
    scenario: Scenario, tmp_path: Path, ray_link_of_module: RayLink
) -> None:
    _compare(scenario, tmp_path, ray_link_of_module)


def _compare(scenario: Scenario, folder: Path, link: RayLink) -> None:
    """The scenario on both backends: the same report, the same verdict, Ray never lost."""
    local = _outcome(scenario, folder / "local", "local")
    loaded = ray_backend._Pool.loaded
    on_ray = _outcome(scenario, folder / "ray", "ray")
    status = link.status()
    assert status.fallbacks == 0, f"Ray was lost: {status.reason}"
    if ray_backend._Pool.loaded != loaded:
        ANSWERED_BY_RAY.add(scenario.name)
    if isinstance(local, str) or isinstance(on_ray, str):
        assert on_ray == local
        return
    assert on_ray.report == local.report
    assert check(on_ray, scenario.expect) == check(local, scenario.expect)


def test_ray_answered_in_the_scenarios_with_topology_gangs(
    tmp_path: Path, ray_link_of_module: RayLink
) -> None:
    """The Ray backend was not left out everywhere. After the test above (the file's
    order) its record is read; run alone, the scenarios are compared here first."""
    if not ANSWERED_BY_RAY:
        for index, scenario in enumerate(_read_scenarios()):
            folder = tmp_path / str(index)
            folder.mkdir()
            _compare(scenario, folder, ray_link_of_module)
    assert len(ANSWERED_BY_RAY) >= 10, sorted(ANSWERED_BY_RAY)
