"""What every shadowctl verb shares: the consoles, the options, output formats, the cluster connection."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Annotated, Any, NoReturn

import httpx
import typer
import yaml
from pydantic import BaseModel
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

from shadow_operator.sdk import kube
from shadow_operator.sdk.errors import ShadowError

out = Console(highlight=False)
# Errors stay on one line however narrow the terminal (scripts grep them).
err = Console(stderr=True, soft_wrap=True, highlight=False)

NamespaceOpt = Annotated[
    str, typer.Option("--namespace", "-n", help="Namespace.", envvar="SHADOW_NAMESPACE", show_envvar=False)
]
OutputOpt = Annotated[str, typer.Option("--output", "-o", help="text, json or yaml.")]
NameArg = Annotated[str, typer.Argument(help="Name of the environment.", show_default=False)]


@dataclass
class Globals:
    context: str | None = None


GLOBALS = Globals()


def fail(message: str, hint: str = "") -> NoReturn:
    raise ShadowError(message, hint=hint)


def connect() -> httpx.Client:
    return kube.connect(context=GLOBALS.context)


def connect_async() -> httpx.AsyncClient:
    return kube.connect_async(context=GLOBALS.context)


def plain(data: Any) -> Any:
    """JSON-ready data from models (by alias, as the API spells it), lists and dicts of them."""
    if isinstance(data, BaseModel):
        return data.model_dump(mode="json", by_alias=True, exclude_none=True)
    if isinstance(data, list | tuple):
        return [plain(x) for x in data]
    if isinstance(data, dict):
        return {k: plain(v) for k, v in data.items()}
    return data


def emit(data: Any, output: str) -> bool:
    """Print data as json or yaml and return True; return False for text (the caller prints)."""
    if output == "json":
        out.print_json(json.dumps(plain(data)))
        return True
    if output == "yaml":
        # soft_wrap: the console must not re-wrap long values (a signed link) at the terminal's width.
        out.print(yaml.safe_dump(plain(data), sort_keys=False), end="", markup=False, soft_wrap=True)
        return True
    if output != "text":
        fail(f"--output {output}: unknown format", "use text, json or yaml")
    return False


@contextmanager
def byte_progress(label: str) -> Iterator[Callable[[int, int], None]]:
    """A transient progress bar on stderr; yields the (done, total) callback the SDK's uploads call."""
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
