"""The target's Docker engine: parse the address a user gives, refuse the unsafe one, connect, ping.

``unix:///var/run/docker.sock`` (a local engine), ``ssh://user@host[:port]`` (the OpenSSH client, as the
docker CLI uses it; an unknown host key is refused), ``tcp://host:2376`` only with TLS client
certificates (a Docker engine on plain TCP is root on the device for anyone on the network, so it is
refused, and so is a plain ``DOCKER_HOST=tcp://`` for the local engine).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from veo_edge.errors import EngineUnreachableError, InsecureEngineError, UsageError

SCHEMES = ("unix", "ssh", "tcp")


@dataclass(frozen=True)
class TlsFiles:
    """Client TLS material for a ``tcp://`` engine: the CA that signed the engine's certificate, and the
    client certificate and key the engine trusts (``dockerd --tlsverify``)."""

    ca: Path
    cert: Path
    key: Path

    def check(self) -> None:
        for what, path in (("--tls-ca", self.ca), ("--tls-cert", self.cert), ("--tls-key", self.key)):
            if not Path(path).is_file():
                raise UsageError(f"{what} {path}: no such file")


@dataclass(frozen=True)
class EngineAddress:
    """Where the target's Docker engine listens. Cheap: nothing connects until :meth:`connect`."""

    url: str
    tls: TlsFiles | None = None
    timeout: float = 60.0

    @property
    def scheme(self) -> str:
        return urlsplit(self.url).scheme

    def check(self) -> None:
        parts = urlsplit(self.url)
        if parts.scheme not in SCHEMES:
            raise UsageError(
                f"--to {self.url!r} is not a Docker engine address; expected unix:///path/docker.sock, "
                "ssh://user@host or tcp://host:2376 (with --tls-ca/--tls-cert/--tls-key)"
            )
        if parts.scheme == "unix" and not parts.path:
            raise UsageError(f"--to {self.url!r} names no socket; e.g. unix:///var/run/docker.sock")
        if parts.scheme in ("ssh", "tcp") and not parts.hostname:
            raise UsageError(f"--to {self.url!r} names no host")
        if parts.scheme == "tcp":
            if self.tls is None:
                raise InsecureEngineError(
                    f"refusing plain {self.url}: a Docker engine on unencrypted TCP gives root on the device to "
                    "anyone who can reach it; serve it with dockerd --tlsverify and pass --tls-ca, --tls-cert "
                    "and --tls-key (or use ssh://user@host)"
                )
            self.tls.check()
        elif self.tls is not None:
            raise UsageError(f"--tls-* options go with a tcp:// address, not {parts.scheme}://")

    def connect(self) -> Any:
        """A ``docker.DockerClient`` for the engine, after a ping; one-line errors when it does not answer."""
        self.check()
        try:
            import docker
            from docker.errors import DockerException
        except ImportError as e:  # pragma: no cover - docker is a core dependency
            raise EngineUnreachableError(f"the Docker SDK is not importable ({e}); pip install docker") from e
        kw: dict[str, Any] = {"timeout": self.timeout}
        base_url = self.url
        if self.scheme == "tcp":
            assert self.tls is not None
            parts = urlsplit(self.url)
            base_url = f"https://{parts.hostname}:{parts.port or 2376}"
            kw["tls"] = docker.tls.TLSConfig(
                client_cert=(str(self.tls.cert), str(self.tls.key)), ca_cert=str(self.tls.ca), verify=True
            )
        elif self.scheme == "ssh":
            kw.update(ssh_transport(self.url))
        try:
            if self.scheme == "tcp":
                # requests lets REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE override the session's CA: the engine's
                # own CA (--tls-ca) must be the one trusted, whatever the environment says
                with _without_ca_bundle_env():
                    client = docker.DockerClient(base_url=base_url, version="auto", **kw)
                client.api.trust_env = False
            else:
                client = docker.DockerClient(base_url=base_url, version="auto", **kw)
            client.ping()
        except DockerException as e:
            raise EngineUnreachableError(f"no Docker engine answers at {self.url}: {_short(e)}") from e
        except OSError as e:
            raise EngineUnreachableError(f"no Docker engine answers at {self.url}: {e}") from e
        return client


def ssh_transport(url: str) -> dict[str, Any]:
    """How the SDK reaches an ``ssh://`` engine: the OpenSSH client (``use_ssh_client``: your
    ~/.ssh/config, agent, known_hosts and certificates, as the docker CLI uses them), checked first with
    one batch-mode command so that an unknown host key, a refused login or a missing remote ``docker`` is
    a one-line error, not a broken pipe; paramiko (``veo-edge[ssh]``) where no ``ssh`` is installed.
    Either way an unknown host key is refused, never accepted on first use."""
    import shutil
    import subprocess

    try:
        import paramiko  # noqa: F401 - the SDK's ssh module imports it even when it shells out to ssh
    except ImportError as e:
        raise EngineUnreachableError(
            f"ssh:// engines need paramiko ({e}); pip install 'veo-edge[ssh]'"
        ) from e
    ssh = shutil.which("ssh")
    if ssh is None:  # paramiko itself, with the SDK's RejectPolicy for unknown host keys
        return {}
    parts = urlsplit(url)
    cmd = [ssh, "-o", "BatchMode=yes", "-o", "ConnectTimeout=15"]
    cmd += ["-l", parts.username] if parts.username else []
    cmd += ["-p", str(parts.port)] if parts.port else []
    cmd += ["--", parts.hostname or "", "docker version --format '{{.Server.Version}}'"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired as e:
        raise EngineUnreachableError(f"no answer from {url} within 60 s over ssh") from e
    err = " ".join(proc.stderr.split())
    if proc.returncode == 0:
        return {"use_ssh_client": True}
    if "Host key verification failed" in err or "REMOTE HOST IDENTIFICATION HAS CHANGED" in err:
        raise InsecureEngineError(
            f"refusing {url}: its ssh host key is not one your known_hosts trusts ({err}); check the key's "
            f"fingerprint on the device, then add it (ssh-keyscan -p {parts.port or 22} {parts.hostname} >> "
            "~/.ssh/known_hosts) or connect once with ssh"
        )
    raise EngineUnreachableError(
        f"no Docker engine answers at {url} over ssh (exit {proc.returncode}): {err}"
    )


def local_engine(timeout: float = 60.0) -> Any:
    """The engine the image was built on: ``DOCKER_HOST``, else the default socket."""

    try:
        import docker
        from docker.errors import DockerException
    except ImportError as e:  # pragma: no cover
        raise EngineUnreachableError(f"the Docker SDK is not importable ({e}); pip install docker") from e
    from veo_edge.packaging.image import refuse_plain_tcp

    refuse_plain_tcp()
    where = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    try:
        client = docker.from_env(timeout=timeout, version="auto")
        client.ping()
    except DockerException as e:
        raise EngineUnreachableError(
            f"no local Docker engine answers at {where} (set DOCKER_HOST to the engine that holds the image): "
            f"{_short(e)}"
        ) from e
    return client


@contextlib.contextmanager
def _without_ca_bundle_env() -> Iterator[None]:
    saved = {k: os.environ.pop(k) for k in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE") if k in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def _short(e: Exception) -> str:
    """The useful end of a docker/requests error (they nest several layers of repr)."""
    text = str(e).replace("\n", " ")
    return text if len(text) <= 300 else text[:297] + "..."
