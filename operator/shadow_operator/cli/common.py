"""What every shadowctl verb shares: the consoles, the options, output formats, the cluster connection."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.console import Console

from shadow_operator.sdk import kube
from shadow_operator.sdk.errors import ShadowError

if TYPE_CHECKING:
    import httpx

    from shadow_operator.api.kinds import ResourceKind

out = Console(highlight=False)
# Errors stay on one line however narrow the terminal (scripts grep them).
err = Console(stderr=True, soft_wrap=True, highlight=False)

OUTPUTS = ("text", "json", "yaml")


def waking(message: str) -> None:
    """Progress of a call that wakes a sandbox suspended for idleness ("waking sandbox ns/name…"), on stderr."""
    err.print(message, markup=False)


@dataclass
class Globals:
    """Options kubectl takes anywhere on the command line: `main()` lifts them out of argv before click
    parses it, so they work before or after the verb."""

    context: str | None = None
    kubeconfig: str | None = None
    namespace: str | None = None
    all_namespaces: bool = False
    output: str | None = None


GLOBALS = Globals()


def fail(message: str, hint: str = "") -> NoReturn:
    raise ShadowError(message, hint=hint)


def default_namespace() -> str:
    """-n if given (anywhere), else $SHADOW_NAMESPACE, else the context's namespace, as kubectl does."""
    if GLOBALS.namespace:
        return GLOBALS.namespace
    if env := os.environ.get("SHADOW_NAMESPACE"):
        return env
    return kube.context_namespace(GLOBALS.context, GLOBALS.kubeconfig)


def _namespace(value: str | None) -> str:
    return value or default_namespace()


def check_output(value: str) -> str:
    """Checked while the command line is parsed, so a typo costs no API call (and no waiting for one)."""
    if value not in OUTPUTS:
        fail(f"--output {value}: unknown format", "use text, json or yaml")
    return value


def _output(value: str) -> str:
    return check_output(GLOBALS.output or value)


NamespaceOpt = Annotated[
    str,
    typer.Option(
        "--namespace",
        "-n",
        help="Namespace (default: the kubeconfig context's).",
        callback=_namespace,
        show_default=False,
    ),
]
AllNamespacesOpt = Annotated[
    bool, typer.Option("--all-namespaces", "-A", help="List in every namespace you may read.")
]
OutputOpt = Annotated[str, typer.Option("--output", "-o", help="text, json or yaml.", callback=_output)]


def complete_names(kind_name: str) -> Callable[[typer.Context, str], list[str]]:
    """Shell completion of the names of the kind `kind_name` in the command's namespace, read from the
    cluster; nothing (never an error, never a wait of more than a few seconds) when the cluster cannot say."""

    def complete(ctx: typer.Context, incomplete: str) -> list[str]:
        from shadow_operator.api.kinds import by_kind

        kind: ResourceKind = by_kind(kind_name)
        try:
            # While completing, main() has not run: the global options given before the verb are the root's.
            given = ctx.find_root().params
            GLOBALS.context = given.get("context") or GLOBALS.context
            GLOBALS.kubeconfig = given.get("kubeconfig") or GLOBALS.kubeconfig
            namespace = given.get("namespace") or ctx.params.get("namespace") or default_namespace()
            with kube.connect(timeout=3.0, context=GLOBALS.context, kubeconfig=GLOBALS.kubeconfig) as http:
                body = kube.request(http, "GET", kind.path(namespace), what=f"list {kind.kind}s")
            names = [str(item["metadata"]["name"]) for item in body.get("items") or ()]
        except Exception:  # completion must not print or fail whatever happens
            return []
        return sorted(n for n in names if n.startswith(incomplete))

    return complete


def name_argument(kind: str, help: str) -> Any:
    """A command's NAME argument (`Annotated[str, name_argument(...)]`), completed from the names of `kind`."""
    return typer.Argument(help=help, show_default=False, autocompletion=complete_names(kind))


NameArg = Annotated[str, name_argument("ShadowEnvironment", "Name of the environment.")]


def connect() -> httpx.Client:
    return kube.connect(context=GLOBALS.context, kubeconfig=GLOBALS.kubeconfig)


def connect_async() -> httpx.AsyncClient:
    return kube.connect_async(context=GLOBALS.context, kubeconfig=GLOBALS.kubeconfig)


def plain(data: Any) -> Any:
    """JSON-ready data from models (by alias, as the API spells it), lists and dicts of them."""
    if hasattr(data, "model_dump"):  # a pydantic model (pydantic is not imported for a verb without one)
        return data.model_dump(mode="json", by_alias=True, exclude_none=True)
    if isinstance(data, list | tuple):
        return [plain(x) for x in data]
    if isinstance(data, dict):
        return {k: plain(v) for k, v in data.items()}
    return data


def kube_list(items: list[dict[str, Any]]) -> dict[str, Any]:
    """Objects as kubectl prints several for -o json|yaml: a v1 List."""
    return {"apiVersion": "v1", "kind": "List", "items": items, "metadata": {"resourceVersion": ""}}


def emit(data: Any, output: str) -> bool:
    """Print data as json or yaml and return True; return False for text (the caller prints)."""
    if output == "json":
        out.print_json(json.dumps(plain(data)))
        return True
    if output == "yaml":
        import yaml

        # soft_wrap: the console must not re-wrap long values (a signed link) at the terminal's width.
        out.print(yaml.safe_dump(plain(data), sort_keys=False), end="", markup=False, soft_wrap=True)
        return True
    return False


@contextmanager
def byte_progress(label: str) -> Iterator[Callable[[int, int], None]]:
    """A transient progress bar on stderr; yields the (done, total) callback the SDK's uploads call."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    columns = (TextColumn(label), BarColumn(), DownloadColumn(), TransferSpeedColumn())
    with Progress(*columns, console=err, transient=True) as progress:
        task = progress.add_task(label, total=None)

        def report(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total or None)

        yield report


def split_remote(spec: str) -> tuple[str | None, str]:
    """`NAME:PATH` -> (NAME, PATH); a local path (no colon before the first slash) -> (None, path)."""
    head, sep, tail = spec.partition(":")
    if sep and head and "/" not in head and not head.startswith("."):
        return head, tail
    return None, spec


# Egress rules narrowing a template's allowlist, for `create` and `sandbox claim`.
AllowOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--allow",
        help="Egress rule narrowing the template's allowlist (repeatable): [METHOD,...] HOST[:PORT][/PATH], e.g. "
        "pypi.org or 'GET,HEAD pypi.org/simple/'. Only narrows: the template's spec.egress is the ceiling.",
    ),
]
