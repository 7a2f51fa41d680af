"""shadowctl verbs for copy-on-write workspaces: `fork` (new environments cloned from a running one) and
`snapshot` (a VolumeSnapshot of a workspace that `spec.workspace.from.snapshot` restores)."""

from __future__ import annotations

import time
from typing import Annotated

import typer
from rich.table import Table

from shadow_operator.api import constants as c
from shadow_operator.api.environment import ShadowEnvironment
from shadow_operator.cli.common import NameArg, NamespaceOpt, OutputOpt, connect, emit, err, fail, out
from shadow_operator.sdk import environment as envops
from shadow_operator.sdk import fork as forkops
from shadow_operator.sdk import kube, localdirs
from shadow_operator.sdk.errors import EnvironmentFailed


def fork(
    source: NameArg,
    names: Annotated[
        list[str] | None,
        typer.Argument(help="Names of the new environments (or give --count).", show_default=False),
    ] = None,
    count: Annotated[
        int, typer.Option("--count", min=0, max=50, help="Make N forks named SOURCE-fork-1..N.")
    ] = 0,
    method: Annotated[
        str, typer.Option(help="Auto (snapshot where the storage can, else copy), Snapshot or Copy.")
    ] = "Auto",
    storage_class: Annotated[
        str | None,
        typer.Option("--storage-class", help="StorageClass of the new volumes (default: the source's)."),
    ] = None,
    verify: Annotated[
        bool | None,
        typer.Option(
            "--verify/--no-verify", help="Run the smoke test again in each fork (default: as the source)."
        ),
    ] = None,
    retain_snapshot: Annotated[
        bool, typer.Option("--retain-snapshot", help="Keep the snapshots when the forks are deleted.")
    ] = False,
    namespace: NamespaceOpt = "",
    wait: Annotated[bool, typer.Option(help="Wait until every fork is Ready.")] = True,
    timeout: Annotated[float, typer.Option(help="Seconds to wait.")] = 600.0,
    output: OutputOpt = "text",
) -> None:
    """Fork an environment: new environments whose workspaces start as copies of SOURCE's, uncommitted work
    included, at the same mount path. Each fork is independent; SOURCE keeps running.

    The copy is a VolumeSnapshot where the workspace's storage supports it (copy-on-write: fast whatever the
    size), else a tar stream between the runtimes; `status.cloneMethod` says which.
    """
    if method not in ("Auto", "Snapshot", "Copy"):
        fail(f"--method {method}: unknown", "use Auto, Snapshot or Copy")
    targets = list(names or ()) + [f"{source}-fork-{i}" for i in range(1, count + 1)]
    if not targets:
        fail("no fork to make", f"name them (shadowctl fork {source} NAME...) or give --count N")
    started = time.monotonic()
    with connect() as http:
        kube.run(
            http,
            forkops.fork(
                namespace,
                source,
                targets,
                method=method,
                storage_class=storage_class,
                retain_snapshot=retain_snapshot,
                verify=verify,
            ),
        )
        localdirs.copy(str(http.base_url), namespace, source, targets)  # promote trusts only this record
        err.print(f"created {len(targets)} fork(s) of {namespace}/{source}: {', '.join(targets)}")
        if not wait:
            return
        done: dict[str, ShadowEnvironment] = {}
        with err.status("waiting for the forks") as spinner:
            for name in targets:

                def show(env: ShadowEnvironment, name: str = name) -> None:
                    ready = envops.conditions(env).get(c.COND_READY)
                    spinner.update(f"{name}: {ready.message if ready else 'starting'}")

                left = max(1.0, timeout - (time.monotonic() - started))
                try:
                    done[name] = kube.run(
                        http,
                        envops.wait(
                            namespace, name, envops.ready_with_verdict, "Ready", left, on_change=show
                        ),
                    )
                except EnvironmentFailed as exc:
                    fail(
                        f"fork {name} failed: {exc.code}: {exc.message}",
                        f"shadowctl status {name} -n {namespace}",
                    )
    rows = [
        {
            "name": name,
            "cloneMethod": (env.status.clone_method if env.status else None) or "",
            "reason": (env.status.clone.reason if env.status and env.status.clone else ""),
            "clonedAfterSeconds": forkops.clone_seconds(env),
            "verdict": (env.status.verdict.result if env.status and env.status.verdict else ""),
        }
        for name, env in done.items()
    ]
    if emit(rows, output):
        return
    table = Table("NAME", "CLONE", "CLONED AFTER", "VERDICT", "WHY", box=None)
    for row in rows:
        table.add_row(
            str(row["name"]),
            str(row["cloneMethod"]),
            f"{row['clonedAfterSeconds']:.1f}s" if row["clonedAfterSeconds"] is not None else "",
            str(row["verdict"]),
            str(row["reason"]),
        )
    out.print(table)


def snapshot(
    name: NameArg,
    snapshot_name: Annotated[
        str | None, typer.Option("--name", help="Name of the VolumeSnapshot (default: ENV-<UTC time>).")
    ] = None,
    retain: Annotated[
        bool, typer.Option("--retain", help="Keep the snapshot when the environment is deleted.")
    ] = False,
    namespace: NamespaceOpt = "",
    timeout: Annotated[float, typer.Option(help="Seconds to wait until it is ready to use.")] = 300.0,
    output: OutputOpt = "text",
) -> None:
    """Snapshot an environment's workspace (flushed first) and wait until the snapshot is ready to use.

    Start new environments from it with spec.workspace.from.snapshot: NAME.
    """
    with connect() as http, err.status(f"snapshotting {name}"):
        body = kube.run(
            http, forkops.snapshot(namespace, name, snapshot_name, retain=retain, timeout=timeout)
        )
    meta, status = body["metadata"], body.get("status") or {}
    data = {
        "name": meta["name"],
        "namespace": meta["namespace"],
        "restoreSize": status.get("restoreSize"),
        "retained": retain,
    }
    if emit(data, output):
        return
    out.print(
        f"VolumeSnapshot {meta['namespace']}/{meta['name']} is ready ({status.get('restoreSize') or 'size unknown'})"
        + ("; retained after the environment" if retain else "; deleted with the environment")
    )


def register(app: typer.Typer) -> None:
    app.command("fork")(fork)
    app.command("snapshot")(snapshot)
