"""`shadowctl preview NAME` and `shadowctl sandbox preview CLAIM`: a signed link to a private preview.

The link is signed here, with the keys of the sandbox's namespace read from the Secret the operator writes there
(`shadow-preview-link-keys`): whoever may read that Secret may hand out links for that namespace's sandboxes,
and for no other namespace's (the router only verifies).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Annotated, Any

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


def environment_sandbox(name: str, namespace: str) -> Op[str]:
    """The workspace Sandbox of a ShadowEnvironment."""
    env = yield from envops.get(namespace, name)
    sandbox = env.status.sandbox if env.status else None
    if not sandbox:
        raise envops.runtime_not_ready(env, " (it has no workspace Sandbox yet)")
    return sandbox


def claim_sandbox(name: str, namespace: str) -> Op[str]:
    """The Sandbox a SandboxClaim holds."""
    ref = yield from ops.get(name, namespace)
    return ref.sandbox_name


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


def link_command(find: Callable[[str, str], Op[str]], name_arg: Any, doc: str) -> Callable[..., None]:
    """A `preview` verb: `find` names the Sandbox of the object NAME (its argument `name_arg`), whose preview
    link the verb signs and prints; the verbs differ in nothing else."""

    def command(
        name: str,
        namespace: NamespaceOpt = "",
        ttl: TtlOpt = DEFAULT_TTL_SECONDS,
        keys_secret: KeysSecretOpt = None,
        keys_namespace: KeysNamespaceOpt = None,
        output: OutputOpt = "text",
    ) -> None:
        def link() -> Op[PreviewLink]:
            sandbox = yield from find(name, namespace)
            return (
                yield from signed_preview(
                    sandbox,
                    namespace,
                    ttl_seconds=ttl,
                    keys_secret=keys_secret,
                    keys_namespace=keys_namespace,
                )
            )

        with connect() as http:
            show(kube.run(http, link()), output)

    command.__doc__ = doc
    command.__annotations__["name"] = name_arg  # typer reads the argument's help from it
    return command


preview = link_command(
    environment_sandbox, NameArg, "Print a signed link to the environment's (private) preview."
)
sandbox_preview = link_command(
    claim_sandbox, ClaimArg, "Print a signed link to the claimed sandbox's (private) preview."
)


def register(app: typer.Typer, sandbox_app: typer.Typer) -> None:
    app.command("preview")(preview)
    sandbox_app.command("preview")(sandbox_preview)
