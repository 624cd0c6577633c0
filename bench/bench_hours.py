"""Where a simulated run's time goes: each cycle's CPU, summed by virtual hour.

Run: `.venv/bin/python -m bench.bench_hours cluster.yaml jobs.yaml [--trace jobs.csv]
[--until 24h] [--span 24] [--json hours.json] [--parts]`. The inputs are `kai-ray simulate`'s;
the run is the simulator's own (`Simulation`), with the process's CPU time
(`time.process_time`) read around every cycle and added to the cycle's virtual
hour. Printed: per span of `--span` virtual hours, the cycles, their CPU, the
mean per cycle and the span's share; then the ten costliest hours. A run sampled
at a few pickled states can miss the hours that cost most (a reclaim episode);
this measures every hour. With `--parts`, each action of the cycle, the
snapshot and what the simulator does with the plan are timed apart too (their
CPU summed over the run, and per cycle), and the evicting actions' victim
searches counted: how many, how many the bound ruled out, how many found
victims. Not a test: it prints figures.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any


def hourly(
    inputs: list[str], traces: list[str], until: str | None, parts: Counter[str] | None = None
) -> tuple[Counter[int], Counter[int]]:
    """CPU seconds and cycles per virtual hour of the run; with `parts`, the CPU of
    each part of the cycles is added there by name (`_time_parts`)."""
    from kai_ray.sim.engine import Simulation
    from kai_ray.sim.loader import load_documents
    from kai_ray.sim.run import parse_until, read_documents

    documents = read_documents([Path(p) for p in inputs], [Path(p) for p in traces])
    sim = Simulation(load_documents(documents), until=parse_until(until))
    cpu, cycles = Counter[int](), Counter[int]()
    if parts is not None:
        _time_parts(sim, parts)
    run_cycle = sim._run_cycle

    def timed() -> None:
        start = time.process_time()
        run_cycle()
        hour = int(sim.clock.now() // 3600)
        cpu[hour] += time.process_time() - start
        cycles[hour] += 1

    sim._run_cycle = timed  # type: ignore[method-assign]
    sim.run()
    return cpu, cycles


def _timer(parts: Counter[str], name: str, call: Callable[..., Any]) -> Callable[..., Any]:
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.process_time()
        try:
            return call(*args, **kwargs)
        finally:
            parts[name] += time.process_time() - start

    return timed


def _time_parts(sim: Any, parts: Counter[str]) -> None:
    """Each built-in action's `run`, the cache's snapshot, the binder's `apply` and
    the simulator's records (`_update_jobs`) timed into `parts`; and the evicting
    actions' victim searches (`eviction.evict_to_fit`, as reclaim and preempt call
    it) counted and timed, with how many the bound ruled out
    (`eviction.no_domain_could_hold`) and how many found victims."""
    from kai_ray.decisions import cycle, eviction, preempt, reclaim

    search, bound = eviction.evict_to_fit, eviction.no_domain_could_hold

    def searched(*args: Any) -> Any:
        start = time.process_time()
        found = search(*args)
        parts["victim searches"] += time.process_time() - start
        parts["# victim searches"] += 1
        parts["# victim searches that found victims"] += found is not None
        return found

    def ruled_out(*args: Any) -> bool:
        start = time.process_time()
        answer = bound(*args)
        parts["  of which the bound"] += time.process_time() - start
        parts["# victim searches ruled out by the bound"] += answer
        return answer

    eviction.no_domain_could_hold = ruled_out
    for module in (reclaim, preempt):
        module.evict_to_fit = searched  # type: ignore[attr-defined]

    registry = cycle.builtin_actions()
    for name in registry.names():
        action = type(registry.get(name))
        action.run = _timer(parts, name, action.run)  # type: ignore[method-assign]
    sim.cache.snapshot = _timer(parts, "snapshot", sim.cache.snapshot)
    sim.binder.apply = _timer(parts, "binder", sim.binder.apply)
    sim._update_jobs = _timer(parts, "records", sim._update_jobs)


#: Parts timed inside an action's (not added to the actions' sum).
_NESTED = frozenset({"victim searches", "  of which the bound"})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("inputs", nargs="+")
    parser.add_argument("--trace", action="append", default=[])
    parser.add_argument("--until", default=None)
    parser.add_argument("--span", type=int, default=24, help="virtual hours per row")
    parser.add_argument("--json", type=Path, default=None, help="write the hours here")
    parser.add_argument("--parts", action="store_true", help="time each action apart too")
    args = parser.parse_args()
    parts = Counter[str]() if args.parts else None
    cpu, cycles = hourly(args.inputs, args.trace, args.until, parts)
    total = sum(cpu.values())
    count = sum(cycles.values())
    print(f"{count} cycles, {total:.1f} s of CPU in cycles")
    if parts is not None:
        timed = Counter({k: v for k, v in parts.items() if not k.startswith("#")})
        for name, spent in timed.most_common():
            each = 1000 * spent / count if count else 0.0
            share = 100 * spent / total if total else 0.0
            print(f"  {name:20s} {spent:8.1f} s  {each:6.2f} ms a cycle  {share:4.1f} %")
        actions = sum(v for k, v in timed.items() if k not in _NESTED)
        print(f"  {'rest of the cycle':20s} {total - actions:8.1f} s")
        for name in sorted(k for k in parts if k.startswith("#")):
            print(f"  {name[2:]}: {int(parts[name]):,}")
    last = max(cycles, default=0)
    for start in range(0, last + 1, args.span):
        hours = range(start, start + args.span)
        spent, count = sum(cpu[h] for h in hours), sum(cycles[h] for h in hours)
        mean = 1000 * spent / count if count else 0.0
        share = 100 * spent / total if total else 0.0
        print(
            f"{start:4d}-{start + args.span:4d} h  {count:6d} cycles  {spent:7.1f} s  "
            f"{mean:6.1f} ms a cycle  {share:4.1f} %"
        )
    costliest = sorted(cpu, key=lambda h: -cpu[h])[:10]
    print("costliest hours:", ", ".join(f"{h} h {cpu[h]:.1f} s / {cycles[h]}" for h in costliest))
    if args.json is not None:
        args.json.write_text(json.dumps({"cpu": cpu, "cycles": cycles}))


if __name__ == "__main__":
    main()
