"""OpenVINO's usage telemetry is off in the veo-edge command unless the user opted in
(``veo_edge/privacy.py``).

OpenVINO sends its events with urllib, which honours ``HTTPS_PROXY``: the test points it at a listener of
its own on loopback that records each tunnel asked for and forwards nothing, so nothing leaves the machine
and every attempt to send is seen."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path


class _Proxy:
    """A loopback listener that records the first line of each connection (``CONNECT host:443 ...``)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.lines: list[str] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                try:
                    self.lines.append(conn.recv(4096).decode("latin-1").splitlines()[0])
                except (OSError, IndexError):
                    self.lines.append("")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"


def _doctor(home: Path, proxy: _Proxy) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "TF_BUILD", "JENKINS_URL")}  # its CI check
    env.update(HOME=str(home), HTTPS_PROXY=proxy.url, https_proxy=proxy.url)
    r = subprocess.run(
        [sys.executable, "-m", "veo_edge.cli.main", "doctor", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["openvino"]


def test_the_command_sends_no_openvino_telemetry_unless_the_user_opted_in(tmp_path: Path) -> None:
    proxy = _Proxy()
    try:
        fresh = tmp_path / "fresh"
        fresh.mkdir()
        probe = _doctor(fresh, proxy)  # imports OpenVINO, which sends an event when its telemetry is on
        assert probe["ok"] and probe["data"]["telemetry"].startswith("usage telemetry off")
        assert proxy.lines == [] and not (fresh / "intel").exists()  # nothing sent, no client id written
        # the user opted in (what `opt_in_out --opt_in` writes): veo-edge leaves it on, and it sends
        opted = tmp_path / "opted"
        (opted / "intel").mkdir(parents=True)
        (opted / "intel" / "openvino_telemetry").write_text("1")
        probe = _doctor(opted, proxy)
        assert probe["data"]["telemetry"].startswith("usage telemetry on: you opted in")
        assert proxy.lines and all("google-analytics.com" in line for line in proxy.lines), proxy.lines
        assert (opted / "intel" / "openvino_ga_cid").exists()
    finally:
        proxy.sock.close()
