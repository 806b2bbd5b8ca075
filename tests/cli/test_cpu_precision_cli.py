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


@pytest.mark.parametrize(
    ("y", "n", "message"),
    [
        (
            [5000] * 4,
            4,
            r"--val v.npz has 4 labels outside the model's classes \(label 5000 at sample 0; "
            r"labels range 5000 to 5000\); expected class indices 0 to 9 \(the model's 10 classes\)",
        ),
        (
            [0, 9, 10, -1],
            4,
            r"has 2 labels outside the model's classes \(label 10 at sample 2; labels range -1",
        ),
        ([3], 1, r"--val v.npz has 1 sample; the accuracy guard needs at least 2"),
    ],
    ids=["over", "over-and-negative", "one-sample"],
)
def test_val_data_the_guard_cannot_use_is_refused_before_the_export(tmp_path, y, n, message):
    """The guard scored labels 5000 of a 10-class model as 0 % at f32 and at bf16 and passed."""
    import re

    import numpy as np

    x = np.random.default_rng(0).standard_normal((n, 3, 32, 32)).astype(np.float32)
    np.savez(tmp_path / "v.npz", x=x, y=np.array(y))
    r = veo("build", "--model", "vit-nano", "--cpu-precision", "bf16", "--val", "v.npz", cwd=tmp_path)
    assert r.returncode == 4, r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and re.search(message, errors[0]), r.stderr
    assert "Exporting" not in r.stdout + r.stderr and not (tmp_path / "vit-nano").exists()


def test_one_val_sample_builds_at_f32_as_the_canary(tmp_path):
    """At f32 no guard scores --val: one sample is the build's canary input and its top-1, not refused."""
    import numpy as np

    x = np.random.default_rng(1).standard_normal((1, 3, 32, 32)).astype(np.float32)
    np.savez(tmp_path / "v.npz", x=x, y=np.array([3]))
    r = veo("build", "--model", "vit-nano", "--val", "v.npz", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    manifest = json.loads((tmp_path / "vit-nano" / "manifest.json").read_text())
    assert manifest["canary"]["source"] == "--val v.npz, sample 0"
    assert np.array_equal(np.load(tmp_path / "vit-nano" / "canary" / "input.npy"), x)
    assert manifest["cpu_precision"]["accuracy"]["samples"] == 1


def test_one_calibration_sample_is_bad_input_as_for_val(tmp_path):
    """The label-free guard holds a fifth of --calibration out: one sample is refused with --val's exit code."""
    import numpy as np

    np.save(tmp_path / "c.npy", np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32))
    r = veo("build", "--model", "vit-nano", "--cpu-precision", "int8", "--calibration", "c.npy", cwd=tmp_path)
    assert r.returncode == 4, r.stderr
    assert "--calibration c.npy has 1 sample; the label-free guard needs at least 2" in r.stderr
    assert "Exporting" not in r.stdout + r.stderr and not (tmp_path / "vit-nano").exists()


def test_calibration_of_the_wrong_shape_is_refused_before_the_export(tmp_path):
    """--calibration is read once, when the model loads (as --val is), so its errors cost no export."""
    import numpy as np

    np.save(tmp_path / "c.npy", np.zeros((4, 3, 16, 16), np.float32))
    r = veo("build", "--model", "vit-nano", "--cpu-precision", "int8", "--calibration", "c.npy", cwd=tmp_path)
    assert r.returncode == 4, r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: --calibration c.npy"), r.stderr
    assert "expected (N, 3, 32, 32)" in errors[0]
    assert "Exporting" not in r.stdout + r.stderr and not (tmp_path / "vit-nano").exists()


def test_labels_for_a_model_without_a_classifier_are_refused(tmp_path):
    import numpy as np

    transformers = pytest.importorskip("transformers", reason="transformers is not installed (hf extra)")
    import torch

    torch.manual_seed(0)
    small = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}
    ckpt = tmp_path / "backbone"
    transformers.ViTModel(transformers.ViTConfig(image_size=32, patch_size=8, **small)).save_pretrained(ckpt)
    transformers.ViTImageProcessorPil(size={"height": 32, "width": 32}).save_pretrained(ckpt)
    x = np.random.default_rng(0).standard_normal((4, 3, 32, 32)).astype(np.float32)
    np.savez(tmp_path / "v.npz", x=x, y=np.array([0, 1, 0, 1]))
    r = veo("build", "--hf", ckpt, "--cpu-precision", "bf16", "--val", "v.npz", "--out", "o", cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert (
        "--val v.npz has labels, but the model has no classification head: it serves pooler_output"
        in r.stderr
    )
    assert not (tmp_path / "o").exists()


def test_an_onnx_build_reads_its_classes_from_the_graph(tmp_path, nano_build):
    """--onnx has no labels and no module: the class count is the ONNX output's width (10 for vit-nano)."""
    import numpy as np

    x = np.random.default_rng(0).standard_normal((3, 3, 32, 32)).astype(np.float32)
    np.savez(tmp_path / "v.npz", x=x, y=np.array([0, 9, 10]))
    onnx = nano_build / "model.onnx"
    r = veo("build", "--onnx", onnx, "--cpu-precision", "bf16", "--val", "v.npz", "--out", "o", cwd=tmp_path)
    assert r.returncode == 4, r.stderr
    assert "expected class indices 0 to 9 (the model's 10 classes)" in r.stderr
    assert not (tmp_path / "o").exists()
