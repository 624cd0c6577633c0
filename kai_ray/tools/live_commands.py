"""The arguments of the commands that read a live cluster: `explain`, `snapshot --kubeconfig`.

Parsing and dispatch only (the command line's `cli.py` registers them); the work
is done by `explain_view.py`, `explain_report.py` and `live_snapshot.py`,
imported when a command runs.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from kai_ray.values.errors import UnavailableError

#: `--kubeconfig` given without a file: $KUBECONFIG (else in-cluster).
FROM_ENVIRONMENT = "$KUBECONFIG"


def add_live_options(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "--kubeconfig",
        nargs="?",
        const=FROM_ENVIRONMENT,
        metavar="FILE",
        help=f"{what} (without FILE: $KUBECONFIG)",
    )
    parser.add_argument("--config", type=Path, help="the SchedulerConfig the operator runs with")


def add_explain_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    explain = commands.add_parser(
        "explain", help="why a pod, PodGroup or workload waits (a live cluster or a report)"
    )
    explain.add_argument("name", help="[kind/]name: pod, podgroup, raycluster, rayjob or job")
    explain.add_argument("-n", "--namespace", help="default: default (a report: any)")
    add_live_options(explain, "the cluster to read (default: $KUBECONFIG)")
    explain.add_argument("--report", type=Path, help="a report of kai-ray simulate instead")
    explain.add_argument("--at", help="with --report: the time, in seconds or as 2h, 90m")


def _kubeconfig(args: argparse.Namespace) -> str | None:
    return None if args.kubeconfig in (None, FROM_ENVIRONMENT) else str(args.kubeconfig)


def explain_command(args: argparse.Namespace) -> int:
    if args.report is not None:
        from kai_ray.tools.explain_report import explain_report

        if args.at is None:
            raise UnavailableError("explain: --report needs --at TIME")
        return explain_report(args.report, args.at, args.name, args.namespace)
    from kai_ray.tools.explain_view import explain_live

    return explain_live(_kubeconfig(args), args.namespace or "default", args.name, args.config)


def live_snapshot_command(args: argparse.Namespace) -> int:
    from kai_ray.tools.live_snapshot import write_live_snapshot

    if args.inputs or args.trace:
        raise UnavailableError("snapshot: give input files or --kubeconfig, not both")
    return write_live_snapshot(_kubeconfig(args), args.config, args.output)
