"""shadowctl verbs for ShadowEnvironments: create, list, status, exec, shell, cp, diff, promote, publish,
publish-all, sync, logs, journal, decide, handoff, verify, stop, start, destroy. Each is a thin layer over the
SDK (`ShadowGateway`); the SDK's modules are imported by the verbs that use them, so a `list` loads none."""

from __future__ import annotations

import fnmatch
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from shadow_operator.api import constants as c
from shadow_operator.cli.common import (
    GLOBALS,
    AllNamespacesOpt,
    NameArg,
    NamespaceOpt,
    OutputOpt,
    byte_progress,
    connect,
    emit,
    err,
    fail,
    kube_list,
    out,
)
from shadow_operator.cli.copying import MaxBytesOpt, cp_command
from shadow_operator.cli.fallback import FallbackLocalOpt, FallbackOpt, FallbackVerifyOpt, with_fallback
from shadow_operator.sdk import confine, kube

if TYPE_CHECKING:  # the models load with the verbs that use them: `list` and `exec` need none
    from shadow_operator.api.environment import ShadowEnvironment
    from shadow_operator.sdk import runtime
    from shadow_operator.sdk.environment import GitSource, LocalSource
    from shadow_operator.sdk.gateway import ShadowGateway
    from shadow_operator.sdk.promote import PromotePlan


def gateway(name: str, namespace: str) -> ShadowGateway:
    from shadow_operator.sdk.gateway import ShadowGateway

    return ShadowGateway(name, namespace=namespace, client=connect())


# ------------------------------------------------------------------------------------------- parsing
def parse_local(spec: str) -> LocalSource:
    """PATH[:org/name]."""
    from shadow_operator.sdk.environment import LocalSource

    path_text, _, repo = spec.partition(":")
    path = Path(path_text).expanduser().resolve()
    if not path.is_dir():
        fail(f"--local {spec}: {path} is not a directory", "give the path of a local repository")
    if repo and repo.count("/") != 1:
        fail(f"--local {spec}: the repository must be org/name", "e.g. --local ./core:microsoft/core")
    return LocalSource(path, repo)


def parse_git(spec: str) -> GitSource:
    """URL[@ref][:org/name]."""
    from shadow_operator.sdk.environment import GitSource

    url, repo = spec, ""
    if spec.count(":") > 1 and not spec.rsplit(":", 1)[1].startswith("//"):
        url, repo = spec.rsplit(":", 1)
    ref = None
    if "@" in url.rsplit("/", 1)[-1]:
        url, ref = url.rsplit("@", 1)
    return GitSource(url, ref, repo)


def parse_rewrites(rules: list[str]) -> dict[str, str]:
    rewrites = {}
    for rule in rules:
        prefix, sep, org = rule.rpartition("=")
        if not sep or not prefix.endswith("/") or not org:
            fail(
                f"--rewrite {rule}: expected FROM=ORG with FROM ending in '/'",
                "e.g. --rewrite https://github.com/microsoft/=microsoft",
            )
        rewrites[prefix] = org
    return rewrites


# --------------------------------------------------------------------------------------------- verbs
def create(
    name: NameArg,
    local: Annotated[
        list[str] | None,
        typer.Option(
            "--local",
            help="PATH[:org/name] of a local repository (repeatable); uncommitted and untracked files go too.",
        ),
    ] = None,
    git: Annotated[
        list[str] | None, typer.Option("--git", help="URL[@ref][:org/name] to clone (repeatable).")
    ] = None,
    rewrite: Annotated[
        list[str] | None,
        typer.Option(
            "--rewrite",
            help="FROM=ORG: fetch URLs starting with FROM from the environment's Gitea organization ORG.",
        ),
    ] = None,
    template: Annotated[str | None, typer.Option(help="SandboxTemplate of the workspace.")] = None,
    runtime_class: Annotated[
        str | None,
        typer.Option(
            "--runtime-class",
            help="RuntimeClass of the workspace Pod, e.g. gvisor (`kubectl get runtimeclass`); default: the "
            "template's.",
        ),
    ] = None,
    pool: Annotated[
        str | None,
        typer.Option(
            help="ShadowEnvironmentPool to take a started workspace and Gitea from (seconds sooner); the "
            "environment starts from the pool's values.",
        ),
    ] = None,
    mount_path: Annotated[
        str | None, typer.Option("--mount-path", help="Where the workspace is mounted (default /workspace).")
    ] = None,
    verify_command: Annotated[
        list[str] | None,
        typer.Option("--verify", help="A command that must succeed for the verdict (repeatable)."),
    ] = None,
    storage_class: Annotated[
        str | None,
        typer.Option(
            "--storage-class",
            help="StorageClass of the workspace volume (one with a VolumeSnapshotClass makes forks copy-on-write).",
        ),
    ] = None,
    cpu: Annotated[
        str | None, typer.Option(help="CPU request of the workspace, e.g. 500m (the template's limits stay).")
    ] = None,
    memory: Annotated[
        str | None,
        typer.Option(help="Memory request of the workspace, e.g. 1Gi (the template's limits stay)."),
    ] = None,
    cpu_limit: Annotated[
        str | None, typer.Option("--cpu-limit", help="CPU limit of the workspace, e.g. 2.")
    ] = None,
    memory_limit: Annotated[
        str | None, typer.Option("--memory-limit", help="Memory limit of the workspace, e.g. 4Gi.")
    ] = None,
    namespace: NamespaceOpt = "",
    fallback: FallbackOpt = None,
    wait: Annotated[bool, typer.Option(help="Wait for Ready and the verdict.")] = True,
    timeout: Annotated[float, typer.Option(help="Seconds to wait.")] = 600.0,
    output: OutputOpt = "text",
) -> None:
    """Create an environment from local directories and git URLs.

    Local directories are uploaded with their uncommitted and untracked (not ignored) files, with a progress
    bar; then it waits for Ready and the verdict. Every local check (directories, repositories) is made
    before anything is created in the cluster.
    """
    from shadow_operator.sdk import environment as envops
    from shadow_operator.sdk.environment import EnvironmentSpec

    spec = EnvironmentSpec(
        local=[parse_local(x) for x in local or ()],
        git=[parse_git(x) for x in git or ()],
        rewrites=parse_rewrites(rewrite or []),
        template=template,
        runtime_class=runtime_class,
        pool=pool,
        mount_path=mount_path,
        storage_class=storage_class,
        verify_commands=verify_command or (),
        requests={k: v for k, v in (("cpu", cpu), ("memory", memory)) if v},
        limits={k: v for k, v in (("cpu", cpu_limit), ("memory", memory_limit)) if v},
    )
    if not spec.local and not spec.git:
        fail("nothing to copy in", "give --local PATH or --git URL")
    with gateway(name, namespace) as gw:
        gw.create(spec)
        err.print(f"created ShadowEnvironment {namespace}/{name}")
        for source in spec.local:
            with byte_progress(f"uploading {source.path.name}") as report:
                result = gw.upload(source, timeout=timeout, progress=report)
            err.print(f"uploaded {source.path} ({result.files} files)")
        if not wait:
            return
        with err.status(f"waiting for {name}") as spinner:

            def show(env: ShadowEnvironment) -> None:
                ready = envops.conditions(env).get(c.COND_READY)
                spinner.update(f"waiting for {name}: {ready.message if ready else 'starting'}")

            env = gw.wait_ready(timeout, on_change=show)
    print_status(env, output)


def list_(
    namespace: NamespaceOpt = "", all_namespaces: AllNamespacesOpt = False, output: OutputOpt = "text"
) -> None:
    """List the environments of a namespace (-A: of every namespace); -o json|yaml prints them as kubectl
    does (a List of the objects)."""
    everywhere = all_namespaces or GLOBALS.all_namespaces
    where = "in all namespaces" if everywhere else f"in {namespace}"
    with connect() as http:
        body = kube.run(
            http,
            kube.get(
                environments_path(None if everywhere else namespace), f"list ShadowEnvironments {where}"
            ),
        )
    items = [
        {"apiVersion": ENVIRONMENT_API_VERSION, "kind": "ShadowEnvironment", **item} for item in body["items"]
    ]
    if emit(kube_list(items), output):
        return
    if not items:
        err.print(
            "no environments in any namespace" if everywhere else f"no environments in namespace {namespace}"
        )
        return
    from rich.table import Table

    table = Table(
        *(["NAMESPACE"] if everywhere else []), "NAME", "READY", "SOURCES", "VERDICT", "FAILURE", box=None
    )
    for item in items:
        st = item.get("status") or {}
        ready: dict[str, Any] = next(
            (x for x in st.get("conditions") or () if x.get("type") == c.COND_READY), {}
        )
        table.add_row(
            *([item["metadata"]["namespace"]] if everywhere else []),
            item["metadata"]["name"],
            str(ready.get("status") or "Unknown"),
            str(st.get("sourcesReady") or ""),
            str((st.get("verdict") or {}).get("result") or ""),
            str((st.get("failure") or {}).get("code") or ""),
        )
    out.print(table, markup=False)


ENVIRONMENT_API_VERSION = f"{c.SHADOW_GROUP}/{c.SHADOW_VERSION}"


def environments_path(namespace: str | None) -> str:
    """The REST path of the ShadowEnvironments of a namespace (None: of all), without loading the models."""
    return (
        f"/apis/{ENVIRONMENT_API_VERSION}"
        + (f"/namespaces/{namespace}" if namespace else "")
        + "/shadowenvironments"
    )


def status(name: NameArg, namespace: NamespaceOpt = "", output: OutputOpt = "text") -> None:
    """Conditions, snapshot commits, URLs and verdict of an environment (-o json|yaml: the object)."""
    with gateway(name, namespace) as gw:
        print_status(gw.status(), output)


def print_status(env: ShadowEnvironment, output: str) -> None:
    from shadow_operator.sdk import environment as envops

    if emit(env.body or env, output):
        return
    st = env.status
    out.print(f"[bold]{env.namespace}/{env.name}[/bold]")
    if st is None:
        out.print("  no status yet (is the operator running? shadowctl doctor)")
        return
    for cond in st.conditions or ():
        mark = "[green]True[/green]" if cond.status == "True" else f"[yellow]{cond.status}[/yellow]"
        out.print(f"  {cond.type:<15} {mark}  {cond.reason}: {cond.message or ''}")
    if st.failure:
        out.print(f"  [red]failure[/red] {st.failure.code}: {st.failure.message}")
    if st.clone:
        out.print(f"  cloned from {st.clone.source} by {st.clone.method}: {st.clone.reason}", markup=False)
    if st.pool:
        out.print(f"  pool {st.pool.name}: {st.pool.reason}: {st.pool.message or ''}", markup=False)
    for src in st.sources or ():
        out.print(f"  source {src.name}: {src.repo}@{src.commit[:12]} ({src.branch}) in {src.path}")
    phases = envops.phase_seconds(env)
    if phases:
        out.print("  timings (s after creation): " + ", ".join(f"{p} {t:.1f}" for p, t in phases.items()))
    for label, value in (("runtime", st.runtime_url), ("preview", st.preview_url), ("gitea", st.gitea_url)):
        if value:
            out.print(f"  {label}: {value}")
    if st.verdict:
        v = st.verdict
        colour = "green" if v.result == "PASS" else "red"
        out.print(
            f"  verdict [{colour}]{v.result}[/{colour}] {v.score}/{v.max_score} (pass at {v.pass_threshold})"
        )
        for issue in v.issues:
            out.print(f"    - {issue}", markup=False)


def exec_(
    name: NameArg,
    command: Annotated[
        list[str],
        typer.Argument(
            help="The command: one argument runs under sh -c; several (after --) run as they are, no shell.",
            show_default=False,
        ),
    ],
    namespace: NamespaceOpt = "",
    cwd: Annotated[str, typer.Option(help="Working directory, relative to the workspace.")] = "",
    timeout: Annotated[float, typer.Option(help="Seconds before the command is killed.")] = 600.0,
) -> None:
    """Run a command in the workspace.

        shadowctl exec my-change "cd app && make test"      # one argument: a shell command line
        shadowctl exec my-change -- python3 -m pytest -q    # several: the program and its arguments

    Output streams as it comes; shadowctl exits with the command's exit code (124 on timeout).
    """
    code = 1
    # As `race`: a single argument is a command line for sh -c, a list is an argv.
    argv: str | list[str] = command[0] if len(command) == 1 else list(command)
    with gateway(name, namespace) as gw:
        for event in gw.exec_stream(argv, timeout, cwd=cwd):
            kind = event["type"]
            if kind == "stdout":
                sys.stdout.write(event["data"])
                sys.stdout.flush()
            elif kind == "stderr":
                sys.stderr.write(event["data"])
                sys.stderr.flush()
            elif kind == "exit":
                exit_code = event.get("exit_code")
                code = (
                    124
                    if event.get("timed_out")
                    else 128 + int(event.get("signal") or 0)
                    if exit_code is None
                    else int(exit_code)
                )
    raise typer.Exit(code)


def shell(
    name: NameArg,
    namespace: NamespaceOpt = "",
    cwd: Annotated[str, typer.Option(help="Start in this directory of the workspace.")] = "",
) -> None:
    """An interactive shell in the workspace.

    A PTY over a WebSocket through the API server. From a pipe, the input runs and the shell ends with it.
    """
    from shadow_operator.cli.terminal import run_terminal

    with gateway(name, namespace) as gw:
        code = run_terminal(gw.client, gw.runtime_endpoint(), cwd)
    raise typer.Exit(code)


def environment_endpoint(name: str, namespace: str) -> kube.Op[runtime.RuntimeEndpoint]:
    """The runtime of an environment's workspace (as the gateway reads it)."""
    from shadow_operator.sdk import environment as envops

    env = yield from envops.get(namespace, name)
    return (yield from envops.runtime_endpoint(env))


cp = cp_command(
    environment_endpoint,
    "NAME:PATH or a local path.",
    ("cp needs exactly one side in the environment", "e.g. shadowctl cp my-env:src/app.py ./app.py"),
    """Copy files between this machine and a workspace.

    One side is NAME:PATH, as with kubectl cp; directories travel as a tar.gz stream. Downloads stream to
    disk within --max-bytes and --max-members; only files and directories are written, never into a .git
    (in any spelling) and never through a symbolic link; execute bits are kept, setuid/setgid are not.
    """,
)


def diff(
    name: NameArg,
    namespace: NamespaceOpt = "",
    stat: Annotated[bool, typer.Option("--stat", help="Only the changed paths.")] = False,
    output: OutputOpt = "text",
) -> None:
    """What changed in the workspace since the copy-in."""
    with gateway(name, namespace) as gw:
        data = gw.diff(paths_only=stat)
    if emit(data, output):
        return
    if data.empty:
        err.print("no changes")
        return
    if stat:
        for paths, mark, colour in (
            (data.added, "A", "green"),
            (data.modified, "M", "yellow"),
            (data.deleted, "D", "red"),
        ):
            for path in paths:
                out.print(f"[{colour}]{mark}[/{colour}] {path}")
        return
    for line in (data.patch or "").splitlines():
        style = (
            "green"
            if line.startswith("+")
            else "red"
            if line.startswith("-")
            else "cyan"
            if line.startswith("@@")
            else None
        )
        out.print(line, style=style, markup=False, soft_wrap=True)  # a patch line is never re-wrapped


def promote(
    name: NameArg,
    namespace: NamespaceOpt = "",
    source: Annotated[
        str | None, typer.Option(help="Only this source (default: every uploaded one).")
    ] = None,
    to: Annotated[
        Path | None,
        typer.Option(help="Local directory to promote into (default: where it was uploaded from)."),
    ] = None,
    paths: Annotated[
        list[str] | None, typer.Option("--paths", help="Only paths matching this glob (repeatable).")
    ] = None,
    to_branch: Annotated[
        str | None,
        typer.Option("--to-branch", help="Push a commit to this branch of the Gitea repository instead."),
    ] = None,
    force: Annotated[bool, typer.Option("--force", "-f", help="Do not ask for confirmation.")] = False,
    max_bytes: MaxBytesOpt = confine.DEFAULT_MAX_BYTES,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Show what would change, change nothing.")
    ] = False,
    output: OutputOpt = "text",
) -> None:
    """Bring the workspace's changes back into your directories.

    Only files changed in the workspace since the copy-in are written or deleted, in the directory each source
    was uploaded from (or --to); .git is never touched. Asks first unless --force.
    """
    with gateway(name, namespace) as gw:
        if to_branch:
            pushed = gw.promote(source=source, to_branch=to_branch)
            if not emit(pushed, output):
                assert isinstance(pushed, dict)
                err.print(
                    f"pushed {pushed['source']} to {pushed['repo']} branch {pushed['branch']} ({pushed['commit'][:12]})"
                )
            return
        plans = gw.plan_promote(source=source, to=to, paths=paths or ())
        if output == "text":
            show_plans(plans)
        if all(p.empty for p in plans):
            if not emit(plans, output):
                err.print("nothing to promote")
            return
        if dry_run:
            emit([plan_data(p) for p in plans], output)
            return
        if not force:
            if not sys.stdin.isatty():
                fail(
                    "promote would change local files", "confirm with --force (or look first with --dry-run)"
                )
            typer.confirm("apply these changes?", abort=True, err=True)
        gw.apply_promote(plans, max_bytes=max_bytes)
    if not emit([plan_data(p) for p in plans], output):
        for p in plans:
            err.print(f"promoted {len(p.write)} written, {len(p.delete)} deleted into {p.local_dir}")


def plan_data(plan: PromotePlan) -> dict[str, Any]:
    return {
        "source": plan.source,
        "localDir": str(plan.local_dir),
        "write": plan.write,
        "delete": plan.delete,
        "refused": plan.refused,
    }


def show_plans(plans: list[PromotePlan]) -> None:
    for plan in plans:
        out.print(f"[bold]{plan.source}[/bold] -> {plan.local_dir}")
        for rel in plan.write:
            mark = "M" if (plan.local_dir / rel).exists() else "A"
            out.print(f"  [{'yellow' if mark == 'M' else 'green'}]{mark}[/] {rel}")
        for rel in plan.delete:
            out.print(f"  [red]D[/red] {rel}")
        for rel in plan.refused:
            out.print(f"  [red]refused[/red] {rel!r} (outside the source, '.'/'..', or a .git spelling)")


def publish(
    name: NameArg,
    path: Annotated[str, typer.Argument(help="PATH[:org/name] of a local repository.", show_default=False)],
    namespace: NamespaceOpt = "",
    output: OutputOpt = "text",
) -> None:
    """Push a local repository into the environment's Gitea.

    Uncommitted work is included (as a snapshot commit); the repository is created if missing.
    """
    local = parse_local(path)
    with gateway(name, namespace) as gw, byte_progress(f"publishing {local.path.name}") as report:
        result = gw.publish_module(local.path, local.repo or None, progress=report)
    if not emit(result, output):
        err.print(
            f"published {local.path} as {result['repo']} ({result['commit'][:12]} on {result['branch']})"
        )


def sync(
    name: NameArg,
    source: Annotated[
        str | None, typer.Option(help="Only this source (default: every uploaded one).")
    ] = None,
    watch: Annotated[
        bool, typer.Option("--watch", "-w", help="Keep pushing as files change, until interrupted.")
    ] = False,
    namespace: NamespaceOpt = "",
    output: OutputOpt = "text",
) -> None:
    """Push local edits into the running workspace.

    The files changed in each source's local directory (the one it was created or uploaded from on this
    machine) since the last push are sent, with the same rules as an upload; files deleted here are deleted
    there, only inside the source and never in .git. --watch keeps doing so as files change.
    """
    with gateway(name, namespace) as gw:
        report(gw.sync(source=source), output)
        if not watch:
            return
        import watchfiles

        dirs = [str(p) for p in localdirs_of(gw)]
        err.print(f"watching {', '.join(dirs)} (Ctrl-C to stop)")
        for _ in watchfiles.watch(*dirs, debounce=300, raise_interrupt=False):
            report(gw.sync(source=source), output)


def localdirs_of(gw: ShadowGateway) -> list[Path]:
    from shadow_operator.sdk import localdirs

    return sorted(
        {Path(d) for d in localdirs.recorded(str(gw.client.base_url), gw.namespace, gw.name).values()}
    )


def report(plans: list[Any], output: str) -> None:
    if emit([{"source": p.source, "sent": p.changed, "deleted": p.deleted} for p in plans], output):
        return
    for p in plans:
        if p.empty:
            err.print(f"{p.source}: up to date")
        else:
            err.print(f"{p.source}: sent {len(p.changed)}, deleted {len(p.deleted)} ({p.local_dir})")


def publish_all(
    name: NameArg,
    workspace: Annotated[Path, typer.Option(help="Directory whose git repositories are published.")] = Path(
        "."
    ),
    pattern: Annotated[str, typer.Option(help="Only repositories whose directory name matches.")] = "*",
    org: Annotated[str, typer.Option(help="Gitea organization of the repositories.")] = "shadow",
    namespace: NamespaceOpt = "",
    output: OutputOpt = "text",
) -> None:
    """Publish every git repository under a directory into the Gitea."""
    root = workspace.expanduser().resolve()
    repos = sorted(p for p in root.iterdir() if (p / ".git").exists() and fnmatch.fnmatch(p.name, pattern))
    if not repos:
        fail(
            f"no git repositories matching {pattern!r} under {root}",
            "point --workspace at their parent directory",
        )
    results = []
    with gateway(name, namespace) as gw:
        for repo in repos:
            with byte_progress(f"publishing {repo.name}") as report:
                result = gw.publish_module(repo, f"{org}/{repo.name}", progress=report)
            results.append(result)
            if output == "text":
                err.print(f"published {repo.name} as {result['repo']} ({result['commit'][:12]})")
    if output != "text":
        emit(results, output)


def logs(
    name: NameArg,
    namespace: NamespaceOpt = "",
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new lines.")] = False,
    tail: Annotated[int, typer.Option(help="Lines from the end (-1: all).")] = 200,
) -> None:
    """The workspace container's log."""
    from shadow_operator.api.kinds import POD

    with gateway(name, namespace) as gw:
        env = gw.status()
        pod = (env.status.sandbox if env.status else None) or name
        params = {"follow": str(follow).lower(), **({"tailLines": str(tail)} if tail >= 0 else {})}
        call = kube.Call("GET", POD.path(namespace, pod, "log"), f"log of {pod}")
        with gw.client.stream("GET", call.path, params=params, timeout=None if follow else 60.0) as response:
            if not response.is_success:
                response.read()
                raise kube.error_of(response, call)
            for chunk in response.iter_text():
                sys.stdout.write(chunk)
                sys.stdout.flush()


def journal(
    name: NameArg,
    namespace: NamespaceOpt = "",
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new entries.")] = False,
    significant: Annotated[
        bool, typer.Option(help="Only significant entries (errors, completions, decisions).")
    ] = False,
    since: Annotated[int, typer.Option(help="Entries after this sequence number.")] = 0,
    output: OutputOpt = "text",
) -> None:
    """The workspace's command journal: what ran, exit codes, decisions."""
    with gateway(name, namespace) as gw:
        entries = (
            gw.follow_journal(since, significant=significant)
            if follow
            else gw.journal(since, significant=significant)
        )
        if output != "text" and not follow:
            emit(list(entries), output)
            return
        for entry in entries:
            if output != "text":
                emit(entry, output)
                continue
            mark = (
                "[red]✗[/red]"
                if entry.kind == "error"
                else "[green]✓[/green]"
                if entry.kind == "success"
                else "·"
            )
            what = entry.command if entry.command is not None else entry.text
            code = f" (exit {entry.exit_code})" if entry.exit_code not in (None, 0) else ""
            out.print(f"{entry.seq:>5} {mark} {what}{code}", markup=True, highlight=False)


def decide(
    name: NameArg,
    text: Annotated[str, typer.Argument(help="The decision: what was chosen, and why.", show_default=False)],
    author: Annotated[str | None, typer.Option(help="Who decided (default: your login name).")] = None,
    namespace: NamespaceOpt = "",
    output: OutputOpt = "text",
) -> None:
    """Record a decision in the workspace's journal and HANDOFF.md's Decision Log.

    shadowctl decide my-change "keep the v1 API: two clients still call it"
    """
    import getpass

    with gateway(name, namespace) as gw:
        entry = gw.decide(text, author=author or getpass.getuser())
    if not emit(entry, output):
        err.print(f"recorded decision {entry.seq} in {name}'s journal")


def handoff(name: NameArg, namespace: NamespaceOpt = "") -> None:
    """Print the workspace's HANDOFF.md."""
    with gateway(name, namespace) as gw:
        text = gw.handoff()
    if text is None:
        fail(f"{name} has no HANDOFF.md", "the template's runtime must run with --handoff")
    sys.stdout.write(text)


def verify(
    name: NameArg,
    namespace: NamespaceOpt = "",
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the verdict.")] = 600.0,
    fallback: FallbackOpt = None,
    local: FallbackLocalOpt = None,
    verify_command: FallbackVerifyOpt = None,
    output: OutputOpt = "text",
) -> None:
    """Run the smoke checks again; exit 1 on FAIL. With --fallback host-only, an environment that cannot be
    had is checked on this machine instead, in a temporary copy of the sources (labelled, out of 50)."""
    with gateway(name, namespace) as gw, err.status(f"verifying {name}"):
        verdict = gw.verify(timeout)
    if not emit(verdict, output):
        colour = "green" if verdict.result == "PASS" else "red"
        out.print(
            f"[{colour}]{verdict.result}[/{colour}] {verdict.score}/{verdict.max_score} (pass at {verdict.pass_threshold})"
        )
        for issue in verdict.issues:
            out.print(f"  - {issue}", markup=False)
    raise typer.Exit(0 if verdict.result == "PASS" else 1)


def stop(
    name: NameArg,
    namespace: NamespaceOpt = "",
    wait: Annotated[bool, typer.Option(help="Wait until the workspace is stopped.")] = True,
    timeout: Annotated[float, typer.Option(help="Seconds to wait.")] = 300.0,
) -> None:
    """Stop an environment and keep it: its workspace Pod goes, its volume (uncommitted work included) and
    Gitea stay. `shadowctl start` brings it back as it was."""
    with gateway(name, namespace) as gw, err.status(f"stopping {name}"):
        gw.suspend(wait=wait, timeout=timeout)
    err.print(f"stopped ShadowEnvironment {namespace}/{name} (start it again: shadowctl start {name})")


def start(
    name: NameArg,
    namespace: NamespaceOpt = "",
    wait: Annotated[bool, typer.Option(help="Wait until it is Ready.")] = True,
    timeout: Annotated[float, typer.Option(help="Seconds to wait.")] = 600.0,
) -> None:
    """Start a stopped environment (or one suspended for idleness) again, as it was."""
    with gateway(name, namespace) as gw, err.status(f"starting {name}"):
        gw.resume(wait=wait, timeout=timeout)
    err.print(f"started ShadowEnvironment {namespace}/{name}")


def destroy(
    name: NameArg,
    namespace: NamespaceOpt = "",
    wait: Annotated[bool, typer.Option(help="Wait until everything is gone.")] = True,
) -> None:
    """Delete an environment with its workspace, Gitea and volumes."""
    with gateway(name, namespace) as gw, err.status(f"deleting {name}"):
        gw.stop(wait=wait)
    err.print(f"deleted ShadowEnvironment {namespace}/{name}")


def register(app: typer.Typer) -> None:
    for fn, verb in (
        (with_fallback(create), "create"),
        (list_, "list"),
        (status, "status"),
        (exec_, "exec"),
        (shell, "shell"),
        (cp, "cp"),
        (diff, "diff"),
        (promote, "promote"),
        (publish, "publish"),
        (publish_all, "publish-all"),
        (sync, "sync"),
        (logs, "logs"),
        (journal, "journal"),
        (decide, "decide"),
        (handoff, "handoff"),
        (with_fallback(verify), "verify"),
        (stop, "stop"),
        (start, "start"),
        (destroy, "destroy"),
    ):
        app.command(verb)(fn)
