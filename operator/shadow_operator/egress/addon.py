"""The mitmproxy addons that make the gateway: who is asking, what they may reach, and with which CA.

The order of checks for a tunnel: the proxy credential and source address name a sandbox; the CONNECT target
is a name (not an IP address) that a rule allows on that port; the name resolves to addresses the gateway may
reach (not private ranges, not the gateway itself), and the connection goes to the address checked, so a DNS
answer that changes later (rebinding) changes nothing; the TLS server name equals the CONNECT target. Where a
rule needs the request (method, path, credential), TLS is terminated with a certificate from the sandbox
namespace's CA and every request is checked again, Host header included (domain fronting).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hashlib
import ipaddress
import logging
import math
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from mitmproxy import certs, connection, http, tls
from mitmproxy.addons.tlsconfig import TlsConfig
from mitmproxy.proxy import server_hooks
from mitmproxy.proxy.context import Context

from shadow_operator.api.models import EgressCredential
from shadow_operator.common import egress
from shadow_operator.egress.audit import Audit
from shadow_operator.egress.table import PolicyTable, SandboxEntry

log = logging.getLogger(__name__)
CA_BASENAME = "shadow-egress"
CA_KEY_SIZE = 2048
CN_CHARS = 64
STREAM_ABOVE_BYTES = 1 << 20
# How long what the gateway's own names (its Service) resolve to is trusted before it is asked again.
OWN_NAMES_SECONDS = 30.0


# keeper(namespace, make): the namespace's CA as PEM (key, certificate), made with make() by whoever finds
# none; the same for every replica and every restart.
Keeper = Callable[[str, Callable[[], tuple[bytes, bytes]]], tuple[bytes, bytes]]


def ca_common_name(namespace: str) -> str:
    """The CA's common name, which X.509 caps at 64 characters (a namespace's name may have 63): a long one is
    cut and ends with a digest of the whole name, so that two namespaces never share a name."""
    name = f"{CA_BASENAME} {namespace}"
    if len(name) <= CN_CHARS:
        return name
    return f"{name[: CN_CHARS - 9]}-{hashlib.sha256(namespace.encode()).hexdigest()[:8]}"


def make_ca(namespace: str) -> tuple[bytes, bytes]:
    key, cert = certs.create_ca(CA_BASENAME, ca_common_name(namespace), CA_KEY_SIZE)
    encoding = serialization.Encoding.PEM
    return (
        key.private_bytes(
            encoding, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()
        ),
        cert.public_bytes(encoding),
    )


class CertAuthorities:
    """One CA per namespace, made on first use. With a `keeper` (the cluster source: a Secret in the gateway's
    own namespace) every replica and restart uses the same CA; without one (the file source) it lives and dies
    with `directory`. Either way the key never goes where a workspace can reach it."""

    def __init__(self, directory: Path, keeper: Keeper | None = None) -> None:
        self.directory = directory
        self.keeper = keeper
        self.stores: dict[str, certs.CertStore] = {}
        # The proxy (event loop) and the cluster source (its own thread) both ask: one CA per namespace, ever.
        self.lock = threading.Lock()

    def store(self, namespace: str) -> certs.CertStore:
        with self.lock:
            return self._store(namespace)

    def _store(self, namespace: str) -> certs.CertStore:
        if namespace not in self.stores:
            path = self.directory / namespace
            with certs.CertStore.umask_secret():
                if self.keeper is not None:
                    key, cert = self.keeper(namespace, lambda: make_ca(namespace))
                    path.mkdir(parents=True, exist_ok=True)
                    (path / f"{CA_BASENAME}-ca.pem").write_bytes(key + cert)
                self.stores[namespace] = certs.CertStore.from_store(path, CA_BASENAME, CA_KEY_SIZE)
        return self.stores[namespace]

    def certificate_pem(self, namespace: str) -> bytes:
        """The public CA certificate the namespace's workspaces trust (never the key)."""
        return bytes(self.store(namespace).default_ca.to_pem())


@dataclass
class Tunnel:
    """What was decided for a client connection at CONNECT time."""

    sandbox: SandboxEntry
    peer: str  # the client's address, which must stay one of the sandbox's
    host: str
    port: int
    address: str  # the resolved address the gateway connects to
    intercept: bool
    refused: str | None = None  # set when the TLS handshake revealed something to refuse


@dataclass(frozen=True)
class InFlight:
    """A request the gateway let out whose response (or WebSocket) has not ended yet."""

    sandbox: SandboxEntry
    peer: str
    host: str
    port: int
    method: str
    path: str
    websocket: bool


def refusal(flow: http.HTTPFlow, message: str) -> None:
    flow.response = http.Response.make(
        403, (message + "\n").encode(), {"Content-Type": "text/plain; charset=utf-8", "Connection": "close"}
    )


def proxy_password(headers: http.Headers) -> str | None:
    value = headers.get("Proxy-Authorization", "")
    scheme, _, encoded = value.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        _, _, password = base64.b64decode(encoded, validate=True).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return None
    return password or None


def is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


class Gate:
    """Attributes, decides, records. Shares `tunnels` with NamespaceTls through the client connection's id."""

    def __init__(
        self,
        table: PolicyTable,
        audit: Audit,
        own: Iterable[tuple[str, int]] = (),
        allowed_private: Iterable[str] = (),
        resolve: dict[str, str] | None = None,
        close: Callable[[str], None] = lambda client_id: None,
        own_names: Iterable[str] = (),
        own_ports: Iterable[int] = (),
    ) -> None:
        self.table = table
        # Closes a client connection by its id (the proxy server's, wired in by the process).
        self.close = close
        self.audit = audit
        self.own = set(own)
        # Names that lead to the gateway too (its Service): what they resolve to, on its ports, is the gateway
        # itself. Resolved again at most every OWN_NAMES_SECONDS; an answer that fails keeps the last one.
        self.own_names = tuple(own_names)
        self.own_ports = tuple(own_ports)
        self._own_by_name: set[tuple[str, int]] = set()
        self._own_resolved_at = -math.inf
        self.allowed_private = [ipaddress.ip_network(cidr) for cidr in allowed_private]
        self.overrides = dict(resolve or {})
        self.tunnels: dict[str, Tunnel] = {}
        # Clear HTTP: per client connection, the (address, port) pairs the gateway resolved and checked.
        self.plain: dict[str, set[tuple[str, int]]] = {}
        # Per client connection, the requests let out whose responses are still running (by flow id).
        self.in_flight: dict[str, dict[str, InFlight]] = {}

    # ------------------------------------------------------------------------------------------ helpers
    def _identify(self, flow: http.HTTPFlow) -> SandboxEntry | None:
        entry = self.table.identify(proxy_password(flow.request.headers), flow.client_conn.peername[0])
        if entry is None:
            self.audit.unidentified.inc()
            flow.response = http.Response.make(
                407,
                b"this proxy serves sandboxes only: the proxy credential in HTTPS_PROXY is missing, wrong, or "
                b"used from another address than its sandbox's\n",
                {
                    "Proxy-Authenticate": 'Basic realm="shadow-egress"',
                    "Content-Type": "text/plain",
                    "Connection": "close",
                },
            )
        return entry

    async def _own(self) -> set[tuple[str, int]]:
        """The (address, port) pairs that are the gateway: its own addresses and what its names resolve to."""
        now = time.monotonic()
        if self.own_names and now - self._own_resolved_at >= OWN_NAMES_SECONDS:
            self._own_resolved_at = now
            found: set[str] = set()
            for name in self.own_names:
                if name in self.overrides:
                    found.add(self.overrides[name])
                    continue
                with contextlib.suppress(OSError):
                    infos = await asyncio.get_running_loop().getaddrinfo(name, None, type=socket.SOCK_STREAM)
                    found.update(str(info[4][0]) for info in infos)
            if found:
                self._own_by_name = {(address, port) for address in found for port in self.own_ports}
        return self.own | self._own_by_name

    async def _resolve(self, sandbox: SandboxEntry, host: str, port: int) -> tuple[str | None, str]:
        """(address to connect to, or None and why not)."""
        if host in self.overrides:
            candidates = [self.overrides[host]]
        else:
            try:
                infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
            except OSError as error:
                return (
                    None,
                    f"egress to {host} failed for sandbox {sandbox.key}: the name does not resolve ({error})",
                )
            candidates = list(dict.fromkeys(str(info[4][0]) for info in infos))
        own = await self._own()
        for candidate in candidates:
            address = ipaddress.ip_address(candidate)
            if (candidate, port) in own or any(address in net for net in self.allowed_private):
                if (candidate, port) in own:
                    return (
                        None,
                        f"egress to {host}:{port} is refused for sandbox {sandbox.key}: that is the gateway itself",
                    )
                return candidate, ""
            if not address.is_global:
                return None, (
                    f"egress to {host} is refused for sandbox {sandbox.key}: it resolves to {candidate}, which is not "
                    "a public address (the gateway never connects sandboxes to private, loopback or link-local "
                    "addresses, whatever a DNS answer says)"
                )
        if not candidates:
            return None, f"egress to {host} failed for sandbox {sandbox.key}: the name has no address"
        return candidates[0], ""

    def _refuse(
        self, flow: http.HTTPFlow, sandbox: SandboxEntry, host: str, port: int, reason: str, method: str
    ) -> None:
        decision = egress.Decision(False, None, reason)
        self.audit.record(sandbox.key, sandbox.rules, decision, host, port, method, flow.request.path)
        refusal(flow, reason)

    # ------------------------------------------------------------------------------------------- hooks
    async def http_connect(self, flow: http.HTTPFlow) -> None:
        sandbox = self._identify(flow)
        if sandbox is None:
            return
        host, port = flow.request.host.lower().rstrip("."), flow.request.port
        if is_ip_literal(host):
            reason = (
                f"egress to the IP address {host} is not allowed for sandbox {sandbox.key}: connect by host name, "
                "so that the egress rules can apply"
            )
            self._refuse(flow, sandbox, host, port, reason, "CONNECT")
            return
        decision = egress.decide_connection(sandbox.rules, sandbox.key, host, port)
        if decision.allowed:
            address, why = await self._resolve(sandbox, host, port)
            if address is None:
                self._refuse(flow, sandbox, host, port, why, "CONNECT")
                return
            intercept = egress.needs_requests(sandbox.rules, host, port)
            peer = flow.client_conn.peername[0]
            self.tunnels[flow.client_conn.id] = Tunnel(sandbox, peer, host, port, address, intercept)
            if not intercept:
                # A tunnel nobody looks into: this is its one decision.
                self.audit.record(sandbox.key, sandbox.rules, decision, host, port, "CONNECT")
            return
        self.audit.record(sandbox.key, sandbox.rules, decision, host, port, "CONNECT")
        refusal(flow, decision.reason)

    def tls_clienthello(self, data: tls.ClientHelloData) -> None:
        tunnel = self.tunnels.get(data.context.client.id)
        if tunnel is None:
            return
        sni = (data.client_hello.sni or "").lower().rstrip(".")
        if sni != tunnel.host:
            # Terminate TLS anyway, so that the refusal reaches the client as a readable 403.
            tunnel.refused = (
                f"egress to {tunnel.host} is refused for sandbox {tunnel.sandbox.key}: the TLS server name "
                f"({sni or 'none'}) differs from the CONNECT host ({tunnel.host})"
            )
            tunnel.intercept = True
        data.ignore_connection = not tunnel.intercept

    def server_connect(self, data: server_hooks.ServerConnectionHookData) -> None:
        tunnel = self.tunnels.get(data.client.id)
        if tunnel is not None and data.server.address is not None:
            # Connect to the address that was checked, with the name kept for TLS verification upstream.
            data.server.address = (tunnel.address, tunnel.port)
            data.server.sni = tunnel.host
        elif data.server.address not in self.plain.get(data.client.id, ()):
            data.server.error = "the gateway connects only to addresses it resolved and checked"

    async def request(self, flow: http.HTTPFlow) -> None:
        if flow.response is not None or flow.request.method == "CONNECT":
            return
        tunnel = self.tunnels.get(flow.client_conn.id)
        if tunnel is None:
            await self._plain_request(flow)
            return
        # The rules as they are now, not as they were at CONNECT: a change applies to the next request.
        sandbox = self.table.sandboxes.get(tunnel.sandbox.key)
        host, port, method = tunnel.host, tunnel.port, flow.request.method
        if sandbox is None or sandbox.token != tunnel.sandbox.token:
            reason = f"egress for sandbox {tunnel.sandbox.key} is refused: the sandbox is no longer known to the gateway"
            self._refuse(flow, tunnel.sandbox, host, port, reason, method)
            return
        if tunnel.refused:
            self._refuse(flow, sandbox, host, port, tunnel.refused, method)
            return
        header_host = (flow.request.host_header or "").lower().rstrip(".")
        header_host = header_host.rsplit(":", 1)[0] if not header_host.startswith("[") else header_host
        if header_host != host:
            reason = (
                f"egress to {host} is refused for sandbox {sandbox.key}: the request's Host ({header_host or 'none'}) "
                f"differs from the host connected to ({host})"
            )
            self._refuse(flow, sandbox, host, port, reason, method)
            return
        if self._decide(flow, sandbox, host, port):
            self._started(flow, sandbox, host, port)
            # Address the request to the checked address (the Host header stays), so that mitmproxy reuses
            # the upstream connection it already has to that address.
            header = flow.request.host_header
            flow.request.host = tunnel.address
            flow.request.host_header = header

    async def _plain_request(self, flow: http.HTTPFlow) -> None:
        """Clear HTTP through the proxy (absolute-form requests): the same checks, per request."""
        sandbox = self._identify(flow)
        if sandbox is None:
            return
        del flow.request.headers["Proxy-Authorization"]
        host, port = flow.request.host.lower().rstrip("."), flow.request.port
        method = flow.request.method
        if is_ip_literal(host):
            self._refuse(
                flow,
                sandbox,
                host,
                port,
                f"egress to the IP address {host} is not allowed for sandbox {sandbox.key}: connect by host name, so that the egress rules can apply",
                method,
            )
            return
        header_host = (flow.request.host_header or host).lower().rsplit(":", 1)[0]
        if header_host != host:
            self._refuse(
                flow,
                sandbox,
                host,
                port,
                f"egress to {host} is refused for sandbox {sandbox.key}: the request's Host ({header_host}) differs from its URL's",
                method,
            )
            return
        if not self._decide(flow, sandbox, host, port):
            return
        address, why = await self._resolve(sandbox, host, port)
        if address is None:
            self._refuse(flow, sandbox, host, port, why, method)
            return
        self.plain.setdefault(flow.client_conn.id, set()).add((address, port))
        self._started(flow, sandbox, host, port)
        header = flow.request.host_header or host
        flow.request.host = address
        flow.request.host_header = header

    def _decide(self, flow: http.HTTPFlow, sandbox: SandboxEntry, host: str, port: int) -> bool:
        method, path = flow.request.method, flow.request.path
        upgrade = flow.request.headers.get("Upgrade", "").lower()
        if upgrade and upgrade != "websocket":
            reason = (
                f"egress to {host} {method} {path.split('?', 1)[0][:200]} is refused for sandbox {sandbox.key}: "
                f"protocol upgrades ({upgrade}) are not allowed through the gateway"
            )
            self._refuse(flow, sandbox, host, port, reason, method)
            return False
        decision = egress.decide_request(
            sandbox.rules, sandbox.key, host, port, method, path, websocket=upgrade == "websocket"
        )
        self.audit.record(sandbox.key, sandbox.rules, decision, host, port, method, path)
        if not decision.allowed:
            refusal(flow, decision.reason)
            return False
        rule = sandbox.rules[decision.rule] if decision.rule is not None else None
        if rule is not None and rule.credential is not None:
            self._add_credential(flow, sandbox, rule.credential)
        return True

    def _add_credential(
        self, flow: http.HTTPFlow, sandbox: SandboxEntry, credential: EgressCredential
    ) -> None:
        value = self.table.secret(sandbox.namespace, credential.secret_name, credential.key)
        if value is None:
            refusal(
                flow,
                f"egress to {flow.request.pretty_host} is allowed for sandbox {sandbox.key}, but its credential "
                f"(Secret {credential.secret_name}, key {credential.key}) is missing: ask the platform team",
            )
            return
        if credential.header is not None:
            flow.request.headers[credential.header] = credential.prefix + value
            return
        assert credential.placeholder is not None
        for name, header_value in list(flow.request.headers.items(multi=True)):
            if credential.placeholder in header_value:
                flow.request.headers[name] = header_value.replace(credential.placeholder, value)

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        # Stream big bodies through instead of holding them in memory; small ones are buffered (mitmproxy's
        # default), which keeps its connection reuse intact.
        if flow.response is not None:
            length = flow.response.headers.get("Content-Length", "")
            flow.response.stream = not length.isdigit() or int(length) > STREAM_ABOVE_BYTES

    # ---------------------------------------------------------------------------------- policy changes
    def _started(self, flow: http.HTTPFlow, sandbox: SandboxEntry, host: str, port: int) -> None:
        websocket = flow.request.headers.get("Upgrade", "").lower() == "websocket"
        self.in_flight.setdefault(flow.client_conn.id, {})[flow.id] = InFlight(
            sandbox,
            flow.client_conn.peername[0],
            host,
            port,
            flow.request.method,
            flow.request.path,
            websocket,
        )

    def _ended(self, flow: http.HTTPFlow) -> None:
        self.in_flight.get(flow.client_conn.id, {}).pop(flow.id, None)

    def response(self, flow: http.HTTPFlow) -> None:
        if flow.websocket is None:  # a WebSocket runs on after its handshake's response
            self._ended(flow)

    def error(self, flow: http.HTTPFlow) -> None:
        self._ended(flow)

    def websocket_end(self, flow: http.HTTPFlow) -> None:
        self._ended(flow)

    def _current(self, sandbox: SandboxEntry, peer: str) -> SandboxEntry | None:
        """The sandbox's entry in the table as it is now, if it still names this connection."""
        entry = self.table.sandboxes.get(sandbox.key)
        if entry is None or entry.token != sandbox.token or peer not in entry.addresses:
            return None
        return entry

    def _disallowed(self) -> Iterator[tuple[str, str, str]]:
        """(client connection id, sandbox, why) of every open connection the table no longer allows: a tunnel
        to a host no rule allows any more, a tunnel passed through whose rules now need to see its requests,
        a response still running for a request the rules now refuse, any connection of a sandbox gone."""
        for client_id, tunnel in self.tunnels.items():
            entry = self._current(tunnel.sandbox, tunnel.peer)
            if entry is None:
                yield client_id, tunnel.sandbox.key, "the sandbox is no longer under this policy"
                continue
            decision = egress.decide_connection(entry.rules, entry.key, tunnel.host, tunnel.port)
            if not decision.allowed:
                yield client_id, entry.key, decision.reason
            elif not tunnel.intercept and egress.needs_requests(entry.rules, tunnel.host, tunnel.port):
                yield client_id, entry.key, f"the rules for {tunnel.host} now check each request"
        for client_id, flows in self.in_flight.items():
            for request in flows.values():
                entry = self._current(request.sandbox, request.peer)
                if entry is None:
                    yield client_id, request.sandbox.key, "the sandbox is no longer under this policy"
                    break
                decision = egress.decide_request(
                    entry.rules,
                    entry.key,
                    request.host,
                    request.port,
                    request.method,
                    request.path,
                    websocket=request.websocket,
                )
                if not decision.allowed:
                    yield client_id, entry.key, decision.reason
                    break

    def policy_changed(self) -> None:
        """A new table: close what it no longer allows, now rather than when the connection ends by itself
        (a tunnel passed through is never looked into again, and a response may stream for hours)."""
        closing = dict((client_id, (key, why)) for client_id, key, why in self._disallowed())
        for client_id, (key, why) in closing.items():
            log.info("closing a connection of sandbox %s after a policy change: %s", key, why)
            try:
                self.close(client_id)
            except Exception:  # one connection that would not close must not keep the others open
                log.exception("closing a connection of sandbox %s", key)

    def client_disconnected(self, client: connection.Client) -> None:
        self.tunnels.pop(client.id, None)
        self.plain.pop(client.id, None)
        self.in_flight.pop(client.id, None)


class NamespaceTls(TlsConfig):  # type: ignore[misc]  # mitmproxy is not installed where mypy runs
    """mitmproxy's TLS setup with one change: the certificate shown to a sandbox comes from its namespace's CA."""

    def __init__(self, gate: Gate, authorities: CertAuthorities) -> None:
        super().__init__()
        self.gate = gate
        self.authorities = authorities

    def get_cert(self, conn_context: Context) -> certs.CertStoreEntry:
        tunnel = self.gate.tunnels.get(conn_context.client.id)
        if tunnel is None:
            raise RuntimeError("TLS from a client the gateway did not attribute to a sandbox")
        host = conn_context.client.sni or tunnel.host
        return self.authorities.store(tunnel.sandbox.namespace).get_cert(host, [x509.DNSName(host)])
