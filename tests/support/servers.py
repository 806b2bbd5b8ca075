"""Real servers the fleet tests deploy through, all on loopback with throwaway keys, stopped by PID: an
OpenSSH server (Debian's openssh-server) whose sessions' ``docker`` reaches a test engine, and the
reference registry (Debian's docker-registry). Each test that starts one holds ``/tmp/veo-swarm.lock``
(:func:`fleet_lock`) while it runs, as every swarm, registry and sshd test on this machine does."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

LOCK = "/tmp/veo-swarm.lock"


_held = 0  # this process's depth: flock on a second descriptor of the same file would wait for itself


@contextlib.contextmanager
def fleet_lock() -> Iterator[None]:
    """/tmp/veo-swarm.lock, held while the block runs; re-entrant within this process (the session's swarm
    engine holds it while a test in the same run starts an sshd or a registry)."""
    global _held
    if _held:
        _held += 1
        try:
            yield
        finally:
            _held -= 1
        return
    with open(LOCK, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        _held = 1
        try:
            yield
        finally:
            _held = 0
            fcntl.flock(f, fcntl.LOCK_UN)


def _stop(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@dataclass
class Sshd:
    """``sshd -D`` on 127.0.0.1:port; ``client_env`` puts an ``ssh`` first on PATH that uses this test's
    client config (identity, known_hosts), as a user's ~/.ssh would."""

    root: Path
    port: int
    proc: subprocess.Popen
    host_key_line: str

    @property
    def url(self) -> str:
        return f"ssh://root@127.0.0.1:{self.port}"

    def client_env(self, known: bool = True) -> dict[str, str]:
        known_hosts = self.root / ("known_hosts" if known else "empty_known_hosts")
        config = self.root / f"ssh_config_{'known' if known else 'unknown'}"
        config.write_text(
            f"Host 127.0.0.1\n  IdentityFile {self.root / 'id_ed25519'}\n  IdentitiesOnly yes\n"
            f"  UserKnownHostsFile {known_hosts}\n  StrictHostKeyChecking yes\n  BatchMode yes\n"
        )
        bindir = self.root / f"bin-{'known' if known else 'unknown'}"
        bindir.mkdir(exist_ok=True)
        wrapper = bindir / "ssh"
        wrapper.write_text(f'#!/bin/sh\nexec {shutil.which("ssh")} -F {config} "$@"\n')
        wrapper.chmod(0o755)
        return {"PATH": f"{bindir}:{os.environ['PATH']}"}


def start_sshd(root: Path, port: int, docker_host: str) -> Sshd:
    sshd = shutil.which("sshd") or "/usr/sbin/sshd"
    if not Path(sshd).exists():
        raise FileNotFoundError("sshd is not installed (apt-get install openssh-server)")
    root.mkdir(parents=True, exist_ok=True)
    for key in ("host_ed25519", "id_ed25519"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(root / key)], check=True)
    (root / "authorized_keys").write_text((root / "id_ed25519.pub").read_text())
    host_pub = (root / "host_ed25519.pub").read_text().split()
    line = f"[127.0.0.1]:{port} {host_pub[0]} {host_pub[1]}\n"
    (root / "known_hosts").write_text(line)
    (root / "empty_known_hosts").write_text("")
    (root / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {root / 'host_ed25519'}\nPidFile {root / 'sshd.pid'}\n"
        f"AuthorizedKeysFile {root / 'authorized_keys'}\nPermitRootLogin prohibit-password\n"
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
        f"SetEnv DOCKER_HOST={docker_host}\nLogLevel VERBOSE\n"
    )
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation directory
    log = open(root / "sshd.log", "ab")  # noqa: SIM115 - the child keeps it open
    proc = subprocess.Popen([sshd, "-D", "-e", "-f", str(root / "sshd_config")], stdout=log, stderr=log,
                            start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 20
    import socket

    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sshd exited {proc.returncode}: {(root / 'sshd.log').read_text()[-500:]}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return Sshd(root, port, proc, line)
        time.sleep(0.1)
    _stop(proc)
    raise RuntimeError("sshd did not listen within 20 s")


def stop_sshd(s: Sshd) -> None:
    _stop(s.proc)


@dataclass
class Registry:
    root: Path
    port: int
    proc: subprocess.Popen

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def blob(self, digest: str) -> Path:
        hexd = digest.split(":", 1)[1]
        return self.root / "data" / "docker/registry/v2/blobs/sha256" / hexd[:2] / hexd / "data"


def start_registry(root: Path, port: int) -> Registry:
    binary = shutil.which("docker-registry") or "/usr/bin/docker-registry"
    if not Path(binary).exists():
        raise FileNotFoundError("docker-registry is not installed (apt-get install docker-registry)")
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.yml").write_text(
        "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n"
        f"    rootdirectory: {root / 'data'}\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\n"
    )
    log = open(root / "registry.log", "ab")  # noqa: SIM115
    proc = subprocess.Popen([binary, "serve", str(root / "config.yml")], stdout=log, stderr=log,
                            start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"registry exited {proc.returncode}: {(root / 'registry.log').read_text()[-500:]}"
            )
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=2) as r,
        ):
            if r.status == 200:
                return Registry(root, port, proc)
        time.sleep(0.1)
    _stop(proc)
    raise RuntimeError("the registry did not answer within 20 s")


def stop_registry(r: Registry) -> None:
    _stop(r.proc)
