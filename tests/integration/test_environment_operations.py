"""Long work as operations (issue 27): each verify check that runs in the workspace is a background process of its
runtime, which the operator starts, records in status.verifyRun and looks in on, never awaiting it in a worker.

On the local control plane (kwok plays the kubelet) with one real sandbox-runtime on loopback answering for every
workspace (SHADOW_RUNTIME_API_URL), as test_environment_hostile_output.py does.

- A tenant whose environments verify with day-long commands no longer holds the environment controller's
  workers: before, its environments took every worker its namespace may hold (three of four) and another
  environment of that namespace got no verdict until they ended.
- An operator that takes over in the middle of a verification carries it on from status: one run of each
  command, one verdict, from the first run. Both ways: the operator stopped and started again (in-process), and a
  real leader change (two operator processes under leader election, the leader SIGKILLed, its Lease not
  released; the standby takes the Lease when it expires).
- A source's copy-in is an operation too (status.operation): tenant A's copy-ins whose clones hang on a slow
  upstream (a real git server over HTTP that holds every request) no longer hold the workers, so an environment
  of another namespace gets its verdict while they wait (before: A's four clones held all four workers, A's
  namespaces each below their share). And an operator that starts again while a clone runs waits for that clone
  (the snapshot's runtime process, from status) instead of cloning a second time: one clone, one copy-in. The
  same both ways as above.
- The setup of an environment's Gitea is an operation too (status.giteaOperation), with a deadline in total: the
  Giteas of tenant A stall (a real TCP server that accepts and answers a byte every 10 s), and an environment of
  another namespace still gets its verdict promptly (before: A's four setups held all four workers, each call
  for up to 120 s); A's environments end with the failure code GiteaStalled. An operator that starts again in
  the middle of a setup carries it on under the same id.
- So are the sources' checks in the workspace (status.verifyRun, `probe`): tenant A's sources whose check of the
  snapshot commit hangs (their git config includes a FIFO nobody writes) no longer hold the workers, so another
  environment of A's namespace gets its verdict while they hang (before: each pass awaited them in turn, a minute
  a source, and three of A's held the namespace's share of the workers); and an operator that starts again while
  such a check hangs waits for it instead of running it a second time.
"""

from __future__ import annotations

import contextlib
import os
import signal
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from shadow_operator.api import constants as c

from tests.runtime.conftest import Server
from tests.support.controlplane import wait_for
from tests.support.githttp import GitHttpServer
from tests.support.hostile_repo import git, one_commit
from tests.support.sandbox_operator import (
    ENVIRONMENT,
    TEMPLATE,
    Objects,
    OperatorProcess,
    in_process_operator,
    install_crds,
    template_body,
)
from tests.support.stalling import StallingServer
from tests.support.volumes import bind_volumes

pytestmark = pytest.mark.integration
V = "v1alpha1"


@pytest.fixture(scope="module")
def operator(k8s_api: client.ApiClient) -> Iterator[None]:
    """Each test runs its own operator (one stops and starts it): here only the CRDs."""
    install_crds(k8s_api)
    yield None


def new_environment(objs: Objects, name: str, source: dict[str, Any], verify: dict[str, Any]) -> None:
    """An environment of one source named like it (`source`: how it comes in), without Gitea."""
    with_sources(objs, name, [{"name": name, "repo": f"shadow/{name}", **source}], verify)


def with_sources(objs: Objects, name: str, sources: list[dict[str, Any]], verify: dict[str, Any]) -> None:
    """An environment of `sources`, without Gitea."""
    objs.create(
        ENVIRONMENT,
        {
            "metadata": {"name": name},
            "spec": {
                "gitea": {"enabled": False},
                "workspace": {"size": "1Gi"},
                "sources": sources,
                "verify": verify,
            },
        },
        version=V,
    )


def create(objs: Objects, runtime: Server, name: str, command: str) -> None:
    """An environment whose one upload source is ready in the shared runtime, verifying with `command`."""
    new_environment(
        objs, name, {"upload": {}}, {"install": False, "commands": [{"name": "check", "command": command}]}
    )
    source = runtime.root / name
    source.mkdir(exist_ok=True)
    (source / "main.py").write_text("print('hello')\n")
    objs.annotate(ENVIRONMENT, name, {c.ANNOTATION_UPLOAD_PREFIX + name: "sha256:test"}, V)


def status_with(
    objs: Objects, name: str, field: str, timeout: float, check: Callable[[Any], bool] = bool
) -> dict[str, Any]:
    """Wait until the environment's status.<field> passes `check`; its status."""
    env = objs.wait(
        ENVIRONMENT,
        name,
        lambda o: check((o.get("status") or {}).get(field)),
        timeout=timeout,
        what=f"{name}'s status.{field}",
        version=V,
    )
    status: dict[str, Any] = env["status"]
    return status


def verdict(objs: Objects, name: str, timeout: float) -> dict[str, Any]:
    result: dict[str, Any] = status_with(objs, name, "verdict", timeout)["verdict"]
    return result


def running_check(objs: Objects, name: str, timeout: float = 90) -> dict[str, Any]:
    """Wait until the environment's verify command runs in the workspace; its entry in status.verifyRun."""

    def running(status: dict[str, Any]) -> list[dict[str, Any]]:
        checks = (status.get("verifyRun") or {}).get("checks", [])
        return [ch for ch in checks if ch.get("command") and ch.get("process") and ch.get("passed") is None]

    env = objs.wait(
        ENVIRONMENT,
        name,
        lambda o: running(o.get("status") or {}),
        timeout=timeout,
        what=f"{name}'s verify command to run",
        version=V,
    )
    (check,) = running(env["status"])
    return check


def test_day_long_verifies_of_one_tenant_hold_no_worker(
    objs: Objects, runtime: Server, tmp_path: Path
) -> None:
    objs.create(TEMPLATE, template_body("workspace"))
    names = [f"l{i}" for i in range(4)] + ["victim"]
    bind_volumes(objs, [f"workspace-{n}" for n in names], tmp_path)
    with in_process_operator(SHADOW_RUNTIME_API_URL=runtime.url):
        for name in names[:4]:
            create(objs, runtime, name, "sleep 600")
        for name in names[:4]:
            check = running_check(objs, name)
            assert check["name"] == "check" and check["deadline"]
        # Before: three of these held the namespace's share of the four workers in `runtime.sh(...)`, and the
        # victim, in the same namespace, waited for them (ten minutes here; a day with `sleep 86400`).
        create(objs, runtime, "victim", "echo verified")
        result = verdict(objs, "victim", timeout=90)
        assert result["result"] == "PASS", result
        (check,) = result["evidence"]["codeExecution"]["checks"]
        assert check["passed"] and check["detail"] == "exit code 0: verified"
        # The long ones run on, each still recorded as under way.
        for name in names[:4]:
            env = objs.get(ENVIRONMENT, name, V)
            assert env is not None and "verdict" not in env["status"] and env["status"]["verifyRun"]


class Replicas:
    """Two operator processes under leader election (a short Lease), the workspace runtime shared."""

    def __init__(self, objs: Objects, runtime: Server, kubeconfig: str, logs: Path) -> None:
        self.lease = client.CoordinationV1Api(objs.api)
        self.namespace = objs.namespace
        self.logs = logs
        self.processes = {
            name: OperatorProcess(
                kubeconfig,
                logs / f"{name}.log",
                args=["--leader-elect", f"--leader-election-namespace={objs.namespace}"],
                env={
                    "POD_NAME": name,
                    "SHADOW_RUNTIME_API_URL": runtime.url,
                    "SHADOW_LEASE_DURATION": "4",
                    "SHADOW_RENEW_DEADLINE": "3",
                    "SHADOW_RETRY_PERIOD": "0.5",
                },
            )
            for name in ("op-a", "op-b")
        }

    def holder(self) -> str:
        lease = self.lease.read_namespaced_lease(c.LEADER_LEASE_NAME, self.namespace)
        return str(lease.spec.holder_identity or "").rpartition("_")[0]

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        try:
            for process in self.processes.values():
                process.start()
            wait_for(
                lambda: self.holder() in self.processes, timeout=60, what="an operator to take the Lease"
            )
            yield
        finally:
            for process in self.processes.values():
                process.kill()
            for name in self.processes:
                print(f"--- {name}'s log tail ---")
                print("\n".join((self.logs / f"{name}.log").read_text(errors="replace").splitlines()[-15:]))

    def kill_leader(self) -> None:
        """SIGKILL the leader (a crash: its Lease is not released) and wait for the standby to take the Lease
        once it expired."""
        first = self.holder()
        leading = self.processes[first].proc
        assert leading is not None
        leading.send_signal(signal.SIGKILL)
        leading.wait(timeout=10)
        wait_for(lambda: self.holder() not in ("", first), timeout=30, what="the standby to take the Lease")


@contextlib.contextmanager
def operators(
    how: str, objs: Objects, runtime: Server, kubeconfig: str, logs: Path
) -> Iterator[Callable[[], None]]:
    """An operator at work, and the call that hands its work over to another: `restart` stops it and starts
    another in-process; `leader-killed` SIGKILLs the leader of two operator processes under leader election."""
    if how == "leader-killed":
        replicas = Replicas(objs, runtime, kubeconfig, logs)
        with replicas.running():
            yield replicas.kill_leader
        return
    with contextlib.ExitStack() as stack:
        stack.enter_context(in_process_operator(SHADOW_RUNTIME_API_URL=runtime.url))

        def restart() -> None:
            stack.pop_all().close()
            stack.enter_context(in_process_operator(SHADOW_RUNTIME_API_URL=runtime.url))

        yield restart


HANDOVERS = ["restart", "leader-killed"]


@pytest.mark.parametrize("how", HANDOVERS)
def test_an_operator_that_takes_over_mid_verify_scores_the_first_run(
    objs: Objects, runtime: Server, tmp_path: Path, kubeconfig: str, how: str
) -> None:
    objs.create(TEMPLATE, template_body("workspace"))
    bind_volumes(objs, [f"workspace-verified-{how}"], tmp_path)
    name = f"verified-{how}"
    runs = runtime.root / f"{name}-runs.txt"
    # Each run writes its own shell's process id; the verdict's evidence says which run it scored.
    command = f"echo $$ >> {runs}; sleep 10; echo done $$"
    with operators(how, objs, runtime, kubeconfig, tmp_path) as hand_over:
        create(objs, runtime, name, command)
        assert running_check(objs, name)["process"]
        hand_over()  # while the command runs
        result = verdict(objs, name, timeout=90)
    pids = runs.read_text().split()
    assert len(pids) == 1, f"the verify command started {len(pids)} times"
    assert result["result"] == "PASS", result
    (check,) = result["evidence"]["codeExecution"]["checks"]
    assert check["detail"] == f"exit code 0: done {pids[0]}", "the verdict is not the first run's"
    env = objs.get(ENVIRONMENT, name, V)
    assert env is not None and "verifyRun" not in env["status"]
    events = objs.core.list_namespaced_event(
        objs.namespace, field_selector=f"involvedObject.name={name}"
    ).items
    verdicts = [e for e in events if e.reason in ("VerificationPassed", "VerificationFailed")]
    assert sum(e.count or 1 for e in verdicts) == 1, [e.message for e in verdicts]


# --- copy-in as an operation ------------------------------------------------------------------------------


def upstream(server: GitHttpServer, tmp_path: Path) -> tuple[str, str]:
    """A repository with one commit on the git server: (its clone URL, the commit)."""
    url = server.repo_url("acme/big")
    work = tmp_path / "big"
    head = one_commit(work)
    bare = server.root / "acme" / "big.git"
    git(work, "push", "-q", str(bare), "main")
    git(bare, "symbolic-ref", "HEAD", "refs/heads/main")
    return url, head


def create_cloned(objs: Objects, name: str, url: str) -> None:
    """An environment whose one source is cloned from `url`; no verification."""
    new_environment(objs, name, {"git": {"url": url}}, {"enabled": False})


def clones(server: GitHttpServer) -> int:
    """How many clones the git server was asked for (each starts with the smart-HTTP ref advertisement)."""
    return sum(1 for r in server.requests if "/info/refs?service=git-upload-pack" in r)


def copied_in(objs: Objects, name: str, commit: str, timeout: float = 90) -> dict[str, Any]:
    env = objs.wait_condition(ENVIRONMENT, name, type_="SourcesReady", timeout=timeout, version=V)
    assert [(s["name"], s["commit"]) for s in env["status"]["sources"]] == [(name, commit)]
    assert "operation" not in env["status"]
    return env


def operation(objs: Objects, name: str, check: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """Wait until the environment's status.operation passes `check`; that operation."""
    env = objs.wait(
        ENVIRONMENT,
        name,
        lambda o: check((o.get("status") or {}).get("operation") or {}),
        timeout=60,
        what=f"{name}'s status.operation",
        version=V,
    )
    found: dict[str, Any] = env["status"]["operation"]
    return found


@contextlib.contextmanager
def other_namespaces(objs: Objects, count: int) -> Iterator[list[Objects]]:
    """`count` more namespaces for another tenant (deleted afterwards), each with the workspace template."""
    names = [f"{objs.namespace[:50]}-{uuid.uuid4().hex[:4]}" for _ in range(count)]
    for name in names:
        objs.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    try:
        tenants = [Objects(objs.api, name) for name in names]
        for tenant in tenants:
            tenant.create(TEMPLATE, template_body("workspace"))
        yield tenants
    finally:
        for name in names:
            objs.core.delete_namespace(name, propagation_policy="Background")


def test_slow_copy_ins_of_one_tenant_leave_another_namespace_served(
    objs: Objects, runtime: Server, tmp_path: Path
) -> None:
    objs.create(TEMPLATE, template_body("workspace"))
    bind_volumes(objs, ["workspace-victim"], tmp_path)
    with GitHttpServer(tmp_path / "repos") as server, other_namespaces(objs, 2) as (a1, a2):
        url, head = upstream(server, tmp_path)
        slow = [(a1, "a1-0"), (a1, "a1-1"), (a1, "a1-2"), (a2, "a2-0")]
        for tenant, name in slow:
            bind_volumes(tenant, [f"workspace-{name}"], tmp_path, prefix=f"t-{uuid.uuid4().hex[:12]}")
        server.gate.clear()  # every clone hangs until the test lets the upstream answer
        try:
            with in_process_operator(SHADOW_RUNTIME_API_URL=runtime.url):
                for tenant, name in slow:
                    create_cloned(tenant, name, url)
                wait_for(lambda: clones(server) >= 4, timeout=90, what="tenant A's four clones to start")
                # Before: these four held all four workers of the environment controller (three of a1, its
                # share, and a2's one) and the victim, in a third namespace, waited for the upstream.
                create(objs, runtime, "victim", "echo verified")
                result = verdict(objs, "victim", timeout=60)
                assert result["result"] == "PASS", result
                for tenant, name in slow:
                    env = tenant.get(ENVIRONMENT, name, V)
                    assert env is not None and "sources" not in env["status"]
                    operation = env["status"]["operation"]
                    assert operation["kind"] == "CopyIn" and operation["source"] == name, operation
                    assert operation["process"] and operation["deadline"]
                server.gate.set()
                # A's copy-ins complete once the upstream answers: nothing lost on either side.
                for tenant, name in slow:
                    copied_in(tenant, name, head)
        finally:
            server.gate.set()
    assert clones(server) == 4


@pytest.mark.parametrize("how", HANDOVERS)
def test_an_operator_that_takes_over_mid_clone_waits_for_that_clone(
    objs: Objects, runtime: Server, tmp_path: Path, kubeconfig: str, how: str
) -> None:
    objs.create(TEMPLATE, template_body("workspace"))
    name = f"cloned-{how}"
    bind_volumes(objs, [f"workspace-{name}"], tmp_path)
    with GitHttpServer(tmp_path / "repos") as server:
        url, head = upstream(server, tmp_path)
        server.gate.clear()
        try:
            with operators(how, objs, runtime, kubeconfig, tmp_path) as hand_over:
                create_cloned(objs, name, url)
                wait_for(lambda: clones(server) == 1, timeout=90, what="the clone to start")
                first = operation(objs, name, lambda op: bool(op.get("process")))
                # Another operator takes over while the clone hangs, and the clone goes on only once it did
                # (before: it had cloned a second time by then).
                hand_over()
                taken = operation(objs, name, lambda op: op.get("takenOver") == 1)
                same = ("id", "process", "startedAt")
                assert [taken[k] for k in same] == [first[k] for k in same]
                server.gate.set()
                copied_in(objs, name, head)
        finally:
            server.gate.set()
    assert clones(server) == 1, "the source was cloned again"
    events = objs.core.list_namespaced_event(
        objs.namespace, field_selector=f"involvedObject.name={name}"
    ).items
    assert sum(e.count or 1 for e in events if e.reason == "SourceCopied") == 1


# --- Gitea's setup as an operation ------------------------------------------------------------------------


def create_with_gitea(objs: Objects, name: str) -> None:
    """An environment with its Gitea (the operator's setup of it is what stalls), its upload not sent yet."""
    objs.create(
        ENVIRONMENT,
        {
            "metadata": {"name": name},
            "spec": {
                "workspace": {"size": "1Gi"},
                "sources": [{"name": name, "repo": f"hostile/{name}", "upload": {}}],
                "verify": {"enabled": False},
            },
        },
        version=V,
    )


def stalled_gitea_operator(runtime: Server, stall: StallingServer, setup_timeout: int) -> Any:
    """The operator in-process, every environment's Gitea API at the stalling server (the Gitea StatefulSets'
    Pods are kwok's and serve nothing)."""
    return in_process_operator(
        SHADOW_RUNTIME_API_URL=runtime.url,
        SHADOW_GITEA_API_URL=stall.url,
        SHADOW_GITEA_IMAGE="gitea:test",
        SHADOW_GITEA_SETUP_TIMEOUT=str(setup_timeout),
    )


def test_a_stalled_gitea_holds_no_worker_and_fails_as_stalled(
    objs: Objects, runtime: Server, tmp_path: Path
) -> None:
    objs.create(TEMPLATE, template_body("workspace"))
    bind_volumes(objs, ["workspace-victim"], tmp_path)
    # A byte every 10 s: below httpx's 30 s read timeout, so only a deadline in total ends a call (the client's
    # own per call is 120 s).
    with StallingServer(period=10) as stall, other_namespaces(objs, 2) as (a1, a2):
        hostile = [(a1, "g1-0"), (a1, "g1-1"), (a1, "g1-2"), (a2, "g2-0")]
        for tenant, name in hostile:
            bind_volumes(tenant, [f"workspace-{name}"], tmp_path, prefix=f"t-{uuid.uuid4().hex[:12]}")
        with stalled_gitea_operator(runtime, stall, setup_timeout=60):
            for tenant, name in hostile:
                create_with_gitea(tenant, name)
            wait_for(lambda: stall.connections >= 4, timeout=90, what="tenant A's four Gitea setups to start")
            # Before: each setup was awaited in a worker, every call for up to 120 s, and these four held all
            # four workers (three of g1's namespace, its share, and g2's one): the victim, in a third
            # namespace, waited minutes for each of its passes.
            create(objs, runtime, "victim", "echo verified")
            result = verdict(objs, "victim", timeout=45)
            assert result["result"] == "PASS", result
            for tenant, name in hostile:
                env = tenant.get(ENVIRONMENT, name, V)
                assert env is not None and "failure" not in env["status"], env["status"]
                run = env["status"]["giteaOperation"]
                assert run["kind"] == "GiteaSetup" and run["deadline"] > run["startedAt"], run
            # Each ends at its deadline in total with a code that says so.
            for tenant, name in hostile:
                status = status_with(tenant, name, "failure", timeout=120)
                assert status["failure"]["code"] == "GiteaStalled", status["failure"]
                assert "did not finish within 60s in total" in status["failure"]["message"]


def test_an_operator_that_takes_over_mid_setup_carries_it_on(
    objs: Objects, runtime: Server, tmp_path: Path
) -> None:
    objs.create(TEMPLATE, template_body("workspace"))
    name = "gitea-restart"
    bind_volumes(objs, [f"workspace-{name}"], tmp_path)
    with StallingServer(period=10) as stall, contextlib.ExitStack() as stack:
        stack.enter_context(stalled_gitea_operator(runtime, stall, setup_timeout=20))
        create_with_gitea(objs, name)
        first = status_with(objs, name, "giteaOperation", timeout=90)["giteaOperation"]
        stack.pop_all().close()  # stopped mid-setup
        stack.enter_context(stalled_gitea_operator(runtime, stall, setup_timeout=20))
        taken = status_with(
            objs, name, "giteaOperation", timeout=60, check=lambda run: (run or {}).get("takenOver") == 1
        )["giteaOperation"]
        assert [taken[k] for k in ("id", "startedAt")] == [first[k] for k in ("id", "startedAt")]
        status = status_with(objs, name, "failure", timeout=60)
        assert status["failure"]["code"] == "GiteaStalled", status["failure"]


# --- the sources' checks as operations --------------------------------------------------------------------


class StalledSources:
    """Upload sources whose check in the workspace hangs, as a tenant's workspace code can make it: once they
    are copied in, each source's git config includes a FIFO nobody writes, so the check that the workspace has
    the snapshot commit (`git cat-file`) waits to read it until the runtime ends it (60 s). `release` lets them
    read its end (the tenant stops)."""

    def __init__(self, runtime: Server) -> None:
        self.runtime = runtime
        self.dirs: list[Path] = []
        self.configs: dict[Path, str] = {}

    def create(self, objs: Objects, name: str, count: int) -> None:
        """An environment of `count` such sources, verified on request only (spec.verify.install on)."""
        sources = [f"{name}-{i}" for i in range(count)]
        new = [{"name": s, "repo": f"shadow/{s}", "upload": {}} for s in sources]
        with_sources(objs, name, new, {"enabled": False, "install": True})
        for source in sources:
            path = self.runtime.root / source
            path.mkdir()
            (path / "main.py").write_text("print('hello')\n")
            self.dirs.append(path.resolve())
        objs.annotate(ENVIRONMENT, name, {c.ANNOTATION_UPLOAD_PREFIX + s: "sha256:test" for s in sources}, V)

    def stall(self, objs: Objects, name: str) -> None:
        """Once the environment's sources are in, make their checks hang and request its verification."""
        objs.wait_condition(ENVIRONMENT, name, type_="SourcesReady", timeout=90, version=V)
        for path in self.dirs:
            config = path / ".git" / "config"
            if config in self.configs:
                continue
            fifo = path / ".git" / "stall"
            os.mkfifo(fifo)
            self.configs[config] = config.read_text()
            config.write_text(self.configs[config] + f"[include]\n\tpath = {fifo}\n")
        objs.annotate(ENVIRONMENT, name, {c.ANNOTATION_VERIFY_REQUEST: "stalled"}, V)

    def hung(self) -> set[int]:
        """The `git cat-file` processes waiting in one of the sources (implementation-blind: read from /proc)."""
        found = set()
        for proc in Path("/proc").iterdir():
            with contextlib.suppress(OSError):
                argv = (proc / "cmdline").read_bytes().split(b"\0") if proc.name.isdigit() else [b""]
                if (
                    argv[0].endswith(b"git")
                    and b"cat-file" in argv
                    and Path(os.readlink(proc / "cwd")) in self.dirs
                ):
                    found.add(int(proc.name))
        return found

    def release(self) -> None:
        for config, text in self.configs.items():
            config.write_text(text)
            with contextlib.suppress(OSError):  # ENXIO: nobody waits on it
                os.close(os.open(config.parent / "stall", os.O_WRONLY | os.O_NONBLOCK))


@contextlib.contextmanager
def stalled_sources(runtime: Server) -> Iterator[StalledSources]:
    stalled = StalledSources(runtime)
    try:
        yield stalled
    finally:
        stalled.release()


def test_source_checks_that_hang_in_the_workspace_hold_no_worker(
    objs: Objects, runtime: Server, tmp_path: Path
) -> None:
    objs.create(TEMPLATE, template_body("workspace"))
    hostile = [f"s{i}" for i in range(4)]
    bind_volumes(objs, [f"workspace-{n}" for n in [*hostile, "victim-s"]], tmp_path)
    with in_process_operator(SHADOW_RUNTIME_API_URL=runtime.url), stalled_sources(runtime) as stalled:
        for name in hostile:
            stalled.create(objs, name, 2)
        for name in hostile:
            stalled.stall(objs, name)
        wait_for(lambda: len(stalled.hung()) >= 3, timeout=60, what="tenant A's source checks to hang")
        # Before: each pass awaited its sources' checks one after another, a minute each, and three of these
        # held the namespace's share of the four workers for two minutes: the victim, in the same namespace,
        # waited for them.
        create(objs, runtime, "victim-s", "echo verified")
        result = verdict(objs, "victim-s", timeout=90)
        assert result["result"] == "PASS", result
        # Every hostile source's check runs at once, each recorded in status with its process and deadline.
        wait_for(lambda: len(stalled.hung()) == 8, timeout=60, what="all eight source checks to run")
        for name in hostile:
            env = objs.get(ENVIRONMENT, name, V)
            assert env is not None and "verdict" not in env["status"], env["status"]
            probes = [ch for ch in env["status"]["verifyRun"]["checks"] if ch.get("probe") == "SourceCommit"]
            assert [ch["name"].partition(":")[0] for ch in probes] == [f"{name}-0", f"{name}-1"]
            assert all(ch["process"] and ch["deadline"] and "passed" not in ch for ch in probes), probes
        # The tenant stops: its verifications end, nothing lost.
        stalled.release()
        for name in hostile:
            result = verdict(objs, name, timeout=60)
            assert result["result"] == "PASS" and result["trigger"] == "stalled", result
            checks = [ch["name"] for ch in result["evidence"]["sourceVerification"]["checks"]]
            assert [x.partition(":")[0] for x in checks] == [f"{name}-0", f"{name}-1"]
            assert not result["evidence"].get("installationHealth", {}).get("checks")  # main.py: no project


def test_an_operator_that_restarts_mid_source_check_waits_for_that_check(
    objs: Objects, runtime: Server, tmp_path: Path, kubeconfig: str
) -> None:
    objs.create(TEMPLATE, template_body("workspace"))
    bind_volumes(objs, ["workspace-stalled-restart", "workspace-after-restart"], tmp_path)
    with (
        stalled_sources(runtime) as stalled,
        operators("restart", objs, runtime, kubeconfig, tmp_path) as restart,
    ):
        stalled.create(objs, "stalled-restart", 1)
        stalled.stall(objs, "stalled-restart")
        wait_for(lambda: len(stalled.hung()) == 1, timeout=60, what="the source's check to hang")
        first = stalled.hung()
        restart()
        # Another environment verified by the new operator: by then it has looked at the first one.
        create(objs, runtime, "after-restart", "echo verified")
        assert verdict(objs, "after-restart", timeout=60)["result"] == "PASS"
        # Before: the new operator planned the verification again and ran the check a second time.
        assert stalled.hung() == first, "the source's check ran again"
        stalled.release()
        result = verdict(objs, "stalled-restart", timeout=30)
        assert result["result"] == "PASS", result
