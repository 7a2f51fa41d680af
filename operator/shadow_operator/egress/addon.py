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
import ipaddress
import socket
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from mitmproxy import certs, connection, http, tls
from mitmproxy.addons.tlsconfig import TlsConfig
from mitmproxy.proxy import server_hooks
from mitmproxy.proxy.context import Context

from shadow_operator.api.models import EgressCredential
from shadow_operator.common import egress
from shadow_operator.egress.audit import Audit
from shadow_operator.egress.table import PolicyTable, SandboxEntry

CA_BASENAME = "shadow-egress"
CA_KEY_SIZE = 2048
STREAM_ABOVE_BYTES = 1 << 20


class CertAuthorities:
    """One CA per namespace, created on first use; the keys stay in `directory` (the gateway's own volume)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.stores: dict[str, certs.CertStore] = {}
        # The proxy (event loop) and the cluster source (its own thread) both ask: one CA per namespace, ever.
        self.lock = threading.Lock()

    def store(self, namespace: str) -> certs.CertStore:
        with self.lock:
            return self._store(namespace)

    def _store(self, namespace: str) -> certs.CertStore:
        if namespace not in self.stores:
            with certs.CertStore.umask_secret():
                self.stores[namespace] = certs.CertStore.from_store(
                    self.directory / namespace, CA_BASENAME, CA_KEY_SIZE
                )
        return self.stores[namespace]

    def certificate_pem(self, namespace: str) -> bytes:
        """The public CA certificate the namespace's workspaces trust (never the key)."""
        return bytes(self.store(namespace).default_ca.to_pem())


@dataclass
class Tunnel:
    """What was decided for a client connection at CONNECT time."""

    sandbox: SandboxEntry
    host: str
    port: int
    address: str  # the resolved address the gateway connects to
    intercept: bool
    refused: str | None = None  # set when the TLS handshake revealed something to refuse


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
    ) -> None:
        self.table = table
        self.audit = audit
        self.own = set(own)
        self.allowed_private = [ipaddress.ip_network(cidr) for cidr in allowed_private]
        self.overrides = dict(resolve or {})
        self.tunnels: dict[str, Tunnel] = {}
        # Clear HTTP: per client connection, the (address, port) pairs the gateway resolved and checked.
        self.plain: dict[str, set[tuple[str, int]]] = {}

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
        for candidate in candidates:
            address = ipaddress.ip_address(candidate)
            if (candidate, port) in self.own or any(address in net for net in self.allowed_private):
                if (candidate, port) in self.own:
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
            self.tunnels[flow.client_conn.id] = Tunnel(sandbox, host, port, address, intercept)
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

    def client_disconnected(self, client: connection.Client) -> None:
        self.tunnels.pop(client.id, None)
        self.plain.pop(client.id, None)


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
