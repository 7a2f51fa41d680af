"""`shadowctl preview NAME` and `shadowctl sandbox preview CLAIM`: a signed link to a private preview.

The link is signed here, with the keys of the sandbox's namespace read from the Secret the operator writes there
(`shadow-preview-link-keys`): whoever may read that Secret may hand out links for that namespace's sandboxes,
and for no other namespace's (the router only verifies).
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated

import typer

from shadow_operator.cli.common import NameArg, NamespaceOpt, OutputOpt, connect, emit, err, out
from shadow_operator.common.links import DEFAULT_TTL_SECONDS
from shadow_operator.sdk import environment as envops
from shadow_operator.sdk import kube
from shadow_operator.sdk import sandbox as ops
from shadow_operator.sdk.kube import Op
from shadow_operator.sdk.preview import PreviewLink, signed_preview

TtlOpt = Annotated[
    int,
    typer.Option(
        "--ttl", help="Seconds the link stays valid (at most 86400: the router refuses longer).", min=1
    ),
]
KeysSecretOpt = Annotated[
    str | None,
    typer.Option(
        "--keys-secret",
        help="The keys Secret (default: shadow-preview-link-keys, the namespace's own link keys; the router's "
        "keys Secret signs for any namespace).",
    ),
]
KeysNamespaceOpt = Annotated[
    str | None,
    typer.Option("--keys-namespace", help="Namespace of the keys Secret (default: the sandbox's)."),
]
ClaimArg = Annotated[str, typer.Argument(help="Name of the SandboxClaim.", show_default=False)]


def environment_link(
    name: str, namespace: str, ttl: int, keys_secret: str | None, keys_namespace: str | None
) -> Op[PreviewLink]:
    env = yield from envops.get(namespace, name)
    sandbox = env.status.sandbox if env.status else None
    if not sandbox:
        raise envops.runtime_not_ready(env, " (it has no workspace Sandbox yet)")
    return (
        yield from signed_preview(
            sandbox, namespace, ttl_seconds=ttl, keys_secret=keys_secret, keys_namespace=keys_namespace
        )
    )


def claim_link(
    name: str, namespace: str, ttl: int, keys_secret: str | None, keys_namespace: str | None
) -> Op[PreviewLink]:
    ref = yield from ops.get(name, namespace)
    return (
        yield from signed_preview(
            ref.sandbox_name,
            namespace,
            ttl_seconds=ttl,
            keys_secret=keys_secret,
            keys_namespace=keys_namespace,
        )
    )


def show(link: PreviewLink, output: str) -> None:
    expires = dt.datetime.fromtimestamp(link.expires_at, dt.UTC)
    data = {
        "url": link.url,
        "sandbox": link.sandbox,
        "namespace": link.namespace,
        "expiresAt": expires.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    if emit(data, output):
        return
    out.print(link.url, markup=False, soft_wrap=True)  # one line, whatever the terminal's width
    err.print(f"valid until {data['expiresAt']}; anyone with the link can open the preview until then")


def preview(
    name: NameArg,
    namespace: NamespaceOpt = "",
    ttl: TtlOpt = DEFAULT_TTL_SECONDS,
    keys_secret: KeysSecretOpt = None,
    keys_namespace: KeysNamespaceOpt = None,
    output: OutputOpt = "text",
) -> None:
    """Print a signed link to the environment's (private) preview."""
    with connect() as http:
        show(kube.run(http, environment_link(name, namespace, ttl, keys_secret, keys_namespace)), output)


def sandbox_preview(
    name: ClaimArg,
    namespace: NamespaceOpt = "",
    ttl: TtlOpt = DEFAULT_TTL_SECONDS,
    keys_secret: KeysSecretOpt = None,
    keys_namespace: KeysNamespaceOpt = None,
    output: OutputOpt = "text",
) -> None:
    """Print a signed link to the claimed sandbox's (private) preview."""
    with connect() as http:
        show(kube.run(http, claim_link(name, namespace, ttl, keys_secret, keys_namespace)), output)


def register(app: typer.Typer, sandbox_app: typer.Typer) -> None:
    app.command("preview")(preview)
    sandbox_app.command("preview")(sandbox_preview)
