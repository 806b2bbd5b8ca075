"""A server over an int8 build says which precision it computes at (metadata, config, /metrics), and its
healthcheck applies the int8 canary tolerance the build recorded."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_an_int8_build_is_served_at_int8_and_says_so(digits_int8_build: Path, serve) -> None:
    server = serve(digits_int8_build)
    status, meta = server.get_json("/v2/models/vit-digits")
    assert status == 200 and meta["parameters"]["precision"] == "int8"
    status, config = server.get_json("/v2/models/vit-digits/config")
    assert status == 200 and config["parameters"]["precision"] == {"string_value": "int8"}
    _, _, metrics = server.request("GET", "/metrics")
    line = 'veo_edge_active_precision{backend="openvino",model="vit-digits",precision="int8",version="1"} 1.0'
    assert line in metrics.decode()
    r = subprocess.run(
        [sys.executable, "-m", "veo_edge.cli.main", "healthcheck", "--url", f"http://{server.url}", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert '"healthy": true' in r.stdout
