"""The `kai-ray` command line: `simulate`, `operator`, `snapshot`, `explain`, `migrate`,
`crds`, `version`.

Argument parsing and exit codes only; the work is done by the simulator and
the CRD generator. Exit statuses: 0 done; 2 invalid input (one line naming the
file, the object and the field, never a traceback); 3 a scheduling invariant
was broken during a simulation (one line: the cycle, the object, the rule); 1
what a command needs cannot be had (a cluster that cannot be read, an object
that is not there; one line), or, for `migrate`, the converted manifests would
schedule differently from KAI (kai_ray/tools/migrate/command.py).
"""

from __future__ import annotations

import argparse
import gc
import sys
from collections.abc import Sequence
from pathlib import Path

from kai_ray import __version__
from kai_ray.tools.live_commands import (
    add_explain_parser,
    add_live_options,
    explain_command,
    live_snapshot_command,
)
from kai_ray.tools.migrate import add_migrate_parser, migrate_command
from kai_ray.values.errors import InvalidObjectError, UnavailableError

EXIT_INVALID_INPUT = 2
EXIT_INVARIANT_BROKEN = 3
EXIT_UNAVAILABLE = 1


def _add_inputs(parser: argparse.ArgumentParser, nargs: str = "+") -> None:
    parser.add_argument("inputs", nargs=nargs, type=Path, help="YAML files or folders")
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


def _operator_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    operator = commands.add_parser(
        "operator", help="run the scheduler against a cluster ($KUBECONFIG or in-cluster)"
    )
    operator.add_argument("--config", type=Path, help="the SchedulerConfig file (YAML)")
    operator.add_argument("--kubeconfig", help="default: $KUBECONFIG, else in-cluster")
    operator.add_argument("--metrics-port", type=int, default=8080, help="0 turns metrics off")
    operator.add_argument("--health-port", type=int, default=8081)
    operator.add_argument("--bind-address", default="0.0.0.0", help="for metrics and health")
    operator.add_argument(
        "--no-leader-elect", dest="leader_elect", action="store_false", help="schedule alone"
    )
    operator.add_argument("--lease-namespace", default="kube-system")
    operator.add_argument("--lease-name", default="kai-ray")
    operator.add_argument("--identity", help="this replica's name in the Lease")
    operator.add_argument(
        "--webhook-host", default="127.0.0.1", help="where the API server reaches the webhook"
    )
    operator.add_argument("--webhook-port", type=int, default=9443)
    operator.add_argument("--webhook-cert-dir", type=Path, default=Path("/tmp/kai-ray-webhook"))
    operator.add_argument(
        "--no-webhook", action="store_true", help="serve no admission webhook (pods not held)"
    )
    operator.add_argument(
        "--webhook-service",
        metavar="NAMESPACE/NAME",
        help="in a cluster: the API server reaches the webhook through this Service "
        "(--webhook-host is then only the address it listens on)",
    )
    operator.add_argument("--webhook-service-port", type=int, default=443)
    operator.add_argument(
        "--webhook-config-name",
        default="kai-ray.io",
        help="the webhook configuration the operator keeps up to date",
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kai-ray", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    _simulate_parser(commands)
    snapshot = commands.add_parser(
        "snapshot", help="write the whole simulator input as one YAML file, from files or a cluster"
    )
    _add_inputs(snapshot, nargs="*")
    snapshot.add_argument("-o", "--output", type=Path, required=True)
    add_live_options(snapshot, "read this live cluster instead of files")
    add_explain_parser(commands)
    _operator_parser(commands)
    add_migrate_parser(commands)
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
    if args.kubeconfig is not None:
        return live_snapshot_command(args)
    from kai_ray.sim.run import write_snapshot

    if not args.inputs:
        raise UnavailableError("snapshot: give input files, or --kubeconfig to read a cluster")
    return write_snapshot(args.inputs, args.trace, args.output)


def _crds(args: argparse.Namespace) -> int:
    from kai_ray.tools.crds import write_crds

    for path in write_crds(args.output):
        print(path)
    return 0


def _operator(args: argparse.Namespace) -> int:
    from kai_ray.controller import OperatorOptions, main

    options = OperatorOptions(
        config_file=args.config,
        kubeconfig=args.kubeconfig,
        metrics_port=args.metrics_port,
        health_port=args.health_port,
        bind_address=args.bind_address,
        leader_elect=args.leader_elect,
        lease_namespace=args.lease_namespace,
        lease_name=args.lease_name,
        webhook_host=None if args.no_webhook else args.webhook_host,
        webhook_port=args.webhook_port,
        webhook_cert_dir=args.webhook_cert_dir,
        webhook_service=args.webhook_service,
        webhook_service_port=args.webhook_service_port,
        webhook_config_name=args.webhook_config_name,
    )
    if args.identity:
        options.identity = args.identity
    main(options)
    return 0


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "simulate":
        return _simulate(args)
    if args.command == "operator":
        return _operator(args)
    if args.command == "snapshot":
        return _snapshot(args)
    if args.command == "crds":
        return _crds(args)
    if args.command == "migrate":
        return migrate_command(args)
    if args.command == "explain":
        return explain_command(args)
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
    except UnavailableError as err:
        print(f"kai-ray: {err}", file=sys.stderr)
        return EXIT_UNAVAILABLE


def run() -> None:
    """`kai-ray` as a process: `main`, then exit with its code. What the process
    still holds as it ends (a finished simulation's whole state, held in reference
    cycles) goes with it; the collector's last passes at exit would walk all of it
    to free nothing the exit does not (10 s after six virtual hours of the
    4,096-node week), so it is moved out of their sight first."""
    code = main()
    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    run()
