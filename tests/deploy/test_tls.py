"""A device engine on ``tcp://127.0.0.1:PORT`` with mutual TLS, its CA made here; plain TCP refused."""

from __future__ import annotations

import datetime
import ipaddress
import json
import tempfile
from pathlib import Path

import pytest

from tests.cli.test_cli import veo
from tests.support.dockerd import DockerEngine, remove_root
from tests.support.net import free_port


def _pki(d: Path) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, as dockerd --tlsverify wants."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def write_key(key, path: Path) -> Path:
        path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        return path

    def write_cert(cert, path: Path) -> Path:
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return path

    def cert(subject: str, key, issuer_name, issuer_key, ca: bool, usage=None, san=None):
        b = (
            x509.CertificateBuilder()
            .subject_name(name(subject))
            .issuer_name(issuer_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if usage:
            b = b.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        if san:
            b = b.add_extension(x509.SubjectAlternativeName(san), critical=False)
        return b.sign(issuer_key, hashes.SHA256())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = cert("veo-edge test CA", ca_key, name("veo-edge test CA"), ca_key, True)
    srv_key = ec.generate_private_key(ec.SECP256R1())
    srv = cert("127.0.0.1", srv_key, ca.subject, ca_key, False, ExtendedKeyUsageOID.SERVER_AUTH,
               [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])  # fmt: skip
    cli_key = ec.generate_private_key(ec.SECP256R1())
    cli = cert("deployer", cli_key, ca.subject, ca_key, False, ExtendedKeyUsageOID.CLIENT_AUTH)
    other_key = ec.generate_private_key(ec.SECP256R1())
    other_ca = cert("another CA", other_key, name("another CA"), other_key, True)
    return {
        "ca": write_cert(ca, d / "ca.pem"),
        "server_cert": write_cert(srv, d / "server-cert.pem"),
        "server_key": write_key(srv_key, d / "server-key.pem"),
        "cert": write_cert(cli, d / "cert.pem"),
        "key": write_key(cli_key, d / "key.pem"),
        "other_ca": write_cert(other_ca, d / "other-ca.pem"),
    }


@pytest.fixture(scope="module")
def tls_engine(docker_engine):
    root = Path(tempfile.mkdtemp(prefix="veo-tls-", dir="/tmp"))
    pki = _pki(root)
    port = free_port()
    engine = DockerEngine(
        root / "e",
        extra_args=[
            "--tlsverify",
            f"--tlscacert={pki['ca']}",
            f"--tlscert={pki['server_cert']}",
            f"--tlskey={pki['server_key']}",
            f"--host=tcp://127.0.0.1:{port}",
        ],
    ).start()
    yield engine, f"tcp://127.0.0.1:{port}", pki
    engine.close()
    remove_root(root)


def test_deploy_over_mutual_tls_and_refusals(docker_engine, tls_engine, test_images) -> None:
    engine, url, pki = tls_engine
    tls = ["--tls-ca", pki["ca"], "--tls-cert", pki["cert"], "--tls-key", pki["key"]]
    r = veo("deploy", test_images["v1"], "--to", url, *tls, "--name", "tls-app", "--json", "--allow-unsigned",
            env={"DOCKER_HOST": docker_engine.host}, timeout=240)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["transfer"]["method"] == "stream"
    inspect = json.loads(engine.docker("inspect", "tls-app").stdout)[0]
    assert inspect["State"]["Health"]["Status"] == "healthy"

    r = veo("deploy", "status", "tls-app", "--to", url, *tls, "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["current"]["health"] == "healthy", r.stderr

    # the same engine without TLS material: refused before any connection is tried
    r = veo("deploy", test_images["v1"], "--to", url, "--allow-unsigned")
    assert r.returncode == 45 and "refusing plain" in r.stderr and "--tls-ca" in r.stderr
    # a CA that did not sign the engine's certificate: the engine is not trusted
    bad = ["--tls-ca", pki["other_ca"], "--tls-cert", pki["cert"], "--tls-key", pki["key"]]
    r = veo("deploy", "status", "tls-app", "--to", url, *bad)
    assert r.returncode == 41 and f"no Docker engine answers at {url}" in r.stderr
    # half the TLS options
    r = veo("deploy", "status", "tls-app", "--to", url, "--tls-ca", pki["ca"])
    assert r.returncode == 2 and "go together" in r.stderr
