"""The shadowctl application: the typer app, its global options and the error handling of `main()`."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Annotated, NoReturn

import typer
from rich.markup import escape

from shadow_operator import __version__
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


def no_options() -> None:
    """Running a verb: `main()` has lifted the global options out of the command line, so the root needs none
    (each would cost the parser a pydantic TypeAdapter); help and completion get `options`. A callback
    there must be, or an app of one command (race) would run it without its name."""


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


# The module of each verb. A command loads its own module only, so a `shadowctl list` does not import the
# models and SDK operations of every other verb; help, completion and an unknown verb load them all.
VERB_MODULES = {
    **dict.fromkeys(
        (
            "create", "list", "status", "exec", "shell", "cp", "diff", "promote", "publish", "publish-all", "sync", "logs",
            "journal", "decide", "handoff", "verify", "stop", "start", "destroy",
        ),
        ("environments",),
    ),
    "fork": ("forks",),
    "snapshot": ("forks",),
    "race": ("race",),
    "manifest": ("manifest",),
    "preview": ("previews", "sandboxes"),
    "sandbox": ("previews", "sandboxes"),
    "doctor": ("maintenance",),
    "mcp": ("mcp",),
    "egress": ("egress",),
    "cleanup": ("maintenance",),
}  # fmt: skip
ALL_MODULES = (
    "environments", "forks", "race", "manifest", "previews", "maintenance", "mcp", "sandboxes", "egress",
)  # fmt: skip


def register(verb: str | None) -> None:
    """Add the commands of `verb`'s module (every module's for None or a verb not in VERB_MODULES)."""
    app.callback()(no_options if verb in VERB_MODULES else options)
    names = VERB_MODULES.get(verb or "", ALL_MODULES)
    modules = {name: importlib.import_module(f"shadow_operator.cli.{name}") for name in names}
    for name, module in modules.items():
        if name == "previews":
            module.register(app, modules["sandboxes"].app)
        elif name == "sandboxes":
            app.add_typer(module.app, name="sandbox")
        else:
            module.register(app)


def first_verb(args: list[str]) -> str | None:
    """The verb of a command line whose global options are lifted out (None when help is asked for)."""
    if "--help" in args or "-h" in args or any(k.endswith("_COMPLETE") for k in os.environ):
        return None
    return next((a for a in args if not a.startswith("-")), None)


def _error(message: str, hint: str, code: int) -> NoReturn:
    err.print(f"[red]error:[/red] {escape(' '.join(message.split()))}")
    if hint:
        err.print(f"hint: {hint}", markup=False)
    sys.exit(code)


def main(argv: list[str] | None = None) -> None:
    """Every error ends as one line and a hint (usage errors too), never a traceback."""
    try:
        args = lift_globals(sys.argv[1:] if argv is None else list(argv)) or ["--help"]
        register(first_verb(args))
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
