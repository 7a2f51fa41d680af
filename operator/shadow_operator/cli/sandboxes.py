"""`shadowctl sandbox ...`: the same verbs for plain sandboxes (claims from a template or a warm pool)."""

from __future__ import annotations

import contextlib
import sys
from typing import Annotated

import typer
from rich.table import Table

from shadow_operator.api import constants as c
from shadow_operator.cli.common import (
    GLOBALS,
    AllNamespacesOpt,
    AllowOpt,
    NamespaceOpt,
    OutputOpt,
    connect,
    emit,
    err,
    fail,
    kube_list,
    name_argument,
    out,
    waking,
)
from shadow_operator.cli.copying import cp_command
from shadow_operator.sdk import fork as forkops
from shadow_operator.sdk import kube, wake
from shadow_operator.sdk import sandbox as ops
from shadow_operator.sdk.errors import ShadowError
from shadow_operator.sdk.runtime import RuntimeEndpoint
from shadow_operator.sdk.sandbox import ClaimOptions, SandboxClient

app = typer.Typer(help="Plain sandboxes: claim, exec, cp, preview, snapshot, delete.", no_args_is_help=True)
ClaimArg = Annotated[str, name_argument("SandboxClaim", "Name of the SandboxClaim.")]


@app.command()
def claim(
    name: Annotated[str | None, typer.Argument(help="Name of the claim (default: generated).")] = None,
    template: Annotated[str | None, typer.Option(help="SandboxTemplate to cold-start from.")] = None,
    warmpool: Annotated[
        str | None, typer.Option(help="SandboxWarmPool to take a ready sandbox from.")
    ] = None,
    env: Annotated[
        list[str] | None, typer.Option("--env", help="NAME=VALUE for the sandbox (repeatable).")
    ] = None,
    allow: AllowOpt = None,
    namespace: NamespaceOpt = "",
    timeout: Annotated[float, typer.Option(help="Seconds to wait for Ready.")] = 180.0,
    output: OutputOpt = "text",
) -> None:
    """Claim a sandbox and wait until it is Ready.

    Prints the claim's name (-o json: claim, sandbox, namespace).
    """
    variables = {}
    for item in env or ():
        key, sep, value = item.partition("=")
        if not sep or not key:
            fail(f"--env {item}: expected NAME=VALUE", "e.g. --env DEBUG=1")
        variables[key] = value
    client = SandboxClient(namespace=namespace, client=connect())
    with err.status("waiting for the sandbox"):
        options: ClaimOptions = {"warmpool": warmpool, "claim_name": name, "env": variables, "allow": allow}
        options["sandbox_ready_timeout"] = timeout
        sandbox = client.create_sandbox(template, **options)
    data = {"claim": sandbox.claim_name, "sandbox": sandbox.sandbox_name, "namespace": sandbox.namespace}
    if not emit(data, output):
        out.print(sandbox.claim_name)


@app.command("list")
def list_(
    namespace: NamespaceOpt = "", all_namespaces: AllNamespacesOpt = False, output: OutputOpt = "text"
) -> None:
    """List the sandbox claims of a namespace (-A: of every namespace); -o json|yaml prints them as kubectl
    does (a List of the objects)."""
    everywhere = all_namespaces or GLOBALS.all_namespaces
    with connect() as http:
        claims = kube.run(http, ops.list_claims(None if everywhere else namespace))
    items = [{"apiVersion": SANDBOX_CLAIM_API_VERSION, "kind": "SandboxClaim", **body} for body in claims]
    if emit(kube_list(items), output):
        return
    rows = []
    for body in claims:
        ready: dict[str, str] = next(
            (x for x in (body.get("status") or {}).get("conditions") or () if x["type"] == c.COND_READY), {}
        )
        rows.append(
            {
                **({"namespace": body["metadata"]["namespace"]} if everywhere else {}),
                "name": body["metadata"]["name"],
                "ready": ready.get("status", "Unknown"),
                "reason": ready.get("reason", ""),
                "sandbox": ((body.get("status") or {}).get("sandbox") or {}).get("name", ""),
            }
        )
    table = Table(*(["NAMESPACE"] if everywhere else []), "NAME", "READY", "REASON", "SANDBOX", box=None)
    for row in rows:
        table.add_row(*row.values())
    out.print(table)


SANDBOX_CLAIM_API_VERSION = f"{c.EXTENSIONS_GROUP}/{c.STORAGE_VERSION}"


@app.command("exec")
def exec_(
    name: ClaimArg,
    command: Annotated[list[str], typer.Argument(help="The command, after --.", show_default=False)],
    namespace: NamespaceOpt = "",
    timeout: Annotated[float, typer.Option(help="Seconds before the command is killed.")] = 600.0,
) -> None:
    """Run a command in the sandbox.

    Prints its output; shadowctl exits with the command's exit code (124 on timeout).
    """
    client = SandboxClient(namespace=namespace, client=connect(), on_wake=waking)
    result = client.get_sandbox(name).commands.run(command, timeout)
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    raise typer.Exit(124 if result.timed_out else result.exit_code)


def claim_endpoint(name: str, namespace: str) -> kube.Op[RuntimeEndpoint]:
    """The runtime of a claimed sandbox, woken first when it sleeps."""
    ref = yield from ops.get(name, namespace)
    yield from wake.wake_sandbox(ref.namespace, ref.sandbox_name, progress=waking, claim=ref.claim_name)
    return (yield from ops.endpoint(ref))


app.command("cp")(
    cp_command(
        claim_endpoint,
        "CLAIM:PATH or a local path.",
        ("cp needs exactly one side in the sandbox", "e.g. shadowctl sandbox cp my-claim:out.txt ./out.txt"),
        "Copy a file or directory between this machine and a sandbox (downloads: as `shadowctl cp`).",
    )
)


@app.command()
def delete(name: ClaimArg, namespace: NamespaceOpt = "") -> None:
    """Delete the claim (and with it the sandbox)."""
    with connect() as http:
        kube.run(http, ops.delete(name, namespace))
    err.print(f"deleted SandboxClaim {namespace}/{name}")


@app.command()
def snapshot(
    name: Annotated[str, typer.Argument(help="Name of the Sandbox (or of the claim that holds it).")],
    volume: Annotated[
        str, typer.Option(help="The volumeClaimTemplate whose volume to snapshot.")
    ] = c.WORKSPACE_VOLUME,
    snapshot_name: Annotated[
        str | None, typer.Option("--name", help="Name of the VolumeSnapshot (default: SANDBOX-<UTC time>).")
    ] = None,
    retain: Annotated[bool, typer.Option("--retain", help="Keep it when the Sandbox is deleted.")] = False,
    namespace: NamespaceOpt = "",
    timeout: Annotated[float, typer.Option(help="Seconds to wait until it is ready to use.")] = 300.0,
    output: OutputOpt = "text",
) -> None:
    """Snapshot a sandbox's volume (flushed first) and wait until it is ready to use.

    A new Sandbox starts from it with a volumeClaimTemplate whose spec has
    dataSource: {apiGroup: snapshot.storage.k8s.io, kind: VolumeSnapshot, name: NAME}.
    """
    with connect() as http, err.status(f"snapshotting {name}"):
        sandbox = name  # unless it names a (ready) claim: then its sandbox
        with contextlib.suppress(ShadowError):
            sandbox = kube.run(http, ops.get(name, namespace)).sandbox_name
        body = kube.run(
            http,
            forkops.snapshot_sandbox(
                namespace, sandbox, snapshot_name, volume=volume, retain=retain, timeout=timeout
            ),
        )
    meta, status = body["metadata"], body.get("status") or {}
    data = {"name": meta["name"], "namespace": meta["namespace"], "restoreSize": status.get("restoreSize")}
    if not emit(data, output):
        out.print(
            f"VolumeSnapshot {meta['namespace']}/{meta['name']} of Sandbox {sandbox} is ready "
            f"({status.get('restoreSize') or 'size unknown'})"
        )
