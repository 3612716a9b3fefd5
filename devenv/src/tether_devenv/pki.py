"""Certificates, keys and tokens for the local cluster, generated in-process with ``cryptography``.

The layout follows what a real cluster has (``../shared/reference/k8s_testenv.md`` §5.3): a private CA,
a serving certificate for kube-apiserver with the in-cluster and loopback SANs, a service-account
signing key pair, and a static token file with an admin in ``system:masters`` (RBAC stays enabled).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import secrets
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_SANS_DNS = (
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)
_SANS_IP = ("127.0.0.1", "10.96.0.1")
_VALIDITY = dt.timedelta(days=365)


@dataclass(frozen=True)
class ClusterPki:
    """Paths of the generated material plus the admin bearer token.

    Attributes:
        ca_cert: PEM CA certificate (clients trust it; also the ``kube-root-ca.crt`` content).
        ca_key: PEM CA private key.
        serving_cert / serving_key: kube-apiserver TLS certificate and key.
        sa_key / sa_pub: service-account token signing key (PEM, RSA 2048) and its public key.
        token_file: kube-apiserver ``--token-auth-file`` CSV.
        admin_token: bearer token of user ``admin`` in group ``system:masters``.
    """

    ca_cert: Path
    ca_key: Path
    serving_cert: Path
    serving_key: Path
    sa_key: Path
    sa_pub: Path
    token_file: Path
    admin_token: str


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    path.chmod(0o600)


def generate(directory: Path) -> ClusterPki:
    """Create a fresh PKI and token file in ``directory`` (created if missing) and return their paths."""
    directory.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tether-dev-cluster-ca")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )

    serving_key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in _SANS_DNS]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in _SANS_IP]
    serving_cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
        .issuer_name(ca_name)
        .public_key(serving_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    admin_token = secrets.token_urlsafe(32)

    pki = ClusterPki(
        ca_cert=directory / "ca.crt",
        ca_key=directory / "ca.key",
        serving_cert=directory / "apiserver.crt",
        serving_key=directory / "apiserver.key",
        sa_key=directory / "sa.key",
        sa_pub=directory / "sa.pub",
        token_file=directory / "tokens.csv",
        admin_token=admin_token,
    )
    pki.ca_cert.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    _write_key(pki.ca_key, ca_key)
    pki.serving_cert.write_bytes(serving_cert.public_bytes(serialization.Encoding.PEM))
    _write_key(pki.serving_key, serving_key)
    _write_key(pki.sa_key, sa_key)
    pki.sa_pub.write_bytes(
        sa_key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    pki.token_file.write_text(f'{admin_token},admin,admin-uid,"system:masters"\n')
    pki.token_file.chmod(0o600)
    return pki


def issue(
    ca_cert_file: Path,
    ca_key_file: Path,
    directory: Path,
    name: str,
    common_name: str,
    organizations: tuple[str, ...] = (),
    ips: tuple[str, ...] = (),
    dns_names: tuple[str, ...] = (),
    server: bool = False,
) -> tuple[Path, Path]:
    """Sign a certificate with the CA in ``ca_cert_file``/``ca_key_file`` (PEM) into ``directory/<name>.crt|key``.

    Kubernetes reads a client certificate's common name as the user and its organisations as the groups
    (``system:node:<node>`` in ``system:nodes`` for a kubelet, upstream's x509 authenticator). ``server``
    adds the serving usage and the ``ips``/``dns_names`` SANs (a kubelet's serving certificate); every
    certificate can authenticate as a client.

    Returns:
        ``(certificate path, key path)``, PEM, the key with mode 0600.
    """
    directory.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    ca_cert = x509.load_pem_x509_certificate(ca_cert_file.read_bytes())
    ca_key = serialization.load_pem_private_key(ca_key_file.read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organizations]
    subject.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH] + ([ExtendedKeyUsageOID.SERVER_AUTH] if server else [])
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name(subject))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    )
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert_path, key_path = directory / f"{name}.crt", directory / f"{name}.key"
    cert_path.write_bytes(builder.sign(ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM))
    _write_key(key_path, key)
    return cert_path, key_path
