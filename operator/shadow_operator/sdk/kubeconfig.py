"""The kubeconfig, read as kubectl reads it, without the `kubernetes` package for the common logins.

A `KUBECONFIG` list is merged as kubectl merges it (the first file to name a cluster, user or context wins; the
first `current-context` wins); relative file paths are relative to the file that names them. Tokens, token
files, client certificates (files or inline data), basic auth, `certificate-authority(-data)`,
`insecure-skip-tls-verify` and `proxy-url` are read here, and a Pod's service account too. A user with an
`exec` credential plugin or an `auth-provider`, or a cluster with `tls-server-name`, is handed to the
`kubernetes` package's loader (`kube.login`), the only one that runs those: importing it costs most of a
second of CPU, which a `shadowctl list` should not pay for a bearer token.
"""

from __future__ import annotations

import base64
import contextlib
import os
import ssl
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from shadow_operator.sdk.errors import NoCredentials

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
# What only the `kubernetes` package's loader knows how to do.
NEEDS_FULL_LOADER_USER = ("exec", "auth-provider")
NEEDS_FULL_LOADER_CLUSTER = ("tls-server-name",)


def paths(kubeconfig: str | None = None) -> list[str]:
    """The kubeconfig files kubectl would read (--kubeconfig, else $KUBECONFIG, else ~/.kube/config), those
    that exist."""
    given = kubeconfig or os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
    return [
        os.path.expanduser(p) for p in given.split(os.pathsep) if p and os.path.exists(os.path.expanduser(p))
    ]


@dataclass(frozen=True)
class Entry:
    """A named cluster, user or context, and the directory of the file it came from."""

    body: dict[str, Any]
    directory: str


@dataclass
class Merged:
    """The merged kubeconfig files."""

    files: list[str]
    clusters: dict[str, Entry]
    users: dict[str, Entry]
    contexts: dict[str, Entry]
    current: str

    def context(self, name: str | None) -> tuple[str, Entry]:
        chosen = name or self.current
        if not chosen:
            raise NoCredentials(
                f"the kubeconfig ({os.pathsep.join(self.files)}) has no current context",
                hint="pick one: kubectl config use-context NAME (or --context NAME)",
            )
        if chosen not in self.contexts:
            raise NoCredentials(
                f"the kubeconfig ({os.pathsep.join(self.files)}) has no context named {chosen!r}",
                hint="list the contexts: kubectl config get-contexts",
            )
        return chosen, self.contexts[chosen]


def _load_file(path: str) -> dict[str, Any]:
    import yaml  # read only when a kubeconfig is

    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.load(fh, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise NoCredentials(
            f"the kubeconfig {path} is not valid YAML{where}: {problem}",
            hint="check the file with: kubectl config view",
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise NoCredentials(
            f"cannot read the kubeconfig {path}: {exc}", hint="check the file with: kubectl config view"
        ) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise NoCredentials(
            f"the kubeconfig {path} is not a kubeconfig (a YAML {type(data).__name__}, not a mapping)",
            hint="check the file with: kubectl config view",
        )
    return data


def _named(path: str, data: dict[str, Any], key: str) -> list[tuple[str, dict[str, Any]]]:
    items = data.get(key) or []
    if not isinstance(items, list):
        raise NoCredentials(
            f"the kubeconfig {path}: {key} is not a list", hint="check the file with: kubectl config view"
        )
    found = []
    for item in items:
        inner = key[:-1]  # clusters -> cluster
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise NoCredentials(
                f"the kubeconfig {path}: an entry of {key} has no name",
                hint="check the file with: kubectl config view",
            )
        body = item.get(inner) or {}
        if not isinstance(body, dict):
            raise NoCredentials(
                f"the kubeconfig {path}: {key} {item['name']!r} is not a mapping",
                hint="check the file with: kubectl config view",
            )
        found.append((item["name"], body))
    return found


def load(kubeconfig: str | None = None) -> Merged | None:
    """The merged kubeconfig files, or None when there is none (then a Pod's service account may do). Read
    once per process while the files stay the same (a command asks for its namespace, then its login)."""
    files = paths(kubeconfig)
    if not files:
        return None
    key = tuple((p, st.st_mtime_ns, st.st_size) for p in files for st in (os.stat(p),))
    if key not in _LOADED:
        _LOADED.clear()
        _LOADED[key] = _merge(files)
    return _LOADED[key]


_LOADED: dict[tuple[tuple[str, int, int], ...], Merged] = {}


def _merge(files: list[str]) -> Merged:
    merged = Merged(files, {}, {}, {}, "")
    for path in files:
        data = _load_file(path)
        directory = os.path.dirname(os.path.abspath(path))
        for key, table in (
            ("clusters", merged.clusters),
            ("users", merged.users),
            ("contexts", merged.contexts),
        ):
            for name, body in _named(path, data, key):
                table.setdefault(name, Entry(body, directory))
        current = data.get("current-context")
        if not merged.current and isinstance(current, str):
            merged.current = current
    return merged


def context_namespace(context: str | None = None, kubeconfig: str | None = None) -> str:
    """The namespace of `context` (the current one if None), else the Pod's, else "default"."""
    merged = load(kubeconfig)
    if merged is None:
        return _pod_namespace()
    _, entry = merged.context(context)
    return str(entry.body.get("namespace") or "default")


@dataclass(frozen=True)
class Login:
    """Where the API server is and how to prove who we are, as the kubeconfig (or the Pod) says."""

    server: str
    ssl_context: ssl.SSLContext
    headers: dict[str, str]
    proxy: str | None
    namespace: str  # the context's namespace, else the Pod's, else "default"
    # Runs the credential source again (an exec plugin's token expired): a fresh Authorization header.
    refresh: Callable[[], dict[str, str]]


def needs_full_loader(context: str | None = None, kubeconfig: str | None = None) -> bool:
    """Whether the chosen login takes what only the `kubernetes` package runs (an exec plugin, an auth
    provider, a TLS server name)."""
    merged = load(kubeconfig)
    if merged is None:
        return False
    _, ctx = merged.context(context)
    user = merged.users.get(str(ctx.body.get("user") or ""))
    cluster = merged.clusters.get(str(ctx.body.get("cluster") or ""))
    return bool(
        (user and any(user.body.get(k) for k in NEEDS_FULL_LOADER_USER))
        or (cluster and any(cluster.body.get(k) for k in NEEDS_FULL_LOADER_CLUSTER))
    )


def _path(entry: Entry, value: str) -> str:
    return value if os.path.isabs(value) else os.path.join(entry.directory, os.path.expanduser(value))


def _data(entry: Entry, key: str, what: str) -> bytes:
    try:
        return base64.b64decode(str(entry.body[key]), validate=True)
    except (ValueError, TypeError):
        raise NoCredentials(
            f"the kubeconfig's {what} is not base64", hint="check it with: kubectl config view --raw"
        ) from None


def _read(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError as exc:
        raise NoCredentials(f"cannot read the kubeconfig's {what} {path}: {exc.strerror}") from None


def _ssl_context(cluster: Entry, user: Entry | None) -> ssl.SSLContext:
    body = cluster.body
    if body.get("certificate-authority-data"):
        ca = _data(cluster, "certificate-authority-data", "certificate-authority-data").decode(
            "ascii", "replace"
        )
        context = ssl.create_default_context(cadata=ca)
    elif body.get("certificate-authority"):
        context = ssl.create_default_context(cafile=_path(cluster, str(body["certificate-authority"])))
    else:
        context = ssl.create_default_context()
    if body.get("insecure-skip-tls-verify"):
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if user is not None:
        _client_certificate(context, user)
    return context


def _client_certificate(context: ssl.SSLContext, user: Entry) -> None:
    body = user.body
    cert = (
        _data(user, "client-certificate-data", "client certificate")
        if body.get("client-certificate-data")
        else None
    )
    key = _data(user, "client-key-data", "client key") if body.get("client-key-data") else None
    if cert is None and body.get("client-certificate"):
        cert = _read(_path(user, str(body["client-certificate"])), "client certificate")
    if key is None and body.get("client-key"):
        key = _read(_path(user, str(body["client-key"])), "client key")
    if cert is None:
        return
    with _as_files(cert, key or b"") as (cert_file, key_file):
        try:
            context.load_cert_chain(cert_file, key_file if key else None)
        except ssl.SSLError as exc:
            raise NoCredentials(
                f"the kubeconfig's client certificate or key cannot be used: {exc.reason or exc}",
                hint="check them with: kubectl config view --raw",
            ) from None


@contextlib.contextmanager
def _as_files(*contents: bytes) -> Iterator[list[str]]:
    """Paths that read as `contents` while the block runs (ssl loads a certificate chain from files only):
    anonymous memory files on Linux, so a key never reaches a disk; else a private directory, removed."""
    if hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd"):
        fds = [os.memfd_create("shadowctl", 0) for _ in contents]
        try:
            for fd, content in zip(fds, contents, strict=True):
                left = memoryview(content)
                while left:
                    left = left[os.write(fd, left) :]
            yield [f"/proc/self/fd/{fd}" for fd in fds]
        finally:
            for fd in fds:
                os.close(fd)
        return
    import tempfile

    with tempfile.TemporaryDirectory(prefix="shadowctl-") as tmp:
        names = []
        for i, content in enumerate(contents):
            name = os.path.join(tmp, str(i))
            with os.fdopen(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as fh:
                fh.write(content)
            names.append(name)
        yield names


def _auth_headers(user: Entry | None) -> dict[str, str]:
    if user is None:
        return {}
    body = user.body
    token = body.get("token")
    if not token and body.get("tokenFile"):
        token = _read(_path(user, str(body["tokenFile"])), "token file").decode().strip()
    if token:
        return {"Authorization": f"Bearer {token}"}
    if body.get("username") and body.get("password"):
        pair = base64.b64encode(f"{body['username']}:{body['password']}".encode()).decode()
        return {"Authorization": f"Basic {pair}"}
    return {}


def credentials(context: str | None = None, kubeconfig: str | None = None) -> Login:
    """The login of `context` (the current one if None), or of the Pod's service account; for what
    `needs_full_loader()` says this module does not run, use `kube.login`."""
    merged = load(kubeconfig)
    if merged is None:
        return _in_cluster(kubeconfig)
    name, ctx = merged.context(context)
    cluster_name, user_name = str(ctx.body.get("cluster") or ""), str(ctx.body.get("user") or "")
    cluster = merged.clusters.get(cluster_name)
    if cluster is None or not cluster.body.get("server"):
        raise NoCredentials(
            f"the kubeconfig's context {name!r} names cluster {cluster_name!r}, which has no server",
            hint="list the contexts: kubectl config get-contexts",
        )
    user = merged.users.get(user_name)
    try:
        context_ssl = _ssl_context(cluster, user)
    except (ssl.SSLError, OSError) as exc:
        raise NoCredentials(
            f"the kubeconfig's certificate authority for cluster {cluster_name!r} cannot be used: {exc}",
            hint="check it with: kubectl config view --raw",
        ) from None
    proxy = cluster.body.get("proxy-url")
    return Login(
        server=str(cluster.body["server"]).rstrip("/"),
        ssl_context=context_ssl,
        headers=_auth_headers(user),
        proxy=str(proxy) if proxy else None,
        namespace=str(ctx.body.get("namespace") or "default"),
        refresh=lambda: _auth_headers(user),  # a token file may have been rotated
    )


def _in_cluster(kubeconfig: str | None) -> Login:
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
    token_file = os.path.join(SERVICE_ACCOUNT_DIR, "token")
    if not host or not port or not os.path.exists(token_file):
        where = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
        raise NoCredentials(
            f"no usable Kubernetes credentials in sight: no kubeconfig at {where}, and not in a Pod",
            hint="set KUBECONFIG (or create ~/.kube/config), or run in a Pod",
        )
    account = Entry({"tokenFile": token_file}, SERVICE_ACCOUNT_DIR)
    server = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
    return Login(
        server=server,
        ssl_context=ssl.create_default_context(cafile=os.path.join(SERVICE_ACCOUNT_DIR, "ca.crt")),
        headers=_auth_headers(account),
        proxy=None,
        namespace=_pod_namespace(),
        refresh=lambda: _auth_headers(account),
    )


def _pod_namespace() -> str:
    try:
        with open(os.path.join(SERVICE_ACCOUNT_DIR, "namespace"), encoding="utf-8") as fh:
            return fh.read().strip() or "default"
    except OSError:
        return "default"
