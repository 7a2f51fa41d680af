"""shadowctl (also the kubectl plugin `kubectl-shadow`): ShadowEnvironments from the command line.

    shadowctl create my-change --local ~/src/core:microsoft/core --rewrite https://github.com/microsoft/=microsoft
    shadowctl status my-change
    shadowctl exec my-change -- python3 -m pytest -q
    shadowctl diff my-change
    shadowctl destroy my-change

Every verb talks to the API server of the current kubeconfig context; the workspace runtime is reached
through the API server's pod proxy, so no Ingress or port-forward is needed. Errors print one line and a hint.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated, Any, NoReturn

import httpx
import typer
import yaml
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn
from rich.table import Table

from shadow_operator.api import constants as c
from shadow_operator.api.environment import ShadowEnvironment
from shadow_operator.api.kinds import SHADOW_ENVIRONMENT
from shadow_operator.sdk import KubeError, UploadError, kube, runtime_endpoint, upload_source

app = typer.Typer(
    name="shadowctl",
    help="Isolated copies of your work on Kubernetes: ShadowEnvironments with their own Gitea, a diff and a verdict.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
out = Console()
# Errors stay on one line however narrow the terminal (scripts grep them).
err = Console(stderr=True, soft_wrap=True)

NamespaceOpt = Annotated[str, typer.Option("--namespace", "-n", help="Namespace of the environment.")]
OutputOpt = Annotated[str, typer.Option("--output", "-o", help="text, json or yaml.")]


class CliError(Exception):
    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


def fail(message: str, hint: str = "") -> NoReturn:
    raise CliError(message, hint)


# --------------------------------------------------------------------------------------------- helpers
def connect() -> httpx.Client:
    try:
        return kube.connect()
    except KubeError as exc:
        fail(exc.message, "point KUBECONFIG at a cluster (kubectl config current-context) and try again")


def call(http: httpx.Client, method: str, path: str, what: str, **kw: Any) -> dict[str, Any]:
    try:
        return kube.request(http, method, path, **kw)
    except KubeError as exc:
        if exc.status == 404 and "could not find the requested resource" in exc.message:
            fail(
                f"{what}: the ShadowEnvironment API is not installed in this cluster",
                "install the chart: helm install shadow-operator charts/shadow-operator",
            )
        if exc.status == 404:
            fail(f"{what}: not found", "list the environments with `shadowctl list`")
        fail(f"{what}: {exc.message}", "check `kubectl auth can-i` for your user")
    except httpx.HTTPError as exc:
        fail(
            f"{what}: cannot reach the API server ({type(exc).__name__})",
            "is the cluster running? kubectl get nodes",
        )


def parse_local(spec: str) -> tuple[str, Path, str]:
    """PATH[:org/name] -> (source name, path, repo)."""
    path_text, _, repo = spec.partition(":")
    path = Path(path_text).expanduser().resolve()
    if not path.is_dir():
        fail(f"--local {spec}: {path} is not a directory", "give the path of a local repository")
    name = path.name.lower().replace("_", "-").replace(".", "-")[:63].strip("-") or "src"
    return name, path, repo or f"shadow/{path.name}"


def parse_git(spec: str) -> tuple[str, dict[str, str], str]:
    """URL[@ref][:org/name] -> (source name, git, repo)."""
    url, repo = spec, ""
    if spec.count(":") > 1 and not spec.rsplit(":", 1)[1].startswith("//"):
        url, repo = spec.rsplit(":", 1)
    ref = None
    if "@" in url.rsplit("/", 1)[-1]:
        url, ref = url.rsplit("@", 1)
    base = url.rstrip("/").rsplit("/", 1)[-1].removesuffix(".git") or "src"
    git = {"url": url, **({"ref": ref} if ref else {})}
    return base.lower()[:63], git, repo or f"shadow/{base}"


def condition(env: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((x for x in (env.get("status") or {}).get("conditions") or () if x["type"] == type_), {})


def emit(data: Any, output: str) -> bool:
    if output == "json":
        out.print_json(json.dumps(data))
        return True
    if output == "yaml":
        out.print(yaml.safe_dump(data, sort_keys=False), end="")
        return True
    if output != "text":
        fail(f"--output {output}: unknown format", "use text, json or yaml")
    return False


def runtime(http: httpx.Client, env: dict[str, Any]) -> tuple[str, dict[str, str]]:
    if condition(env, c.COND_WORKSPACE_READY).get("status") != "True":
        fail(f"{env['metadata']['name']}: the workspace is not ready", "wait for it: shadowctl status NAME")
    try:
        return runtime_endpoint(http, ShadowEnvironment.from_body(env))
    except (KubeError, UploadError) as exc:
        fail(
            f"{env['metadata']['name']}: cannot read the runtime token: {exc}",
            "check `kubectl auth can-i get secrets`",
        )


# ---------------------------------------------------------------------------------------------- verbs
@app.command()
def create(
    name: Annotated[str, typer.Argument(help="Name of the environment.")],
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
    mount_path: Annotated[
        str | None, typer.Option("--mount-path", help="Where the workspace is mounted (default /workspace).")
    ] = None,
    namespace: NamespaceOpt = "default",
    wait: Annotated[bool, typer.Option(help="Wait for Ready and the verdict.")] = True,
    timeout: Annotated[float, typer.Option(help="Seconds to wait.")] = 600.0,
) -> None:
    """Create an environment from local repositories and/or git URLs."""
    if not local and not git:
        fail("nothing to copy in", "give --local PATH or --git URL")
    sources: list[dict[str, Any]] = []
    uploads: list[tuple[str, Path]] = []
    for local_spec in local or ():
        src, path, repo = parse_local(local_spec)
        sources.append({"name": src, "repo": repo, "upload": {}})
        uploads.append((src, path))
    for git_spec in git or ():
        src, git_source, repo = parse_git(git_spec)
        sources.append({"name": src, "repo": repo, "git": git_source})
    if len({s["name"] for s in sources}) != len(sources):
        fail("two sources would have the same name", "rename a directory or pass distinct repositories")
    rewrites = []
    for rule in rewrite or ():
        prefix, sep, org = rule.rpartition("=")
        if not sep or not prefix.endswith("/"):
            fail(
                f"--rewrite {rule}: expected FROM=ORG with FROM ending in '/'",
                "e.g. --rewrite https://github.com/microsoft/=microsoft",
            )
        rewrites.append({"from": prefix, "to": org})
    spec: dict[str, Any] = {"sources": sources}
    if rewrites:
        spec["gitRewrites"] = rewrites
    if template:
        spec["template"] = template
    if mount_path:
        spec["workspace"] = {"mountPath": mount_path}
    body = {
        "apiVersion": SHADOW_ENVIRONMENT.api_version,
        "kind": "ShadowEnvironment",
        "metadata": {"name": name},
        "spec": spec,
    }
    with connect() as http:
        call(http, "POST", SHADOW_ENVIRONMENT.path(namespace), f"create {name}", body=body)
        err.print(f"created ShadowEnvironment {namespace}/{name}")
        for src, path in uploads:
            upload(name, src, path, namespace, timeout)
        if wait:
            wait_verdict(http, namespace, name, timeout)
            status(name, namespace=namespace, output="text")


def upload(name: str, source: str, path: Path, namespace: str, timeout: float) -> None:
    columns = (TextColumn(f"uploading {path.name}"), BarColumn(), DownloadColumn(), TransferSpeedColumn())
    with Progress(*columns, console=err, transient=True) as progress:
        task = progress.add_task("upload", total=None)

        def report(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        try:
            result = upload_source(name, source, path, namespace=namespace, timeout=timeout, progress=report)
        except UploadError as exc:
            fail(f"upload of {path}: {exc}", f"shadowctl status {name} -n {namespace}")
    err.print(f"uploaded {path} ({result['files']} files)")


def wait_verdict(http: httpx.Client, namespace: str, name: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    with err.status(f"waiting for {name}") as spinner:
        while time.monotonic() < deadline:
            env = call(http, "GET", SHADOW_ENVIRONMENT.path(namespace, name), name)
            status = env.get("status") or {}
            if status.get("failure"):
                fail(
                    f"{name}: {status['failure']['code']}: {status['failure']['message']}",
                    f"kubectl -n {namespace} describe shadowenvironment {name}",
                )
            if status.get("verdict") and condition(env, c.COND_READY).get("status") == "True":
                return
            spinner.update(f"waiting for {name}: {condition(env, c.COND_READY).get('message', 'starting')}")
            time.sleep(1)
    fail(f"{name}: not ready after {timeout:.0f}s", f"shadowctl status {name} -n {namespace}")


@app.command("list")
def list_(namespace: NamespaceOpt = "default", output: OutputOpt = "text") -> None:
    """List the environments of a namespace."""
    with connect() as http:
        items = call(http, "GET", SHADOW_ENVIRONMENT.path(namespace), "list")["items"]
    rows = [
        {
            "name": e["metadata"]["name"],
            "ready": condition(e, c.COND_READY).get("status", "Unknown"),
            "sources": (e.get("status") or {}).get("sourcesReady", ""),
            "verdict": ((e.get("status") or {}).get("verdict") or {}).get("result", ""),
            "failure": ((e.get("status") or {}).get("failure") or {}).get("code", ""),
        }
        for e in items
    ]
    if emit(rows, output):
        return
    table = Table("NAME", "READY", "SOURCES", "VERDICT", "FAILURE", box=None)
    for row in rows:
        table.add_row(*row.values())
    out.print(table)


@app.command()
def status(
    name: Annotated[str, typer.Argument(help="Name of the environment.")],
    namespace: NamespaceOpt = "default",
    output: OutputOpt = "text",
) -> None:
    """Conditions, snapshot commits, URLs and verdict of an environment."""
    with connect() as http:
        env = call(http, "GET", SHADOW_ENVIRONMENT.path(namespace, name), name)
    st = env.get("status") or {}
    if emit(st, output):
        return
    out.print(f"[bold]{namespace}/{name}[/bold]")
    for cond in st.get("conditions") or ():
        mark = "[green]True[/green]" if cond["status"] == "True" else f"[yellow]{cond['status']}[/yellow]"
        out.print(f"  {cond['type']:<15} {mark}  {cond['reason']}: {cond.get('message', '')}")
    if st.get("failure"):
        out.print(f"  [red]failure[/red] {st['failure']['code']}: {st['failure']['message']}")
    for src in st.get("sources") or ():
        out.print(
            f"  source {src['name']}: {src['repo']}@{src['commit'][:12]} ({src['branch']}) in {src['path']}"
        )
    for key in ("runtimeURL", "previewURL", "giteaURL"):
        if st.get(key):
            out.print(f"  {key}: {st[key]}")
    verdict = st.get("verdict")
    if verdict:
        colour = "green" if verdict["result"] == "PASS" else "red"
        out.print(
            f"  verdict [{colour}]{verdict['result']}[/{colour}] {verdict['score']}/{verdict['maxScore']} (pass at {verdict['passThreshold']})"
        )
        for issue in verdict.get("issues") or ():
            out.print(f"    - {issue}")


@app.command("exec")
def exec_(
    name: Annotated[str, typer.Argument(help="Name of the environment.")],
    command: Annotated[list[str], typer.Argument(help="The command, after --.")],
    namespace: NamespaceOpt = "default",
    timeout: Annotated[float, typer.Option(help="Seconds before the command is killed.")] = 600.0,
) -> None:
    """Run a command in the workspace; its output is printed and its exit code returned."""
    with connect() as http:
        env = call(http, "GET", SHADOW_ENVIRONMENT.path(namespace, name), name)
        proxy, headers = runtime(http, env)
        body = {"argv": command, "timeout_seconds": timeout}
        response = http.post(proxy + "/v1/exec", json=body, headers=headers, timeout=timeout + 30)
    if not response.is_success:
        fail(
            f"exec in {name}: the runtime answered {response.status_code}: {response.text[:200]}",
            f"shadowctl status {name}",
        )
    result = response.json()
    sys.stdout.write(result["stdout"])
    sys.stderr.write(result["stderr"])
    raise typer.Exit(result["exit_code"])


@app.command()
def diff(
    name: Annotated[str, typer.Argument(help="Name of the environment.")],
    namespace: NamespaceOpt = "default",
    stat: Annotated[bool, typer.Option("--stat", help="Only the changed paths.")] = False,
    output: OutputOpt = "text",
) -> None:
    """What changed in the workspace since the sources were copied in."""
    with connect() as http:
        env = call(http, "GET", SHADOW_ENVIRONMENT.path(namespace, name), name)
        proxy, headers = runtime(http, env)
        response = http.get(
            proxy + "/v1/diff", params={"paths_only": str(stat).lower()}, headers=headers, timeout=300
        )
    if not response.is_success:
        fail(f"diff of {name}: the runtime answered {response.status_code}", f"shadowctl status {name}")
    data = response.json()
    if emit(data, output):
        return
    if stat:
        for kind, mark in (("added", "A"), ("modified", "M"), ("deleted", "D")):
            for path in data.get(kind) or ():
                out.print(f"{mark} {path}")
        return
    for line in (data.get("patch") or "").splitlines():
        style = (
            "green"
            if line.startswith("+")
            else "red"
            if line.startswith("-")
            else "cyan"
            if line.startswith("@@")
            else ""
        )
        out.print(line, style=style or None, highlight=False, markup=False)


@app.command()
def destroy(
    name: Annotated[str, typer.Argument(help="Name of the environment.")],
    namespace: NamespaceOpt = "default",
) -> None:
    """Delete an environment: its workspace, Gitea, Secrets and volumes go with it."""
    with connect() as http:
        call(http, "DELETE", SHADOW_ENVIRONMENT.path(namespace, name), name)
    err.print(f"deleted ShadowEnvironment {namespace}/{name}")


def main(argv: list[str] | None = None) -> None:
    try:
        app(args=argv, prog_name="shadowctl", standalone_mode=True)
    except CliError as exc:
        err.print(f"[red]error:[/red] {exc.message}", highlight=False)
        if exc.hint:
            err.print(f"hint: {exc.hint}", highlight=False)
        sys.exit(1)
