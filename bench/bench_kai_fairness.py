"""KAI's oscillating example (issue 19) in `kai-ray simulate`, against KAI (a script, not a test).

Run: `.venv/bin/python -m bench.bench_kai_fairness [--grace 0 1 2 3] [--until 1024]`.
One node of 16 GPUs, two queues under one department with two 16-GPU jobs each that
never finish, k = 1, half-life 128 s, sliding window 256 s (KAI's bundled example),
each pod taking `--grace` seconds to go when evicted. For each grace it prints where
queue 1's allocation changes, and the mean difference over the run of:

- queue 1's fair share against the sample model of KAI's accounting
  (`kai_sample_model`) with KAI's reaction (the node changes hands 3 samples after
  the fair share does), and with a reaction of grace + 1 samples (kai-ray's: the
  cycle after the fair share moves, plus the grace);
- queue 1's allocation against KAI's measured run (`KAI_SWITCHES`).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from tests.sim.test_time_based_fairness import (
    KAI_SWITCHES,
    _oscillating,
    _series,
    _switches,
    kai_sample_model,
)

#: Samples KAI's harness keeps the first queue on the node for (its reaction time).
KAI_LAG = 3


def kai_allocated(samples: int) -> list[int]:
    """Queue 1's GPUs at each sample of KAI's measured run: 16 until its first switch."""
    held, at = [], 0
    for now in range(samples):
        at += sum(1 for s in KAI_SWITCHES if s == now)
        held.append(16 if at % 2 == 0 else 0)
    return held


def mean_difference(ours: list[float], theirs: list[int]) -> float:
    return sum(abs(a - b) for a, b in zip(ours, theirs, strict=True)) / len(ours)


def measure(grace: float, until: int) -> str:
    """One row: the grace, kai-ray's switches, and the three mean differences."""
    with tempfile.TemporaryDirectory() as tmp:
        report = _oscillating(Path(tmp), f"{grace:g}s", until)
    shares = _series(report, "test-queue1", "fair_share", until)
    allocated = _series(report, "test-queue1", "allocated", until)
    kai_shares, _ = kai_sample_model(lag=KAI_LAG, samples=until)
    own_shares, _ = kai_sample_model(lag=int(grace) + 1, samples=until)
    return (
        f"| {grace:g} s | {', '.join(map(str, _switches(allocated)))} "
        f"| {mean_difference(shares, kai_shares):.2f} "
        f"| {mean_difference(shares, own_shares):.2f} "
        f"| {mean_difference(allocated, kai_allocated(until)):.2f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grace", type=float, nargs="+", default=[0, 1, 2, 3, 4, 5, 6])
    parser.add_argument("--until", type=int, default=1024, help="seconds of the run")
    args = parser.parse_args()
    print(f"KAI's run switches at {', '.join(map(str, KAI_SWITCHES))} samples")
    print(
        "| grace | queue 1's allocation changes at (s) | fair share vs KAI's model (GPUs) "
        "| fair share vs model, lag grace + 1 | allocation vs KAI's run |"
    )
    print("|---|---|---|---|---|")
    for grace in args.grace:
        print(measure(grace, args.until), flush=True)


if __name__ == "__main__":
    main()
