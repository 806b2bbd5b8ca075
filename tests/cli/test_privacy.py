"""OpenVINO's and ONNX Runtime's usage telemetry are off in the veo-edge command unless the user opted in
(``veo_edge/privacy.py``).

Both send over HTTPS through ``HTTPS_PROXY`` when it is set (OpenVINO with urllib): the test points it at a
listener of its own on loopback that records each tunnel asked for and forwards nothing, so nothing leaves
the machine and every attempt to send is seen. ONNX Runtime's uploader sends when it gets round to it (one
CI run saw a ``doctor`` ask for mobile.events.data.microsoft.com, runs here did not), so for it the test
checks the switch the command sets, which ONNX Runtime documents as a full opt-out."""

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


def _doctor(home: Path, proxy: _Proxy, **env_vars: str) -> dict:
    # without the CI variables OpenVINO checks, and without the switch this test process set for ONNX Runtime
    drop = ("CI", "TF_BUILD", "JENKINS_URL", "ORT_DISABLE_TELEMETRY")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(HOME=str(home), HTTPS_PROXY=proxy.url, https_proxy=proxy.url, **env_vars)
    r = subprocess.run(
        [sys.executable, "-m", "veo_edge.cli.main", "doctor", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_the_command_sends_no_openvino_telemetry_unless_the_user_opted_in(tmp_path: Path) -> None:
    proxy = _Proxy()
    try:
        fresh = tmp_path / "fresh"
        fresh.mkdir()
        rows = _doctor(
            fresh, proxy
        )  # imports OpenVINO (which sends an event when its telemetry is on) and ORT
        assert rows["openvino"]["ok"] and rows["openvino"]["data"]["telemetry"].startswith(
            "usage telemetry off"
        )
        assert rows["onnxruntime"]["data"]["telemetry"].startswith(
            "usage telemetry off (ORT_DISABLE_TELEMETRY=1"
        )
        assert proxy.lines == [] and not (fresh / "intel").exists()  # nothing sent, no client id written
        # the user opted in (what `opt_in_out --opt_in` writes; ONNX Runtime's switch set to 0): veo-edge
        # leaves both on, and OpenVINO sends
        opted = tmp_path / "opted"
        (opted / "intel").mkdir(parents=True)
        (opted / "intel" / "openvino_telemetry").write_text("1")
        rows = _doctor(opted, proxy, ORT_DISABLE_TELEMETRY="0")
        assert rows["openvino"]["data"]["telemetry"].startswith("usage telemetry on: you opted in")
        assert (
            rows["onnxruntime"]["data"]["telemetry"] == "usage telemetry on: ORT_DISABLE_TELEMETRY=0 was set"
        )
        assert any("www.google-analytics.com:443" in line for line in proxy.lines), proxy.lines
        collectors = ("www.google-analytics.com:443", "mobile.events.data.microsoft.com:443")
        assert all(any(c in line for c in collectors) for line in proxy.lines), proxy.lines
        assert (opted / "intel" / "openvino_ga_cid").exists()
    finally:
        proxy.sock.close()
