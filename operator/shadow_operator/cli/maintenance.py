"""`shadowctl doctor` (is this cluster ready for shadow environments?) and `shadowctl cleanup` (leftovers)."""

from __future__ import annotations

from typing import Annotated, Any

import httpx
import typer

from shadow_operator.api.kinds import (
    SANDBOX,
    SANDBOX_CLAIM,
    SANDBOX_TEMPLATE,
    SHADOW_ENVIRONMENT,
    STORAGE_CLASS,
)
from shadow_operator.cli.common import GLOBALS, NamespaceOpt, OutputOpt, connect, emit, err, out
from shadow_operator.common.podsecurity import ENFORCE_LABEL
from shadow_operator.sdk import cleanup as cleanup_ops
from shadow_operator.sdk import discovery, kube
from shadow_operator.sdk.errors import ApiNotInstalled, NotFound, ShadowError

DEFAULT_CLASS = "storageclass.kubernetes.io/is-default-class"
# The most Sandboxes `doctor` reads to find the namespaces that hold some (one page).
SANDBOX_PAGE = 500


class Check:
    def __init__(self, name: str, ok: bool, detail: str, fix: str = "", warning: bool = False) -> None:
        self.name, self.ok, self.detail, self.fix, self.warning = name, ok, detail, fix, warning

    def as_dict(self) -> dict[str, Any]:
        state = "ok" if self.ok else "warning" if self.warning else "failed"
        return {
            "check": self.name,
            "state": state,
            "detail": self.detail,
            **({"fix": self.fix} if self.fix else {}),
        }


# The install the README shows (Quick start; For platform teams): a release of the chart from a registry. The
# chart's directory cannot be installed as it is (its images point at no registry until a release sets them).
INSTALL = (
    "helm install sandboxes oci://<registry>/charts/shadow-operator --version <version> "
    "-n sandbox-platform --create-namespace --set 'tenants.namespaces={{{namespace}}}'"
)


def install_hint(namespace: str) -> str:
    """What to run when the operator is not installed (a cluster admin's command), as the README shows it."""
    return f"a cluster admin installs it (README: Quick start): {INSTALL.format(namespace=namespace)}"


def _checks(http: httpx.Client, namespace: str) -> list[Check]:
    checks: list[Check] = []
    try:
        version = kube.request(http, "GET", "/version", what="read the server version")
        checks.append(
            Check("cluster", True, f"{http.base_url} answers (Kubernetes {version.get('gitVersion')})")
        )
    except ShadowError as exc:
        checks.append(Check("cluster", False, exc.message, exc.hint))
        return checks

    missing = []
    for kind in (SHADOW_ENVIRONMENT, SANDBOX, SANDBOX_CLAIM, SANDBOX_TEMPLATE):
        try:
            kube.request(http, "GET", kind.path(namespace) + "?limit=1", what=f"list {kind.kind}s")
        except ApiNotInstalled:
            missing.append(kind.name)
        except ShadowError:
            pass  # installed; reading may be forbidden, which the checks below report where it matters
    checks.append(
        Check(
            "CRDs",
            not missing,
            "installed" if not missing else f"missing: {', '.join(missing)}",
            install_hint(namespace),
        )
    )

    if missing:
        checks.append(Check("operator", False, "not running: its CRDs are missing"))
    else:
        state = kube.run(http, discovery.operator_state(namespace))
        where = state.location
        found = f" (found by {where.source})" if where.source else ""
        checks.append(
            Check(
                "operator",
                state.alive is not False,
                state.detail + found,
                f"kubectl -n {where.namespace} get pods; kubectl -n {where.namespace} logs deploy/{where.deployment}"
                if where.source or state.alive is False
                else f"{install_hint(namespace)}; or ask who runs the cluster",
                warning=state.alive is None,
            )
        )

    try:
        classes = kube.request(http, "GET", STORAGE_CLASS.path(), what="list StorageClasses")["items"]
        default = [
            s["metadata"]["name"]
            for s in classes
            if (s["metadata"].get("annotations") or {}).get(DEFAULT_CLASS) == "true"
        ]
        checks.append(
            Check(
                "storage",
                bool(default),
                f"default StorageClass {default[0]}"
                if default
                else f"no default StorageClass ({len(classes)} classes)",
                'mark one default (kubectl patch storageclass NAME -p \'{"metadata":{"annotations":{"'
                + DEFAULT_CLASS
                + '":"true"}}}\') or set spec.workspace.storageClassName',
            )
        )
    except ShadowError as exc:
        checks.append(Check("storage", False, exc.message, exc.hint, warning=True))

    try:
        snap = kube.request(
            http,
            "GET",
            "/apis/snapshot.storage.k8s.io/v1/volumesnapshotclasses",
            what="list VolumeSnapshotClasses",
        )
        names = [s["metadata"]["name"] for s in snap["items"]]
        checks.append(
            Check(
                "snapshots",
                bool(names),
                f"VolumeSnapshotClasses: {', '.join(names)}" if names else "no VolumeSnapshotClass",
                "install a CSI driver with snapshots; until then forks copy",
                warning=True,
            )
        )
    except (ApiNotInstalled, NotFound):
        checks.append(
            Check(
                "snapshots",
                False,
                "the VolumeSnapshot API is not installed (forks copy instead)",
                "install the external-snapshotter CRDs and controller",
                warning=True,
            )
        )
    except ShadowError as exc:
        checks.append(Check("snapshots", False, exc.message, exc.hint, warning=True))

    if not missing:
        try:
            templates = kube.request(
                http, "GET", SANDBOX_TEMPLATE.path(namespace), what="list SandboxTemplates"
            )["items"]
            checks.append(
                Check(
                    "templates",
                    bool(templates),
                    f"{len(templates)} in namespace {namespace}"
                    if templates
                    else f"none in namespace {namespace}",
                    "the chart installs one (defaultTemplate.enabled); or kubectl apply a SandboxTemplate",
                    warning=True,
                )
            )
        except ShadowError as exc:
            checks.append(Check("templates", False, exc.message, exc.hint, warning=True))
        checks.append(_pod_security(http, namespace))
    return checks


def _pod_security(http: httpx.Client, namespace: str) -> Check:
    """Namespaces holding sandboxes where Pod Security enforces nothing: there a tenant allowed to create Pods
    (the built-in `edit` role) may create a privileged one directly, whatever the chart's admission policy."""
    try:
        try:
            found = kube.request(
                http, "GET", f"{SANDBOX.path()}?limit={SANDBOX_PAGE}", what="list Sandboxes in all namespaces"
            )
        except ShadowError:  # not allowed cluster-wide: the namespace at hand
            found = kube.request(http, "GET", SANDBOX.path(namespace), what="list Sandboxes")
        namespaces = sorted({item["metadata"]["namespace"] for item in found["items"]})
        unenforced = []
        for name in namespaces:
            labels = (
                kube.request(http, "GET", f"/api/v1/namespaces/{name}", what=f"read namespace {name}")[
                    "metadata"
                ].get("labels")
                or {}
            )
            if labels.get(ENFORCE_LABEL, "privileged") == "privileged":
                unenforced.append(name)
    except ShadowError as exc:
        return Check("podsecurity", False, exc.message, exc.hint, warning=True)
    if not unenforced:
        where = f"{len(namespaces)} namespaces with sandboxes" if namespaces else "no sandboxes yet"
        return Check("podsecurity", True, f"enforced ({where})")
    return Check(
        "podsecurity",
        False,
        f"no Pod Security enforced where sandboxes run: {', '.join(unenforced)} "
        "(anyone there who may create Pods may create a privileged one)",
        f"list them under the chart's tenants.namespaces (the operator labels them), or kubectl label namespace "
        f"{unenforced[0]} {ENFORCE_LABEL}=restricted",
        warning=True,
    )


def doctor(namespace: NamespaceOpt = "", output: OutputOpt = "text") -> None:
    """Check the cluster, each failure with its fix.

    kubeconfig, CRDs, the operator (its leader Lease), storage and snapshot classes, templates, Pod Security
    enforced where sandboxes run.
    """
    try:
        http = connect()
    except ShadowError as exc:
        checks = [Check("kubeconfig", False, exc.message, exc.hint)]
    else:
        with http:
            context = f" (context {GLOBALS.context})" if GLOBALS.context else ""
            checks = [
                Check("kubeconfig", True, f"server {http.base_url}{context}"),
                *_checks(http, namespace),
            ]
    if not emit([x.as_dict() for x in checks], output):
        for check in checks:
            mark = (
                "[green]✓[/green]" if check.ok else "[yellow]![/yellow]" if check.warning else "[red]✗[/red]"
            )
            out.print(f"{mark} {check.name:<11} {check.detail}")
            if not check.ok and check.fix:
                out.print(f"  fix: {check.fix}", markup=False)
    raise typer.Exit(1 if any(not x.ok and not x.warning for x in checks) else 0)


def cleanup(
    namespace: Annotated[
        str | None, typer.Option("--namespace", "-n", help="Only this namespace (default: all).")
    ] = None,
    yes: Annotated[
        bool, typer.Option("--yes", "-y", help="Delete what was found (default: only report).")
    ] = False,
    output: OutputOpt = "text",
) -> None:
    """Find what deleted environments left behind.

    Volumes, VolumeSnapshots and Secrets labelled with an environment that no longer exists. A dry run unless
    --yes.
    """
    namespace = namespace or GLOBALS.namespace  # -n anywhere on the command line
    with connect() as http:
        orphans = kube.run(http, cleanup_ops.find(namespace))
        if yes:
            for orphan in orphans:
                kube.run(http, cleanup_ops.delete(orphan))
    if emit([o.as_dict() for o in orphans], output):
        return
    if not orphans:
        err.print("nothing to clean up")
        return
    for o in orphans:
        size = f" ({o.size})" if o.size else ""
        out.print(
            f"{'deleted' if yes else 'would delete'} {o.kind} {o.namespace}/{o.name}{size} of environment {o.environment}"
        )
    if not yes:
        err.print("dry run: nothing deleted; run again with --yes to delete")


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor)
    app.command("cleanup")(cleanup)
