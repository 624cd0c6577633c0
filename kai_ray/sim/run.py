"""`kai-ray simulate` and `kai-ray snapshot`: read, run, report, print, plot.

This is the simulator's only module that writes files and prints; the engine,
the report builder and the summary rows are pure. Progress is drawn (rich) only
on a terminal unless `--progress always`, and never with `--quiet`.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from kai_ray.sim.engine import Simulation
from kai_ray.sim.job_trace import trace_documents
from kai_ray.sim.loader import Document, iter_documents, load_documents
from kai_ray.sim.overrides import apply_overrides, parse_set, parse_sweep, variants
from kai_ray.sim.report import build_report
from kai_ray.sim.summary import gpu_quotas
from kai_ray.sim.sweep import VariantResult, check_variants, run_sweep
from kai_ray.sim.tables import print_summary, print_sweep
from kai_ray.state.heap import collector_paused, long_lived_heap, settle
from kai_ray.values.config import duration_seconds
from kai_ray.values.errors import InvalidObjectError, ObjectRef, Problem

Quotas = dict[str, float | None]


@dataclass
class Options:
    inputs: Sequence[Path]
    traces: Sequence[Path] = ()
    report: Path | None = None
    plot: Path | None = None
    until: str | None = None
    quiet: bool = False
    progress: str = "auto"
    sets: Sequence[str] = ()
    sweeps: Sequence[str] = ()
    ray: bool = True
    ray_address: str | None = None
    console: Console = field(
        default_factory=lambda: Console(width=None if sys.stdout.isatty() else 150)
    )


def parse_until(text: str | None) -> float | None:
    """`--until` as seconds; days (`7d`) are accepted besides Go-style durations."""
    if text is None:
        return None
    try:
        if text.endswith("d") and text[:-1].replace(".", "", 1).isdigit():
            return float(text[:-1]) * 86400
        return duration_seconds(text)
    except ValueError as err:
        raise InvalidObjectError(
            [Problem(ObjectRef("Option", "--until"), "value", str(err))]
        ) from None


def read_documents(inputs: Sequence[Path], traces: Sequence[Path] = ()) -> list[Document]:
    """The input files' documents, then one Job per trace row (a bare topology level
    in a trace names the input's only Topology)."""
    documents = list(iter_documents(inputs))
    topologies = [d.ref.name for d in documents if d.raw.get("kind") == "Topology"]
    default = topologies[0] if len(topologies) == 1 else None
    for trace in traces:
        documents.extend(trace_documents(trace, default))
    return documents


def run_simulation(options: Options) -> int:
    limit = parse_until(options.until)
    # The inputs, the engine made of them and the report are kept whole, each made
    # with no cycle collection (`heap.collector_paused`) and moved out of the
    # collector's sight before it comes back (`heap.settle`, within the command's
    # `long_lived_heap`, which the run's own block runs inside).
    with long_lived_heap():
        with collector_paused():
            documents = read_documents(options.inputs, options.traces)
            settle()
        if options.sweeps:
            return _run_sweep(options, documents, limit)
        with collector_paused():
            base = apply_overrides(load_documents(documents), [parse_set(s) for s in options.sets])
            sim = Simulation(base, until=limit)
            settle()
        with _progress_bar(options, "simulating", sim.horizon()) as advance:
            sim.run(progress=advance)
        with collector_paused():
            result = build_report(sim)
            _write_outputs(result, options.report, options.plot, gpu_quotas(base.queues))
            settle()
    if not options.quiet:
        print_summary(result, gpu_quotas(base.queues), options.console)
    return 0


def _run_sweep(options: Options, documents: list[Document], limit: float | None) -> int:
    sets = [parse_set(s) for s in options.sets]
    chosen = [tuple(sets) + v for v in variants([parse_sweep(s) for s in options.sweeps])]
    base = load_documents(documents)
    check_variants(base, chosen)
    with _progress_bar(options, f"{len(chosen)} variants", len(chosen), count=True) as advance:
        done = [0]

        def on_done(_: str) -> None:
            done[0] += 1
            advance(float(done[0]))

        results = run_sweep(documents, chosen, limit, options.ray, options.ray_address, on_done)
    quotas = gpu_quotas(base.queues)
    for result in results:
        report, plot = _variant_path(options.report, result), _variant_path(options.plot, result)
        _write_outputs(result.report, report, plot, quotas)
    if not options.quiet:
        print_sweep(results, quotas, options.console)
    return 0


def _variant_path(path: Path | None, result: VariantResult) -> Path | None:
    """`out/r.json` -> `out/r.<variant>.json`."""
    return None if path is None else path.with_name(f"{path.stem}.{result.name}{path.suffix}")


def _write_outputs(
    report: dict[str, Any], path: Path | None, plot: Path | None, quotas: Quotas
) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Written as it is encoded: a week's report is hundreds of megabytes, and
        # `json.dumps` with an indent would hold it whole, in pieces, then joined.
        with path.open("w") as out:
            json.dump(report, out, indent=2)
            out.write("\n")
    if plot is not None:
        from kai_ray.sim.plot import plot_report

        plot_report(report, plot, quotas)


@contextmanager
def _progress_bar(
    options: Options, label: str, total: float, count: bool = False
) -> Iterator[Callable[[float], None]]:
    shown = not options.quiet and (
        options.progress == "always" or (options.progress == "auto" and options.console.is_terminal)
    )
    if not shown:
        yield lambda _: None
        return
    done = MofNCompleteColumn() if count else TextColumn("{task.fields[virtual]}")
    columns = [TextColumn(label), BarColumn(), done, TimeElapsedColumn()]
    with Progress(*columns, console=options.console, transient=True) as progress:
        task = progress.add_task(label, total=max(total, 1.0), virtual="")

        def advance(now: float) -> None:
            text = f"virtual {now / 3600:,.1f}h of {total / 3600:,.1f}h"
            progress.update(task, completed=min(now, total), virtual=text)

        yield advance


def write_snapshot(inputs: Sequence[Path], traces: Sequence[Path], output: Path) -> int:
    """`kai-ray snapshot`: the whole checked input as one normalised YAML file."""
    from kai_ray.sim.export import snapshot_yaml

    documents = read_documents(inputs, traces)
    load_documents(documents)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(snapshot_yaml(documents))
    print(output)
    return 0
