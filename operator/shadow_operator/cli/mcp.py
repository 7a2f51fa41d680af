"""`shadowctl mcp`: environments and sandboxes as the tools of a Model Context Protocol server.

    shadowctl mcp                            # stdio: a local agent starts it (Claude Code, an IDE)
    shadowctl mcp --http --port 8765         # streamable HTTP at http://127.0.0.1:8765/mcp, with a bearer token

The server acts with this CLI's login (the kubeconfig context, or the Pod's service account): an agent gets
tools, never the credentials. Over HTTP every request needs `Authorization: Bearer TOKEN`, a token the person
starting the server gives (--token-file, $SHADOW_MCP_TOKEN) or that is made and printed once on stderr; the
server binds 127.0.0.1 unless --host names another address and --allow-remote says so.

The `mcp` package is an extra (`pip install 'shadow-operator[mcp]'`): it is imported by this verb only, so the
other verbs start as fast as before.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
from pathlib import Path
from typing import Annotated

import typer

from shadow_operator.cli.common import GLOBALS, NamespaceOpt, err, fail

TOKEN_ENV = "SHADOW_MCP_TOKEN"
MIN_TOKEN = 32  # characters: a token an attacker cannot guess


def bearer_token(token_file: Path | None) -> tuple[str, bool]:
    """The token remote agents must send: from --token-file, else $SHADOW_MCP_TOKEN, else a new one (True:
    made here, so it is shown once)."""
    if token_file is not None:
        try:
            token = token_file.read_text().strip()
        except OSError as exc:
            fail(f"--token-file {token_file}: {exc.strerror}", "give a readable file holding the token")
        source = f"--token-file {token_file}"
    elif env := os.environ.get(TOKEN_ENV):
        token, source = env.strip(), f"${TOKEN_ENV}"
    else:
        return secrets.token_urlsafe(32), True
    if len(token) < MIN_TOKEN or any(ch.isspace() for ch in token):
        fail(
            f"{source}: a token must be at least {MIN_TOKEN} characters without spaces",
            "make one: python3 -c 'import secrets; print(secrets.token_urlsafe(32))'",
        )
    return token, False


def check_host(host: str, allow_remote: bool) -> None:
    """Loopback unless asked: anyone who reaches the port may try the token."""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        fail(f"--host {host}: not an IP address", "e.g. --host 127.0.0.1, or --host 0.0.0.0 --allow-remote")
    if not loopback and not allow_remote:
        fail(
            f"--host {host} would serve this machine's cluster login beyond it",
            "add --allow-remote if that is what you want (the bearer token then guards it)",
        )


def roots_of(roots: list[Path] | None) -> tuple[Path, ...]:
    chosen = [Path(r).expanduser().resolve() for r in roots or [Path.cwd()]]
    for root in chosen:
        if not root.is_dir():
            fail(f"--root {root}: not a directory", "give a directory agents may work from")
    return tuple(chosen)


def mcp(
    namespace: NamespaceOpt = "",
    root: Annotated[
        list[Path] | None,
        typer.Option(
            "--root",
            metavar="DIR",
            help="A local directory agents may create environments from and promote into (repeatable; "
            "default: the current directory). Nothing outside the roots is read or written.",
            show_default=False,
        ),
    ] = None,
    http: Annotated[bool, typer.Option("--http", help="Serve streamable HTTP instead of stdio.")] = False,
    host: Annotated[str, typer.Option(help="Address to bind with --http.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port to bind with --http.")] = 8765,
    allow_remote: Annotated[
        bool, typer.Option("--allow-remote", help="Allow --host to be an address other machines reach.")
    ] = False,
    token_file: Annotated[
        Path | None,
        typer.Option(
            "--token-file",
            help=f"With --http: the file holding the bearer token agents send (default: ${TOKEN_ENV}, else "
            "a new token printed on stderr).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Serve environments and sandboxes to coding agents over MCP (stdio, or streamable HTTP)."""
    roots = roots_of(root)
    if http:
        check_host(host, allow_remote)
        token, made = bearer_token(token_file)
    try:
        from shadow_operator.cli import mcptools
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] not in ("mcp", "mcp_types"):
            raise
        fail("shadowctl mcp needs the mcp package", "pip install 'shadow-operator[mcp]'")
    config = mcptools.Config(namespace, roots, GLOBALS.context, GLOBALS.kubeconfig)
    if not http:
        mcptools.serve_stdio(config)
        return
    where = f"http://{host if ':' not in host else f'[{host}]'}:{port}{mcptools.HTTP_PATH}"
    err.print(f"serving MCP at {where} for namespace {namespace}", markup=False)
    if made:
        err.print(f"bearer token (shown once): {token}", markup=False)
    mcptools.serve_http(config, host, port, token)


def register(app: typer.Typer) -> None:
    app.command("mcp")(mcp)
