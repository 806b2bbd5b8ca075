"""The CLI as a user runs it: a real subprocess, its exit code, stdout and stderr."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

HEAVY = ["torch", "tensorrt", "pynvml", "docker", "onnxruntime", "openvino", "onnx", "onnx_graphsurgeon"]


def veo(*args, env=None, block=(), cwd=None, timeout=300):
    """Run ``veo-edge`` in a fresh interpreter, optionally with some packages made unimportable; an ``env``
    value of ``None`` removes that variable."""
    code = textwrap.dedent(
        f"""
        import sys
        for name in {list(block)!r}:
            sys.modules[name] = None  # any import of it raises ImportError
        from veo_edge.cli.main import main
        main({list(map(str, args))!r})
        """
    )
    full_env = {**os.environ, "COLUMNS": "200", **(env or {})}
    full_env = {k: v for k, v in full_env.items() if v is not None and k != "VEO_EDGE_DEBUG"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full_env, cwd=cwd,
                          timeout=timeout)  # fmt: skip


def test_help_works_without_any_heavy_dependency():
    r = veo("--help", block=HEAVY)
    assert r.returncode == 0, r.stderr
    for command in ("build", "infer", "doctor"):
        assert command in r.stdout


def test_doctor_reports_what_is_missing_and_why_without_heavy_dependencies():
    r = veo("doctor", "--json", block=HEAVY)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["cpu"]["ok"] is True
    for name in ("gpu", "tensorrt", "openvino", "onnxruntime"):
        assert report[name]["ok"] is False
        assert report[name]["reason"], name
    from veo_edge.runtime.probes import _nvidia_driver_present

    # without pynvml: where no driver is loaded that is the reason; where one is, the missing package
    assert ("pynvml" if _nvidia_driver_present() else "no NVIDIA driver") in report["gpu"]["reason"]


def test_doctor_table_and_json_agree_on_this_machine():
    r = veo("doctor", "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["openvino"]["ok"] and "CPU" in report["openvino"]["data"]["devices"]
    assert (
        report["onnxruntime"]["ok"] and "CPUExecutionProvider" in report["onnxruntime"]["data"]["providers"]
    )
    table = veo("doctor")
    assert table.returncode == 0
    for name, probe in report.items():
        assert name in table.stdout
        assert ("ok" if probe["ok"] else "absent") in table.stdout


def test_doctor_lives_through_a_package_that_crashes_at_import(tmp_path):
    """An onnxruntime whose import dies of SIGSEGV (ONNX Runtime on aarch64 under QEMU does): doctor
    reports it with the signal and exits 0 (it died with the signal before)."""
    (tmp_path / "onnxruntime").mkdir()
    (tmp_path / "onnxruntime" / "__init__.py").write_text("import ctypes\nctypes.string_at(0)\n")
    r = veo("doctor", "--json", env={"PYTHONPATH": str(tmp_path), "PYTHONFAULTHANDLER": None})
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["onnxruntime"]["ok"] is False
    assert "importing onnxruntime killed a child process with SIGSEGV" in report["onnxruntime"]["reason"]
    assert report["openvino"]["ok"] is True


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["build", "--model", "vit-tny"], 2, "unknown model 'vit-tny'; choose one of: "),
        (["build", "--onnx", "missing.onnx"], 3, "ONNX file missing.onnx does not exist"),
        (["build", "--model", "vit-nano", "--onnx", "x.onnx"], 2, "--model and --onnx were both given"),
        (["build", "--max-batch", "0", "--model", "vit-nano"], 2, "--max-batch 0 is out of range"),
        (["build", "--input-shape", "3,a", "--module", "a:b"], 2, "is not a list of positive integers"),
        (["build", "--hf", "d", "--input-shape", "3,64,64"], 2, "--input-shape goes with --module; a --hf"),
        (["infer", "nowhere"], 7, "build directory nowhere does not exist"),
        (
            ["serve", "nowhere", "--threads", "-2"],
            2,
            "Invalid value for '--threads'",
        ),  # was an internal error
        (
            ["deploy", "reg/vit:1", "--k8s", "k", "--replicas", "0"],
            2,
            "--replicas 0 must be at least 1",
        ),  # was 1
        (
            ["deploy", "reg/vit:1", "--to", "unix:///nowhere.sock", "--update-delay", "1"],
            2,
            "--update-monitor and --update-delay pace a Swarm service's updates: add --swarm",
        ),
        (
            ["deploy", "reg/vit:1", "--swarm", "--to", "unix:///nowhere.sock", "--update-monitor", "0"],
            2,
            "--update-monitor 0 must be a number of seconds above 0",
        ),
    ],
)
def test_bad_input_is_one_line_and_an_exit_code(tmp_path, args, code, message):
    r = veo(*args, cwd=tmp_path)
    assert r.returncode == code, r.stderr
    assert message in r.stderr
    assert "Traceback" not in r.stderr


def test_corrupt_onnx_and_existing_output(tmp_path, nano_build):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08garbage")
    r = veo("build", "--onnx", bad, "--out", tmp_path / "o", cwd=tmp_path)
    assert r.returncode == 3 and "is unreadable or corrupt" in r.stderr
    r = veo("build", "--model", "vit-nano", "--out", nano_build, cwd=tmp_path)
    assert r.returncode == 5 and "already exists; pass --force to overwrite it" in r.stderr


def test_debug_shows_the_traceback(tmp_path):
    r = veo("--debug", "build", "--model", "vit-tny", cwd=tmp_path)
    assert r.returncode != 0 and "Traceback" in r.stderr and "UsageError" in r.stderr


def test_infer_rejects_a_wrong_input_shape(tmp_path, nano_build):
    x = tmp_path / "x.npy"
    np.save(x, np.zeros((2, 3, 16, 16), np.float32))
    r = veo("infer", nano_build, "--input", x, "--backend", "openvino")
    assert r.returncode == 4, r.stderr
    assert "has shape (2, 3, 16, 16), expected input: float32[N, 3, 32, 32]" in r.stderr


def test_inspect_shows_a_build_with_a_missing_artifact_and_fails(copy_build, nano_build):
    build = copy_build(nano_build)
    (build / "openvino" / "model.bin").unlink()
    r = veo("inspect", build)
    assert r.returncode == 7, r.stderr
    assert "artifact openvino_bin (openvino/model.bin) is missing" in r.stdout  # shown with the rest
    # the parity proof the README promises: each backend's worst error against its tolerance
    parity = next(
        line for line in r.stdout.splitlines() if "parity vs float64 PyTorch at batch 1, 8:" in line
    )
    assert "onnxruntime max abs" in parity and "openvino max abs" in parity and "(passed)" in parity
    assert r.stderr.strip().splitlines()[-1].startswith(f"error: build {build} is incomplete: artifact")
    r = veo("inspect", build, "--json")
    assert r.returncode == 7
    assert json.loads(r.stdout)["artifact_problems"] == [
        "artifact openvino_bin (openvino/model.bin) is missing"
    ]


def test_infer_input_that_is_not_npy_says_so(tmp_path, nano_build):
    (tmp_path / "cat.jpg").write_bytes(b"\xff\xd8\xff\xe0 a picture, not an array")
    r = veo("infer", nano_build, "--input", tmp_path / "cat.jpg")
    assert r.returncode == 4, r.stderr
    line = r.stderr.strip().splitlines()[-1]
    assert line.endswith("cat.jpg is not a .npy file (numpy.save writes one); for a picture use --image")
    assert "pickle" not in r.stderr
    r = veo("infer", nano_build, "--input", tmp_path / "missing.npy")
    assert r.returncode == 4 and "cannot read input" in r.stderr and "No such file or directory" in r.stderr


def test_infer_warns_of_nan_inputs(tmp_path, nano_build):
    x = np.zeros((1, 3, 32, 32), np.float32)
    x[0, 0, :2, :3] = np.nan
    np.save(tmp_path / "nan.npy", x)
    r = veo("infer", nano_build, "--input", tmp_path / "nan.npy", "--json")
    assert r.returncode == 0, r.stderr
    said = "the input holds 6 NaN or infinite values of 3072; outputs follow from them"
    assert f"warning: {said}" in r.stderr and json.loads(r.stdout)["warning"] == said
    np.save(tmp_path / "ok.npy", np.zeros_like(x))
    r = veo("infer", nano_build, "--input", tmp_path / "ok.npy")
    assert r.returncode == 0 and "warning" not in r.stderr


def test_infer_runs_a_npy_input_on_both_cpu_backends(tmp_path, nano_build):
    x = tmp_path / "x.npy"
    np.save(x, np.load(nano_build / "canary" / "input.npy")[0])  # one sample, no batch axis
    expected = np.load(nano_build / "canary" / "expected.npy")[0]
    for backend in ("openvino", "onnxruntime"):
        r = veo("infer", nano_build, "--input", x, "--backend", backend, "--json", "--top-k", "3")
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert out["output_shape"] == [1, 10]
        assert [t["class"] for t in out["top_k"][0]] == list(np.argsort(-expected)[:3])


@pytest.mark.slow
def test_default_build_end_to_end_on_vit_digits(tmp_path):
    """What the README's first command runs: the default model (trained on real data), default output
    directory, its accuracy on the held-out test split measured by the build and shown by inspect."""
    r = veo("build", "--quiet", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    m = json.loads((tmp_path / "vit-digits" / "manifest.json").read_text())
    assert m["model"]["name"] == "vit-digits" and m["input_shape"] == [1, 32, 32]
    assert all(p["passed"] for p in m["parity"])
    assert m["outputs"][0]["shape"] == [-1, 10]
    acc = m["cpu_precision"]["accuracy"]
    assert acc["samples"] == 540 and acc["top1"]["openvino"]["f32"] > 90  # an untrained ViT scores ~10
    r = veo("inspect", tmp_path / "vit-digits", env={"COLUMNS": None})  # piped, as into a file or grep
    assert r.returncode == 0 and "top-1 on 540 labelled samples" in r.stdout, r.stderr
    (artifacts,) = [line for line in r.stdout.splitlines() if "artifacts:" in line]
    assert "openvino_xml" in artifacts and "surgery_report" in artifacts, r.stdout  # whole, not cut at 80


def test_successful_build_says_where_and_what_next(tmp_path):
    r = veo("build", "--model", "veo-video-nano", "--max-batch", "2", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert f"-> {tmp_path / 'veo-video-nano'}" in r.stdout
    assert "Next: veo-edge infer" in r.stdout
    assert "Checking parity with PyTorch" in r.stderr  # the progress display goes to stderr
    quiet = veo("build", "--model", "veo-video-nano", "--force", "--quiet", cwd=tmp_path)
    assert quiet.returncode == 0 and quiet.stdout == "" and quiet.stderr == ""


def test_dynamo_at_opset_23_is_quiet_and_its_attention_ops_are_fused(tmp_path):
    """torch's dynamo exporter emits the ONNX Attention op at opset 23, and prints progress of its own
    unless kept quiet: --quiet must stay silent and the surgery must fuse what that exporter made."""
    import onnx

    r = veo("build", "--model", "vit-nano", "--exporter", "dynamo", "--opset", "23", "--max-batch", "2",
            "--quiet", cwd=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout == "" and r.stderr == ""
    ops = {n.op_type for n in onnx.load(str(tmp_path / "vit-nano" / "model.onnx")).graph.node}
    assert "Attention" in ops
    counts = json.loads((tmp_path / "vit-nano" / "manifest.json").read_text())["surgery"]["counts"]
    assert counts["VeoAttention"] == {"candidates": 2, "matched": 2, "replaced": 2}
    assert counts["VeoPatchEmbedLayerNorm"]["replaced"] == 1
