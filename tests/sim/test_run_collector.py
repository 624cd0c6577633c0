"""The cycle collector around one `kai-ray simulate` run: paused while the inputs
are read and loaded and while the report is made (both are kept whole, so its
full passes would walk them all and free nothing), on for the run, and the process's
own setting back afterwards, whatever happened (tests and callers run many
simulations in one process)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import kai_ray.sim.run as run
from kai_ray.sim.engine import Simulation
from kai_ray.tools.cli import main
from kai_ray.tools.cli import run as run_command

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart"


def _frozen(sim: Simulation) -> bool:
    """Whether the engine's objects are out of the collector's sight: frozen objects
    are in no generation, so `gc.get_objects()` of every generation misses them."""
    everything = {id(obj) for generation in range(3) for obj in gc.get_objects(generation)}
    return gc.is_tracked(sim) and id(sim) not in everything and gc.get_freeze_count() > 0


@pytest.fixture
def collector() -> Iterator[None]:
    """The collector on for the test, put back as it was whatever the test did."""
    enabled = gc.isenabled()
    gc.enable()
    yield
    if enabled:
        gc.enable()
    else:
        gc.disable()


def test_inputs_and_report_are_made_with_the_collector_paused_and_the_run_with_it_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, collector: None
) -> None:
    seen: dict[str, bool] = {}
    read, load, simulate = run.read_documents, run.load_documents, Simulation.run
    report_of = run.build_report

    def reading(*args: Any) -> Any:
        seen["reading"] = gc.isenabled()
        return read(*args)

    def loading(documents: Any) -> Any:
        seen["loading"] = gc.isenabled()
        return load(documents)

    def running(self: Simulation, *args: Any, **kwargs: Any) -> None:
        seen["running"] = gc.isenabled()
        # The loaded input and the engine are out of the collector's sight.
        seen["engine frozen"] = _frozen(self)
        simulate(self, *args, **kwargs)

    def reporting(sim: Simulation) -> Any:
        seen["reporting"] = gc.isenabled()
        return report_of(sim)

    monkeypatch.setattr(run, "read_documents", reading)
    monkeypatch.setattr(run, "build_report", reporting)
    monkeypatch.setattr(run, "load_documents", loading)
    monkeypatch.setattr(Simulation, "run", running)
    report = tmp_path / "report.json"
    assert main(["simulate", str(QUICKSTART), "--report", str(report), "--quiet"]) == 0
    assert report.exists()
    assert seen == {
        "reading": False,
        "loading": False,
        "running": True,
        "engine frozen": True,
        "reporting": False,
    }
    assert gc.isenabled()
    assert gc.get_freeze_count() == 0  # all given back once the command is done


def test_a_refused_input_leaves_the_collector_on(tmp_path: Path, collector: None) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: v1\nkind: Secret\nmetadata: {name: x}\n")
    assert main(["simulate", str(bad), "--quiet"]) != 0
    assert gc.isenabled()


def test_the_process_ends_with_what_it_holds_out_of_the_collectors_sight(
    monkeypatch: pytest.MonkeyPatch, collector: None
) -> None:
    monkeypatch.setattr("sys.argv", ["kai-ray", "simulate", str(QUICKSTART), "--quiet"])
    try:
        with pytest.raises(SystemExit) as ended:
            run_command()
        assert ended.value.code == 0
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()


def test_a_collector_the_caller_turned_off_stays_off(collector: None) -> None:
    gc.disable()
    assert main(["simulate", str(QUICKSTART), "--quiet", "--until", "10m"]) == 0
    assert not gc.isenabled()
