"""A wheel (non-editable install, e.g. inside a container image) carries the plugin specs."""

import subprocess
import sys
import zipfile
from dataclasses import replace
from pathlib import Path

from veo_edge.surgery.spec import SOURCE_PLUGINS_DIR, load_spec

REPO = Path(__file__).resolve().parents[2]


def test_the_wheel_ships_the_specs_and_they_load(tmp_path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(REPO),
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("veo_edge-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(tmp_path / "site")
    packaged = tmp_path / "site" / "veo_edge" / "_plugin_specs"
    for source in sorted(SOURCE_PLUGINS_DIR.glob("*/spec.json")):
        copy = packaged / source.parent.name / "spec.json"
        assert copy.read_bytes() == source.read_bytes(), copy
    for op in ("VeoAttention", "VeoPatchEmbedLayerNorm"):
        shipped = load_spec.__wrapped__(op, packaged)
        assert shipped.path.is_relative_to(packaged)
        assert replace(shipped, path=None) == replace(load_spec(op), path=None)
