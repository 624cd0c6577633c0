"""The admission webhook's serving certificate, made by the operator itself.

A private CA and a serving certificate signed by it, for the webhook's host
name or IP address, written as PEM files into a folder (kept when they are
still valid for that host, so restarts keep the caBundle the API server
holds). The CA certificate is what the webhook configurations carry as
`caBundle`. The folder must be the operator's own: one that another user owns
or may write to could hold a certificate and key of theirs, which the operator
would then serve and register (and the API server would send them every pod),
so it is refused (a read-only mount such as a Secret volume is fine); the key is
created readable by its owner only. Uses the
`cryptography` library; writes files, nothing else.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

VALID_DAYS = 365


@dataclass(frozen=True)
class ServingCertificate:
    ca_file: Path
    cert_file: Path
    key_file: Path


def ensure_certificate(folder: Path, host: str) -> ServingCertificate:
    """The CA and serving certificate for `host` in `folder`, made when missing,
    expiring within 30 days, or made for another host. Raises PermissionError
    when the folder is not private to this user."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    _check_private(folder)
    files = ServingCertificate(folder / "ca.crt", folder / "tls.crt", folder / "tls.key")
    if not _still_good(files, host):
        _make(files, host)
    return files


def _still_good(files: ServingCertificate, host: str) -> bool:
    if not all(path.exists() for path in (files.ca_file, files.cert_file, files.key_file)):
        return False
    cert = x509.load_pem_x509_certificate(files.cert_file.read_bytes())
    left = cert.not_valid_after_utc - dt.datetime.now(dt.UTC)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return left > dt.timedelta(days=30) and _san(host) in list(names)


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _make(files: ServingCertificate, host: str) -> None:
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kai-ray webhook CA")])
    ca = (
        _builder(ca_name, ca_name, ca_key.public_key(), now)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)])
    cert = (
        _builder(name, ca_name, key.public_key(), now)
        .add_extension(x509.SubjectAlternativeName([_san(host)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    files.ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    files.cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_private(
        files.key_file,
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )


def _check_private(folder: Path) -> None:
    """Owned by this user (or root), and nobody else may write into it, unless it is
    a read-only mount (a Secret volume: the kubelet alone fills it)."""
    info = folder.stat()
    owner_trusted = info.st_uid in (os.getuid(), 0)
    others_write = bool(info.st_mode & 0o022) and not os.statvfs(folder).f_flag & os.ST_RDONLY
    if not owner_trusted or others_write:
        raise PermissionError(
            f"{folder}: not private to this user (owner uid {info.st_uid}, mode "
            f"{oct(info.st_mode & 0o777)}): another user could plant the webhook's "
            "certificate; choose another --webhook-cert-dir"
        )


def _write_private(path: Path, data: bytes) -> None:
    """Write a file that is never readable by others, not even for a moment."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, data)
    finally:
        os.close(fd)


def _builder(
    subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey, now: dt.datetime
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=VALID_DAYS))
    )
