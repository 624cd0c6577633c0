"""One loaded input runs any number of simulations (sweeps do): the engine copies a
job's pods when it submits them and never changes the input's own."""

from __future__ import annotations

import copy
from pathlib import Path

from kai_ray.sim.engine import Simulation
from kai_ray.sim.loader import load_documents
from kai_ray.sim.report import build_report
from kai_ray.sim.run import read_documents

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart"


def test_a_loaded_input_runs_twice_alike_and_is_left_as_it_was() -> None:
    sim_input = load_documents(read_documents([QUICKSTART]))
    pods_before = copy.deepcopy([w.pods for w in sim_input.workloads])
    assert any(pods for pods in pods_before), "the example has workloads with pods"
    first = Simulation(sim_input)
    first.run()
    assert first.pods or first.bindings or first.cycles, "the run did something"
    assert [w.pods for w in sim_input.workloads] == pods_before
    second = Simulation(sim_input)
    second.run()
    assert build_report(second) == build_report(first)
