"""shadowctl (also the kubectl plugin `kubectl-shadow`): shadow environments and sandboxes from the command line.

    shadowctl create my-change --local ~/src/core --rewrite https://github.com/microsoft/=shadow
    shadowctl exec my-change -- python3 -m pytest -q
    shadowctl diff my-change
    shadowctl fork my-change --count 3   # three independent copies (copy-on-write where storage allows)
    shadowctl race my-change --count 3 -- 'agent fix-tests'   # forks, verified and ranked; --promote the best
    shadowctl manifest my-change -o yaml # seed 001's handoff manifest for a smoke-test agent
    shadowctl promote my-change
    shadowctl preview my-change          # a signed link to its private preview
    shadowctl destroy my-change

Every verb talks to the API server of the kubeconfig's context (`--context` picks another); workspace runtimes
are reached through the API server's pod proxy, so no Ingress or port-forward is needed. Errors print one line
and a hint, never a traceback.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from rich.markup import escape

from shadow_operator.cli import environments, forks, maintenance, manifest, previews, race, sandboxes
from shadow_operator.cli.common import GLOBALS, err
from shadow_operator.sdk.errors import ShadowError

app = typer.Typer(
    name="shadowctl",
    help="Isolated copies of your work on Kubernetes: ShadowEnvironments with their own Gitea, a diff, a "
    "verdict and a way back (promote); and plain sandboxes.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


@app.callback()
def options(
    context: Annotated[
        str | None, typer.Option("--context", help="kubeconfig context to use (default: the current one).")
    ] = None,
) -> None:
    GLOBALS.context = context


environments.register(app)
forks.register(app)
race.register(app)
manifest.register(app)
previews.register(app, sandboxes.app)
maintenance.register(app)
app.add_typer(sandboxes.app, name="sandbox")


def main(argv: list[str] | None = None) -> None:
    try:
        app(args=argv, prog_name="shadowctl", standalone_mode=True)
    except ShadowError as exc:
        err.print(f"[red]error:[/red] {escape(exc.message)}")
        if exc.hint:
            err.print(f"hint: {exc.hint}", markup=False)
        sys.exit(1)
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)
