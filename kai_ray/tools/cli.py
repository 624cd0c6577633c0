"""The `kai-ray` command line: `simulate`, `crds`, `version`.

Argument parsing and exit codes only; the work is done by the simulator and
the CRD generator. Invalid input exits with status 2 and one line naming the
file, the object and the field, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from kai_ray import __version__
from kai_ray.values.errors import InvalidObjectError

EXIT_INVALID_INPUT = 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kai-ray", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    simulate = commands.add_parser(
        "simulate", help="run the scheduling cycle on an in-memory cluster on a virtual clock"
    )
    simulate.add_argument("inputs", nargs="+", type=Path, help="YAML files or folders")
    simulate.add_argument("--report", type=Path, help="write the JSON report here")
    simulate.add_argument("--plot", type=Path, help="write a PNG chart of queues over time")
    simulate.add_argument(
        "--until", type=str, default=None, help="stop at this virtual time (e.g. 7d, 36h)"
    )
    simulate.add_argument("--quiet", action="store_true", help="print no table")
    crds = commands.add_parser("crds", help="write the CRDs generated from the API models")
    crds.add_argument("--output", type=Path, default=Path("crds"))
    commands.add_parser("version", help="print the version")
    return parser


def _simulate(args: argparse.Namespace) -> int:
    from kai_ray.sim.run import run_simulation

    return run_simulation(
        args.inputs, report=args.report, plot=args.plot, until=args.until, quiet=args.quiet
    )


def _crds(args: argparse.Namespace) -> int:
    from kai_ray.tools.crds import write_crds

    for path in write_crds(args.output):
        print(path)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "simulate":
            return _simulate(args)
        if args.command == "crds":
            return _crds(args)
        print(__version__)
        return 0
    except InvalidObjectError as err:
        first = err.problems[0] if err.problems else err
        more = f" (and {len(err.problems) - 1} more)" if len(err.problems) > 1 else ""
        print(f"kai-ray: invalid input: {first}{more}", file=sys.stderr)
        return EXIT_INVALID_INPUT


if __name__ == "__main__":
    sys.exit(main())
