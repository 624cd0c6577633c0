"""The `kai-ray` command line: `simulate`, `snapshot`, `crds`, `version`.

Argument parsing and exit codes only; the work is done by the simulator and
the CRD generator. Exit statuses: 0 done; 2 invalid input (one line naming the
file, the object and the field, never a traceback); 3 a scheduling invariant
was broken during a simulation (one line: the cycle, the object, the rule).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from kai_ray import __version__
from kai_ray.values.errors import InvalidObjectError

EXIT_INVALID_INPUT = 2
EXIT_INVARIANT_BROKEN = 3


def _add_inputs(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("inputs", nargs="+", type=Path, help="YAML files or folders")
    parser.add_argument(
        "--trace",
        action="append",
        type=Path,
        default=[],
        help="a CSV job trace to replay (repeatable; columns in docs/simulator.md)",
    )


def _simulate_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    simulate = commands.add_parser(
        "simulate", help="run the scheduling cycle on an in-memory cluster on a virtual clock"
    )
    _add_inputs(simulate)
    simulate.add_argument("--report", type=Path, help="write the JSON report here")
    simulate.add_argument("--plot", type=Path, help="write a PNG chart of queues over time")
    simulate.add_argument("--until", help="stop at this virtual time (e.g. 7d, 36h)")
    simulate.add_argument("--quiet", action="store_true", help="print no table, no progress")
    simulate.add_argument(
        "--progress",
        choices=("auto", "always", "never"),
        default="auto",
        help="progress bar: auto shows it on a terminal only",
    )
    simulate.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="PATH=VALUE",
        dest="sets",
        help="override a field, e.g. Queue/team-b.spec.resources.gpu.overQuotaWeight=3",
    )
    simulate.add_argument(
        "--sweep",
        action="append",
        default=[],
        metavar="PATH=V1,V2,...",
        dest="sweeps",
        help="run one variant per value (repeatable: the cartesian product), in parallel on Ray",
    )
    simulate.add_argument("--no-ray", action="store_true", help="run sweep variants in-process")
    simulate.add_argument("--ray-address", help="join this Ray cluster for a sweep")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kai-ray", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    _simulate_parser(commands)
    snapshot = commands.add_parser(
        "snapshot", help="write the whole simulator input as one normalised YAML file"
    )
    _add_inputs(snapshot)
    snapshot.add_argument("-o", "--output", type=Path, required=True)
    crds = commands.add_parser("crds", help="write the CRDs generated from the API models")
    crds.add_argument("--output", type=Path, default=Path("crds"))
    commands.add_parser("version", help="print the version")
    return parser


def _simulate(args: argparse.Namespace) -> int:
    from kai_ray.sim.run import Options, run_simulation

    options = Options(
        inputs=args.inputs,
        traces=args.trace,
        report=args.report,
        plot=args.plot,
        until=args.until,
        quiet=args.quiet,
        progress=args.progress,
        sets=args.sets,
        sweeps=args.sweeps,
        ray=not args.no_ray,
        ray_address=args.ray_address,
    )
    return run_simulation(options)


def _snapshot(args: argparse.Namespace) -> int:
    from kai_ray.sim.run import write_snapshot

    return write_snapshot(args.inputs, args.trace, args.output)


def _crds(args: argparse.Namespace) -> int:
    from kai_ray.tools.crds import write_crds

    for path in write_crds(args.output):
        print(path)
    return 0


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "simulate":
        return _simulate(args)
    if args.command == "snapshot":
        return _snapshot(args)
    if args.command == "crds":
        return _crds(args)
    print(__version__)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    from kai_ray.sim.invariants import InvariantViolation

    args = _parser().parse_args(argv)
    try:
        return _dispatch(args)
    except InvalidObjectError as err:
        first = err.problems[0] if err.problems else err
        more = f" (and {len(err.problems) - 1} more)" if len(err.problems) > 1 else ""
        print(f"kai-ray: invalid input: {first}{more}", file=sys.stderr)
        return EXIT_INVALID_INPUT
    except InvariantViolation as err:
        print(f"kai-ray: invariant broken: {err}", file=sys.stderr)
        return EXIT_INVARIANT_BROKEN


if __name__ == "__main__":
    sys.exit(main())
