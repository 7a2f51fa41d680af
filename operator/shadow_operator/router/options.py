"""Command-line options of `shadow-operator router-auth` (light: `--help` imports nothing else)."""

from __future__ import annotations

import argparse
from pathlib import Path

ACCESS_VALUES = ("public", "private")
# decisions.SUBJECT_ACCESS_REVIEW, decisions.INSECURE_ALLOW_ALL (named here again: --help stays light).
AUTHZ_MODES = ("subjectaccessreview", "insecure-allow-all")
DEFAULT_MAX_TOKEN_SECONDS = 24 * 3600  # tokens.DEFAULT_MAX_LIFETIME_SECONDS
DEFAULT_HOLD_SECONDS = 15.0  # wake.DEFAULT_HOLD_SECONDS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--listen", default="127.0.0.1:8090", help="HOST:PORT to serve nginx on")
    parser.add_argument(
        "--namespace", "-n", action="append", required=True, help="namespace of routable sandboxes"
    )
    parser.add_argument("--domain", required=True, help="preview domain: <sandbox>.<domain>")
    parser.add_argument("--scheme", choices=("http", "https"), default="https", help="scheme of preview URLs")
    parser.add_argument(
        "--default-access",
        choices=ACCESS_VALUES,
        default="public",
        help="previews without a shadow.dev/preview-access annotation (on the Sandbox or its template)",
    )
    parser.add_argument("--keys-dir", type=Path, help="directory of preview signing keys (a mounted Secret)")
    parser.add_argument(
        "--preview-port", type=int, default=3000, help="when the template names no preview port"
    )
    parser.add_argument(
        "--max-token-seconds",
        type=int,
        default=DEFAULT_MAX_TOKEN_SECONDS,
        help="refuse preview links signed to live longer than this",
    )
    parser.add_argument(
        "--authz-mode",
        choices=AUTHZ_MODES,
        default=AUTHZ_MODES[0],
        help="who may use the SDK path: subjectaccessreview (a port-forward, or a bearer token allowed to "
        "create sandboxes/proxy in the sandbox's namespace); insecure-allow-all (anyone, public sandboxes)",
    )
    parser.add_argument(
        "--trust-loopback",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="SDK requests from loopback (kubectl port-forward to the router) need no token",
    )
    parser.add_argument(
        "--sdk",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="serve the SDK path (reads a sandbox's runtime token Secret, by name, to attach it)",
    )
    parser.add_argument(
        "--hold-seconds",
        type=float,
        default=DEFAULT_HOLD_SECONDS,
        help="how long a request for a sleeping sandbox waits while it wakes up, then 504",
    )
    parser.add_argument(
        "--metrics-listen",
        help="HOST:PORT of /metrics (requests and upstream latency per sandbox); none if unset",
    )
    parser.add_argument(
        "--access-log-listen",
        default="127.0.0.1:8091",
        help="UDP HOST:PORT where nginx sends its metrics access log (syslog); used with --metrics-listen",
    )
    parser.add_argument(
        "--metrics-max-sandboxes",
        type=int,
        default=200,
        help="sandbox label values at most; further sandboxes count under _other",
    )
