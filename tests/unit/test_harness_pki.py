"""The harness's certificates work for a real mutual-TLS handshake, and a foreign CA is refused."""

from __future__ import annotations

import socket
import ssl
import threading
from pathlib import Path

import pytest

from tests.support.pki import CertificateAuthority

pytestmark = pytest.mark.unit


def _serve_once(server_ctx: ssl.SSLContext, listener: socket.socket, seen: dict[str, object]) -> None:
    conn, _ = listener.accept()
    try:
        with server_ctx.wrap_socket(conn, server_side=True) as tls:
            seen["peer"] = tls.getpeercert()
            tls.sendall(b"ok")
    except ssl.SSLError as e:
        seen["error"] = e


def _handshake(ca: CertificateAuthority, client_ca_file: Path, tmp_path: Path) -> dict[str, object]:
    server = ca.issue("server", "kube-apiserver", ip_addresses=("127.0.0.1",), server=True)
    client = ca.issue("client", "kubernetes-admin", organizations=("system:masters",))
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(server.cert, server.key)
    server_ctx.load_verify_locations(cafile=ca.pair.cert)
    server_ctx.verify_mode = ssl.CERT_REQUIRED
    client_ctx = ssl.create_default_context(cafile=str(client_ca_file))
    client_ctx.load_cert_chain(client.cert, client.key)

    seen: dict[str, object] = {}
    with socket.create_server(("127.0.0.1", 0)) as listener:
        thread = threading.Thread(target=_serve_once, args=(server_ctx, listener, seen))
        thread.start()
        try:
            with (
                socket.create_connection(listener.getsockname()) as raw,
                client_ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
            ):
                seen["reply"] = tls.recv(2)
        except ssl.SSLError as e:
            seen["client_error"] = e
        finally:
            thread.join(timeout=10)
    return seen


def test_mutual_tls_with_issued_certificates(tmp_path: Path) -> None:
    ca = CertificateAuthority(tmp_path)
    seen = _handshake(ca, ca.pair.cert, tmp_path)
    assert seen.get("reply") == b"ok"
    subject = dict(x[0] for x in seen["peer"]["subject"])  # type: ignore[index]
    assert subject == {"organizationName": "system:masters", "commonName": "kubernetes-admin"}
    assert (tmp_path / "client.key").stat().st_mode & 0o777 == 0o600


def test_server_from_another_ca_is_refused(tmp_path: Path) -> None:
    ca = CertificateAuthority(tmp_path)
    (tmp_path / "other").mkdir()
    other = CertificateAuthority(tmp_path / "other")
    seen = _handshake(ca, other.pair.cert, tmp_path)
    assert "reply" not in seen
    assert isinstance(seen.get("client_error"), ssl.SSLCertVerificationError)
