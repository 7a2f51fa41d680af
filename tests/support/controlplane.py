"""A real, local Kubernetes control plane for tests and for people.

etcd + kube-apiserver (TLS, client-cert auth, RBAC) + kube-controller-manager (garbage collector, namespaces,
service accounts) + kube-scheduler + kwok, which plays the kubelet of a few fake nodes so pods get scheduled
and become Running and Ready with an IP. Every process binds random loopback ports, so several control planes
can run side by side; all state lives in one directory.

    python -m tests.support.controlplane up --dir DIR     # start in the background, print `export KUBECONFIG=…`
    python -m tests.support.controlplane down --dir DIR   # stop every process it started
    python -m tests.support.controlplane status --dir DIR

The same class backs the session-scoped pytest fixture in tests/conftest.py.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import random
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from tests.support.pki import CertificateAuthority, write_service_account_keys

DEFAULT_CACHE = Path(
    os.environ.get("SHADOW_CACHE")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "shadow-operator"
)
DEFAULT_BIN_DIR = Path(os.environ.get("SHADOW_TOOLS_BIN", DEFAULT_CACHE / "bin"))
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
SERVICE_CIDR = "10.96.0.0/16"
POD_CIDR = "10.244.0.1/16"
FAKE_NODE_ANNOTATION = "kwok.x-k8s.io/node"


class ControlPlaneError(RuntimeError):
    """The control plane could not be started; the message says which component and where its log is."""


# Ports handed to servers the tests start. Below Linux's ephemeral range (32768-60999 by default), so that a
# port found free is not taken a moment later by some process's outgoing connection or port-0 listener
# before the server binds it (nginx binds 0.0.0.0 and failed so, once, beside a busy machine).
_PORTS = range(20000, 32768)


def free_port() -> int:
    """A TCP port nothing listens on, on any address."""
    for port in random.sample(_PORTS, 200):
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free TCP port in {_PORTS.start}-{_PORTS.stop - 1} after 200 tries")


def not_found(exc: BaseException) -> bool:
    """Whether `exc` is the Kubernetes client's "not found": an ApiException with status 404 (the dynamic
    client's NotFoundError is one). Checked without importing kubernetes: if no module imported its client, no
    exception can be one of its."""
    exceptions = sys.modules.get("kubernetes.client.exceptions")
    return (
        exceptions is not None
        and isinstance(exc, exceptions.ApiException)
        and getattr(exc, "status", None) == 404
    )


def absent(read: Callable[[], object]) -> bool:
    """For waits on a deletion: True when `read` raises the Kubernetes client's "not found", False when it
    returns; any other error propagates (a 403 is not a deletion)."""
    try:
        read()
    except Exception as exc:
        if not_found(exc):
            return True
        raise
    return False


def _describe(exc: BaseException) -> str:
    """`404 persistentvolumeclaims "x" not found`: the status and the API server's message, one line."""
    status, body = getattr(exc, "status", None), getattr(exc, "body", None)
    message = None
    if body:
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            message = json.loads(body).get("message")
    message = message or getattr(exc, "reason", None) or str(exc).splitlines()[0]
    return f"{status} {message}" if status is not None else str(message)


T = TypeVar("T")


def wait_for(
    predicate: Callable[[], T],
    *,
    timeout: float,
    what: str,
    interval: float = 0.1,
    max_interval: float | None = None,
) -> T:
    """Poll `predicate` until it returns something truthy, and return that; raise TimeoutError with `what` in the
    message when `timeout` passes.

    An object the predicate reads that does not exist yet counts as "not yet": a Kubernetes "not found" (see
    `not_found`) raised by the predicate is waited through, and named in the TimeoutError if the object was
    still missing at the last poll. Any other exception propagates at once. (A predicate that waits for an
    object to be deleted must therefore say so itself, e.g. a getter that returns None on 404.)
    `max_interval`: grow the pause by half each poll, from `interval` up to this."""
    deadline = time.monotonic() + timeout
    pause = interval
    while True:
        missing: BaseException | None = None
        try:
            result = predicate()
        except Exception as exc:
            if not not_found(exc):
                raise
            missing = exc
        else:
            if result:
                return result
        if time.monotonic() > deadline:
            last = f" (last: {_describe(missing)})" if missing is not None else ""
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}{last}") from missing
        time.sleep(pause)
        if max_interval is not None:
            pause = min(pause * 1.5, max_interval)


@dataclass
class ControlPlane:
    directory: Path
    bin_dir: Path = DEFAULT_BIN_DIR
    nodes: int = 3
    # Tie every component to this process's lifetime (pytest sessions) instead of detaching it (`up`).
    die_with_parent: bool = False
    ports: dict[str, int] = field(default_factory=dict)
    pids: dict[str, int] = field(default_factory=dict)

    # ---- paths -------------------------------------------------------------------------------------
    @property
    def state_file(self) -> Path:
        return self.directory / "state.json"

    @property
    def kubeconfig(self) -> Path:
        return self.directory / "kubeconfig"

    @property
    def pki(self) -> Path:
        return self.directory / "pki"

    @property
    def logs(self) -> Path:
        return self.directory / "logs"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports['apiserver']}"

    def binary(self, name: str) -> str:
        path = self.bin_dir / name
        if not os.access(path, os.X_OK):
            raise ControlPlaneError(f"{path} is missing: build the pinned tools first with `make tools`")
        return str(path)

    # ---- lifecycle ---------------------------------------------------------------------------------
    def start(self, *, progress: Callable[[str], None] = lambda _: None) -> None:
        """Start every component and wait until fake nodes are Ready. Stops what it started on failure."""
        for name in COMPONENTS:
            self.binary(name)
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)
        for d in (self.directory, self.pki, self.logs):
            d.mkdir(parents=True, exist_ok=True)
        self.ports = {
            k: free_port() for k in ("etcd", "etcd-peer", "apiserver", "controller-manager", "scheduler")
        }
        try:
            progress("generating certificates and kubeconfigs")
            self._write_pki()
            progress("starting etcd")
            self._start_etcd()
            progress("starting kube-apiserver")
            self._start_apiserver()
            progress("starting kube-controller-manager, kube-scheduler and kwok")
            self._start_controllers()
            progress(f"registering {self.nodes} fake nodes")
            self._create_nodes()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop every process recorded in the state file (and this object); idempotent."""
        pids = dict(self.pids)
        if self.state_file.exists():
            with contextlib.suppress(ValueError, OSError):
                pids.update(json.loads(self.state_file.read_text()).get("pids", {}))
        # Reverse start order: clients first, etcd last, so nothing logs storms about a vanished apiserver.
        for name in reversed(COMPONENTS):
            if name in pids and _runs(pids[name], name):
                _terminate(pids[name])
        self.pids.clear()
        with contextlib.suppress(FileNotFoundError):
            self.state_file.unlink()

    @classmethod
    def load(cls, directory: Path, bin_dir: Path = DEFAULT_BIN_DIR) -> ControlPlane | None:
        """The control plane recorded in `directory`, if one is running there."""
        state_file = directory / "state.json"
        if not state_file.exists():
            return None
        state = json.loads(state_file.read_text())
        cp = cls(directory=directory, bin_dir=bin_dir, ports=state["ports"], pids=state["pids"])
        return cp if cp.healthy() else None

    def healthy(self) -> bool:
        return all(_alive(pid) for pid in self.pids.values()) and self._get("/readyz") == 200

    # ---- components --------------------------------------------------------------------------------
    def _spawn(self, name: str, args: list[str]) -> None:
        log = (self.logs / f"{name}.log").open("ab")
        # A new session per component: `down` can signal the whole group, and Ctrl-C in the shell that ran
        # `make cluster-up` does not reach the background processes.
        proc = subprocess.Popen(
            [self.binary(name), *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=self.directory,
            preexec_fn=_die_with_parent if self.die_with_parent else None,
        )
        log.close()
        self.pids[name] = proc.pid
        self.state_file.write_text(json.dumps({"ports": self.ports, "pids": self.pids}, indent=2))

    def _check_alive(self, name: str) -> None:
        if not _alive(self.pids[name]):
            tail = (self.logs / f"{name}.log").read_text(errors="replace").splitlines()[-15:]
            raise ControlPlaneError(
                f"{name} exited during start-up; last lines of {self.logs / name}.log:\n" + "\n".join(tail)
            )

    def _write_pki(self) -> None:
        ca = CertificateAuthority(self.pki)
        ca.issue(
            "apiserver",
            "kube-apiserver",
            dns_names=("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"),
            ip_addresses=("127.0.0.1", "10.96.0.1"),
            server=True,
        )
        write_service_account_keys(self.pki)
        users = {
            "admin": ("kubernetes-admin", ("system:masters",)),
            "controller-manager": ("system:kube-controller-manager", ()),
            "scheduler": ("system:kube-scheduler", ()),
            "kwok": ("kwok-controller", ("system:masters",)),
        }
        for name, (cn, orgs) in users.items():
            pair = ca.issue(name, cn, organizations=orgs)
            self._write_kubeconfig(self.pki / f"{name}.kubeconfig", pair.cert, pair.key)
        admin = self.pki / "admin"
        self._write_kubeconfig(self.kubeconfig, admin.with_suffix(".crt"), admin.with_suffix(".key"))

    def _write_kubeconfig(self, path: Path, cert: Path, key: Path) -> None:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "shadow-local",
                    "cluster": {"server": self.server, "certificate-authority": str(self.pki / "ca.crt")},
                }
            ],
            "users": [
                {"name": "shadow-local", "user": {"client-certificate": str(cert), "client-key": str(key)}}
            ],
            "contexts": [
                {"name": "shadow-local", "context": {"cluster": "shadow-local", "user": "shadow-local"}}
            ],
            "current-context": "shadow-local",
        }
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)

    def _start_etcd(self) -> None:
        client = f"http://127.0.0.1:{self.ports['etcd']}"
        peer = f"http://127.0.0.1:{self.ports['etcd-peer']}"
        self._spawn(
            "etcd",
            [
                "--name=local",
                f"--data-dir={self.directory / 'etcd'}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=local={peer}",
                "--listen-metrics-urls=",
                # Test data is disposable: skipping fsync makes every write several times faster.
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )

        def etcd_healthy() -> bool:
            self._check_alive("etcd")
            try:
                with urllib.request.urlopen(f"{client}/health", timeout=1) as r:
                    return bool(json.load(r).get("health") == "true")
            except (OSError, ValueError):
                return False

        wait_for(etcd_healthy, timeout=60, what="etcd /health")

    def _start_apiserver(self) -> None:
        pki = self.pki
        self._spawn(
            "kube-apiserver",
            [
                f"--etcd-servers=http://127.0.0.1:{self.ports['etcd']}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self.ports['apiserver']}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--client-ca-file={pki / 'ca.crt'}",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--authorization-mode=Node,RBAC",
                "--allow-privileged=true",
                "--enable-priority-and-fairness=false",
                # Without the node lifecycle controller nothing would lift the not-ready taint this plugin
                # puts on new nodes, and no pod would ever schedule on the kwok nodes.
                "--disable-admission-plugins=TaintNodesByCondition",
                f"--cert-dir={pki}",
                "--profiling=false",
            ],
        )

        def apiserver_ready() -> bool:
            self._check_alive("kube-apiserver")
            return self._get("/readyz") == 200

        wait_for(apiserver_ready, timeout=120, what="kube-apiserver /readyz", interval=0.25)

    def _start_controllers(self) -> None:
        pki = self.pki
        self._spawn(
            "kube-controller-manager",
            [
                f"--kubeconfig={pki / 'controller-manager.kubeconfig'}",
                f"--authentication-kubeconfig={pki / 'controller-manager.kubeconfig'}",
                f"--authorization-kubeconfig={pki / 'controller-manager.kubeconfig'}",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.ports['controller-manager']}",
                "--leader-elect=false",
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={pki / 'sa.key'}",
                f"--root-ca-file={pki / 'ca.crt'}",
                f"--cluster-signing-cert-file={pki / 'ca.crt'}",
                f"--cluster-signing-key-file={pki / 'ca.key'}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--controllers=*,-nodeipam,-nodelifecycle,-cloud-node-lifecycle,-route,-service",
                # Quotas on custom resources are counted once the quota controller's discovery (every 30 s)
                # has found the CRD and the quota is next re-counted: 10 s here instead of 5 minutes.
                "--resource-quota-sync-period=10s",
                # The PV controller's binding decisions in its log, for volume_report when a claim stays
                # Pending (the rest of the controllers keep the default verbosity).
                "--vmodule=pv_controller*=4",
            ],
        )
        self._spawn(
            "kube-scheduler",
            [
                f"--kubeconfig={pki / 'scheduler.kubeconfig'}",
                f"--authentication-kubeconfig={pki / 'scheduler.kubeconfig'}",
                f"--authorization-kubeconfig={pki / 'scheduler.kubeconfig'}",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.ports['scheduler']}",
                "--leader-elect=false",
            ],
        )
        kwok_config = self.directory / "kwok.yaml"
        # An explicit (empty) configuration keeps kwok from reading ~/.kwok and so from a user's settings;
        # kwok then uses its built-in stages: nodes become Ready, pods Running + Ready with an IP.
        kwok_config.write_text("kind: KwokConfiguration\napiVersion: config.kwok.x-k8s.io/v1alpha1\n")
        self._spawn(
            "kwok",
            [
                f"--kubeconfig={pki / 'kwok.kubeconfig'}",
                f"--config={kwok_config}",
                f"--manage-nodes-with-annotation-selector={FAKE_NODE_ANNOTATION}=fake",
                f"--cidr={POD_CIDR}",
                "--node-ip=127.0.0.1",
                "--node-lease-duration-seconds=40",
            ],
        )

    def _create_nodes(self) -> None:
        for i in range(self.nodes):
            name = f"kwok-node-{i}"
            node = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "annotations": {FAKE_NODE_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
                    "labels": {
                        "kubernetes.io/hostname": name,
                        "kubernetes.io/os": "linux",
                        "kubernetes.io/arch": "amd64",
                        "type": "kwok",
                    },
                },
                "status": {
                    "allocatable": {"cpu": "32", "memory": "256Gi", "pods": "110"},
                    "capacity": {"cpu": "32", "memory": "256Gi", "pods": "110"},
                },
            }
            status = self._request("POST", "/api/v1/nodes", node)
            if status not in (201, 409):
                raise ControlPlaneError(f"creating node {name} failed with HTTP {status}")

        def nodes_ready() -> bool:
            for name in COMPONENTS:
                self._check_alive(name)
            body = self._get_json("/api/v1/nodes")
            ready = [
                n
                for n in body.get("items", [])
                if any(
                    c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", [])
                )
            ]
            return len(ready) >= self.nodes

        wait_for(nodes_ready, timeout=60, what=f"{self.nodes} kwok nodes to become Ready", interval=0.25)

        def default_service_account() -> bool:
            return self._get("/api/v1/namespaces/default/serviceaccounts/default") == 200

        wait_for(default_service_account, timeout=60, what="the default service account (controller-manager)")

    # ---- tiny admin client (stdlib only, so the harness starts before any Kubernetes client is set up) -
    def _ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        ctx.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
        return ctx

    def _request(self, method: str, path: str, body: dict[str, object] | None = None) -> int:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.server + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, context=self._ssl_context(), timeout=5) as r:
                return int(r.status)
        except urllib.error.HTTPError as e:
            return int(e.code)
        except OSError:
            return 0

    def _get(self, path: str) -> int:
        return self._request("GET", path)

    def _get_json(self, path: str) -> dict[str, object]:
        req = urllib.request.Request(self.server + path)
        with urllib.request.urlopen(req, context=self._ssl_context(), timeout=5) as r:
            result: dict[str, object] = json.load(r)
            return result


def _die_with_parent() -> None:
    """In the child before exec: ask the kernel for SIGKILL when the parent dies, even by SIGKILL itself.

    A test run that is killed (timeout, Ctrl-C twice) then leaves no etcd or apiserver behind.
    """
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of this process still answers signal 0; reap it so it counts as gone.
    with contextlib.suppress(ChildProcessError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    return True


def _runs(pid: int, component: str) -> bool:
    """Whether `pid` is still that component (a stale state file must not make us signal a reused pid)."""
    try:
        argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
    except OSError:
        return False
    return Path(argv0.decode(errors="replace")).name.startswith(component)


def _terminate(pid: int, timeout: float = 15.0) -> None:
    """SIGTERM the component's process group, then SIGKILL whatever is left after `timeout`."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)
        try:
            wait_for(lambda: not _alive(pid), timeout=timeout, what=f"process {pid} to exit")
            return
        except TimeoutError:
            continue


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="controlplane", description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["up", "down", "status"])
    parser.add_argument("--dir", type=Path, default=DEFAULT_CACHE / "cluster")
    parser.add_argument("--bin-dir", type=Path, default=DEFAULT_BIN_DIR)
    parser.add_argument("--nodes", type=int, default=3)
    args = parser.parse_args(argv)

    def say(msg: str) -> None:
        print(f"==> {msg}", file=sys.stderr, flush=True)

    if args.action == "up":
        existing = ControlPlane.load(args.dir, args.bin_dir)
        if existing is not None:
            say(f"control plane already running at {existing.server}")
        else:
            cp = ControlPlane(directory=args.dir, bin_dir=args.bin_dir, nodes=args.nodes)
            try:
                cp.start(progress=say)
            except (ControlPlaneError, TimeoutError) as e:
                print(f"error: {e}\nlogs: {cp.logs}", file=sys.stderr)
                return 1
            say(f"control plane ready at {cp.server} with {args.nodes} kwok nodes (logs: {cp.logs})")
        print(f"export KUBECONFIG={args.dir / 'kubeconfig'}")
        return 0
    if args.action == "down":
        ControlPlane(directory=args.dir, bin_dir=args.bin_dir).stop()
        say("control plane stopped")
        return 0
    running = ControlPlane.load(args.dir, args.bin_dir)
    if running is None:
        print("not running")
        return 1
    print(f"running at {running.server}; export KUBECONFIG={running.kubeconfig}")
    return 0


if __name__ == "__main__":
    sys.exit(main())


def volume_report(core: Any, namespace: str, log_lines: int = 60) -> str:
    """The PV controller's view, for the message of a test whose claims do not bind: the claims of
    `namespace`, the volumes bound or pre-bound to them, the events about both, and the tail of
    kube-controller-manager's log when this harness started it (beside KUBECONFIG)."""
    claims = core.list_namespaced_persistent_volume_claim(namespace).items
    volumes = [
        pv
        for pv in core.list_persistent_volume().items
        if pv.spec.claim_ref is not None and pv.spec.claim_ref.namespace == namespace
    ]
    lines = ["claims:"]
    for pvc in claims:
        lines.append(
            f"  {pvc.metadata.name}: phase {pvc.status.phase}, class {pvc.spec.storage_class_name!r}, "
            f"volume {pvc.spec.volume_name!r}, requests {pvc.spec.resources.requests}, uid {pvc.metadata.uid}"
        )
    lines.append("volumes:")
    for pv in volumes:
        ref = pv.spec.claim_ref
        lines.append(
            f"  {pv.metadata.name}: phase {pv.status.phase} ({pv.status.message or ''}), class "
            f"{pv.spec.storage_class_name!r}, claimRef {ref.name} uid {ref.uid!r}, capacity {pv.spec.capacity}"
        )
    names = {pvc.metadata.name for pvc in claims} | {pv.metadata.name for pv in volumes}
    lines.append("events:")
    for event in [
        *core.list_namespaced_event(namespace).items,
        *core.list_event_for_all_namespaces(field_selector="involvedObject.kind=PersistentVolume").items,
    ]:
        if event.involved_object.name in names:
            lines.append(
                f"  {event.involved_object.kind}/{event.involved_object.name}: {event.reason}: {event.message}"
            )
    log = Path(os.environ.get("KUBECONFIG", "/nonexistent")).parent / "logs" / "kube-controller-manager.log"
    if log.is_file():
        pv_lines = [x for x in log.read_text(errors="replace").splitlines() if "pv_controller" in x]
        lines += [f"kube-controller-manager log, PV controller ({log}):", *pv_lines[-log_lines:]]
    return "\n".join(lines)
