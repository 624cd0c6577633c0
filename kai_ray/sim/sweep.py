"""Sweeps: the same input run once per variant of its settings, compared side by side.

A variant is a tuple of overrides (`kai_ray.sim.overrides`). Every variant is run
by `run_variant`, a pure function of the documents, the overrides and the stop
time, so that the same seeds give the same reports whether the variants run one
after another in this process (`--no-ray`) or as Ray tasks (`sweep_ray`, the only
module that imports Ray). Every variant is applied once here, before anything
runs, so a bad path fails fast with status 2. No I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kai_ray.sim.engine import Simulation
from kai_ray.sim.loader import Document, SimInput, load_documents
from kai_ray.sim.overrides import Override, apply_overrides, variant_name
from kai_ray.sim.report import build_report

Report = dict[str, Any]
OnDone = Callable[[str], None]


@dataclass(frozen=True)
class VariantResult:
    name: str
    overrides: tuple[Override, ...]
    report: Report


def run_variant(
    documents: Sequence[Document], overrides: Sequence[Override], until: float | None
) -> Report:
    """Load, override, simulate and report: one variant, start to end."""
    sim_input = apply_overrides(load_documents(documents), overrides)
    return simulate(sim_input, until)


def simulate(sim_input: SimInput, until: float | None) -> Report:
    simulation = Simulation(sim_input, until=until)
    simulation.run()
    return build_report(simulation)


def check_variants(base: SimInput, variants: Sequence[tuple[Override, ...]]) -> None:
    """Raise InvalidObjectError for the first variant that cannot be applied."""
    for variant in variants:
        apply_overrides(base, variant)


def run_sweep(
    documents: Sequence[Document],
    variants: Sequence[tuple[Override, ...]],
    until: float | None,
    ray: bool,
    ray_address: str | None = None,
    on_done: OnDone | None = None,
) -> list[VariantResult]:
    """Every variant's report, in the order of `variants`."""
    names = [variant_name(v) for v in variants]
    if ray:
        from kai_ray.sim.sweep_ray import run_on_ray

        reports = run_on_ray(documents, variants, until, ray_address, names, on_done)
    else:
        reports = []
        for name, variant in zip(names, variants, strict=True):
            reports.append(run_variant(documents, variant, until))
            if on_done is not None:
                on_done(name)
    return [VariantResult(n, v, r) for n, v, r in zip(names, variants, reports, strict=True)]
