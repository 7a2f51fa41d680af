"""`shadowctl cp` and `shadowctl sandbox cp`: files and directories between this machine and a workspace.

One command, made for each kind by `cp_command`: they differ only in what NAME is (an environment, a claim)
and so how the workspace's runtime is found; the copy itself is `copy`'s (uploads as a tar.gz stream,
downloads within a budget, confined to the target).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from shadow_operator.cli.common import NamespaceOpt, byte_progress, connect, err, fail, split_remote
from shadow_operator.sdk import confine, kube
from shadow_operator.sdk.kube import Op

if TYPE_CHECKING:
    from shadow_operator.sdk import runtime

MaxBytesOpt = Annotated[
    int,
    typer.Option(
        "--max-bytes", min=1, help="Stop before writing more than this many bytes from the workspace."
    ),
]
MaxMembersOpt = Annotated[
    int, typer.Option("--max-members", min=1, help="Refuse a download of more entries than this.")
]


def cp_command(
    endpoint_of: Callable[[str, str], Op[runtime.RuntimeEndpoint]],
    remote_help: str,
    one_side: tuple[str, str],
    doc: str,
) -> Callable[..., None]:
    """A `cp` verb: `endpoint_of(NAME, namespace)` finds the runtime of the workspace named in NAME:PATH;
    `one_side` is the error (and hint) when not exactly one side is remote."""

    def cp(
        source: str,
        dest: str,
        namespace: NamespaceOpt = "",
        max_bytes: MaxBytesOpt = confine.DEFAULT_MAX_BYTES,
        max_members: MaxMembersOpt = confine.DEFAULT_MAX_MEMBERS,
    ) -> None:
        src_remote, src_path = split_remote(source)
        dst_remote, dst_path = split_remote(dest)
        if (src_remote is None) == (dst_remote is None):
            fail(*one_side)
        with connect() as http:
            ep = kube.run(http, endpoint_of(str(src_remote or dst_remote), namespace))
            copy(http, ep, src_remote, src_path, dst_path, confine.Budget(max_bytes, max_members))

    side = Annotated[str, typer.Argument(help=remote_help, show_default=False)]
    cp.__annotations__.update(source=side, dest=side)  # typer reads the arguments' help from them
    cp.__doc__ = doc
    return cp


def copy(
    http: Any,
    ep: runtime.RuntimeEndpoint,
    src_remote: str | None,
    src: str,
    dst: str,
    budget: confine.Budget | None = None,
) -> None:
    """Shared by `cp` and `sandbox cp`: files one by one, directories as a tar.gz stream (downloads within
    the budget, 1 GiB and 100,000 entries by default)."""
    from shadow_operator.sdk import download, runtime
    from shadow_operator.sdk.upload import stream_worktree

    budget = budget or confine.Budget()
    if src_remote is None:
        local = Path(src).expanduser()
        if local.is_dir():
            with byte_progress(f"uploading {local.name}") as report:
                result = kube.run(
                    http, runtime.import_archive(ep, dst, stream_worktree(local, progress=report))
                )
            err.print(f"copied {result.files} files into {dst or '.'}")
        elif local.is_file():
            kube.run(http, runtime.write_file(ep, dst, local.read_bytes()))
        else:
            fail(f"{src}: no such file or directory", "check the local path")
        return
    info = kube.run(http, runtime.stat(ep, src))
    if info is None:
        fail(f"{src}: no such file or directory in the workspace", "list it: shadowctl exec NAME -- ls")
    target = Path(dst).expanduser()
    if info.get("type") == "directory":
        count = download.download_dir(http, ep, src, target, budget)
        err.print(f"copied {count} files into {target}")
        return
    if target.is_dir():
        target = target / Path(src).name
    download.download_file(http, ep, src, target, confine.number(info.get("mode"), 8), budget)
