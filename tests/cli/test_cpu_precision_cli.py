"""The CPU precision and the built-in checkpoint as a user meets them on the command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


def veo(*args, cwd=None):
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("VEO_EDGE_DEBUG", None)
    cmd = [sys.executable, "-m", "veo_edge.cli.main", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=600)


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--cpu-precision", "fp8"], 2, "--cpu-precision 'fp8' is unknown; choose one of: f32, bf16, int8"),
        (["--cpu-precision", "int8"], 2, "--cpu-precision int8 needs calibration inputs for vit-nano"),
        (["--calibration", "c.npy"], 2, "--calibration goes with --cpu-precision int8, not f32"),
        (["--cpu-precision", "int8", "--calibration", "c.npy"], 2, "--calibration c.npy does not exist"),
        (["--max-accuracy-drop", "-1"], 2, "--max-accuracy-drop -1.0 is out of range"),
        (["--checkpoint", "w.pt"], 3, "checkpoint w.pt does not exist"),
    ],
)
def test_bad_precision_options_are_one_line_and_an_exit_code(tmp_path, args, code, message):
    r = veo("build", "--model", "vit-nano", *args, cwd=tmp_path)
    assert r.returncode == code, r.stderr
    assert message in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "vit-nano").exists()


def test_inspect_and_infer_say_which_precision(digits_int8_build):
    shown = veo("inspect", digits_int8_build)
    assert shown.returncode == 0, shown.stderr
    assert "cpu precision: int8 on openvino (asked for int8), f32 on onnxruntime" in shown.stdout
    assert "guard (labelled): top-1 on 540 labelled samples" in shown.stdout
    assert "canary tolerance at int8" in shown.stdout
    summary = json.loads(veo("inspect", digits_int8_build, "--json").stdout)
    assert summary["cpu_precision"]["served"]["openvino"] == "int8"
    out = json.loads(veo("infer", digits_int8_build, "--backend", "openvino", "--json").stdout)
    assert out["precision"] == "int8" and out["backend_info"]["inference_precision_hint"] == "f32"
