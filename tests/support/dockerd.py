"""A real Docker engine for the tests: its own dockerd with data root, exec root and socket under a
temporary directory, no bridge and no iptables (so no port publishing: containers use host or no
networking), stopped by its PID.

Several engines can run side by side (one standing in for a build host, one for a device). Tests that
need an engine get it from the fixtures in ``tests/conftest.py``; where ``dockerd`` is missing they skip
with the reason, unless ``VEO_EDGE_REQUIRE_DOCKER=1`` (set by ``.ci/run``) makes that a failure.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path


def remove_root(root: Path, wait: bool = True) -> None:
    """Delete an engine's root. dockerd leaves its network namespace (``exec/netns/default``) bind-mounted
    when it stops, and a mount point cannot be removed: unmount what is mounted under the root first.
    ``wait=False`` leaves the deletion of the (gigabytes of) image layers to an ``rm -rf`` that outlives
    the call, so a session does not wait for it at its end."""
    prefix = str(Path(root).resolve()) + "/"
    try:
        mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    except OSError:
        mounts = []
    for target in sorted((m for m in mounts if m.startswith(prefix)), key=len, reverse=True):
        subprocess.run(["umount", "-l", target], capture_output=True, check=False)
    if wait:
        shutil.rmtree(root, ignore_errors=True)
    else:
        subprocess.Popen(["rm", "-rf", "--one-file-system", str(root)], start_new_session=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip


REPO = Path(__file__).resolve().parents[2]
BASE_IMAGE = "veo-edge/base:bookworm-python3"


class EngineUnavailable(RuntimeError):
    """dockerd is not installed or did not come up."""


@dataclass
class DockerEngine:
    """One dockerd under ``root``. ``start`` waits until the API answers; ``stop`` ends it by PID."""

    root: Path
    extra_args: list[str] = field(default_factory=list)
    pid: int | None = None
    _log: object = None

    @property
    def socket(self) -> Path:
        return self.root / "docker.sock"

    @property
    def host(self) -> str:
        return f"unix://{self.socket}"

    @property
    def env(self) -> dict[str, str]:
        """The environment for a ``docker`` CLI or SDK call against this engine."""
        return {**os.environ, "DOCKER_HOST": self.host}

    def start(self, timeout: float = 60.0) -> DockerEngine:
        dockerd = shutil.which("dockerd")
        if dockerd is None:
            raise EngineUnavailable("dockerd is not installed (apt-get install docker.io)")
        # unix socket paths are limited to 108 bytes: keep the root short
        self.root.mkdir(parents=True, exist_ok=True)
        args = [
            dockerd,
            "--iptables=false",
            "--ip6tables=false",
            "--bridge=none",
            f"--data-root={self.root / 'data'}",
            f"--exec-root={self.root / 'exec'}",
            f"--pidfile={self.root / 'dockerd.pid'}",
            f"--host={self.host}",
            "--containerd-namespace=veo",
            "--containerd-plugins-namespace=veo-plugins",
            *self.extra_args,
        ]
        self._log = open(self.root / "dockerd.log", "ab")  # noqa: SIM115 - closed in stop()
        proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        self.pid = proc.pid
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise EngineUnavailable(f"dockerd exited with {proc.returncode}: {self.log_tail()}")
            if self.socket.exists() and self.docker("version", check=False).returncode == 0:
                return self
            time.sleep(0.3)
        self.stop()
        raise EngineUnavailable(f"dockerd did not answer within {timeout:.0f} s: {self.log_tail()}")

    def docker(
        self, *args: str, check: bool = True, timeout: float = 600, **kw
    ) -> subprocess.CompletedProcess:
        """Run the docker CLI against this engine."""
        return subprocess.run(
            ["docker", *args],
            env=self.env,
            capture_output=True,
            text=True,
            check=check,
            timeout=timeout,
            **kw,
        )

    def log_tail(self, n: int = 15) -> str:
        try:
            lines = (self.root / "dockerd.log").read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return " | ".join(lines[-n:])

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM dockerd by its PID (it stops its containers and its containerd), SIGKILL if it hangs."""
        if self.pid is None:
            return
        pid, self.pid = self.pid, None
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done == pid:
                break
            time.sleep(0.2)
        else:
            os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        if self._log is not None:
            self._log.close()

    def close(self, wait: bool = True) -> None:
        """Remove every container this engine runs (killed: no stop timeout to sit out), stop it by its
        PID, and delete its root (``wait=False``: in the background, see :func:`remove_root`)."""
        if self.pid is not None:
            cids = self.docker("ps", "-aq", check=False).stdout.split()
            if cids:
                self.docker("rm", "-f", *cids, check=False)
        self.stop()
        remove_root(self.root, wait=wait)

    def ensure_base_image(self, tag: str = BASE_IMAGE) -> str:
        """Import the local Debian base (packaging/base/make-base-image.sh; cached tarball) if absent."""
        subprocess.run(
            [str(REPO / "packaging" / "base" / "make-base-image.sh"), tag],
            env=self.env,
            check=True,
            capture_output=True,
            text=True,
            timeout=1800,
        )
        return tag


def require_docker() -> bool:
    return os.environ.get("VEO_EDGE_REQUIRE_DOCKER", "") == "1"
