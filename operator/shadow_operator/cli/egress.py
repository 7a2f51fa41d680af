"""`shadowctl egress log`: what the egress gateway allowed and refused for an environment or a sandbox."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from shadow_operator.cli.common import (
    NamespaceOpt,
    OutputOpt,
    connect,
    emit,
    err,
    name_argument,
    out,
)
from shadow_operator.sdk import egress, kube

TargetArg = Annotated[
    str,
    name_argument(
        "ShadowEnvironment", "Name of the environment (with --sandbox: of the SandboxClaim, or of a Sandbox)."
    ),
]
app = typer.Typer(help="Egress through the gateway: its decisions for a workspace.", no_args_is_help=True)


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="egress")


@app.command("log")
def log(
    name: TargetArg,
    namespace: NamespaceOpt = "",
    sandbox: Annotated[
        bool, typer.Option("--sandbox", help="NAME is a SandboxClaim (or a Sandbox), not an environment.")
    ] = False,
    refused: Annotated[bool, typer.Option("--refused", help="Refusals only.")] = False,
    output: OutputOpt = "text",
) -> None:
    """The egress gateway's decisions for an environment's workspace (--sandbox: a claim's sandbox), the
    most recent last: each kind (allowed or refused, method, host) once, with how often and when last.

    A refusal says which rule would allow it, as --allow takes it. Kept as Events on the Sandbox, so
    `kubectl describe sandbox` shows them too, for the API server's event TTL (an hour by default).
    """
    with connect() as http:
        target = kube.run(
            http,
            egress.claim_sandbox(namespace, name) if sandbox else egress.environment_sandbox(namespace, name),
        )
        decisions = kube.run(http, egress.log(namespace, target))
    if refused:
        decisions = [d for d in decisions if d.refused]
    if emit([d.to_dict() for d in decisions], output):
        return
    if not decisions:
        err.print(
            f"no {'refused ' if refused else ''}egress decisions recorded for Sandbox {namespace}/{target} "
            "(in the last hour, or its template has no spec.egress)",
            markup=False,
        )
        return
    table = Table("LAST SEEN", "COUNT", "DECISION", "METHOD", "DESTINATION", "RULE", box=None)
    for d in decisions:
        where = f"{d.host}{'' if d.port in (0, 443) else f':{d.port}'}{d.path}"
        if d.decision == "allowed":
            rule = d.rule
        elif d.hint:
            rule = f"add: --allow '{d.hint}'"
        else:
            rule = d.note.partition(": ")[2] or d.note
        # Escaped by the SDK, and plain Text: no cell is read as rich markup either.
        table.add_row(*(Text(cell) for cell in (d.last, str(d.count), d.decision, d.method, where, rule)))
    for column in table.columns:
        column.overflow = "fold"
    out.print(table)
