"""Copy-on-write workspaces on kind (seed 004): one environment with uncommitted work forked into clones.

On the `shadow-snapshots` StorageClass (our CSI host-path driver, reflink XFS) each fork restores a
VolumeSnapshot of the source's volume; on `standard` (local-path, no snapshot support) the fork is copied
through the two runtimes and says so. Either way every clone sees the source's files at the same mount path,
changes stay in the clone that made them, and deleting clones leaves the source as it was.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.cluster import (
    Cluster,
    assert_runs_under_namespace_runtime,
    eventually,
    is_ready,
    namespace_runtime_class,
    under_each_runtime,
)
from tests.e2e.test_cli_sdk import REQUESTS, TIMEOUT, ctl, ok
from tests.support.hostile_repo import git

# Under runc and under gVisor (the namespace's template asks for the class; see tests/e2e/cluster.py).
pytestmark = [pytest.mark.e2e, under_each_runtime]

SNAPSHOT_CLASS = "shadow-snapshots"
SNAPSHOT_GROUP, SNAPSHOT_VERSION = "snapshot.storage.k8s.io", "v1"


def repository(root: Path) -> Path:
    """A package with a commit, uncommitted changes and an untracked file."""
    repo = root / "core"
    (repo / "core").mkdir(parents=True)
    (repo / "core" / "__init__.py").write_text('VERSION = "committed"\n')
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "initial")
    (repo / "core" / "__init__.py").write_text('VERSION = "uncommitted"\n')
    (repo / "notes.md").write_text("untracked\n")
    return repo


def create_source(cluster: Cluster, ns: str, name: str, repo: Path, *extra: str) -> dict[str, Any]:
    status = json.loads(
        ok(
            ctl(
                cluster, "create", name, "-n", ns, "--local", str(repo), "--cpu", REQUESTS["cpu"],
                "--memory", REQUESTS["memory"], "--timeout", TIMEOUT, "-o", "json", *extra,
            )
        )
    )["status"]  # fmt: skip
    assert status["sourcesReady"] == "1/1"
    # Work done in the workspace after the copy-in, never committed: the forks must carry it.
    ok(ctl(cluster, "exec", name, "-n", ns, "--", "sh", "-c", "echo agent > core/agent.txt"))
    return dict(status)


def read(cluster: Cluster, ns: str, env: str, path: str) -> str:
    return ok(ctl(cluster, "exec", env, "-n", ns, "--", "cat", path))


def snapshots_in(cluster: Cluster, ns: str) -> list[dict[str, Any]]:
    listed = cluster.custom.list_namespaced_custom_object(
        SNAPSHOT_GROUP, SNAPSHOT_VERSION, ns, "volumesnapshots"
    )
    return list(listed["items"])


def assert_isolated_clones(cluster: Cluster, ns: str, source: str, forks: list[str]) -> None:
    """Every fork has the source's files (committed, uncommitted, untracked, made in the workspace) at the
    same absolute path; a change in one is seen by none of the others nor by the source."""
    source_dir = ok(ctl(cluster, "exec", source, "-n", ns, "--", "pwd")).strip()
    for fork in forks:
        assert ok(ctl(cluster, "exec", fork, "-n", ns, "--", "pwd")).strip() == source_dir
        assert read(cluster, ns, fork, "core/core/__init__.py") == 'VERSION = "uncommitted"\n'
        assert read(cluster, ns, fork, "core/notes.md") == "untracked\n"
        assert read(cluster, ns, fork, "core/agent.txt") == "agent\n"
        assert git_log(cluster, ns, fork) == git_log(cluster, ns, source)
    first, others = forks[0], forks[1:]
    ok(
        ctl(
            cluster,
            "exec",
            first,
            "-n",
            ns,
            "--",
            "sh",
            "-c",
            "echo mine > core/agent.txt && rm core/notes.md",
        )
    )
    assert read(cluster, ns, first, "core/agent.txt") == "mine\n"
    for other in [*others, source]:
        assert read(cluster, ns, other, "core/agent.txt") == "agent\n"
        assert read(cluster, ns, other, "core/notes.md") == "untracked\n"
    # The fork diffs against the sources as they were copied in (its baseline came with the clone).
    stat = ok(ctl(cluster, "diff", first, "-n", ns, "--stat"))
    assert "A core/agent.txt" in stat and "D core/notes.md" in stat, stat
    assert "core/core/__init__.py" not in stat, stat  # modes and contents survived the clone
    # Promote from a fork goes to the source's local directory: `shadowctl fork` copied this machine's record
    # of where the sources were uploaded from, and the annotation the fork inherited agrees with it.
    plan = json.loads(ok(ctl(cluster, "promote", first, "-n", ns, "--dry-run", "-o", "json")))
    assert [(p["source"], p["write"], p["delete"]) for p in plan] == [
        ("core", ["agent.txt"], ["notes.md"])
    ], plan
    assert Path(plan[0]["localDir"]).name == "core"


def git_log(cluster: Cluster, ns: str, env: str) -> str:
    return ok(ctl(cluster, "exec", env, "-n", ns, "--", "git", "-C", "core", "log", "--format=%H %s"))


def destroy_forks_and_check_source(cluster: Cluster, ns: str, source: str, forks: list[str]) -> None:
    for fork in forks:
        ok(ctl(cluster, "destroy", fork, "-n", ns))
    assert read(cluster, ns, source, "core/agent.txt") == "agent\n"
    assert read(cluster, ns, source, "core/core/__init__.py") == 'VERSION = "uncommitted"\n'
    assert (
        json.loads(ok(ctl(cluster, "status", source, "-n", ns, "-o", "json")))["status"]["sourcesReady"]
        == "1/1"
    )


def test_fork_three_clones_by_snapshot(cluster: Cluster, e2e_namespace: str, tmp_path: Path) -> None:
    ns, source = e2e_namespace, f"base-{uuid.uuid4().hex[:6]}"
    runtime_class = namespace_runtime_class(cluster, ns)
    # Under gVisor the source also names the class itself (`--runtime-class`), which its forks inherit.
    extra = ["--runtime-class", runtime_class] if runtime_class else []
    create_source(cluster, ns, source, repository(tmp_path), "--storage-class", SNAPSHOT_CLASS, *extra)
    forks = [f"{source}-fork-{i}" for i in (1, 2, 3)]

    rows = json.loads(
        ok(
            ctl(
                cluster,
                "fork",
                source,
                "--count",
                "3",
                "-n",
                ns,
                "--no-verify",
                "--timeout",
                TIMEOUT,
                "-o",
                "json",
            )
        )
    )
    assert [r["name"] for r in rows] == forks
    assert {r["cloneMethod"] for r in rows} == {"Snapshot"}, rows

    # One baseline for the three: a VolumeSnapshot of the source's volume, ready, owned by all three forks;
    # each fork's volume is restored from it.
    (snap,) = snapshots_in(cluster, ns)
    name = snap["metadata"]["name"]
    assert snap["spec"]["source"] == {"persistentVolumeClaimName": f"workspace-{source}"}
    assert snap["spec"]["volumeSnapshotClassName"] == SNAPSHOT_CLASS
    assert snap["status"]["readyToUse"] is True
    owners = snap["metadata"]["ownerReferences"]
    assert sorted((o["kind"], o["name"]) for o in owners) == [("ShadowEnvironment", f) for f in forks]
    assert snap["metadata"]["labels"]["shadow.dev/snapshot-of"] == source
    for fork in forks:
        claim = cluster.core.read_namespaced_persistent_volume_claim(f"workspace-{fork}", ns)
        assert claim.spec.data_source.name == name
        assert claim.spec.storage_class_name == SNAPSHOT_CLASS
        status = (cluster.get(ns, "shadowenvironments", fork) or {})["status"]
        assert status["cloneMethod"] == "Snapshot" and status["clone"]["source"] == f"volumesnapshot/{name}"
        assert [s["name"] for s in status["sources"]] == ["core"]  # inherited and pushed to the fork's Gitea
        assert (cluster.get(ns, "shadowenvironments", fork) or {})["spec"].get(
            "runtimeClassName"
        ) == runtime_class
    assert_runs_under_namespace_runtime(cluster, ns, forks[0])

    assert_isolated_clones(cluster, ns, source, forks)
    destroy_forks_and_check_source(cluster, ns, source, forks)
    # The snapshot went with the last fork that owned it.
    eventually(lambda: not snapshots_in(cluster, ns) or None, "the forks' snapshot to be deleted", 120)

    # A single fork: the operator takes its snapshot itself, owned by the fork alone.
    one = f"{source}-one"
    row = json.loads(ok(ctl(cluster, "fork", source, one, "-n", ns, "--no-verify", "-o", "json")))[0]
    assert (
        row["cloneMethod"] == "Snapshot"
        and "serves the volume's driver hostpath.csi.shadow.dev" in row["reason"]
    )
    (snap,) = snapshots_in(cluster, ns)
    assert snap["metadata"]["name"] == f"{one}-fork" and snap["status"]["readyToUse"] is True
    assert [(o["name"], o.get("controller")) for o in snap["metadata"]["ownerReferences"]] == [(one, True)]
    assert read(cluster, ns, one, "core/agent.txt") == "agent\n"
    ok(ctl(cluster, "destroy", one, "-n", ns))
    eventually(lambda: not snapshots_in(cluster, ns) or None, "the single fork's snapshot to be deleted", 120)
    ok(ctl(cluster, "destroy", source, "-n", ns))


def test_fork_by_copy_where_storage_cannot_snapshot(
    cluster: Cluster, e2e_namespace: str, tmp_path: Path
) -> None:
    ns, source = e2e_namespace, f"plain-{uuid.uuid4().hex[:6]}"
    create_source(cluster, ns, source, repository(tmp_path))  # the default class: local-path, no snapshots
    forks = [f"{source}-a", f"{source}-b", f"{source}-c"]

    rows = json.loads(
        ok(ctl(cluster, "fork", source, *forks, "-n", ns, "--no-verify", "--timeout", TIMEOUT, "-o", "json"))
    )
    assert {r["cloneMethod"] for r in rows} == {"Copy"}, rows
    for row in rows:
        assert "no VolumeSnapshotClass serves the volume's driver rancher.io/local-path" in row["reason"], row
    for fork in forks:
        status = (cluster.get(ns, "shadowenvironments", fork) or {})["status"]
        cloned = next(c for c in status["conditions"] if c["type"] == "Cloned")
        assert cloned["status"] == "True" and cloned["reason"] == "Copied", cloned
        assert status["clone"]["copiedBytes"] > 0
    assert not [
        s
        for s in snapshots_in(cluster, ns)
        if s["metadata"]["labels"].get("shadow.dev/snapshot-of") == source
    ]

    assert_isolated_clones(cluster, ns, source, forks)
    destroy_forks_and_check_source(cluster, ns, source, forks)
    ok(ctl(cluster, "destroy", source, "-n", ns))


def test_snapshot_then_start_from_it(cluster: Cluster, e2e_namespace: str, tmp_path: Path) -> None:
    """`shadowctl snapshot` (flush, VolumeSnapshot, ready) and an environment that names it in
    spec.workspace.from.snapshot: the sources come from the snapshot's annotation."""
    ns, source = e2e_namespace, f"snap-{uuid.uuid4().hex[:6]}"
    create_source(cluster, ns, source, repository(tmp_path), "--storage-class", SNAPSHOT_CLASS)
    taken = json.loads(ok(ctl(cluster, "snapshot", source, "--name", f"{source}-v1", "-n", ns, "-o", "json")))
    assert taken["name"] == f"{source}-v1" and taken["restoreSize"]
    snap = cluster.custom.get_namespaced_custom_object(
        SNAPSHOT_GROUP, SNAPSHOT_VERSION, ns, "volumesnapshots", f"{source}-v1"
    )
    assert snap["metadata"]["ownerReferences"][0]["name"] == source  # not retained: goes with the environment

    restored = f"{source}-restored"
    body = {
        "apiVersion": "shadow.dev/v1alpha1",
        "kind": "ShadowEnvironment",
        "metadata": {"name": restored},
        "spec": {
            "workspace": {"from": {"snapshot": f"{source}-v1"}},
            "resources": {"requests": REQUESTS},
            "verify": {"enabled": False},
        },
    }
    cluster.custom.create_namespaced_custom_object("shadow.dev", "v1alpha1", ns, "shadowenvironments", body)

    def ready() -> dict[str, Any] | None:
        env = cluster.get(ns, "shadowenvironments", restored) or {}
        conds = {c["type"]: c for c in (env.get("status") or {}).get("conditions") or ()}
        return env if conds.get("Ready", {}).get("status") == "True" else None

    env = eventually(ready, f"{restored} to be Ready", float(TIMEOUT))
    assert env["status"]["cloneMethod"] == "Snapshot"
    assert env["status"]["clone"]["storageClassName"] == SNAPSHOT_CLASS  # the class of the snapshot's driver
    assert [s["name"] for s in env["status"]["sources"]] == ["core"]
    assert read(cluster, ns, restored, "core/agent.txt") == "agent\n"
    ok(ctl(cluster, "destroy", restored, "-n", ns))
    ok(ctl(cluster, "destroy", source, "-n", ns))
    eventually(lambda: not snapshots_in(cluster, ns) or None, "the snapshot to go with its environment", 120)


def sandbox_with_volume(
    cluster: Cluster, ns: str, name: str, data_source: dict[str, str] | None = None
) -> dict[str, Any]:
    """A plain Sandbox of the default template's Pod whose `workspace` volume is a claim on the snapshot
    class (restored from `data_source` when given)."""
    template = cluster.get(ns, "sandboxtemplates", "workspace")
    assert template is not None
    claim_spec: dict[str, Any] = {
        "accessModes": ["ReadWriteOnce"],
        "storageClassName": SNAPSHOT_CLASS,
        "resources": {"requests": {"storage": "1Gi"}},
    }
    if data_source:
        claim_spec["dataSource"] = data_source
    body = {
        "kind": "Sandbox",
        "metadata": {"name": name},
        "spec": {
            "podTemplate": template["spec"]["podTemplate"],
            "volumeClaimTemplates": [{"metadata": {"name": "workspace"}, "spec": claim_spec}],
        },
    }
    cluster.create(ns, "sandboxes", body)
    return eventually(
        lambda: (lambda sb: sb if is_ready(sb) else None)(cluster.get(ns, "sandboxes", name)),
        f"Sandbox {name} to be Ready",
    )


def test_plain_sandbox_snapshot_and_restore(cluster: Cluster, e2e_namespace: str) -> None:
    """`shadowctl sandbox snapshot` and a Sandbox whose volumeClaimTemplate restores it (dataSource)."""
    ns, first = e2e_namespace, f"sbx-{uuid.uuid4().hex[:6]}"
    sandbox_with_volume(cluster, ns, first)
    with cluster.runtime(ns, first) as rt:
        rt.put("/v1/files/made-here.txt", content=b"in the first sandbox\n").raise_for_status()
    taken = json.loads(
        ok(ctl(cluster, "sandbox", "snapshot", first, "--name", f"{first}-snap", "-n", ns, "-o", "json"))
    )
    assert taken["name"] == f"{first}-snap"
    source = {"apiGroup": SNAPSHOT_GROUP, "kind": "VolumeSnapshot", "name": f"{first}-snap"}
    second = f"{first}-restored"
    sandbox_with_volume(cluster, ns, second, source)
    with cluster.runtime(ns, second) as rt:
        got = rt.get("/v1/files/made-here.txt")
        assert got.status_code == 200 and got.content == b"in the first sandbox\n"
        rt.put("/v1/files/made-here.txt", content=b"changed in the second\n").raise_for_status()
    with cluster.runtime(ns, first) as rt:
        assert rt.get("/v1/files/made-here.txt").content == b"in the first sandbox\n"
    claim = cluster.core.read_namespaced_persistent_volume_claim(f"workspace-{second}", ns)
    assert claim.spec.data_source.name == f"{first}-snap"
    # Owned by the first Sandbox: deleting it deletes the snapshot; the restored one keeps its data.
    cluster.delete(ns, "sandboxes", first)
    eventually(
        lambda: f"{first}-snap" not in {s["metadata"]["name"] for s in snapshots_in(cluster, ns)} or None,
        "the Sandbox's snapshot to go with it",
        120,
    )
    with cluster.runtime(ns, second) as rt:
        assert rt.get("/v1/files/made-here.txt").content == b"changed in the second\n"
    cluster.delete(ns, "sandboxes", second)
