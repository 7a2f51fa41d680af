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
from typing import Annotated, NoReturn

import typer
from rich.markup import escape

from shadow_operator import __version__
from shadow_operator.cli import environments, forks, maintenance, manifest, mcp, previews, race, sandboxes
from shadow_operator.cli.common import GLOBALS, check_output, err, out
from shadow_operator.sdk.errors import ShadowError

app = typer.Typer(
    name="shadowctl",
    help="Isolated copies of your work on Kubernetes: ShadowEnvironments with their own Gitea, a diff, a "
    "verdict and a way back (promote); and plain sandboxes.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _version(value: bool) -> None:
    if value:
        out.print(f"shadowctl {__version__}", markup=False)
        raise typer.Exit()


@app.callback()
def options(
    context: Annotated[
        str | None, typer.Option("--context", help="kubeconfig context to use (default: the current one).")
    ] = None,
    kubeconfig: Annotated[
        str | None,
        typer.Option(
            "--kubeconfig", help="kubeconfig file(s) to read (default: $KUBECONFIG, ~/.kube/config)."
        ),
    ] = None,
    namespace: Annotated[
        str | None, typer.Option("--namespace", "-n", help="Namespace (default: the context's).")
    ] = None,
    version: Annotated[
        bool, typer.Option("--version", help="Print the version and exit.", callback=_version, is_eager=True)
    ] = False,
) -> None:
    """Global options; `main()` has already lifted them out of the command line wherever they stood."""


# Options kubectl users give anywhere: (long, short, takes a value) -> the Globals field it sets.
GLOBAL_OPTIONS = {
    "--context": ("context", True),
    "--kubeconfig": ("kubeconfig", True),
    "--namespace": ("namespace", True),
    "-n": ("namespace", True),
    "--all-namespaces": ("all_namespaces", False),
    "-A": ("all_namespaces", False),
    "--output": ("output", True),
    "-o": ("output", True),
}


def lift_globals(argv: list[str]) -> list[str]:
    """Take the global options out of `argv` (up to `--`, after which everything is the command's) into
    GLOBALS and return the rest: click then never sees them, so they work before or after the verb, and the
    verbs' own -n and -A read GLOBALS."""
    rest: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            rest.extend(argv[i:])
            break
        name, eq, value = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        if name not in GLOBAL_OPTIONS and arg[:2] in ("-n", "-o") and len(arg) > 2:
            name, eq, value = arg[:2], "=", arg[2:]  # -nteam-a, -ojson
        if name not in GLOBAL_OPTIONS:
            rest.append(arg)
            i += 1
            continue
        field, takes_value = GLOBAL_OPTIONS[name]
        if not takes_value:
            setattr(GLOBALS, field, True)
            i += 1
            continue
        if not eq:
            if i + 1 >= len(argv) or argv[i + 1] == "--":
                raise ShadowError(f"{name} needs a value", hint=f"e.g. {name} NAME")
            value = argv[i + 1]
            i += 1
        setattr(GLOBALS, field, value)
        i += 1
    if GLOBALS.output is not None:
        check_output(GLOBALS.output)
    return rest


environments.register(app)
forks.register(app)
race.register(app)
manifest.register(app)
previews.register(app, sandboxes.app)
maintenance.register(app)
mcp.register(app)
app.add_typer(sandboxes.app, name="sandbox")


def _error(message: str, hint: str, code: int) -> NoReturn:
    err.print(f"[red]error:[/red] {escape(' '.join(message.split()))}")
    if hint:
        err.print(f"hint: {hint}", markup=False)
    sys.exit(code)


def main(argv: list[str] | None = None) -> None:
    """Every error ends as one line and a hint (usage errors too), never a traceback."""
    try:
        args = lift_globals(sys.argv[1:] if argv is None else list(argv)) or ["--help"]
        code = app(args=args, prog_name="shadowctl", standalone_mode=False)
    except ShadowError as exc:
        _error(exc.message, exc.hint, 1)
    except typer.TyperException as exc:  # the parser's: a usage error, or the help of a bare group
        ctx = getattr(exc, "ctx", None)
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        if "\n" in message.strip():
            err.print(message, markup=False)
            sys.exit(2)
        _error(message, f"{ctx.command_path if ctx else 'shadowctl'} --help", 2)
    except (typer.Abort, KeyboardInterrupt):
        err.print("interrupted")
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)
