"""Entry point: `shadow-operator run` or `python -m shadow_operator run`."""

from __future__ import annotations

import argparse
import sys

import kopf

from shadow_operator import __version__


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="shadow-operator", description=__doc__)
    parser.add_argument("--version", action="version", version=f"shadow-operator {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the operator against the current kubeconfig / in-cluster config")
    run.add_argument("--namespace", "-n", action="append", default=[], help="watch only these namespaces")
    run.add_argument("--standalone", action="store_true", help="no peering (single replica)")
    run.add_argument("--liveness", default="http://0.0.0.0:8080/healthz", help="liveness endpoint URL")
    args = parser.parse_args(argv)

    import shadow_operator.controllers  # noqa: F401  (registers the handlers)

    kopf.configure(verbose=False)
    kopf.run(
        standalone=args.standalone,
        namespaces=args.namespace,
        clusterwide=not args.namespace,
        liveness_endpoint=args.liveness,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
