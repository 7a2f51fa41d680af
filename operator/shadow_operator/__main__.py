"""Entry point: `shadow-operator run` or `python -m shadow_operator run`.

Leader election (a coordination.k8s.io/v1 Lease) is on by default unless `--standalone` is given, so that
several replicas can run and exactly one of them acts: `--leader-elect` / `--no-leader-elect` (or
SHADOW_LEADER_ELECTION=true|false) decide explicitly. A replica waiting for the Lease serves its liveness
endpoint and does nothing else: kopf (watches, handlers, the metrics server) starts only once it leads.
With leader election, kopf's own peering is always off; `--standalone` without it keeps the old single-replica
behaviour.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import sys

from shadow_operator import __version__


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="shadow-operator", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"shadow-operator {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the operator against the current kubeconfig / in-cluster config")
    scope = run.add_mutually_exclusive_group()
    scope.add_argument("--namespace", "-n", action="append", default=[], help="watch only these namespaces")
    scope.add_argument(
        "--all-namespaces", "-A", action="store_true", help="watch the whole cluster (the default)"
    )
    run.add_argument(
        "--standalone", action="store_true", help="no peering and, by default, no leader election"
    )
    run.add_argument("--liveness", default="http://0.0.0.0:8080/healthz", help="liveness endpoint URL")
    election = run.add_argument_group(
        "leader election", "each flag overrides its environment variable (in parentheses)"
    )
    election.add_argument(
        "--leader-elect",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="act only while holding the Lease (SHADOW_LEADER_ELECTION; default: on unless --standalone)",
    )
    election.add_argument(
        "--leader-election-namespace",
        metavar="NS",
        help="namespace of the Lease (SHADOW_LEADER_ELECTION_NAMESPACE, else POD_NAMESPACE, "
        "else SHADOW_OPERATOR_NAMESPACE, else shadow-system)",
    )
    election.add_argument(
        "--leader-election-id", metavar="NAME", help="name of the Lease (SHADOW_LEASE_NAME; shadow-operator)"
    )
    election.add_argument(
        "--lease-duration", type=int, metavar="S", help="seconds a standby waits (SHADOW_LEASE_DURATION; 15)"
    )
    election.add_argument(
        "--renew-deadline",
        type=float,
        metavar="S",
        help="seconds the leader keeps trying to renew before it exits (SHADOW_RENEW_DEADLINE; 10)",
    )
    election.add_argument(
        "--retry-period", type=float, metavar="S", help="seconds between attempts (SHADOW_RETRY_PERIOD; 2)"
    )
    auth = sub.add_parser(
        "router-auth", help="the router's decision service for nginx auth_request (beside the preview router)"
    )
    from shadow_operator.router.options import add_arguments

    add_arguments(auth)
    return parser


OPERATOR_EXTRA = ("kopf", "aiohttp", "prometheus_client")


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except ModuleNotFoundError as exc:
        if exc.name not in OPERATOR_EXTRA:
            raise
        # `pip install shadow-operator` is the client alone: say what is missing instead of a traceback.
        print(
            f"shadow-operator: the operator needs the `operator` extra ({exc.name} is not installed): "
            "pip install 'shadow-operator[operator]'",
            file=sys.stderr,
        )
        return 2


def _main(argv: list[str] | None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "router-auth":
        from shadow_operator.router import server

        return server.main(args)
    if argv is None:
        # The operator's own process (not a test calling main): kopf imports these optional clients, when
        # installed, only to recognise their objects, which this operator never hands it. That is 1 s of
        # start-up and ~35 MiB for nothing (`kubernetes` is a test dependency in the dev environment).
        for optional in ("kubernetes", "kubernetes_asyncio", "pykube"):
            sys.modules.setdefault(optional, None)  # type: ignore[arg-type]

    # Imported here, not at the top: `--help` and bad arguments should not need the whole operator.
    from shadow_operator.engine import leader

    try:
        elect = args.leader_elect
        if elect is None:
            elect = leader.enabled_from_env(default=not args.standalone)
        config = (
            leader.LeaderElectionConfig.from_env(
                namespace=args.leader_election_namespace,
                lease_name=args.leader_election_id,
                lease_duration=args.lease_duration,
                renew_deadline=args.renew_deadline,
                retry_period=args.retry_period,
            )
            if elect
            else None
        )
    except ValueError as exc:
        parser.error(str(exc))

    import kopf

    import shadow_operator.controllers  # (registers the handlers)

    json_logs = os.environ.get("SHADOW_LOG_FORMAT", "").lower() == "json"
    kopf.configure(verbose=False, log_format=kopf.LogFormat.JSON if json_logs else kopf.LogFormat.FULL)
    namespaces: list[str] = args.namespace
    shadow_operator.controllers.manager.namespaces = tuple(namespaces)  # its own feeds follow kopf's scope
    if config is None:
        kopf.run(
            standalone=args.standalone,
            namespaces=namespaces,
            clusterwide=not namespaces,
            liveness_endpoint=args.liveness,
        )
        return 0
    # A standby's metrics endpoint answers too (the metrics Service selects every replica).
    shadow_operator.controllers.settings.start_metrics(shadow_operator.controllers.Config.from_env())
    # The Lease replaces kopf's peering, so kopf itself always runs standalone here.
    operator = functools.partial(
        kopf.operator,
        standalone=True,
        namespaces=namespaces,
        clusterwide=not namespaces,
        liveness_endpoint=args.liveness,
    )
    asyncio.run(leader.run_with_leadership(operator, config, liveness=args.liveness))
    return 0


if __name__ == "__main__":
    sys.exit(main())
