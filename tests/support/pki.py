"""Certificates for the local control plane: one CA, the apiserver's serving cert, client certs.

Written with `cryptography` so the harness needs neither openssl nor cfssl on the machine.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = dt.timedelta(days=365)


@dataclass(frozen=True)
class KeyPair:
    cert: Path
    key: Path


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write(path: Path, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> KeyPair:
    key_path = path.with_suffix(".key")
    cert_path = path.with_suffix(".crt")
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    key_path.chmod(0o600)
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return KeyPair(cert=cert_path, key=key_path)


def _builder(
    subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey
) -> x509.CertificateBuilder:
    now = dt.datetime.now(dt.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
    )


class CertificateAuthority:
    """A throwaway CA that signs the apiserver's serving cert and the client certs."""

    def __init__(self, directory: Path, common_name: str = "shadow-operator-local-ca") -> None:
        self._dir = directory
        self._key = _new_key()
        self._name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        cert = (
            _builder(self._name, self._name, self._key.public_key())
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()), critical=False)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self._key, hashes.SHA256())
        )
        self.pair = _write(directory / "ca", self._key, cert)

    @classmethod
    def load(cls, directory: Path) -> CertificateAuthority:
        """The CA a running control plane wrote to `directory` (ca.key, ca.crt), to sign more client certs."""
        ca = cls.__new__(cls)
        ca._dir = directory
        key = serialization.load_pem_private_key((directory / "ca.key").read_bytes(), password=None)
        assert isinstance(key, ec.EllipticCurvePrivateKey)
        ca._key = key
        cert = x509.load_pem_x509_certificate((directory / "ca.crt").read_bytes())
        ca._name = cert.subject
        ca.pair = KeyPair(cert=directory / "ca.crt", key=directory / "ca.key")
        return ca

    def issue(
        self,
        name: str,
        common_name: str,
        *,
        organizations: tuple[str, ...] = (),
        dns_names: tuple[str, ...] = (),
        ip_addresses: tuple[str, ...] = (),
        server: bool = False,
    ) -> KeyPair:
        key = _new_key()
        attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
        attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        # The key identifiers: Python 3.13's strict verification (the egress gateway's client) requires them.
        builder = (
            _builder(x509.Name(attrs), self._name, key.public_key())
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()), critical=False
            )
        )
        if server:
            sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns_names]
            sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        return _write(self._dir / name, key, builder.sign(self._key, hashes.SHA256()))


def write_service_account_keys(directory: Path) -> KeyPair:
    """The key pair kube-apiserver verifies and kube-controller-manager signs service-account tokens with."""
    key = _new_key()
    key_path = directory / "sa.key"
    pub_path = directory / "sa.pub"
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    key_path.chmod(0o600)
    pub_path.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return KeyPair(cert=pub_path, key=key_path)
